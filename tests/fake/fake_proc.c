/* Fake CUDA driver: cuGetProcAddress and the error strings.
 *
 * cudart (static or shared) finds nearly every entry point through cuGetProcAddress_v2 by
 * base name plus the CUDA version it was built for, so this table must pick the versioned
 * function exactly as the real driver does. The library is linked with -Bsymbolic, so the
 * addresses taken here are the fake's own functions, the same ones dlsym returns, even when
 * a preloaded shim exports the same names. */
#include "fake_internal.h"

#include <stdint.h>
#include <string.h>

struct proc {
    const char *name;
    int since;               /* cudaVersion from which `fn` applies instead of `old` */
    void *old, *fn;          /* legacy-stream variants; old: NULL when none exists here */
    void *old_ptsz, *ptsz;   /* per-thread-default-stream variants, NULL when none */
};

/* Function to object pointer, as the void ** API requires (POSIX guarantees it works). */
#define FN(f) ((void *)(uintptr_t)(f))
#define P(base) {#base, 0, NULL, FN(base), NULL, NULL}
#define P_PTSZ(base) {#base, 0, NULL, FN(base), NULL, FN(base##_ptsz)}
#define P_V(base, since, old, new) {#base, since, FN(old), FN(new), NULL, NULL}
#define P_V_PTDS(base) {#base, 3020, FN(base), FN(base##_v2), NULL, FN(base##_v2_ptds)}
#define P_V2_PTSZ(base) {#base, 3020, NULL, FN(base##_v2), NULL, FN(base##_v2_ptsz)}
/* Entry points that came with a CUDA version: older versions get "not found". */
#define P_SINCE(base, since) {#base, since, NULL, FN(base), NULL, NULL}

