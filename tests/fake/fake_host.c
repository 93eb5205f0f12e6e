/* Fake CUDA driver: pinned host memory (cuMemAllocHost, cuMemHostAlloc, cuMemFreeHost) and the
 * device allocation calls other than cuMemAlloc: cuMemAllocPitch, cuMemAllocManaged and the
 * stream-ordered cuMemAllocAsync, cuMemAllocFromPoolAsync and cuMemFreeAsync, with the memory
 * pools these take from (cuMemPoolCreate, cuMemPoolDestroy, cuDeviceGetDefaultMemPool). The
 * device calls make cuMemAlloc allocations (fake_mem.c), counted against the device alike, a
 * pool's against the pool's device (a host pool's against none). Pinned
 * memory is a private anonymous mapping of its own, counted against the host budget
 * (fake_set_host_bytes), and belongs to the context it was allocated in: destroying that
 * context frees it, as on the real driver. */
#include "fake_internal.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct host_alloc {
    void *p;
    size_t size, maplen;
    unsigned flags;
    fake_ctx *ctx;
    struct host_alloc *next;
} host_alloc;

static host_alloc *g_host;
static uint64_t g_host_used, g_host_budget = UINT64_MAX;
static long g_host_count;

FAKE_API void fake_set_host_bytes(uint64_t bytes)
{
    fake_lock();
    g_host_budget = bytes;
    fake_unlock();
}

FAKE_API uint64_t fake_host_used(void)
{
    fake_lock();
    uint64_t n = g_host_used;
    fake_unlock();
    return n;
}

FAKE_API long fake_host_allocations(void)
{
    fake_lock();
    long n = g_host_count;
    fake_unlock();
    return n;
}

FAKE_API unsigned fake_host_flags(const void *p)
{
    fake_lock();
    host_alloc *a = g_host;
    while (a && a->p != p)
        a = a->next;
    unsigned flags = a ? a->flags : ~0u;
    fake_unlock();
    return flags;
}

static void host_release(host_alloc **at)
{
    host_alloc *a = *at;
    *at = a->next;
    munmap(a->p, a->maplen);
    g_host_used -= a->size;
    g_host_count--;
    free(a);
}

void fake_host_ctx_destroyed(fake_ctx *ctx)
{
    for (host_alloc **at = &g_host; *at;) {
        if ((*at)->ctx == ctx)
            host_release(at);
        else
            at = &(*at)->next;
    }
}

#define HOST_FLAGS_KNOWN                                                                   \
    (CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED)

static CUresult host_alloc_locked(void **pp, size_t size, unsigned flags)
{
    fake_ctx *c;
    CUresult rc = fake_current_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pp || size == 0 || (flags & ~HOST_FLAGS_KNOWN))
        return CUDA_ERROR_INVALID_VALUE;
    if (g_host_used > g_host_budget || size > g_host_budget - g_host_used)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (size > SIZE_MAX - page)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t maplen = (size + page - 1) / page * page;
    void *p = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    host_alloc *a = p == MAP_FAILED ? NULL : malloc(sizeof *a);
    if (!a) {
        if (p != MAP_FAILED)
            munmap(p, maplen);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *a = (host_alloc){.p = p, .size = size, .maplen = maplen, .flags = flags, .ctx = c,
                      .next = g_host};
    g_host = a;
    g_host_used += size;
    g_host_count++;
    *pp = p;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    ENTER(cuMemAllocHost_v2);
    LOCKED(host_alloc_locked(pp, bytesize, 0));
}

FAKE_API CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    ENTER(cuMemHostAlloc);
    LOCKED(host_alloc_locked(pp, bytesize, Flags));
}

