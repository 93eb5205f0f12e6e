/* deep_host: loads deep_lib (an nvcc-built library with static cudart) and has it allocate.
 *
 *     deep_host LIBRARY deepbind|plain RUNS PAIRS KERNEL
 *
 * deepbind: dlopen with RTLD_DEEPBIND (the preload cannot reach the library's driver calls);
 * plain: an ordinary dlopen (it can). KERNEL 1: a kernel on each block, no host sync in the
 * loop. Prints
 *     PASS deep_host mode=M runs=R pairs=P kernel=K median_ns=X
 *     shim requests=N hits=H         (when cacheshim.h's API answers: the cache preloaded)
 *     shim not loaded                (otherwise; with LD_AUDIT alone the exit table says)
 * scripts/gpu-check-bind runs it under each way of loading the cache. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim_probe.h"

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: deep_host LIBRARY deepbind|plain RUNS PAIRS KERNEL\n");
        return 2;
    }
    int deep = strcmp(argv[2], "deepbind") == 0;
    int runs = atoi(argv[3]), pairs = atoi(argv[4]), kernel = atoi(argv[5]);
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL | (deep ? RTLD_DEEPBIND : 0));
    if (!lib) {
        printf("FAIL deep_host dlopen: %s\n", dlerror());
        return 1;
    }
    int (*run)(int, int, size_t, int, double *);
    void *sym = dlsym(lib, "deep_run");
    if (!sym) {
        printf("FAIL deep_host no deep_run: %s\n", dlerror());
        return 1;
    }
    memcpy(&run, &sym, sizeof run);
    double median = 0;
    int rc = run(runs, pairs, (size_t)1 << 20, kernel, &median);
    if (rc != 0) {
        printf("FAIL deep_host mode=%s deep_run=%d (1 start, 2 cudaMalloc, 3 kernel, 4 cudaFree, "
               "5 synchronize)\n", argv[2], rc);
        return 1;
    }
    printf("PASS deep_host mode=%s runs=%d pairs=%d kernel=%d median_ns=%.1f\n", argv[2], runs,
           pairs, kernel, median);
    cacheshim_stats s;
    if (shim_stats(&s) == 0)
        printf("shim requests=%llu hits=%llu\n", (unsigned long long)s.requests,
               (unsigned long long)s.hits);
    else
        printf("shim not loaded\n");
    return 0;
}