static const struct proc g_procs[] = {
    P(cuInit),
    P(cuDriverGetVersion),
    P(cuGetErrorName),
    P(cuGetErrorString),
    P_V(cuGetProcAddress, 12000, cuGetProcAddress, cuGetProcAddress_v2),
    P(cuDeviceGet),
    P(cuDeviceGetCount),
    P(cuDeviceGetName),
    P_V(cuDeviceGetUuid, 11040, cuDeviceGetUuid, cuDeviceGetUuid_v2),
    P_V(cuDeviceTotalMem, 3020, cuDeviceTotalMem, cuDeviceTotalMem_v2),
    P(cuDeviceGetAttribute),
    P(cuDeviceCanAccessPeer),
    P(cuDevicePrimaryCtxRetain),
    P_V(cuDevicePrimaryCtxRelease, 11000, cuDevicePrimaryCtxRelease,
        cuDevicePrimaryCtxRelease_v2),
    P_V(cuDevicePrimaryCtxReset, 11000, cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset_v2),
    P(cuDevicePrimaryCtxGetState),
    /* Only the CUDA 12.5 form exists here; older versions get "not found". */
    {"cuCtxCreate", 12050, NULL, FN(cuCtxCreate_v4), NULL, NULL},
    P_V(cuCtxDestroy, 4000, cuCtxDestroy, cuCtxDestroy_v2),
    P(cuCtxSetCurrent),
    P(cuCtxGetCurrent),
    P_V(cuCtxPushCurrent, 4000, cuCtxPushCurrent, cuCtxPushCurrent_v2),
    P_V(cuCtxPopCurrent, 4000, cuCtxPopCurrent, cuCtxPopCurrent_v2),
    P(cuCtxGetDevice),
    P(cuCtxSynchronize),
    P(cuCtxGetApiVersion),
    P(cuCtxEnablePeerAccess),
    P(cuCtxDisablePeerAccess),
    P_V(cuMemAlloc, 3020, cuMemAlloc, cuMemAlloc_v2),
    P_V(cuMemFree, 3020, cuMemFree, cuMemFree_v2),
    P_V(cuMemGetInfo, 3020, cuMemGetInfo, cuMemGetInfo_v2),
    P_V(cuMemGetAddressRange, 3020, cuMemGetAddressRange, cuMemGetAddressRange_v2),
    P_V_PTDS(cuMemsetD8),
    P_V_PTDS(cuMemcpyHtoD),
    P_V_PTDS(cuMemcpyDtoH),
    P_V_PTDS(cuMemcpyDtoD),
    P(cuStreamCreate),
    P(cuStreamCreateWithPriority),
    P_V(cuStreamDestroy, 4000, cuStreamDestroy, cuStreamDestroy_v2),
    P_PTSZ(cuStreamQuery),
    P_PTSZ(cuStreamSynchronize),
    P_PTSZ(cuStreamGetFlags),
    P_PTSZ(cuStreamGetCtx),
    P(cuEventCreate),
    P_PTSZ(cuEventRecord),
    P(cuEventQuery),
    P(cuEventSynchronize),
    P_V(cuEventDestroy, 4000, cuEventDestroy, cuEventDestroy_v2),
    {"cuStreamBeginCapture", 10010, FN(cuStreamBeginCapture), FN(cuStreamBeginCapture_v2),
     FN(cuStreamBeginCapture_ptsz), FN(cuStreamBeginCapture_v2_ptsz)},
    P_PTSZ(cuStreamBeginCaptureToGraph),
    P_PTSZ(cuStreamEndCapture),
    P_PTSZ(cuStreamIsCapturing),
    P(cuThreadExchangeStreamCaptureMode),
    P_PTSZ(cuStreamWaitEvent),
    P_PTSZ(cuLaunchKernel),
    P_PTSZ(cuLaunchKernelEx),
    P_PTSZ(cuLaunchHostFunc),
    P_PTSZ(cuGraphLaunch),
    P_PTSZ(cuMemsetD8Async),
    /* Only the _v2 forms exist here; older versions get "not found". */
    P_V2_PTSZ(cuMemcpyHtoDAsync),
    P_V2_PTSZ(cuMemcpyDtoHAsync),
    P_V2_PTSZ(cuMemcpyDtoDAsync),
    P_SINCE(cuMemGetAllocationGranularity, 10020),
    P_SINCE(cuMemCreate, 10020),
    P_SINCE(cuMemRelease, 10020),
    P_SINCE(cuMemGetAllocationPropertiesFromHandle, 10020),
    P_SINCE(cuMemRetainAllocationHandle, 11000),
    P_SINCE(cuMemExportToShareableHandle, 10020),
    P_SINCE(cuMemImportFromShareableHandle, 10020),
    P_SINCE(cuMemAddressReserve, 10020),
    P_SINCE(cuMemAddressFree, 10020),
    P_SINCE(cuMemMap, 10020),
    P_SINCE(cuMemUnmap, 10020),
    P_SINCE(cuMemSetAccess, 10020),
    P_SINCE(cuMemGetAccess, 10020),
    P_SINCE(cuPointerGetAttribute, 4000),
    P_SINCE(cuPointerGetAttributes, 7000),
    P_SINCE(cuIpcGetMemHandle, 4010),
    {"cuIpcOpenMemHandle", 11000, FN(cuIpcOpenMemHandle), FN(cuIpcOpenMemHandle_v2), NULL,
     NULL},
    P_SINCE(cuIpcCloseMemHandle, 4010),
    {"cuMemAllocHost", 3020, NULL, FN(cuMemAllocHost_v2), NULL, NULL},
    P(cuMemHostAlloc),
    P(cuMemFreeHost),
    {"cuMemAllocPitch", 3020, NULL, FN(cuMemAllocPitch_v2), NULL, NULL},
    P_SINCE(cuMemAllocManaged, 6000),
    {"cuMemAllocAsync", 11020, NULL, FN(cuMemAllocAsync), NULL, FN(cuMemAllocAsync_ptsz)},
    {"cuMemAllocFromPoolAsync", 11020, NULL, FN(cuMemAllocFromPoolAsync), NULL,
     FN(cuMemAllocFromPoolAsync_ptsz)},
    {"cuMemFreeAsync", 11020, NULL, FN(cuMemFreeAsync), NULL, FN(cuMemFreeAsync_ptsz)},
    P_SINCE(cuMemPoolCreate, 11020),
    P_SINCE(cuMemPoolDestroy, 11020),
    P_SINCE(cuDeviceGetDefaultMemPool, 11020),
};

