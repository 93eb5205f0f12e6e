/* Fake CUDA driver: device memory. A "device pointer" is the address of a private anonymous
 * mapping made with MAP_NORESERVE, so a 16 GiB device costs nothing until a test touches it,
 * and a use after free faults like it would on the GPU. */
#include "fake_internal.h"

#include <limits.h>
#include <search.h>
#include <stdlib.h>
#include <string.h>
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

/* The n bytes at p must lie inside one allocation. */
static CUresult span(CUdeviceptr p, size_t n)
{
    fake_alloc *a = containing(p);
    if (!a || n > a->base + a->size - p)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

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
    fake_devices[a->ctx->device].used -= a->size;
    fake_live_allocs--;
    free(a);
}

void fake_mem_ctx_destroyed(fake_ctx *ctx)
{
    while (ctx->allocs)
        release(ctx->allocs);
}

static CUresult map_new(fake_ctx *c, size_t size, CUdeviceptr *out)
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
        *a = (fake_alloc){.base = (uintptr_t)p, .size = size, .maplen = maplen, .ctx = c,
                          .next = c->allocs};
    if (!a || !tsearch(a, &g_allocs, cmp_range)) {
        munmap(p, maplen);
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (c->allocs)
        c->allocs->prev = a;
    c->allocs = a;
    fake_devices[c->device].used += size;
    fake_live_allocs++;
    *out = a->base;
    return CUDA_SUCCESS;
}

static CUresult mem_alloc(CUdeviceptr *dptr, size_t size)
{
    fake_ctx *c;
    CUresult rc = fake_current_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!dptr || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = fake_capture_guard_unsafe()) != CUDA_SUCCESS)
        return rc;
    uint64_t budget = fake_budget(c->device), used = fake_devices[c->device].used;
    if (used > budget || size > budget - used)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return map_new(c, size, dptr);
}

FAKE_API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    ENTER(cuMemAlloc_v2);
    LOCKED(mem_alloc(dptr, bytesize));
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
    fake_alloc *a = containing(p);
    if (!a || a->base != p)
        return CUDA_ERROR_INVALID_VALUE;
    fake_complete_ctx(a->ctx);
    release(a);
    return CUDA_SUCCESS;
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

static CUresult address_range(CUdeviceptr *pbase, size_t *psize, CUdeviceptr p)
{
    fake_ctx *c;
    CUresult rc = fake_current_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    fake_alloc *a = containing(p);
    if (!a)
        return CUDA_ERROR_NOT_FOUND;
    if (pbase)
        *pbase = a->base;
    if (psize)
        *psize = a->size;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    ENTER(cuMemGetAddressRange_v2);
    LOCKED(address_range(pbase, psize, dptr));
}

/* ---- copies and sets. The bytes move under the lock, so a concurrent free cannot unmap the
 * memory halfway through. A synchronous call is a unit on the legacy stream (the per-thread
 * stream for the _ptds forms) that completes, with all it is ordered after, before the
 * bytes move; an asynchronous one is a unit on its stream whose bytes move at submission
 * (the fake keeps no data per unit), or, into a capturing stream, a graph node that moves
 * nothing. Either way the device ranges must lie inside live allocations. */

static CUresult spans(const struct fake_range *r, int nr)
{
    for (int i = 0; i < nr; i++)
        if (span(r[i].p, r[i].n) != CUDA_SUCCESS)
            return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

CUresult fake_mem_span(CUdeviceptr p, size_t n) { return span(p, n); }

/* The unit of a synchronous call touching ranges r. */
static CUresult sync_unit(enum fake_entry_id id, bool ptds, const struct fake_range *r, int nr)
{
    fake_ctx *c;
    fake_stream *s;
    CUresult rc = fake_current_ctx(&c);
    if (rc == CUDA_SUCCESS)
        rc = spans(r, nr);
    if (rc == CUDA_SUCCESS)
        rc = fake_sync_stream(ptds, &s);
    if (rc == CUDA_SUCCESS)
        rc = fake_submit_sync(s, fake_entry_name(id), r, nr);
    return rc;
}

/* The unit of an asynchronous call on stream h touching ranges r; *run says whether the bytes
 * should move now (not when the call fails or is captured). */
static CUresult async_unit(enum fake_entry_id id, CUstream h, bool ptsz,
                           const struct fake_range *r, int nr, bool *run)
{
    fake_stream *s;
    bool captured = false;
    *run = false;
    CUresult rc = fake_resolve_stream(h, ptsz, false, &s);
    if (rc == CUDA_SUCCESS)
        rc = spans(r, nr);
    if (rc == CUDA_SUCCESS)
        rc = fake_async_admit(s, &captured);
    if (rc == CUDA_SUCCESS && !captured)
        rc = fake_submit(s, fake_entry_name(id), r, nr, NULL, NULL);
    *run = rc == CUDA_SUCCESS && !captured;
    return rc;
}

static CUresult memset_d8(enum fake_entry_id id, CUdeviceptr dst, unsigned char value, size_t n,
                          bool ptds)
{
    struct fake_range r = {dst, n};
    CUresult rc = sync_unit(id, ptds, &r, 1);
    if (rc == CUDA_SUCCESS)
        memset(host(dst), value, n);
    return rc;
}

FAKE_API CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    ENTER(cuMemsetD8_v2);
    LOCKED(memset_d8(ID_cuMemsetD8_v2, dstDevice, uc, N, false));
}

