/* What the integration tests share: they run under LD_PRELOAD=libcacheshim.so against the
 * fake driver (tests/fake), linked with it, and find the shim's API at run time. Include after
 * <cmocka.h>. */
#ifndef SHIM_UTIL_H
#define SHIM_UTIL_H

#include <cuda.h>
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cacheshim.h"
#include "fake_control.h"

#define MiB (1024ull * 1024)

/* ---- the backend under test
 * Each shim test program runs twice (tests/meson.build): as configured, pooled by default, and
 * with CACHESHIM_BACKEND=classic. What depends on the backend is asked through these helpers,
 * so one assertion states what both must do. The environment says which backend the shim is
 * meant to run; test_backend_as_configured (test_shim.c) checks that it does. */

/* Pooled: unless CACHESHIM_BACKEND=classic, or the fake driver offers no virtual memory
 * management (FAKE_CUDA_NO_VMM=1, which gives classic by itself). */
static inline bool shim_pooled(void)
{
    const char *b = getenv("CACHESHIM_BACKEND"), *novmm = getenv("FAKE_CUDA_NO_VMM");
    return !(b && !strcmp(b, "classic")) && !(novmm && !strcmp(novmm, "1"));
}

/* The driver entry point through which the shim takes new memory for blocks (one call per
 * block classic, per chunk pooled), and the one through which memory goes back. */
static inline const char *driver_alloc_call(void)
{
    return shim_pooled() ? "cuMemCreate" : "cuMemAlloc_v2";
}

static inline const char *driver_free_call(void)
{
    return shim_pooled() ? "cuMemRelease" : "cuMemFree_v2";
}

/* Calls of those since the fake's counters were last reset. */
static inline long driver_allocs(void)
{
    return fake_calls(driver_alloc_call());
}

static inline long driver_frees(void)
{
    return fake_calls(driver_free_call());
}

static inline CUcontext shim_test_primary(void)
{
    CUdevice dev;
    CUcontext ctx;
    assert_int_equal(cuInit(0), CUDA_SUCCESS);
    assert_int_equal(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    assert_int_equal(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
    assert_int_equal(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    return ctx;
}

/* Found at run time, as the header recommends: the shim is preloaded, not linked. */
static inline cacheshim_stats shim_stats(int device)
{
    int (*fn)(int, cacheshim_stats *, size_t) =
        (int (*)(int, cacheshim_stats *, size_t))dlsym(RTLD_DEFAULT, "cacheshim_get_stats");
    cacheshim_stats s;
    assert_non_null(fn);
    assert_int_equal(fn(device, &s, sizeof s), 0);
    return s;
}

/* cacheshim_trim(): idle memory whose work is done goes back to the driver. */
static inline uint64_t shim_trim(void)
{
    uint64_t (*fn)(void) = (uint64_t (*)(void))dlsym(RTLD_DEFAULT, "cacheshim_trim");
    assert_non_null(fn);
    return fn();
}

static inline CUdeviceptr must_alloc(size_t size)
{
    CUdeviceptr p = 0;
    assert_int_equal(cuMemAlloc(&p, size), CUDA_SUCCESS);
    assert_true(p != 0);
    return p;
}

static inline void must_free(CUdeviceptr p)
{
    assert_int_equal(cuMemFree(p), CUDA_SUCCESS);
}

/* A kernel that uses [p, p + n) on stream s, launched through the driver as a program does,
 * so the shim sees it. */
static inline void launch(CUstream s, CUdeviceptr p, size_t n)
{
    void *params[] = {&p, &n};
    assert_int_equal(cuLaunchKernel(fake_touch_kernel(), 1, 1, 1, 1, 1, 1, 0, s, params, NULL),
                     CUDA_SUCCESS);
}

/* Runs this program (named prog) again with `mode` and the variables env (name, value, ...,
 * NULL), returning its exit status and stderr. */
static inline int shim_run_self(const char *prog, const char *mode, const char *const env[],
                                char *err, size_t errlen)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        for (int i = 0; env && env[i]; i += 2)
            setenv(env[i], env[i + 1], 1);
        execl("/proc/self/exe", prog, mode, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    size_t n = 0;
    ssize_t k;
    while (n + 1 < errlen && (k = read(fds[0], err + n, errlen - n - 1)) > 0)
        n += (size_t)k;
    err[n] = 0;
    close(fds[0]);
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

#endif
