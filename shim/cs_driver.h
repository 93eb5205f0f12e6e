/* The real driver: libcuda found at run time through the real dlsym, never linked. */
#ifndef CS_DRIVER_H
#define CS_DRIVER_H

#include <dlfcn.h>
#include <stdbool.h>

#include "cs_exports.h"

/* Every real entry point the shim calls or wraps, with its exact ABI. The v1 names take
 * 32-bit sizes and pointers; they are only ever forwarded. */
typedef struct cs_driver {
    void *handle;  /* libcuda.so.1, or NULL when it could not be loaded */

    /* wrapped */
    CUresult (*cuMemAlloc_v2)(CUdeviceptr *, size_t);
    CUresult (*cuMemFree_v2)(CUdeviceptr);
    CUresult (*cuMemGetInfo_v2)(size_t *, size_t *);
    CUresult (*cuMemGetAddressRange_v2)(CUdeviceptr *, size_t *, CUdeviceptr);
    CUresult (*cuMemAlloc)(unsigned int *, unsigned int);
    CUresult (*cuMemFree)(unsigned int);
    CUresult (*cuMemGetInfo)(unsigned int *, unsigned int *);
    CUresult (*cuStreamDestroy_v2)(CUstream);
    CUresult (*cuStreamDestroy)(CUstream);
    CUresult (*cuCtxDestroy_v2)(CUcontext);
    CUresult (*cuCtxDestroy)(CUcontext);
    CUresult (*cuDevicePrimaryCtxRelease_v2)(CUdevice);
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
    CUresult (*cuDevicePrimaryCtxReset_v2)(CUdevice);
    CUresult (*cuDevicePrimaryCtxReset)(CUdevice);
    CUresult (*cuStreamBeginCapture)(CUstream);
    CUresult (*cuStreamBeginCapture_ptsz)(CUstream);
    CUresult (*cuStreamBeginCapture_v2)(CUstream, CUstreamCaptureMode);
    CUresult (*cuStreamBeginCapture_v2_ptsz)(CUstream, CUstreamCaptureMode);
    CUresult (*cuStreamBeginCaptureToGraph)(CUstream, CUgraph, const CUgraphNode *,
                                            const CUgraphEdgeData *, size_t, CUstreamCaptureMode);
    CUresult (*cuStreamBeginCaptureToGraph_ptsz)(CUstream, CUgraph, const CUgraphNode *,
                                                 const CUgraphEdgeData *, size_t,
                                                 CUstreamCaptureMode);
    CUresult (*cuStreamEndCapture)(CUstream, CUgraph *);
    CUresult (*cuStreamEndCapture_ptsz)(CUstream, CUgraph *);
    CUresult (*cuMemGetAddressRange)(unsigned int *, unsigned int *, unsigned int);
    CUresult (*cuPointerGetAttribute)(void *, CUpointer_attribute, CUdeviceptr);
    CUresult (*cuPointerGetAttributes)(unsigned int, CUpointer_attribute *, void **, CUdeviceptr);
    CUresult (*cuIpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
    CUresult (*cuIpcOpenMemHandle_v2)(CUdeviceptr *, CUipcMemHandle, unsigned int);
    CUresult (*cuIpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned int);
    CUresult (*cuIpcCloseMemHandle)(CUdeviceptr);
    CUresult (*cuCtxEnablePeerAccess)(CUcontext, unsigned int);
    CUresult (*cuGetProcAddress)(const char *, void **, int, cuuint64_t);
    CUresult (*cuGetProcAddress_v2)(const char *, void **, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult *);

    /* used by the backend and the stream layer */
    CUresult (*cuCtxGetCurrent)(CUcontext *);
    CUresult (*cuCtxGetDevice)(CUdevice *);
    CUresult (*cuCtxPushCurrent_v2)(CUcontext);
    CUresult (*cuCtxPopCurrent_v2)(CUcontext *);
    CUresult (*cuCtxGetApiVersion)(CUcontext, unsigned int *);
    CUresult (*cuDeviceTotalMem_v2)(size_t *, CUdevice);
    CUresult (*cuDeviceGetUuid_v2)(CUuuid *, CUdevice);  /* or cuDeviceGetUuid: the same ABI */
    CUresult (*cuDevicePrimaryCtxGetState)(CUdevice, unsigned int *, int *);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*cuStreamGetCtx)(CUstream, CUcontext *);
    CUresult (*cuEventCreate)(CUevent *, unsigned int);
    CUresult (*cuEventRecord)(CUevent, CUstream);
    CUresult (*cuEventQuery)(CUevent);
    CUresult (*cuEventSynchronize)(CUevent);
    CUresult (*cuEventDestroy_v2)(CUevent);
    CUresult (*cuThreadExchangeStreamCaptureMode)(CUstreamCaptureMode *);
    CUresult (*cuStreamIsCapturing)(CUstream, CUstreamCaptureStatus *);
    CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned int);
    CUresult (*cuCtxSynchronize)(void);
    CUresult (*cuDeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
    CUresult (*cuMemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *,
                                              CUmemAllocationGranularity_flags);
    CUresult (*cuMemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                            unsigned long long);
    CUresult (*cuMemRelease)(CUmemGenericAllocationHandle);
    CUresult (*cuMemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
                                    unsigned long long);
    CUresult (*cuMemAddressFree)(CUdeviceptr, size_t);
    CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                         unsigned long long);
    CUresult (*cuMemUnmap)(CUdeviceptr, size_t);
    CUresult (*cuMemRetainAllocationHandle)(CUmemGenericAllocationHandle *, void *);
    CUresult (*cuMemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    /* Pooled blocks between processes (cs_ipc.c). */
    CUresult (*cuMemExportToShareableHandle)(void *, CUmemGenericAllocationHandle,
                                             CUmemAllocationHandleType, unsigned long long);
    CUresult (*cuMemImportFromShareableHandle)(CUmemGenericAllocationHandle *, void *,
                                               CUmemAllocationHandleType);
    /* Allocation calls past the cache (cs_paths.c) and pinned host memory (cs_host.c). */
    CUresult (*cuMemAllocPitch_v2)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
    CUresult (*cuMemAllocManaged)(CUdeviceptr *, size_t, unsigned int);
    CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*cuMemAllocAsync_ptsz)(CUdeviceptr *, size_t, CUstream);
    CUresult (*cuMemAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*cuMemAllocFromPoolAsync_ptsz)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*cuMemFreeAsync)(CUdeviceptr, CUstream);
    CUresult (*cuMemFreeAsync_ptsz)(CUdeviceptr, CUstream);
    CUresult (*cuMemPoolCreate)(CUmemoryPool *, const CUmemPoolProps *);
    CUresult (*cuMemPoolDestroy)(CUmemoryPool);
    CUresult (*cuDeviceGetDefaultMemPool)(CUmemoryPool *, CUdevice);
    CUresult (*cuMemAllocHost_v2)(void **, size_t);
    CUresult (*cuMemHostAlloc)(void **, size_t, unsigned int);
    CUresult (*cuMemFreeHost)(void *);
} cs_driver;

