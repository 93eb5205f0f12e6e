/* Fake CUDA driver: device memory from cuMemAlloc (copies and memsets are in fake_copy.c).
 * A "device pointer" is the address of a private anonymous mapping made with MAP_NORESERVE,
 * so a 16 GiB device costs nothing until a test touches it, and a use after free faults like
 * it would on the GPU. */
#include "fake_internal.h"

#include <limits.h>
#include <search.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* Live allocations ordered by address range; ranges never overlap, so a lookup with a
 * one-byte key finds the allocation containing an address. */
static void *g_allocs;

static int cmp_range(const void *a, const void *b)
{
    const fake_alloc *x = a, *y = b;
    if (x->base + x->size <= y->base)
        return -1;
    if (y->base + y->size <= x->base)
        return 1;
    return 0;
}

static fake_alloc *containing(CUdeviceptr p)
{
    fake_alloc key = {.base = p, .size = 1};
    void **node = tfind(&key, &g_allocs, cmp_range);
    return node ? *node : NULL;
}

static void *host(CUdeviceptr p) { return (void *)(uintptr_t)p; }

fake_alloc *fake_mem_find(CUdeviceptr p) { return containing(p); }

static uint64_t g_last_id;

uint64_t fake_next_id(void) { return ++g_last_id; }

static void release(fake_alloc *a)
{
    tdelete(a, &g_allocs, cmp_range);
    if (a->prev)
        a->prev->next = a->next;
    else
        a->ctx->allocs = a->next;
    if (a->next)
        a->next->prev = a->prev;
    munmap(host(a->base), a->maplen);
    if (a->device >= 0)
        fake_devices[a->device].used -= a->size;
    fake_live_allocs--;
    free(a);
}

void fake_mem_ctx_destroyed(fake_ctx *ctx)
{
    while (ctx->allocs)
        release(ctx->allocs);
    fake_host_ctx_destroyed(ctx);
}

static CUresult map_new(fake_ctx *c, int device, size_t size, CUdeviceptr *out)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (size > SIZE_MAX - page)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t maplen = (size + page - 1) / page * page;
    void *p = mmap(NULL, maplen, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    fake_alloc *a = malloc(sizeof *a);
    if (a)
        *a = (fake_alloc){.base = (uintptr_t)p, .size = size, .maplen = maplen,
                          .id = fake_next_id(), .ctx = c, .device = device, .next = c->allocs};
    if (!a || !tsearch(a, &g_allocs, cmp_range)) {
        munmap(p, maplen);
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (c->allocs)
        c->allocs->prev = a;
    c->allocs = a;
    if (device >= 0)
        fake_devices[device].used += size;
    fake_live_allocs++;
    *out = a->base;
    return CUDA_SUCCESS;
}

CUresult fake_mem_free_at(CUdeviceptr p)
{
    fake_alloc *a = containing(p);
    if (!p || !a || a->base != p)
        return CUDA_ERROR_INVALID_VALUE;
    fake_complete_ctx(a->ctx);
    release(a);
    return CUDA_SUCCESS;
}

CUresult fake_mem_alloc_current(CUdeviceptr *dptr, size_t size, bool capture_guard)
{
    fake_ctx *c;
    CUresult rc = fake_current_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!dptr || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (capture_guard && (rc = fake_capture_guard_unsafe()) != CUDA_SUCCESS)
        return rc;
    return fake_mem_alloc_in(c, c->device, dptr, size);
}

CUresult fake_mem_alloc_in(fake_ctx *c, int device, CUdeviceptr *dptr, size_t size)
{
    if (!dptr || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (device >= 0) {
        uint64_t budget = fake_budget(device), used = fake_devices[device].used;
        if (used > budget || size > budget - used)
            return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return map_new(c, device, size, dptr);
}

FAKE_API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    ENTER(cuMemAlloc_v2);
    LOCKED(fake_mem_alloc_current(dptr, bytesize, true));
}

/* Like the real cuMemFree, waits for work first: the memory may be in use. The real one
 * waits for the whole device; the fake, as before the timeline, completes the pending work
 * of the allocation's context (and so everything that work is ordered after). */
static CUresult mem_free(CUdeviceptr p)
{
    fake_ctx *c;
    CUresult rc = fake_current_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if ((rc = fake_capture_guard_unsafe()) != CUDA_SUCCESS)
        return rc;
    if (!p)
        return CUDA_SUCCESS;  /* as the real driver answers (seen on an H100, driver 580) */
    return fake_mem_free_at(p);
}

FAKE_API CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    ENTER(cuMemFree_v2);
    LOCKED(mem_free(dptr));
}

static CUresult mem_info(uint64_t *free_bytes, uint64_t *total)
{
    fake_ctx *c;
    CUresult rc = fake_current_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    uint64_t budget = fake_budget(c->device), used = fake_devices[c->device].used;
    *total = budget;
    *free_bytes = used < budget ? budget - used : 0;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    ENTER(cuMemGetInfo_v2);
    if (!free_bytes || !total)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t f = 0, t = 0;
    fake_lock();
    CUresult rc = mem_info(&f, &t);
    fake_unlock();
    if (rc == CUDA_SUCCESS) {
        *free_bytes = (size_t)f;
        *total = (size_t)t;
    }
    return rc;
}

/* ---- the CUDA 3.0 originals, with 32-bit pointers and sizes. cuMemAlloc never gives a
 * device pointer that fits in 32 bits, so the calls that take or return one are refused; the
 * size-only query clamps. They exist so that cuGetProcAddress with an old cudaVersion
 * resolves to a distinct function, as with the real driver. (cuMemGetAddressRange, which
 * can find VMM memory reserved low, is in fake_ptr.c.) */

FAKE_API CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    ENTER(cuMemAlloc);
    (void)dptr;
    (void)bytesize;
    return CUDA_ERROR_NOT_SUPPORTED;
}

FAKE_API CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
    ENTER(cuMemFree);
    (void)dptr;
    return CUDA_ERROR_NOT_SUPPORTED;
}

FAKE_API CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total)
{
    ENTER(cuMemGetInfo);
    if (!free_bytes || !total)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t f = 0, t = 0;
    fake_lock();
    CUresult rc = mem_info(&f, &t);
    fake_unlock();
    if (rc == CUDA_SUCCESS) {
        *free_bytes = f > UINT_MAX ? UINT_MAX : (unsigned int)f;
        *total = t > UINT_MAX ? UINT_MAX : (unsigned int)t;
    }
    return rc;
}
