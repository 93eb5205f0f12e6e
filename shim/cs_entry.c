/* The interposed driver entry points. Thin: each one turns the call into a call on the cache
 * (or a note to it) and forwards everything it does not handle to the real driver unchanged.
 */
#include "cs_exports.h"

#include "cs_debug.h"
#include "cs_outside.h"
#include "cs_shim.h"
#include "cs_streams.h"

/* The real driver, or NOT_INITIALIZED from a wrapper when there is none (the program found
 * the shim's symbol without a libcuda in the process). */
#define REAL(d, name) \
    const cs_driver *d = cs_driver_get(); \
    if (!d->name) \
        return CUDA_ERROR_NOT_INITIALIZED

/* ---------------------------------------------------------------- memory */

CS_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    REAL(d, cuMemAlloc_v2);
    cs_shim *s = cs_shim_get();
    CUcontext ctx;
    cs_heap *h;
    /* NULL pointer, zero size, no context: the driver's own answer is the right one. */
    if (s->disabled || !dptr || bytesize == 0 || !(h = cs_shim_current_heap(d, &ctx)))
        return d->cuMemAlloc_v2(dptr, bytesize);
    uint64_t addr;
    int raw = CUDA_SUCCESS;
    cs_alloc_failure failure;
    cs_result res = cs_cache_alloc(s->cache, h, bytesize, &addr, &raw, &failure);
    if (cs_debug_active())
        res = cs_debug_alloc(s->cache, h, ctx, bytesize, &addr, &raw, &failure, res);
    switch (res) {
    case CS_OK:
        *dptr = (CUdeviceptr)addr;
        return CUDA_SUCCESS;
    case CS_OOM:
        cs_shim_report_failure(d, &failure);
        return CUDA_ERROR_OUT_OF_MEMORY;
    case CS_GONE:
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;  /* destroyed by another thread meanwhile */
    default:
        return (CUresult)raw;
    }
}

CS_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    REAL(d, cuMemFree_v2);
    cs_shim *s = cs_shim_get();
    /* cudaFree(NULL) is a common way to start the runtime: not a foreign free. */
    if (s->disabled || dptr == 0)
        return d->cuMemFree_v2(dptr);
    cs_result res = cs_debug_active() ? cs_debug_free(s->cache, (uint64_t)dptr)
                                      : cs_cache_free(s->cache, (uint64_t)dptr);
    switch (res) {
    case CS_OK:
        /* The driver's free waits for the whole device; the cache's does not, unless asked. */
        if (s->opts.sync_free && d->cuCtxSynchronize)
            return d->cuCtxSynchronize();
        return CUDA_SUCCESS;
    case CS_NOT_IN_USE:
        return CUDA_ERROR_INVALID_VALUE;  /* what the driver says to a double free */
    default: {
        /* not ours: the driver decides; pitched, managed and stream-ordered memory stays
         * counted until it has */
        cs_outside_entry *e = cs_outside_free_begin((uint64_t)dptr);
        CUresult r = d->cuMemFree_v2(dptr);
        cs_outside_free_end(e, r == CUDA_SUCCESS);
        if (cs_debug_active())
            cs_debug_foreign_free((uint64_t)dptr, (int)r);
        return r;
    }
    }
}

CS_EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    REAL(d, cuMemGetInfo_v2);
    size_t f = 0, t = 0;
    CUresult r = d->cuMemGetInfo_v2(&f, &t);
    cs_shim *s = cs_shim_get();
    CUdevice dev;
    CUcontext ctx;
    /* The heap is made here if need be: a program asks before its first allocation, and
     * must see the cap from the start. */
    if (r == CUDA_SUCCESS && !s->disabled && cs_shim_current_heap(d, &ctx) &&
        d->cuCtxGetDevice(&dev) == CUDA_SUCCESS) {
        uint64_t vf, vt;
        cs_cache_mem_view(s->cache, (int)dev, f, t, &vf, &vt);
        f = (size_t)vf;
        t = (size_t)vt;
    }
    if (r == CUDA_SUCCESS) {
        if (free)
            *free = f;
        if (total)
            *total = t;
    }
    return r;
}

/* The v1 entry points take 32-bit pointers and sizes (CUDA before 3.2): forwarded as they are. */
CS_EXPORT CUresult cuMemAlloc(unsigned int *dptr, unsigned int bytesize)
{
    REAL(d, cuMemAlloc);
    return d->cuMemAlloc(dptr, bytesize);
}

CS_EXPORT CUresult cuMemFree(unsigned int dptr)
{
    REAL(d, cuMemFree);
    return d->cuMemFree(dptr);
}

CS_EXPORT CUresult cuMemGetInfo(unsigned int *free, unsigned int *total)
{
    REAL(d, cuMemGetInfo);
    return d->cuMemGetInfo(free, total);
}

/* ---------------------------------------------------------------- streams */

/* Streams are learnt from the work put on them (cs_work.h); a destroyed one's last work
 * still runs and is fenced before the handle goes. */
CS_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream)
{
    REAL(d, cuStreamDestroy_v2);
    if (!cs_shim_get()->disabled)
        cs_streams_destroying(hStream);
    return d->cuStreamDestroy_v2(hStream);
}

CS_EXPORT CUresult cuStreamDestroy(CUstream hStream)
{
    REAL(d, cuStreamDestroy);
    if (!cs_shim_get()->disabled)
        cs_streams_destroying(hStream);
    return d->cuStreamDestroy(hStream);
}

/* ---------------------------------------------------------------- contexts
 *
 * Destroying a context frees all its memory in the driver: the cache must forget the blocks
 * of that context, or it would hand out dead pointers. */

