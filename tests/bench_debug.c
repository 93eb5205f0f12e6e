/* CPU benchmark of the shim's entry points with the debug modes (CACHESHIM_DEBUG, scopes):
 * cuMemAlloc + cuMemFree pairs of one size through the preloaded shim on the fake driver,
 * every pair a cache hit (or, with CACHESHIM_DEBUG=uaf, a fill, and a read-back when a block
 * leaves the quarantine: host memsets and copies in the fake driver, so what it measures is
 * the shim's CPU cost, not the GPU's). Prints the median ns per pair; asserts nothing.
 *
 *     LD_PRELOAD=libcacheshim.so bench_debug SIZE PAIRS RUNS [scope]
 *
 * scripts/bench-debug runs it in each mode. "scope": the pairs run inside a scope. */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cacheshim.h"
#include "fake_control.h"

#define MAX_RUNS 1000

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void check(CUresult r, const char *what)
{
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "bench_debug: %s failed (%d)\n", what, (int)r);
        exit(1);
    }
}

int main(int argc, char **argv)
{
    if (argc < 4 || argc > 5) {
        fprintf(stderr, "usage: bench_debug SIZE PAIRS RUNS [scope]\n");
        return 2;
    }
    size_t size = strtoull(argv[1], NULL, 10);
    long pairs = strtol(argv[2], NULL, 10);
    int runs = atoi(argv[3]);
    int scope = argc == 5 && !strcmp(argv[4], "scope");
    if (size == 0 || pairs <= 0 || runs <= 0 || runs > MAX_RUNS) {
        fprintf(stderr, "bench_debug: bad arguments\n");
        return 2;
    }
    CUdevice dev;
    CUcontext ctx;
    check(cuInit(0), "cuInit");
    check(cuDeviceGet(&dev, 0), "cuDeviceGet");
    check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    /* The fake's work completes by itself, as a GPU's would: nothing piles up pending. */
    fake_set_work_ticks(1);
    if (scope && cacheshim_scope_begin_if_loaded("bench", 0) != 0) {
        fprintf(stderr, "bench_debug: no scope (is the shim preloaded?)\n");
        return 1;
    }
    double ns[MAX_RUNS];
    for (int r = -1; r < runs; r++) {  /* run -1 warms up */
        double t0 = now_ns();
        for (long i = 0; i < pairs; i++) {
            CUdeviceptr p;
            check(cuMemAlloc(&p, size), "cuMemAlloc");
            check(cuMemFree(p), "cuMemFree");
        }
        if (r >= 0)
            ns[r] = (now_ns() - t0) / (double)pairs;
    }
    qsort(ns, (size_t)runs, sizeof ns[0], by_value);
    printf("%.0f\n", ns[runs / 2]);
    if (scope)
        cacheshim_scope_end_if_loaded(NULL);
    return 0;
}
