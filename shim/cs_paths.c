/* The device allocation calls the cache does not serve: each passes to the driver, counted
 * against CACHESHIM_CAP (cs_outside.h). Pitched and managed memory is freed with cuMemFree
 * (cs_entry.c tells cs_outside), stream-ordered memory with cuMemFreeAsync or cuMemFree,
 * cuMemCreate handles with their last cuMemRelease and cuMemUnmap. The shim's own pooled
 * backend calls the real cuMemCreate, cuMemRelease, cuMemMap and cuMemUnmap, never these
 * wrappers: its memory is counted once, as blocks. */
#include "cs_exports.h"

#include "cs_outside.h"
#include "cs_shim.h"
#include "cs_work.h"

#define REAL(d, name) \
    const cs_driver *d = cs_driver_get(); \
    if (!d->name) \
        return CUDA_ERROR_NOT_INITIALIZED

/* The heap whose cap counts an allocation in the current context, or NULL: the call then goes
 * to the driver as it is (shim disabled, no context, or the driver's own error to give). */
static cs_heap *current_heap(const cs_driver *d)
{
    CUcontext ctx;
    return cs_shim_get()->disabled ? NULL : cs_shim_current_heap(d, &ctx);
}

/* ---------------------------------------------------------------- pitched */

typedef struct {
    const cs_driver *d;
    CUdeviceptr *dptr;
    size_t *pitch, width, height;
    unsigned elem;
} pitch_args;

static CUresult pitch_call(void *p, uint64_t *id)
{
    pitch_args *a = p;
    CUresult r = a->d->cuMemAllocPitch_v2(a->dptr, a->pitch, a->width, a->height, a->elem);
    *id = r == CUDA_SUCCESS ? *a->dptr : 0;
    return r;
}

/* Rows are padded to the device's pitch alignment (512 bytes on current GPUs): charged at
 * that first, then at what the driver chose. */
#define PITCH_GUESS 512u

