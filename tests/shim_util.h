/* What the integration tests share: they run under LD_PRELOAD=libcacheshim.so against the
 * fake driver (tests/fake), linked with it, and find the shim's API at run time. Include after
 * <cmocka.h>. */
#ifndef SHIM_UTIL_H
#define SHIM_UTIL_H

#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>

#include "cacheshim.h"
#include "fake_control.h"

#define MiB (1024ull * 1024)

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

#endif
