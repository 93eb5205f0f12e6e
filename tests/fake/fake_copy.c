/* Fake CUDA driver: copies and memsets. The bytes move under the lock, so a concurrent free
 * cannot unmap the memory halfway through. A synchronous call is a unit on the legacy
 * stream (the per-thread stream for the _ptds forms) that completes, with all it is ordered
 * after, before the bytes move; an asynchronous one is a unit on its stream whose bytes
 * move at submission (the fake keeps no data per unit), or, into a capturing stream, a graph
 * node that moves nothing. Either way the device ranges must be memory the copying context
 * (the current one, or the stream's) may access so (fake_access.c). */
#include "fake_internal.h"

#include <string.h>

static void *host(CUdeviceptr p) { return (void *)(uintptr_t)p; }

/* What the ranges r touch when a context of device `dev` copies: see fake_access_copy. */
static CUresult touches(struct fake_touches *t, const struct fake_range *r, int nr, int dev)
{
    CUresult rc = CUDA_SUCCESS;
    for (int i = 0; i < nr && rc == CUDA_SUCCESS; i++)
        rc = fake_access_copy(t, &r[i], dev);
    return rc;
}

/* The unit of a synchronous call touching ranges r, done by the current context. */
static CUresult sync_unit(enum fake_entry_id id, bool ptds, const struct fake_range *r, int nr)
{
    fake_ctx *c;
    fake_stream *s;
    struct fake_touches t = {0};
    CUresult rc = fake_current_ctx(&c);
    if (rc == CUDA_SUCCESS)
        rc = touches(&t, r, nr, c->device);
    if (rc == CUDA_SUCCESS)
        rc = fake_sync_stream(ptds, &s);
    if (rc == CUDA_SUCCESS)
        rc = fake_submit_sync(s, fake_entry_name(id), &t);
    fake_touches_free(&t);
    return rc;
}

/* The unit of an asynchronous call on stream h touching ranges r, done by the stream's
 * context; *run says whether the bytes should move now (not when the call fails or is
 * captured). */
static CUresult async_unit(enum fake_entry_id id, CUstream h, bool ptsz,
                           const struct fake_range *r, int nr, bool *run)
{
    fake_stream *s;
    bool captured = false;
    struct fake_touches t = {0};
    *run = false;
    CUresult rc = fake_resolve_stream(h, ptsz, false, &s);
    if (rc == CUDA_SUCCESS)
        rc = touches(&t, r, nr, s->ctx->device);
    if (rc == CUDA_SUCCESS)
        rc = fake_async_admit(s, &captured);
    if (rc == CUDA_SUCCESS && !captured)
        rc = fake_submit(s, fake_entry_name(id), &t, NULL, NULL);
    fake_touches_free(&t);
    *run = rc == CUDA_SUCCESS && !captured;
    return rc;
}

static CUresult memset_d8(enum fake_entry_id id, CUdeviceptr dst, unsigned char value, size_t n,
                          bool ptds)
{
    struct fake_range r = {dst, n, true};
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
    struct fake_range r = {dst, n, true};
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
    struct fake_range r = {dst, n, true};
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
    struct fake_range r = {dst, n, true};
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
    struct fake_range r = {src, n, false};
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
    struct fake_range r = {src, n, false};
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
    struct fake_range r[2] = {{dst, n, true}, {src, n, false}};
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
    struct fake_range r[2] = {{dst, n, true}, {src, n, false}};
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

/* ---- the CUDA 3.0 originals, with 32-bit pointers and sizes. cuMemAlloc never gives a
 * device pointer that fits in 32 bits (only a VMM reservation placed low can have one), so
 * they are refused. They exist so that cuGetProcAddress with an old cudaVersion resolves to
 * a distinct function, as with the real driver. */

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