CS_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    REAL(d, cuCtxDestroy_v2);
    CUresult r = d->cuCtxDestroy_v2(ctx);
    if (r == CUDA_SUCCESS && !cs_shim_get()->disabled)
        cs_shim_context_gone(ctx);
    return r;
}

CS_EXPORT CUresult cuCtxDestroy(CUcontext ctx)
{
    REAL(d, cuCtxDestroy);
    CUresult r = d->cuCtxDestroy(ctx);
    if (r == CUDA_SUCCESS && !cs_shim_get()->disabled)
        cs_shim_context_gone(ctx);
    return r;
}

/* The primary context's handle, if it is active (a retain and release leave its count as it
 * was); NULL otherwise. */
static CUcontext active_primary(const cs_driver *d, CUdevice dev)
{
    unsigned int flags;
    int active = 0;
    CUcontext ctx = NULL;
    if (!d->cuDevicePrimaryCtxGetState || !d->cuDevicePrimaryCtxRetain ||
        !d->cuDevicePrimaryCtxRelease_v2 ||
        d->cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS || !active)
        return NULL;
    if (d->cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS)
        return NULL;
    d->cuDevicePrimaryCtxRelease_v2(dev);
    return ctx;
}

/* Runs a primary-context release or reset and forgets the context if it is gone after. */
static CUresult primary_op(const cs_driver *d, CUresult (*op)(CUdevice), CUdevice dev)
{
    if (cs_shim_get()->disabled)
        return op(dev);
    CUcontext ctx = active_primary(d, dev);
    CUresult r = op(dev);
    unsigned int flags;
    int active = 1;
    if (r == CUDA_SUCCESS && ctx &&
        d->cuDevicePrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS && !active)
        cs_shim_context_gone(ctx);
    return r;
}

CS_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    REAL(d, cuDevicePrimaryCtxRelease_v2);
    return primary_op(d, d->cuDevicePrimaryCtxRelease_v2, dev);
}

CS_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    REAL(d, cuDevicePrimaryCtxRelease);
    return primary_op(d, d->cuDevicePrimaryCtxRelease, dev);
}

CS_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    REAL(d, cuDevicePrimaryCtxReset_v2);
    return primary_op(d, d->cuDevicePrimaryCtxReset_v2, dev);
}

CS_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    REAL(d, cuDevicePrimaryCtxReset);
    return primary_op(d, d->cuDevicePrimaryCtxReset, dev);
}

/* ---------------------------------------------------------------- stream capture
 *
 * Nothing may be recorded into a capturing stream, nor waited from it: the capture state is
 * kept per stream (cs_streams.c), learnt from the driver after every begin and end, however
 * the end went. */

static CUresult capture_begin(CUstream stream, int per_thread, CUresult (*begin)(CUstream),
                              CUresult (*begin_mode)(CUstream, CUstreamCaptureMode),
                              CUstreamCaptureMode mode)
{
    bool track = !cs_shim_get()->disabled, was = false;
    if (track)
        was = cs_streams_capture_beginning(stream, per_thread);
    CUresult r = begin ? begin(stream) : begin_mode(stream, mode);
    if (track)
        cs_streams_capture_begun(stream, per_thread, r, was);
    return r;
}

static CUresult capture_end(CUstream stream, int per_thread, CUresult r)
{
    if (!cs_shim_get()->disabled)
        cs_streams_capture_ended(stream, per_thread);
    return r;
}

CS_EXPORT CUresult cuStreamBeginCapture(CUstream hStream)
{
    REAL(d, cuStreamBeginCapture);
    return capture_begin(hStream, 0, d->cuStreamBeginCapture, NULL, 0);
}

CS_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream hStream)
{
    REAL(d, cuStreamBeginCapture_ptsz);
    return capture_begin(hStream, 1, d->cuStreamBeginCapture_ptsz, NULL, 0);
}

CS_EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    REAL(d, cuStreamBeginCapture_v2);
    return capture_begin(hStream, 0, NULL, d->cuStreamBeginCapture_v2, mode);
}

CS_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
    REAL(d, cuStreamBeginCapture_v2_ptsz);
    return capture_begin(hStream, 1, NULL, d->cuStreamBeginCapture_v2_ptsz, mode);
}

CS_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                               const CUgraphNode *dependencies,
                                               const CUgraphEdgeData *dependencyData,
                                               size_t numDependencies, CUstreamCaptureMode mode)
{
    REAL(d, cuStreamBeginCaptureToGraph);
    bool track = !cs_shim_get()->disabled, was = false;
    if (track)
        was = cs_streams_capture_beginning(hStream, 0);
    CUresult r = d->cuStreamBeginCaptureToGraph(hStream, hGraph, dependencies, dependencyData,
                                                numDependencies, mode);
    if (track)
        cs_streams_capture_begun(hStream, 0, r, was);
    return r;
}

CS_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                                    const CUgraphNode *dependencies,
                                                    const CUgraphEdgeData *dependencyData,
                                                    size_t numDependencies,
                                                    CUstreamCaptureMode mode)
{
    REAL(d, cuStreamBeginCaptureToGraph_ptsz);
    bool track = !cs_shim_get()->disabled, was = false;
    if (track)
        was = cs_streams_capture_beginning(hStream, 1);
    CUresult r = d->cuStreamBeginCaptureToGraph_ptsz(hStream, hGraph, dependencies,
                                                     dependencyData, numDependencies, mode);
    if (track)
        cs_streams_capture_begun(hStream, 1, r, was);
    return r;
}

CS_EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    REAL(d, cuStreamEndCapture);
    return capture_end(hStream, 0, d->cuStreamEndCapture(hStream, phGraph));
}

CS_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
    REAL(d, cuStreamEndCapture_ptsz);
    return capture_end(hStream, 1, d->cuStreamEndCapture_ptsz(hStream, phGraph));
}
