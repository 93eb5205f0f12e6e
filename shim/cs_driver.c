/* Finding the real driver. The shim exports driver symbols itself, so plain dlsym or symbol
 * binding would find the shim: everything here goes through the real dlsym on the handle of
 * the real libcuda.so.1. */
#include "cs_driver.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stddef.h>

#include "cs_work_gen.h"

static cs_dlsym_fn real_dlsym_ptr;
static cs_driver driver;
static pthread_once_t driver_once = PTHREAD_ONCE_INIT;
static _Thread_local int loading;
/* As an audit module (cs_bind.c) the shim lives in a namespace of its own: a dlopen here
 * would load a second libcuda. It opens the program's (cs_driver_use names it; opening it
 * again pins it), or else libcuda.so.1 in the program's first namespace. Its lookups go
 * through dlsym, so a tracer loaded as the next audit module sees them as the shim's. */
static bool bind_mode;
static struct link_map *bind_map;
static Lmid_t bind_lmid;

CS_NO_SANITIZE cs_dlsym_fn cs_real_dlsym_fn(void)
{
    cs_dlsym_fn f = __atomic_load_n(&real_dlsym_ptr, __ATOMIC_ACQUIRE);
    if (!f) {
        /* dlvsym, not dlsym: our dlsym is what everyone else's dlsym calls reach. Every
         * thread that races here finds the same pointer. */
        f = (cs_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (!f)
            f = (cs_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
        __atomic_store_n(&real_dlsym_ptr, f, __ATOMIC_RELEASE);
    }
    return f;
}

void *cs_real_dlsym(void *handle, const char *name)
{
    cs_dlsym_fn f = cs_real_dlsym_fn();
    return f ? f(handle, name) : NULL;
}

#define LOAD(name) *(void **)&driver.name = cs_real_dlsym(driver.handle, #name)

static void load_driver(void)
{
    loading = 1;
    if (!bind_mode) {
        driver.handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    } else {
        struct link_map *map = __atomic_load_n(&bind_map, __ATOMIC_ACQUIRE);
        driver.handle = map ? dlmopen(bind_lmid, map->l_name, RTLD_NOW | RTLD_NOLOAD) : NULL;
        if (!driver.handle)
            driver.handle = dlmopen(LM_ID_BASE, "libcuda.so.1", RTLD_NOW);
    }
    if (driver.handle) {
        LOAD(cuMemAlloc_v2);
        LOAD(cuMemFree_v2);
        LOAD(cuMemGetInfo_v2);
        LOAD(cuMemGetAddressRange_v2);
        LOAD(cuMemAlloc);
        LOAD(cuMemFree);
        LOAD(cuMemGetInfo);
        LOAD(cuStreamDestroy_v2);
        LOAD(cuStreamDestroy);
        LOAD(cuCtxDestroy_v2);
        LOAD(cuCtxDestroy);
        LOAD(cuDevicePrimaryCtxRelease_v2);
        LOAD(cuDevicePrimaryCtxRelease);
        LOAD(cuDevicePrimaryCtxReset_v2);
        LOAD(cuDevicePrimaryCtxReset);
        LOAD(cuStreamBeginCapture);
        LOAD(cuStreamBeginCapture_ptsz);
        LOAD(cuStreamBeginCapture_v2);
        LOAD(cuStreamBeginCapture_v2_ptsz);
        LOAD(cuStreamBeginCaptureToGraph);
        LOAD(cuStreamBeginCaptureToGraph_ptsz);
        LOAD(cuStreamEndCapture);
        LOAD(cuStreamEndCapture_ptsz);
        LOAD(cuMemGetAddressRange);
        LOAD(cuPointerGetAttribute);
        LOAD(cuPointerGetAttributes);
        LOAD(cuIpcGetMemHandle);
        LOAD(cuIpcOpenMemHandle_v2);
        LOAD(cuIpcOpenMemHandle);
        LOAD(cuIpcCloseMemHandle);
        LOAD(cuCtxEnablePeerAccess);
        LOAD(cuGetProcAddress);
        LOAD(cuGetProcAddress_v2);
        LOAD(cuCtxGetCurrent);
        LOAD(cuCtxGetDevice);
        LOAD(cuCtxPushCurrent_v2);
        LOAD(cuCtxPopCurrent_v2);
        LOAD(cuCtxGetApiVersion);
        LOAD(cuDeviceTotalMem_v2);
        LOAD(cuDeviceGetUuid_v2);
        if (!driver.cuDeviceGetUuid_v2)  /* drivers before CUDA 11.4 */
            *(void **)&driver.cuDeviceGetUuid_v2 = cs_real_dlsym(driver.handle, "cuDeviceGetUuid");
        LOAD(cuDevicePrimaryCtxGetState);
        LOAD(cuDevicePrimaryCtxRetain);
        LOAD(cuStreamGetCtx);
        LOAD(cuEventCreate);
        LOAD(cuEventRecord);
        LOAD(cuEventQuery);
        LOAD(cuEventSynchronize);
        LOAD(cuEventDestroy_v2);
        LOAD(cuThreadExchangeStreamCaptureMode);
        LOAD(cuStreamIsCapturing);
        LOAD(cuStreamWaitEvent);
        LOAD(cuCtxSynchronize);
        LOAD(cuDeviceGetAttribute);
        LOAD(cuMemGetAllocationGranularity);
        LOAD(cuMemCreate);
        LOAD(cuMemRelease);
        LOAD(cuMemAddressReserve);
        LOAD(cuMemAddressFree);
        LOAD(cuMemMap);
        LOAD(cuMemUnmap);
        LOAD(cuMemRetainAllocationHandle);
        LOAD(cuMemSetAccess);
        LOAD(cuMemExportToShareableHandle);
        LOAD(cuMemImportFromShareableHandle);
        LOAD(cuMemAllocPitch_v2);
        LOAD(cuMemAllocManaged);
        LOAD(cuMemAllocAsync);
        LOAD(cuMemAllocAsync_ptsz);
        LOAD(cuMemAllocFromPoolAsync);
        LOAD(cuMemAllocFromPoolAsync_ptsz);
        LOAD(cuMemFreeAsync);
        LOAD(cuMemFreeAsync_ptsz);
        LOAD(cuMemPoolCreate);
        LOAD(cuMemPoolDestroy);
        LOAD(cuDeviceGetDefaultMemPool);
        LOAD(cuMemAllocHost_v2);
        LOAD(cuMemHostAlloc);
        LOAD(cuMemFreeHost);
        for (int i = 0; i < CS_WORK_COUNT; i++)
            __atomic_store_n(&cs_work_real[i], cs_real_dlsym(driver.handle, cs_work_table[i].name),
                             __ATOMIC_RELEASE);
    }
    loading = 0;
}

void *cs_work_load(int i)
{
    cs_driver_get();
    return __atomic_load_n(&cs_work_real[i], __ATOMIC_ACQUIRE);
}

void cs_driver_bind_mode(void)
{
    bind_mode = true;
}

void cs_driver_use(struct link_map *map, Lmid_t lmid)
{
    struct link_map *none = NULL;
    if (__atomic_load_n(&bind_map, __ATOMIC_ACQUIRE))
        return;
    bind_lmid = lmid;
    __atomic_compare_exchange_n(&bind_map, &none, map, false, __ATOMIC_ACQ_REL,
                                __ATOMIC_ACQUIRE);
}

const cs_driver *cs_driver_get(void)
{
    pthread_once(&driver_once, load_driver);
    return &driver;
}

CS_NO_SANITIZE int cs_driver_loading(void)
{
    return loading;
}

bool cs_ctx_enter(CUcontext ctx, bool *pushed)
{
    CUcontext cur = NULL;
    *pushed = false;
    if (driver.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == ctx)
        return true;
    if (driver.cuCtxPushCurrent_v2(ctx) != CUDA_SUCCESS)
        return false;
    *pushed = true;
    return true;
}

void cs_ctx_leave(bool pushed)
{
    CUcontext popped;
    if (pushed)
        driver.cuCtxPopCurrent_v2(&popped);
}