/* Like the real one, waits for the work of the memory's context first. */
static CUresult host_free_locked(void *p)
{
    fake_ctx *c;
    CUresult rc = fake_current_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    host_alloc **at = &g_host;
    while (*at && (*at)->p != p)
        at = &(*at)->next;
    if (!*at)
        return CUDA_ERROR_INVALID_VALUE;
    fake_complete_ctx((*at)->ctx);
    host_release(at);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemFreeHost(void *p)
{
    ENTER(cuMemFreeHost);
    LOCKED(host_free_locked(p));
}

/* ---- device memory by other calls ---------------------------------------------------------- */

/* A cuMemAlloc-like allocation in the current context (stream-ordered ones may be captured). */
static CUresult device_alloc(CUdeviceptr *dptr, size_t size)
{
    return fake_mem_alloc_current(dptr, size, false);
}

/* Rows padded to 512 bytes, as on current GPUs. */
static size_t g_pitch_align = 512;

FAKE_API void fake_set_pitch_alignment(uint64_t bytes)
{
    if (bytes == 0 || (bytes & (bytes - 1)))
        fake_die("fake_set_pitch_alignment: not a power of two", "");
    fake_lock();
    g_pitch_align = (size_t)bytes;
    fake_unlock();
}

static CUresult pitch_alloc(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                            unsigned elem)
{
    if (!pitch || width == 0 || height == 0 || (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t p = (width + g_pitch_align - 1) / g_pitch_align * g_pitch_align;
    if (p < width || height > SIZE_MAX / p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = device_alloc(dptr, p * height);
    if (rc == CUDA_SUCCESS)
        *pitch = p;
    return rc;
}

FAKE_API CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                     size_t Height, unsigned int ElementSizeBytes)
{
    ENTER(cuMemAllocPitch_v2);
    LOCKED(pitch_alloc(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes));
}

FAKE_API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    ENTER(cuMemAllocManaged);
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    LOCKED(device_alloc(dptr, bytesize));
}

/* A memory pool keeps its memory at its location: a device, or the host (location types
 * HOST and HOST_NUMA), which may be another device than the one of the stream an allocation
 * from it is ordered on. Each device's default pool is made at its first use and never
 * destroyed. */
typedef struct {
    enum fake_kind kind;
    int device;  /* -1: the host */
} fake_pool;

static fake_pool g_default_pools[FAKE_MAX_DEVICES];

static CUresult pool_create(CUmemoryPool *out, const CUmemPoolProps *props)
{
    if (!out || !props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    int device;
    if (props->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
        props->location.id >= 0 && props->location.id < fake_device_count)
        device = props->location.id;
    else if (props->location.type == CU_MEM_LOCATION_TYPE_HOST ||
             props->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA)
        device = -1;
    else
        return CUDA_ERROR_INVALID_VALUE;
    fake_pool *p = malloc(sizeof *p);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *p = (fake_pool){.kind = KIND_POOL, .device = device};
    if (!fake_reg_add(p)) {
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}

/* A default pool cannot be destroyed. The allocations of a destroyed pool live on until
 * freed, as on the real driver. */
static CUresult pool_destroy(CUmemoryPool pool)
{
    fake_pool *p = fake_reg_find(pool, KIND_POOL);
    if (!p || (p >= g_default_pools && p < g_default_pools + FAKE_MAX_DEVICES))
        return CUDA_ERROR_INVALID_VALUE;
    fake_reg_del(p);
    free(p);
    return CUDA_SUCCESS;
}

static CUresult default_pool(CUmemoryPool *out, CUdevice dev)
{
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= fake_device_count)
        return CUDA_ERROR_INVALID_DEVICE;
    fake_pool *p = &g_default_pools[dev];
    *p = (fake_pool){.kind = KIND_POOL, .device = dev};
    if (!fake_reg_add(p))
        return CUDA_ERROR_OUT_OF_MEMORY;
    *out = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    ENTER(cuMemPoolCreate);
    LOCKED(pool_create(pool, poolProps));
}

FAKE_API CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    ENTER(cuMemPoolDestroy);
    LOCKED(pool_destroy(pool));
}

FAKE_API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    ENTER(cuDeviceGetDefaultMemPool);
    LOCKED(default_pool(pool_out, dev));
}

/* Stream-ordered: the allocation is made at once (nothing the fake tracks can touch it
 * before the stream's later work); a free waits for the stream's earlier work. From a pool:
 * of the pool's device (none for a host pool), listed with the stream's context. */
static CUresult async_alloc(CUdeviceptr *dptr, size_t size, CUstream stream, bool ptsz,
                            bool pool_given, CUmemoryPool pool)
{
    fake_stream *s;
    CUresult rc = fake_resolve_stream(stream, ptsz, false, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pool_given)
        return device_alloc(dptr, size);
    const fake_pool *p = fake_reg_find(pool, KIND_POOL);
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    return fake_mem_alloc_in(s->ctx, p->device, dptr, size);
}

static CUresult async_free(CUdeviceptr p, CUstream stream, bool ptsz)
{
    fake_stream *s;
    CUresult rc = fake_resolve_stream(stream, ptsz, false, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    fake_stream_drain(s);
    return fake_mem_free_at(p);
}

FAKE_API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    ENTER(cuMemAllocAsync);
    LOCKED(async_alloc(dptr, bytesize, hStream, false, false, NULL));
}

FAKE_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    ENTER(cuMemAllocAsync_ptsz);
    LOCKED(async_alloc(dptr, bytesize, hStream, true, false, NULL));
}

FAKE_API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                          CUstream hStream)
{
    ENTER(cuMemAllocFromPoolAsync);
    LOCKED(async_alloc(dptr, bytesize, hStream, false, true, pool));
}

FAKE_API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                               CUmemoryPool pool, CUstream hStream)
{
    ENTER(cuMemAllocFromPoolAsync_ptsz);
    LOCKED(async_alloc(dptr, bytesize, hStream, true, true, pool));
}

FAKE_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    ENTER(cuMemFreeAsync);
    LOCKED(async_free(dptr, hStream, false));
}

FAKE_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    ENTER(cuMemFreeAsync_ptsz);
    LOCKED(async_free(dptr, hStream, true));
}
