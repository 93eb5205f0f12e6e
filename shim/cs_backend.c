/* The backend: allocation on one real driver context, and the cache's fences, which are the
 * stream layer's epochs (cs_streams.c). The context is made current for each driver call
 * that depends on it. */
#include "cs_backend.h"

#include <stdint.h>

#include "cs_driver.h"
#include "cs_streams.h"

static const cs_driver *drv(void)
{
    return cs_driver_get();
}

static CUcontext ctx_of(void *dev)
{
    return cs_streams_context(dev);
}

static int be_alloc(void *dev, uint64_t size, uint64_t *addr, int *raw)
{
    bool pushed;
    if (!cs_ctx_enter(ctx_of(dev), &pushed)) {
        *raw = CUDA_ERROR_INVALID_CONTEXT;
        return CS_BE_ERROR;
    }
    CUdeviceptr p = 0;
    CUresult r = drv()->cuMemAlloc_v2(&p, (size_t)size);
    cs_ctx_leave(pushed);
    *raw = r;
    if (r == CUDA_SUCCESS) {
        *addr = p;
        return CS_BE_OK;
    }
    return r == CUDA_ERROR_OUT_OF_MEMORY ? CS_BE_OOM : CS_BE_ERROR;
}

static int be_free(void *dev, uint64_t addr, int *raw)
{
    bool pushed;
    if (cs_streams_dead(dev) || !cs_ctx_enter(ctx_of(dev), &pushed)) {
        *raw = CUDA_ERROR_INVALID_CONTEXT;
        return CS_BE_ERROR;
    }
    CUresult r = drv()->cuMemFree_v2((CUdeviceptr)addr);
    cs_ctx_leave(pushed);
    *raw = r;
    return r == CUDA_SUCCESS ? CS_BE_OK : CS_BE_ERROR;
}

static uint64_t be_fence(void *dev) { return cs_streams_fence(dev); }
static int be_reached(void *dev, uint64_t epoch) { return cs_streams_reached(dev, epoch); }
static int be_wait(void *dev, uint64_t epoch) { return cs_streams_wait(dev, epoch); }
static int be_order_after(void *dev, uint64_t epoch) { return cs_streams_order_after(dev, epoch); }
static int be_busy_streams(void *dev) { return cs_streams_busy(dev); }

const cs_backend_ops cs_cuda_ops = {
    .alloc = be_alloc,
    .free = be_free,
    .fence = be_fence,
    .reached = be_reached,
    .wait = be_wait,
    .order_after = be_order_after,
    .busy_streams = be_busy_streams,
};

void *cs_backend_for(CUcontext ctx)
{
    return cs_streams_for(ctx);
}