CS_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                      size_t Height, unsigned int ElementSizeBytes)
{
    REAL(d, cuMemAllocPitch_v2);
    cs_heap *h;
    if (!dptr || !pPitch || WidthInBytes == 0 || Height == 0 ||
        SIZE_MAX / Height < PITCH_GUESS || WidthInBytes > SIZE_MAX / Height - PITCH_GUESS ||
        !(h = current_heap(d)))
        return d->cuMemAllocPitch_v2(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    uint64_t guess = (WidthInBytes + PITCH_GUESS - 1) / PITCH_GUESS * PITCH_GUESS * Height;
    pitch_args a = {d, dptr, pPitch, WidthInBytes, Height, ElementSizeBytes};
    CUresult r = cs_outside_alloc(h, CS_OUTSIDE_POINTER, guess, pitch_call, &a);
    if (r == CUDA_SUCCESS &&
        !cs_outside_adjust(CS_OUTSIDE_POINTER, *dptr, (uint64_t)*pPitch * Height)) {
        /* A wider pitch than guessed, and the cap cannot take the difference. */
        cs_outside_entry *e = cs_outside_free_begin(*dptr);
        cs_outside_free_end(e, d->cuMemFree_v2(*dptr) == CUDA_SUCCESS);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return r;
}

/* ---------------------------------------------------------------- managed */

typedef struct {
    const cs_driver *d;
    CUdeviceptr *dptr;
    size_t bytes;
    unsigned flags;
} managed_args;

static CUresult managed_call(void *p, uint64_t *id)
{
    managed_args *a = p;
    CUresult r = a->d->cuMemAllocManaged(a->dptr, a->bytes, a->flags);
    *id = r == CUDA_SUCCESS ? *a->dptr : 0;
    return r;
}

/* Managed memory may live on the host as well; counted in full, as the device may hold all
 * of it. */
CS_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    REAL(d, cuMemAllocManaged);
    cs_heap *h;
    if (!dptr || bytesize == 0 || !(h = current_heap(d)))
        return d->cuMemAllocManaged(dptr, bytesize, flags);
    managed_args a = {d, dptr, bytesize, flags};
    return cs_outside_alloc(h, CS_OUTSIDE_POINTER, bytesize, managed_call, &a);
}

/* ---------------------------------------------------------------- stream-ordered
 *
 * These put work on their stream: the work is tracked as the generated wrappers track it
 * (cs_work.h), which is why scripts/gen-work-wrappers leaves them to this file. */

typedef struct {
    const cs_driver *d;
    CUdeviceptr *dptr;
    size_t bytes;
    CUmemoryPool pool;  /* NULL: the stream's device's current pool */
    CUstream stream;
    int per_thread;
} async_args;

static CUresult async_call(void *p, uint64_t *id)
{
    async_args *a = p;
    CUresult (*fn)(CUdeviceptr *, size_t, CUstream) =
        a->per_thread ? a->d->cuMemAllocAsync_ptsz : a->d->cuMemAllocAsync;
    CUresult (*from)(CUdeviceptr *, size_t, CUmemoryPool, CUstream) =
        a->per_thread ? a->d->cuMemAllocFromPoolAsync_ptsz : a->d->cuMemAllocFromPoolAsync;
    cs_stream *st = cs_work_begin(a->stream, a->per_thread);
    CUresult r = a->pool ? from(a->dptr, a->bytes, a->pool, a->stream)
                         : fn(a->dptr, a->bytes, a->stream);
    cs_work_end(st, r);
    *id = r == CUDA_SUCCESS ? *a->dptr : 0;
    return r;
}

/* The heap of the stream's context (the current one for the NULL and per-thread streams). */
static cs_heap *stream_heap(const cs_driver *d, CUstream stream)
{
    CUcontext ctx = NULL;
    if (cs_shim_get()->disabled)
        return NULL;
    if (stream && stream != CU_STREAM_LEGACY && stream != CU_STREAM_PER_THREAD &&
        d->cuStreamGetCtx && d->cuStreamGetCtx(stream, &ctx) == CUDA_SUCCESS && ctx)
        return cs_shim_heap_of(d, ctx);
    return cs_shim_current_heap(d, &ctx);
}

/* Is pool the device's default pool? */
static bool default_pool_of(const cs_driver *d, CUmemoryPool pool, int device)
{
    CUmemoryPool def = NULL;
    return d->cuDeviceGetDefaultMemPool &&
           d->cuDeviceGetDefaultMemPool(&def, (CUdevice)device) == CUDA_SUCCESS && def == pool;
}

/* Where a pool's memory is: a pool the program made says (cuMemPoolCreate, below); any other
 * it can allocate from is a default pool (an imported one cannot allocate): the stream's
 * device's (`mine`) or one of another device the cache holds memory on, remembered (a
 * default pool is never destroyed), else one of no device the cache counts (the host's, a
 * device it holds nothing on, a managed pool). */
static int pool_device(const cs_driver *d, CUmemoryPool pool, int mine)
{
    uint64_t id = (uint64_t)(uintptr_t)pool;
    int dev = CS_OUTSIDE_NO_DEVICE;
    if (cs_outside_pool_device(id, &dev))
        return dev;
    int devices[CS_MAX_DEVICES];
    int n = cs_cache_devices(cs_shim_get()->cache, devices, CS_MAX_DEVICES);
    if (default_pool_of(d, pool, mine))
        dev = mine;
    for (int i = 0; dev == CS_OUTSIDE_NO_DEVICE && i < n; i++)
        if (devices[i] != mine && default_pool_of(d, pool, devices[i]))
            dev = devices[i];
    if (dev != CS_OUTSIDE_NO_DEVICE)
        cs_outside_pool_made(id, dev);
    return dev;
}

/* The heap charged for memory from pool (NULL: the stream's device's current pool, which is
 * that device's) ordered on a stream of h's context: h for its device's pool; for another
 * device's, which cuda.h allows, a heap of that device; NULL, not counted, for a pool of the
 * host or of a device the cache holds no memory on (as cuMemCreate there). */
static cs_heap *pool_heap(const cs_driver *d, CUmemoryPool pool, cs_heap *h)
{
    int mine = cs_cache_heap_device(h);
    int dev = pool ? pool_device(d, pool, mine) : mine;
    if (dev == mine)
        return h;
    return dev == CS_OUTSIDE_NO_DEVICE ? NULL : cs_cache_device_heap(cs_shim_get()->cache, dev);
}

static CUresult alloc_async(const cs_driver *d, async_args *a)
{
    cs_heap *h;
    if (!a->dptr || a->bytes == 0 || !(h = stream_heap(d, a->stream)) ||
        !(h = pool_heap(d, a->pool, h))) {
        uint64_t ignored;
        return async_call(a, &ignored);
    }
    return cs_outside_alloc(h, CS_OUTSIDE_ASYNC, a->bytes, async_call, a);
}

CS_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    REAL(d, cuMemAllocAsync);
    async_args a = {d, dptr, bytesize, NULL, hStream, 0};
    return alloc_async(d, &a);
}

CS_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    REAL(d, cuMemAllocAsync_ptsz);
    async_args a = {d, dptr, bytesize, NULL, hStream, 1};
    return alloc_async(d, &a);
}

CS_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize,
                                           CUmemoryPool pool, CUstream hStream)
{
    REAL(d, cuMemAllocFromPoolAsync);
    async_args a = {d, dptr, bytesize, pool, hStream, 0};
    return pool ? alloc_async(d, &a) : d->cuMemAllocFromPoolAsync(dptr, bytesize, pool, hStream);
}

CS_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                                CUmemoryPool pool, CUstream hStream)
{
    REAL(d, cuMemAllocFromPoolAsync_ptsz);
    async_args a = {d, dptr, bytesize, pool, hStream, 1};
    return pool ? alloc_async(d, &a)
                : d->cuMemAllocFromPoolAsync_ptsz(dptr, bytesize, pool, hStream);
}

/* The program's pools, remembered with where their memory is (pool_device above). Forgotten
 * before the driver destroys one (its handle may be a new pool's at once), back if it did
 * not. */