FAKE_API CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    ENTER(cuMemsetD8_v2_ptds);
    LOCKED(memset_d8(ID_cuMemsetD8_v2_ptds, dstDevice, uc, N, true));
}

static CUresult memset_d8_async(enum fake_entry_id id, CUdeviceptr dst, unsigned char value,
                                size_t n, CUstream h, bool ptsz)
{
    struct fake_range r = {dst, n};
    bool run;
    CUresult rc = async_unit(id, h, ptsz, &r, 1, &run);
    if (run)
        memset(host(dst), value, n);
    return rc;
}

FAKE_API CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                                  CUstream hStream)
{
    ENTER(cuMemsetD8Async);
    LOCKED(memset_d8_async(ID_cuMemsetD8Async, dstDevice, uc, N, hStream, false));
}

FAKE_API CUresult cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                                       CUstream hStream)
{
    ENTER(cuMemsetD8Async_ptsz);
    LOCKED(memset_d8_async(ID_cuMemsetD8Async_ptsz, dstDevice, uc, N, hStream, true));
}

static CUresult copy_htod(enum fake_entry_id id, CUdeviceptr dst, const void *src, size_t n,
                          bool ptds)
{
    if (!src && n)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_range r = {dst, n};
    CUresult rc = sync_unit(id, ptds, &r, 1);
    if (rc == CUDA_SUCCESS && n)
        memcpy(host(dst), src, n);
    return rc;
}

FAKE_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    ENTER(cuMemcpyHtoD_v2);
    LOCKED(copy_htod(ID_cuMemcpyHtoD_v2, dstDevice, srcHost, ByteCount, false));
}

FAKE_API CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost,
                                       size_t ByteCount)
{
    ENTER(cuMemcpyHtoD_v2_ptds);
    LOCKED(copy_htod(ID_cuMemcpyHtoD_v2_ptds, dstDevice, srcHost, ByteCount, true));
}

static CUresult copy_htod_async(enum fake_entry_id id, CUdeviceptr dst, const void *src,
                                size_t n, CUstream h, bool ptsz)
{
    if (!src && n)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_range r = {dst, n};
    bool run;
    CUresult rc = async_unit(id, h, ptsz, &r, 1, &run);
    if (run && n)
        memcpy(host(dst), src, n);
    return rc;
}

FAKE_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost,
                                       size_t ByteCount, CUstream hStream)
{
    ENTER(cuMemcpyHtoDAsync_v2);
    LOCKED(copy_htod_async(ID_cuMemcpyHtoDAsync_v2, dstDevice, srcHost, ByteCount, hStream,
                           false));
}

FAKE_API CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost,
                                            size_t ByteCount, CUstream hStream)
{
    ENTER(cuMemcpyHtoDAsync_v2_ptsz);
    LOCKED(copy_htod_async(ID_cuMemcpyHtoDAsync_v2_ptsz, dstDevice, srcHost, ByteCount,
                           hStream, true));
}

static CUresult copy_dtoh(enum fake_entry_id id, void *dst, CUdeviceptr src, size_t n, bool ptds)
{
    if (!dst && n)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_range r = {src, n};
    CUresult rc = sync_unit(id, ptds, &r, 1);
    if (rc == CUDA_SUCCESS && n)
        memcpy(dst, host(src), n);
    return rc;
}

FAKE_API CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    ENTER(cuMemcpyDtoH_v2);
    LOCKED(copy_dtoh(ID_cuMemcpyDtoH_v2, dstHost, srcDevice, ByteCount, false));
}

FAKE_API CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    ENTER(cuMemcpyDtoH_v2_ptds);
    LOCKED(copy_dtoh(ID_cuMemcpyDtoH_v2_ptds, dstHost, srcDevice, ByteCount, true));
}

static CUresult copy_dtoh_async(enum fake_entry_id id, void *dst, CUdeviceptr src, size_t n,
                                CUstream h, bool ptsz)
{
    if (!dst && n)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_range r = {src, n};
    bool run;
    CUresult rc = async_unit(id, h, ptsz, &r, 1, &run);
    if (run && n)
        memcpy(dst, host(src), n);
    return rc;
}

