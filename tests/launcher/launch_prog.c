/* A program for the launcher's tests (check_launcher.py): it shows what it was given and
 * whether the cache is loaded, through the public header's run-time helpers.
 *
 *     launch_prog args CODE [ARG...]   print each ARG as [ARG] on its own line, exit CODE
 *     launch_prog alloc N              N pairs of 1 MiB cuMemAlloc/cuMemFree on the (fake)
 *                                      driver, then the pid, the driver's own count of
 *                                      allocations (cuMemAlloc_v2 and cuMemCreate calls:
 *                                      the shim's pooled backend takes memory with the
 *                                      latter), and of cuMemCreate alone, the shim's
 *                                      statistics and a trim
 *     launch_prog env                  the variables the launcher sets, and whether the
 *                                      library in launch_marker.c is loaded
 *     launch_prog signal               kill itself with SIGTERM */
#include <cuda.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cacheshim.h"
#include "fake_control.h"

#define CHECK(x)                                                                        \
    do {                                                                                \
        if (!(x)) {                                                                     \
            fprintf(stderr, "launch_prog: %s:%d: %s failed\n", __FILE__, __LINE__, #x); \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

static void alloc(int n)
{
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0) == CUDA_SUCCESS);
    CHECK(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
    CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    for (int i = 0; i < n; i++) {
        CUdeviceptr p = 0;
        CHECK(cuMemAlloc(&p, 1 << 20) == CUDA_SUCCESS && p != 0);
        CHECK(cuMemFree(p) == CUDA_SUCCESS);
    }
    printf("pid %d\n", (int)getpid());
    printf("driver allocations %ld\n", fake_calls("cuMemAlloc_v2") + fake_calls("cuMemCreate"));
    printf("driver cuMemCreate %ld\n", fake_calls("cuMemCreate"));
    printf("shim %s\n", cacheshim_loaded() ? "loaded" : "not loaded");

    cacheshim_stats st;
    int rc = cacheshim_get_stats_if_loaded(-1, &st);
    if (rc == 0)
        printf("stats: requests %llu hits %llu\n", (unsigned long long)st.requests,
               (unsigned long long)st.hits);
    else
        printf("stats: %s\n", rc == CACHESHIM_NOT_LOADED ? "not loaded" : "none");

    uint64_t released = 1;
    if (cacheshim_trim_if_loaded(&released) == 0)
        printf("trim: released %llu\n", (unsigned long long)released);
    else
        printf("trim: not loaded, released %llu\n", (unsigned long long)released);
}

static void show_env(void)
{
    static const char *const names[] = {
        "LD_PRELOAD", "LD_AUDIT", "CACHESHIM_CAP", "CACHESHIM_RELEASE_THRESHOLD",
        "CACHESHIM_STATS", "CACHESHIM_VERBOSE", "CACHESHIM_DISABLE", "CACHESHIM_TRACE_FILE",
        "CACHESHIM_TRACE_FORMAT", "CACHESHIM_TRACE_FILTER"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *v = getenv(names[i]);
        printf("%s=%s\n", names[i], v ? v : "(unset)");
    }
    printf("marker %s\n", dlsym(RTLD_DEFAULT, "launch_marker") ? "loaded" : "not loaded");
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "args") == 0) {
        for (int i = 3; i < argc; i++)
            printf("[%s]\n", argv[i]);
        return atoi(argv[2]);
    }
    if (argc == 3 && strcmp(argv[1], "alloc") == 0)
        alloc(atoi(argv[2]));
    else if (argc == 2 && strcmp(argv[1], "env") == 0)
        show_env();
    else if (argc == 2 && strcmp(argv[1], "signal") == 0)
        raise(SIGTERM);
    else {
        fprintf(stderr, "usage: launch_prog args CODE [ARG...] | alloc N | env | signal\n");
        return 2;
    }
    return ferror(stdout) ? 1 : 0;
}