CS_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    REAL(d, cuMemPoolCreate);
    CUresult r = d->cuMemPoolCreate(pool, poolProps);
    if (r == CUDA_SUCCESS && !cs_shim_get()->disabled)
        cs_outside_pool_made((uint64_t)(uintptr_t)*pool,
                             poolProps->location.type == CU_MEM_LOCATION_TYPE_DEVICE
                                 ? poolProps->location.id
                                 : CS_OUTSIDE_NO_DEVICE);
    return r;
}

CS_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    REAL(d, cuMemPoolDestroy);
    int dev;
    bool known = !cs_shim_get()->disabled && cs_outside_pool_gone((uint64_t)(uintptr_t)pool, &dev);
    CUresult r = d->cuMemPoolDestroy(pool);
    if (r != CUDA_SUCCESS && known)
        cs_outside_pool_made((uint64_t)(uintptr_t)pool, dev);
    return r;
}

/* A block of the cache freed on a stream is the cache's (its fence covers the stream's work);
 * anything else is the driver's, uncharged once the driver took it back. */
static CUresult free_async(CUresult (*real)(CUdeviceptr, CUstream), CUdeviceptr p,
                           CUstream stream, int per_thread)
{
    cs_shim *s = cs_shim_get();
    if (!s->disabled && p) {
        cs_result fr = cs_cache_free(s->cache, (uint64_t)p);
        if (fr == CS_OK)
            return CUDA_SUCCESS;
        if (fr == CS_NOT_IN_USE)
            return CUDA_ERROR_INVALID_VALUE;
    }
    cs_outside_entry *e = !s->disabled && p ? cs_outside_free_begin((uint64_t)p) : NULL;
    cs_stream *st = cs_work_begin(stream, per_thread);
    CUresult r = real(p, stream);
    cs_work_end(st, r);
    cs_outside_free_end(e, r == CUDA_SUCCESS);
    return r;
}

CS_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    REAL(d, cuMemFreeAsync);
    return free_async(d->cuMemFreeAsync, dptr, hStream, 0);
}

CS_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    REAL(d, cuMemFreeAsync_ptsz);
    return free_async(d->cuMemFreeAsync_ptsz, dptr, hStream, 1);
}

/* ---------------------------------------------------------------- virtual memory */

typedef struct {
    const cs_driver *d;
    CUmemGenericAllocationHandle *handle;
    size_t size;
    const CUmemAllocationProp *prop;
    unsigned long long flags;
} create_args;

static CUresult create_call(void *p, uint64_t *id)
{
    create_args *a = p;
    CUresult r = a->d->cuMemCreate(a->handle, a->size, a->prop, a->flags);
    *id = r == CUDA_SUCCESS ? (uint64_t)*a->handle : 0;
    return r;
}

/* Device memory of the current context's device is counted; memory of another device or of
 * the host is not (documented in docs/usage.md). */
CS_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                               const CUmemAllocationProp *prop, unsigned long long flags)
{
    REAL(d, cuMemCreate);
    cs_heap *h;
    CUdevice dev;
    if (!handle || !prop || size == 0 || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        !(h = current_heap(d)) || d->cuCtxGetDevice(&dev) != CUDA_SUCCESS ||
        dev != prop->location.id)
        return d->cuMemCreate(handle, size, prop, flags);
    create_args a = {d, handle, size, prop, flags};
    return cs_outside_alloc(h, CS_OUTSIDE_HANDLE, size, create_call, &a);
}

/* The memory goes once its last reference is released and its last mapping unmapped: it
 * is uncharged then (cs_outside_release_end, or cs_outside_unmapped). */
CS_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    REAL(d, cuMemRelease);
    if (cs_shim_get()->disabled)
        return d->cuMemRelease(handle);
    cs_outside_entry *last = cs_outside_release_begin((uint64_t)handle);
    CUresult r = d->cuMemRelease(handle);
    cs_outside_release_end((uint64_t)handle, last, r == CUDA_SUCCESS);
    return r;
}

/* The program's mappings and references of its handles, for when their memory goes. The
 * shim's own pooled backend and IPC call the driver's functions, never these. */
CS_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                            CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    REAL(d, cuMemMap);
    CUresult r = d->cuMemMap(ptr, size, offset, handle, flags);
    if (r == CUDA_SUCCESS && !cs_shim_get()->disabled)
        cs_outside_mapped((uint64_t)handle, (uint64_t)ptr, size);
    return r;
}

CS_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    REAL(d, cuMemUnmap);
    CUresult r = d->cuMemUnmap(ptr, size);
    if (r == CUDA_SUCCESS && !cs_shim_get()->disabled)
        cs_outside_unmapped((uint64_t)ptr, size);
    return r;
}

CS_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    REAL(d, cuMemRetainAllocationHandle);
    CUresult r = d->cuMemRetainAllocationHandle(handle, addr);
    if (r == CUDA_SUCCESS && handle && !cs_shim_get()->disabled)
        cs_outside_retained((uint64_t)*handle, (uint64_t)(uintptr_t)addr);
    return r;
}