/* The shim is an audit module (cs_bind.c): set before anything else runs. The driver is then
 * the libcuda given to cs_driver_use (a link map of the program's, in namespace lmid), else
 * libcuda.so.1 opened in the program's first namespace, never a copy in the shim's own. */
void cs_driver_bind_mode(void);
/* The first call wins; later ones are ignored (the process has one driver). ld.so calls
 * la_objopen under its lock, one at a time. */
struct link_map;
void cs_driver_use(struct link_map *map, Lmid_t lmid);

/* The table, loaded once (thread-safe). Entries the driver lacks are NULL. */
const cs_driver *cs_driver_get(void);

/* Make ctx current for a driver call that depends on it; *pushed says to pop it after with
 * cs_ctx_leave. False when it cannot be made current. */
bool cs_ctx_enter(CUcontext ctx, bool *pushed);
void cs_ctx_leave(bool pushed);
/* dlsym is called by sanitizer runtimes while they start, before instrumented code may run:
 * what our dlsym reaches on its way to the real one is not instrumented. */
#define CS_NO_SANITIZE __attribute__((no_sanitize("address", "undefined", "thread")))

/* The real dlsym, found with dlvsym so it can never be our own. */
typedef void *(*cs_dlsym_fn)(void *, const char *);
CS_NO_SANITIZE cs_dlsym_fn cs_real_dlsym_fn(void);
void *cs_real_dlsym(void *handle, const char *name);
/* True while this thread is loading the driver: lookups it makes must not be wrapped. */
CS_NO_SANITIZE int cs_driver_loading(void);

#endif