FAKE_API CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                       CUstream hStream)
{
    ENTER(cuMemcpyDtoHAsync_v2);
    LOCKED(copy_dtoh_async(ID_cuMemcpyDtoHAsync_v2, dstHost, srcDevice, ByteCount, hStream,
                           false));
}

FAKE_API CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice,
                                            size_t ByteCount, CUstream hStream)
{
    ENTER(cuMemcpyDtoHAsync_v2_ptsz);
    LOCKED(copy_dtoh_async(ID_cuMemcpyDtoHAsync_v2_ptsz, dstHost, srcDevice, ByteCount,
                           hStream, true));
}

static CUresult copy_dtod(enum fake_entry_id id, CUdeviceptr dst, CUdeviceptr src, size_t n,
                          bool ptds)
{
    struct fake_range r[2] = {{dst, n}, {src, n}};
    CUresult rc = sync_unit(id, ptds, r, 2);
    if (rc == CUDA_SUCCESS && n)
        memmove(host(dst), host(src), n);
    return rc;
}

FAKE_API CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
    ENTER(cuMemcpyDtoD_v2);
    LOCKED(copy_dtod(ID_cuMemcpyDtoD_v2, dstDevice, srcDevice, ByteCount, false));
}

FAKE_API CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                       size_t ByteCount)
{
    ENTER(cuMemcpyDtoD_v2_ptds);
    LOCKED(copy_dtod(ID_cuMemcpyDtoD_v2_ptds, dstDevice, srcDevice, ByteCount, true));
}

static CUresult copy_dtod_async(enum fake_entry_id id, CUdeviceptr dst, CUdeviceptr src,
                                size_t n, CUstream h, bool ptsz)
{
    struct fake_range r[2] = {{dst, n}, {src, n}};
    bool run;
    CUresult rc = async_unit(id, h, ptsz, r, 2, &run);
    if (run && n)
        memmove(host(dst), host(src), n);
    return rc;
}

FAKE_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                       size_t ByteCount, CUstream hStream)
{
    ENTER(cuMemcpyDtoDAsync_v2);
    LOCKED(copy_dtod_async(ID_cuMemcpyDtoDAsync_v2, dstDevice, srcDevice, ByteCount, hStream,
                           false));
}

FAKE_API CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                            size_t ByteCount, CUstream hStream)
{
    ENTER(cuMemcpyDtoDAsync_v2_ptsz);
    LOCKED(copy_dtod_async(ID_cuMemcpyDtoDAsync_v2_ptsz, dstDevice, srcDevice, ByteCount,
                           hStream, true));
}

/* ---- the CUDA 3.0 originals, with 32-bit pointers and sizes. A 64-bit process cannot be
 * given a device pointer that fits in 32 bits, so the calls that take or return one are
 * refused; the size-only query clamps. They exist so that cuGetProcAddress with an old
 * cudaVersion resolves to a distinct function, as with the real driver. */

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

FAKE_API CUresult cuMemGetAddressRange(CUdeviceptr_v1 *pbase, unsigned int *psize,
                                       CUdeviceptr_v1 dptr)
{
    ENTER(cuMemGetAddressRange);
    (void)pbase;
    (void)psize;
    (void)dptr;
    return CUDA_ERROR_NOT_SUPPORTED;
}

FAKE_API CUresult cuMemsetD8(CUdeviceptr_v1 dstDevice, unsigned char uc, unsigned int N)
{
    ENTER(cuMemsetD8);
    (void)dstDevice;
    (void)uc;
    (void)N;
    return CUDA_ERROR_NOT_SUPPORTED;
}

FAKE_API CUresult cuMemcpyHtoD(CUdeviceptr_v1 dstDevice, const void *srcHost,
                               unsigned int ByteCount)
{
    ENTER(cuMemcpyHtoD);
    (void)dstDevice;
    (void)srcHost;
    (void)ByteCount;
    return CUDA_ERROR_NOT_SUPPORTED;
}

FAKE_API CUresult cuMemcpyDtoH(void *dstHost, CUdeviceptr_v1 srcDevice, unsigned int ByteCount)
{
    ENTER(cuMemcpyDtoH);
    (void)dstHost;
    (void)srcDevice;
    (void)ByteCount;
    return CUDA_ERROR_NOT_SUPPORTED;
}

FAKE_API CUresult cuMemcpyDtoD(CUdeviceptr_v1 dstDevice, CUdeviceptr_v1 srcDevice,
                               unsigned int ByteCount)
{
    ENTER(cuMemcpyDtoD);
    (void)dstDevice;
    (void)srcDevice;
    (void)ByteCount;
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
