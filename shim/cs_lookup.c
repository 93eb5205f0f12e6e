/* How programs find driver functions: dlsym on libcuda, and cuGetProcAddress (which cudart,
 * PyTorch and CuPy use for nearly everything). Both hand out the shim's wrapper for the
 * entry points it wraps, so every path reaches the same wrapper. */
#include "cs_exports.h"
#include <dlfcn.h>
#include <stddef.h>
#include <string.h>

#include "cs_shim.h"
#include "cs_work_gen.h"

/* The wrappers (defined in cs_entry.c and below). */
#define WRAPPED(X) \
    X(cuMemAlloc_v2, cuMemAlloc, 3020, 0) \
    X(cuMemAlloc, cuMemAlloc, 0, 0) \
    X(cuMemFree_v2, cuMemFree, 3020, 0) \
    X(cuMemFree, cuMemFree, 0, 0) \
    X(cuMemGetInfo_v2, cuMemGetInfo, 3020, 0) \
    X(cuMemGetInfo, cuMemGetInfo, 0, 0) \
    X(cuMemGetAddressRange_v2, cuMemGetAddressRange, 3020, 0) \
    X(cuMemGetAddressRange, cuMemGetAddressRange, 0, 0) \
    X(cuPointerGetAttribute, cuPointerGetAttribute, 0, 0) \
    X(cuPointerGetAttributes, cuPointerGetAttributes, 0, 0) \
    X(cuIpcGetMemHandle, cuIpcGetMemHandle, 0, 0) \
    X(cuIpcOpenMemHandle_v2, cuIpcOpenMemHandle, 11000, 0) \
    X(cuIpcOpenMemHandle, cuIpcOpenMemHandle, 0, 0) \
    X(cuIpcCloseMemHandle, cuIpcCloseMemHandle, 0, 0) \
    X(cuCtxEnablePeerAccess, cuCtxEnablePeerAccess, 0, 0) \
    X(cuStreamDestroy_v2, cuStreamDestroy, 4000, 0) \
    X(cuStreamDestroy, cuStreamDestroy, 0, 0) \
    X(cuCtxDestroy_v2, cuCtxDestroy, 4000, 0) \
    X(cuCtxDestroy, cuCtxDestroy, 0, 0) \
    X(cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease, 11000, 0) \
    X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease, 0, 0) \
    X(cuDevicePrimaryCtxReset_v2, cuDevicePrimaryCtxReset, 11000, 0) \
    X(cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset, 0, 0) \
    X(cuStreamBeginCapture_v2, cuStreamBeginCapture, 10010, 0) \
    X(cuStreamBeginCapture_v2_ptsz, cuStreamBeginCapture, 10010, 1) \
    X(cuStreamBeginCapture, cuStreamBeginCapture, 0, 0) \
    X(cuStreamBeginCapture_ptsz, cuStreamBeginCapture, 0, 1) \
    X(cuStreamBeginCaptureToGraph, cuStreamBeginCaptureToGraph, 0, 0) \
    X(cuStreamBeginCaptureToGraph_ptsz, cuStreamBeginCaptureToGraph, 0, 1) \
    X(cuStreamEndCapture, cuStreamEndCapture, 0, 0) \
    X(cuStreamEndCapture_ptsz, cuStreamEndCapture, 0, 1) \
    X(cuMemAllocPitch_v2, cuMemAllocPitch, 3020, 0) \
    X(cuMemAllocManaged, cuMemAllocManaged, 0, 0) \
    X(cuMemAllocAsync, cuMemAllocAsync, 0, 0) \
    X(cuMemAllocAsync_ptsz, cuMemAllocAsync, 0, 1) \
    X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, 0, 0) \
    X(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync, 0, 1) \
    X(cuMemFreeAsync, cuMemFreeAsync, 0, 0) \
    X(cuMemFreeAsync_ptsz, cuMemFreeAsync, 0, 1) \
    X(cuMemPoolCreate, cuMemPoolCreate, 0, 0) \
    X(cuMemPoolDestroy, cuMemPoolDestroy, 0, 0) \
    X(cuMemCreate, cuMemCreate, 0, 0) \
    X(cuMemRelease, cuMemRelease, 0, 0) \
    X(cuMemMap, cuMemMap, 0, 0) \
    X(cuMemUnmap, cuMemUnmap, 0, 0) \
    X(cuMemRetainAllocationHandle, cuMemRetainAllocationHandle, 0, 0) \
    X(cuMemAllocHost_v2, cuMemAllocHost, 3020, 0) \
    X(cuMemHostAlloc, cuMemHostAlloc, 0, 0) \
    X(cuMemFreeHost, cuMemFreeHost, 0, 0) \
    X(cuGetProcAddress_v2, cuGetProcAddress, 12000, 0) \
    X(cuGetProcAddress, cuGetProcAddress, 0, 0)

