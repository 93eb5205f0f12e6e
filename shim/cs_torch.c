/* PyTorch's pluggable allocator (torch.cuda.memory.CUDAPluggableAllocator): two functions it
 * loads from libcacheshim.so by name, so a program can plug the cache in from Python, with or
 * without LD_PRELOAD (docs/usage.md, "PyTorch").
 *
 * Without LD_PRELOAD the shim sees none of PyTorch's kernel launches, so it learns the streams'
 * work from these calls: the stream a block is allocated for, and the one it is freed on, are
 * taken to have had work (cs_work_begin/cs_work_end), so the fence at the free covers that
 * stream, and a block handed out before its fence completed makes the allocating stream wait
 * for it on the GPU. */
#include "cs_exports.h"

#include <sys/types.h>

#include "cs_shim.h"
#include "cs_work.h"

/* The device's primary context, which PyTorch's runtime works in: the current one when it is
 * of that device, else the primary context, retained once for the process (it is never
 * released: PyTorch keeps it for its life too). */
static CUcontext device_context(const cs_driver *d, int device)
{
    static CUcontext retained[CS_MAX_DEVICES];  /* atomic */
    CUcontext ctx = NULL;
    CUdevice cur;
    if (d->cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx &&
        d->cuCtxGetDevice(&cur) == CUDA_SUCCESS && cur == device)
        return ctx;
    if (device < 0 || device >= CS_MAX_DEVICES)
        return NULL;
    ctx = __atomic_load_n(&retained[device], __ATOMIC_ACQUIRE);
    if (ctx)
        return ctx;
    if (!d->cuDevicePrimaryCtxRetain || d->cuDevicePrimaryCtxRetain(&ctx, device) != CUDA_SUCCESS)
        return NULL;
    CUcontext expected = NULL;
    if (!__atomic_compare_exchange_n(&retained[device], &expected, ctx, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        d->cuDevicePrimaryCtxRelease_v2(device);  /* another thread retained it first */
    return ctx;
}

/* The stream had (or will have) work the shim did not see. */
static void stream_used(CUstream stream)
{
    cs_work_end(cs_work_begin(stream, 0), CUDA_SUCCESS);
}

CS_EXPORT void *cacheshim_torch_alloc(ssize_t size, int device, void *stream)
{
    const cs_driver *d = cs_driver_get();
    CUcontext ctx;
    bool pushed;
    if (size <= 0 || !d->cuMemAlloc_v2 || !(ctx = device_context(d, device)) ||
        !cs_ctx_enter(ctx, &pushed))
        return NULL;
    CUdeviceptr p = 0;
    /* The shim's own cuMemAlloc: the cache, the cap, the failure report. */
    CUresult r = cuMemAlloc_v2(&p, (size_t)size);
    if (r == CUDA_SUCCESS && !cs_shim_get()->disabled)
        stream_used((CUstream)stream);
    cs_ctx_leave(pushed);
    return r == CUDA_SUCCESS ? (void *)(uintptr_t)p : NULL;
}

CS_EXPORT void cacheshim_torch_free(void *ptr, ssize_t size, int device, void *stream)
{
    (void)size;
    const cs_driver *d = cs_driver_get();
    CUcontext ctx;
    bool pushed;
    if (!ptr || !d->cuMemFree_v2 || !(ctx = device_context(d, device)) ||
        !cs_ctx_enter(ctx, &pushed))
        return;
    if (!cs_shim_get()->disabled)
        stream_used((CUstream)stream);
    cuMemFree_v2((CUdeviceptr)(uintptr_t)ptr);  /* nothing to tell PyTorch on failure */
    cs_ctx_leave(pushed);
}