static void *resolve(const char *symbol, int version, cuuint64_t flags)
{
    bool ptsz = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    for (size_t i = 0; i < sizeof g_procs / sizeof g_procs[0]; i++) {
        const struct proc *p = &g_procs[i];
        if (strcmp(p->name, symbol) != 0)
            continue;
        bool newer = version >= p->since;
        void *plain = newer ? p->fn : p->old;
        void *pt = newer ? p->ptsz : p->old_ptsz;
        return ptsz && pt ? pt : plain;
    }
    return NULL;
}

static CUresult proc_address(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = resolve(symbol, version, flags);
    if (status)
        *status = *pfn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

FAKE_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                      cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
    ENTER(cuGetProcAddress_v2);
    return proc_address(symbol, pfn, cudaVersion, flags, symbolStatus);
}

FAKE_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                   cuuint64_t flags)
{
    ENTER(cuGetProcAddress);
    return proc_address(symbol, pfn, cudaVersion, flags, NULL);
}

/* ---- control API: the fake's own functions by exported name ---------------------------- */

static const struct {
    const char *name;
    void *fn;
} g_exports[] = {
#define FAKE_EXPORT(fn, init) {#fn, FN(fn)},
    FAKE_ENTRIES(FAKE_EXPORT)
#undef FAKE_EXPORT
};

FAKE_API void *fake_real_symbol(const char *name)
{
    for (size_t i = 0; name && i < sizeof g_exports / sizeof g_exports[0]; i++)
        if (strcmp(g_exports[i].name, name) == 0)
            return g_exports[i].fn;
    return NULL;
}

/* ---- error strings: the real driver's wording for the codes the fake returns, plus the
 * ones tests commonly inject. */

struct err {
    CUresult code;
    const char *name, *text;
};

#define E(code, text) {code, #code, text}

static const struct err g_errors[] = {
    E(CUDA_SUCCESS, "no error"),
    E(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
    E(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
    E(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
    E(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
    E(CUDA_ERROR_STUB_LIBRARY, "CUDA driver is a stub library"),
    E(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
    E(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
    E(CUDA_ERROR_ECC_UNCORRECTABLE, "uncorrectable ECC error encountered"),
    E(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
    E(CUDA_ERROR_CONTEXT_ALREADY_IN_USE, "context already in use"),
    E(CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported on this OS"),
    E(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
    E(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state"),
    E(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
    E(CUDA_ERROR_NOT_READY, "device not ready"),
    E(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"),
    E(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"),
    E(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed"),
    E(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "peer access is already enabled"),
    E(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "peer access has not been enabled"),
    E(CUDA_ERROR_TOO_MANY_PEERS, "peer mapping resources exhausted"),
    E(CUDA_ERROR_NOT_PERMITTED, "operation not permitted"),
    E(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
    E(CUDA_ERROR_SYSTEM_NOT_READY, "system not yet initialized"),
    E(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing"),
    E(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
      "operation failed due to a previous error during capture"),
    E(CUDA_ERROR_STREAM_CAPTURE_MERGE, "operation would result in a merge of separate capture "
                                       "sequences"),
    E(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "capture was not ended in the same stream as it began"),
    E(CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
      "capturing stream has unjoined work"),
    E(CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
      "dependency created on uncaptured work in another stream"),
    E(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
      "operation would make the legacy stream depend on a capturing blocking stream"),
    E(CUDA_ERROR_CAPTURED_EVENT,
      "operation not permitted on an event last recorded in a capturing stream"),
    E(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
      "attempt to terminate a thread-local capture sequence from another thread"),
    E(CUDA_ERROR_UNKNOWN, "unknown error"),
};

static const struct err *find_error(CUresult code)
{
    for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++)
        if (g_errors[i].code == code)
            return &g_errors[i];
    return NULL;
}

/* Unknown codes: CUDA_ERROR_INVALID_VALUE and *pStr = NULL, as the real driver answers. */
FAKE_API CUresult cuGetErrorName(CUresult error, const char **pStr)
{
    ENTER(cuGetErrorName);
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    const struct err *e = find_error(error);
    *pStr = e ? e->name : NULL;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FAKE_API CUresult cuGetErrorString(CUresult error, const char **pStr)
{
    ENTER(cuGetErrorString);
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    const struct err *e = find_error(error);
    *pStr = e ? e->text : NULL;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