typedef struct {
    const char *name;   /* exported, versioned */
    const char *base;   /* what cuGetProcAddress is asked for */
    int version;        /* first cudaVersion that resolves base to name */
    int ptsz;           /* the per-thread-default-stream variant */
    size_t real;        /* offset of the real pointer in cs_driver */
    void *wrapper;
} wrapped;

#define ROW(name, base, version, ptsz) \
    {#name, #base, version, ptsz, offsetof(cs_driver, name), (void *)name},
static const wrapped table[] = {WRAPPED(ROW)};
#define NWRAPPED (sizeof table / sizeof table[0])

static void *real_of(const cs_driver *d, const wrapped *w)
{
    return *(void *const *)((const char *)d + w->real);
}

void *cs_wrap_symbol(const char *name, void *real, int cuda_version, cuuint64_t flags)
{
    const cs_driver *d = cs_driver_get();
    for (size_t i = 0; i < NWRAPPED; i++)
        if (real == real_of(d, &table[i]))
            return table[i].wrapper;
    /* The entry points that put work on a stream: what the driver hands out for a name is
     * the function it exports under the versioned name the caller's version maps to. */
    for (int i = 0; i < CS_WORK_COUNT; i++)
        if (real == __atomic_load_n(&cs_work_real[i], __ATOMIC_ACQUIRE))
            return cs_work_table[i].wrapper;
    /* The driver may hand out an internal address for a base name: choose the variant by
     * cuda.h's versioning rules, as the driver did. */
    if (!name)
        return real;
    int ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const wrapped *best = NULL;
    for (int pass = 0; pass < 2 && !best; pass++) {
        for (size_t i = 0; i < NWRAPPED; i++) {
            const wrapped *w = &table[i];
            /* Second pass: entry points without a per-thread variant serve both. */
            if (strcmp(w->base, name) != 0 || w->ptsz != (pass == 0 ? ptsz : 0) ||
                w->version > cuda_version || !real_of(d, w))
                continue;
            if (!best || w->version > best->version)
                best = w;
        }
        if (!ptsz)
            break;
    }
    return best ? best->wrapper : real;
}

/* The wrapper of the exported name `name` (what a binding or dlsym names), or NULL: the
 * binding-time hooks (cs_bind.c) hand it out in place of the driver's function. */
void *cs_wrapper_named(const char *name)
{
    for (size_t i = 0; i < NWRAPPED; i++)
        if (strcmp(table[i].name, name) == 0)
            return table[i].wrapper;
    for (int i = 0; i < CS_WORK_COUNT; i++)
        if (strcmp(cs_work_table[i].name, name) == 0)
            return cs_work_table[i].wrapper;
    return NULL;
}

/* ---------------------------------------------------------------- cuGetProcAddress */

static void *wrap_found(const char *symbol, void *p, int version, cuuint64_t flags)
{
    if (!p || cs_driver_loading() || cs_shim_get()->disabled)
        return p;
    return cs_wrap_symbol(symbol, p, version, flags);
}

CS_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                       cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
    const cs_driver *d = cs_driver_get();
    if (!d->cuGetProcAddress_v2)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = d->cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, status);
    if (r == CUDA_SUCCESS && pfn)
        *pfn = wrap_found(symbol, *pfn, cudaVersion, flags);
    return r;
}

CS_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                    cuuint64_t flags)
{
    const cs_driver *d = cs_driver_get();
    if (!d->cuGetProcAddress)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = d->cuGetProcAddress(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && pfn)
        *pfn = wrap_found(symbol, *pfn, cudaVersion, flags);
    return r;
}

/* ---------------------------------------------------------------- dlsym
 *
 * glibc's dlsym looks at its return address to resolve RTLD_NEXT (and the caller's
 * namespace), so for every lookup the shim does not wrap the real dlsym must be reached by a
 * tail call, as if the program had called it (the dlsym-next test checks that this holds).
 * RTLD_NEXT lookups are never wrapped: a library asking for the next definition after itself
 * is chaining interposers, and must get exactly that, or it could be handed itself. */

static void *wrap_dlsym(void *handle, const char *name)
{
    void *p = cs_real_dlsym(handle, name);
    return wrap_found(NULL, p, 0, 0);
}

__attribute__((optimize("O2", "optimize-sibling-calls"))) CS_NO_SANITIZE
CS_EXPORT void *dlsym(void *handle, const char *name)
{
    /* glibc declares name non-null, as the real dlsym needs it. Driver entry points are "cu"
     * and a capital (cuMemAlloc_v2); cuDNN, cuBLAS, cuFFT... (cudnn*, cublas*, cufft*) are
     * not the shim's, and reach the real dlsym by the tail call. */
    if (name[0] == 'c' && name[1] == 'u' && name[2] >= 'A' && name[2] <= 'Z' &&
        handle != RTLD_NEXT && !cs_driver_loading())
        return wrap_dlsym(handle, name);
    return cs_real_dlsym_fn()(handle, name);
}
