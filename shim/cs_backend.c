/* The backend: memory on one real driver context, and the cache's fences, which are the
 * stream layer's epochs (cs_streams.c). Two kinds of memory: classic (a cuMemAlloc per
 * block) and pooled (the virtual memory calls the pool, cs_pool.c, makes its blocks of).
 * The context is made current for each driver call that depends on it. */
#include "cs_backend.h"

#include <stdint.h>
#include <stdlib.h>

#include "cs_driver.h"
#include "cs_streams.h"

/* The backend's state of one context: the cache's `dev`. */
typedef struct {
    cs_ctx_streams *streams;
    CUcontext ctx;
    CUdevice device;
    bool rdma;        /* the device can do GPUDirect RDMA on virtual memory: chunks allow it */
    bool no_fd;       /* atomic: the driver refused chunks exportable as file descriptors */
    uint64_t peers;   /* atomic: other devices granted access to pooled memory (bit = ordinal) */
} backend_dev;

static const cs_driver *drv(void)
{
    return cs_driver_get();
}

static int be_code(CUresult r, int *raw)
{
    *raw = r;
    return r == CUDA_SUCCESS ? CS_BE_OK : r == CUDA_ERROR_OUT_OF_MEMORY ? CS_BE_OOM : CS_BE_ERROR;
}

/* The context made current for a call on it: false (raw set) when it is gone or cannot be
 * made current. */
static bool enter(const backend_dev *b, bool *pushed, int *raw)
{
    if (cs_streams_dead(b->streams) || !cs_ctx_enter(b->ctx, pushed)) {
        *raw = CUDA_ERROR_INVALID_CONTEXT;
        return false;
    }
    return true;
}

static int leave(bool pushed, CUresult r, int *raw)
{
    cs_ctx_leave(pushed);
    return be_code(r, raw);
}

/* Unmapping, freeing a reservation and releasing a chunk take no context in the driver: once
 * the context is gone they run without it, to give its pool's memory back (virtual memory
 * outlives the context it was made in). entered: what enter() said. */
static int leave_any(bool entered, bool pushed, CUresult r, int *raw)
{
    if (entered)
        cs_ctx_leave(pushed);
    return be_code(r, raw);
}

/* ---------------------------------------------------------------- classic */

static int be_alloc(void *dev, uint64_t size, uint64_t *addr, int *raw)
{
    backend_dev *b = dev;
    bool pushed;
    if (!cs_ctx_enter(b->ctx, &pushed)) {
        *raw = CUDA_ERROR_INVALID_CONTEXT;
        return CS_BE_ERROR;
    }
    CUdeviceptr p = 0;
    CUresult r = drv()->cuMemAlloc_v2(&p, (size_t)size);
    if (r == CUDA_SUCCESS)
        *addr = p;
    return leave(pushed, r, raw);
}

static int be_free(void *dev, uint64_t addr, int *raw)
{
    bool pushed;
    if (!enter(dev, &pushed, raw))
        return CS_BE_ERROR;
    return leave(pushed, drv()->cuMemFree_v2((CUdeviceptr)addr), raw);
}

/* ---------------------------------------------------------------- pooled */

static int vmm_create(void *dev, uint64_t size, uint64_t *handle, int *raw)
{
    backend_dev *b = dev;
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = (int)b->device;
    prop.allocFlags.gpuDirectRDMACapable = b->rdma;
    /* Exportable as a file descriptor, for cuIpcGetMemHandle (cs_ipc.c), where the driver
     * allows it; where it refuses that handle type (some containers; it answers not
     * supported or invalid value), chunks without, from then on: a chunk made without is
     * only a block that cannot be exported, a wrong guess costs nothing else. */
    bool fd = !__atomic_load_n(&b->no_fd, __ATOMIC_RELAXED);
    prop.requestedHandleTypes = fd ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : 0;
    CUmemGenericAllocationHandle h = 0;
    bool pushed;
    if (!enter(b, &pushed, raw))
        return CS_BE_ERROR;
    CUresult r = drv()->cuMemCreate(&h, (size_t)size, &prop, 0);
    if (fd && (r == CUDA_ERROR_NOT_SUPPORTED || r == CUDA_ERROR_INVALID_VALUE)) {
        __atomic_store_n(&b->no_fd, true, __ATOMIC_RELAXED);
        prop.requestedHandleTypes = 0;
        r = drv()->cuMemCreate(&h, (size_t)size, &prop, 0);
    }
    if (r == CUDA_SUCCESS)
        *handle = h;
    return leave(pushed, r, raw);
}

static int vmm_release(void *dev, uint64_t handle, int *raw)
{
    bool pushed = false, in = enter(dev, &pushed, raw);
    return leave_any(in, pushed, drv()->cuMemRelease((CUmemGenericAllocationHandle)handle), raw);
}

static int vmm_reserve(void *dev, uint64_t size, uint64_t *va, int *raw)
{
    CUdeviceptr p = 0;
    bool pushed;
    if (!enter(dev, &pushed, raw))
        return CS_BE_ERROR;
    CUresult r = drv()->cuMemAddressReserve(&p, (size_t)size, 0, 0, 0);
    if (r == CUDA_SUCCESS)
        *va = p;
    return leave(pushed, r, raw);
}

static int vmm_unreserve(void *dev, uint64_t va, uint64_t size, int *raw)
{
    bool pushed = false, in = enter(dev, &pushed, raw);
    return leave_any(in, pushed, drv()->cuMemAddressFree((CUdeviceptr)va, (size_t)size), raw);
}

static int vmm_map(void *dev, uint64_t va, uint64_t size, uint64_t handle, int *raw)
{
    bool pushed;
    if (!enter(dev, &pushed, raw))
        return CS_BE_ERROR;
    return leave(pushed,
                 drv()->cuMemMap((CUdeviceptr)va, (size_t)size, 0,
                                 (CUmemGenericAllocationHandle)handle, 0),
                 raw);
}

/* Read and write for the context's device and every peer granted (cs_backend_grant_peer). */
static int vmm_access(void *dev, uint64_t va, uint64_t size, int *raw)
{
    backend_dev *b = dev;
    CUmemAccessDesc desc[64];
    int n = 0;
    uint64_t peers = __atomic_load_n(&b->peers, __ATOMIC_ACQUIRE) | (1ull << b->device);
    for (int d = 0; d < 64; d++)
        if (peers & (1ull << d)) {
            desc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            desc[n].location.id = d;
            desc[n].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            n++;
        }
    bool pushed;
    if (!enter(b, &pushed, raw))
        return CS_BE_ERROR;
    return leave(pushed, drv()->cuMemSetAccess((CUdeviceptr)va, (size_t)size, desc, (size_t)n),
                 raw);
}

static int vmm_unmap(void *dev, uint64_t va, uint64_t size, int *raw)
{
    bool pushed = false, in = enter(dev, &pushed, raw);
    return leave_any(in, pushed, drv()->cuMemUnmap((CUdeviceptr)va, (size_t)size), raw);
}

static int vmm_sync(void *dev, int *raw)
{
    bool pushed;
    if (!enter(dev, &pushed, raw))
        return CS_BE_ERROR;
    return leave(pushed, drv()->cuCtxSynchronize(), raw);
}

static const cs_vmm_ops cuda_vmm = {vmm_create, vmm_release, vmm_reserve, vmm_unreserve,
                                    vmm_map, vmm_access, vmm_unmap, vmm_sync};

/* ---------------------------------------------------------------- fences */

static uint64_t be_fence(void *dev) { return cs_streams_fence(((backend_dev *)dev)->streams); }
static int be_reached(void *dev, uint64_t epoch)
{
    return cs_streams_reached(((backend_dev *)dev)->streams, epoch);
}
static int be_wait(void *dev, uint64_t epoch)
{
    return cs_streams_wait(((backend_dev *)dev)->streams, epoch);
}
static int be_order_after(void *dev, uint64_t epoch)
{
    return cs_streams_order_after(((backend_dev *)dev)->streams, epoch);
}
static int be_busy_streams(void *dev) { return cs_streams_busy(((backend_dev *)dev)->streams); }

/* The two backends differ only in where blocks get their memory. */
#define CUDA_OPS                         \
    .alloc = be_alloc,                   \
    .free = be_free,                     \
    .fence = be_fence,                   \
    .reached = be_reached,               \
    .wait = be_wait,                     \
    .order_after = be_order_after,       \
    .busy_streams = be_busy_streams

const cs_backend_ops cs_cuda_ops = {CUDA_OPS, .vmm = NULL};
const cs_backend_ops cs_cuda_pooled_ops = {CUDA_OPS, .vmm = &cuda_vmm};

/* ---------------------------------------------------------------- set-up */

uint64_t cs_backend_granularity(CUdevice device)
{
    const cs_driver *d = drv();
    int vmm = 0;
    if (!d->cuDeviceGetAttribute || !d->cuMemGetAllocationGranularity || !d->cuMemCreate ||
        !d->cuMemRelease || !d->cuMemAddressReserve || !d->cuMemAddressFree || !d->cuMemMap ||
        !d->cuMemUnmap || !d->cuMemSetAccess ||
        d->cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                device) != CUDA_SUCCESS ||
        !vmm)
        return 0;
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = (int)device;
    size_t g = 0;
    if (d->cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
            CUDA_SUCCESS ||
        g < 4096 || (g & (g - 1)))
        return 0;
    return g;
}

void *cs_backend_for(CUcontext ctx, CUdevice device)
{
    cs_ctx_streams *s = cs_streams_for(ctx);
    if (!s)
        return NULL;
    /* Kept for the process's life, as the cache keeps its heaps: a few per context. */
    backend_dev *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->streams = s;
    b->ctx = ctx;
    b->device = device;
    int rdma = 0;
    const cs_driver *d = drv();
    if (d->cuDeviceGetAttribute &&
        d->cuDeviceGetAttribute(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                                device) == CUDA_SUCCESS)
        b->rdma = rdma != 0;
    return b;
}

bool cs_backend_exportable(void *dev)
{
    return !__atomic_load_n(&((backend_dev *)dev)->no_fd, __ATOMIC_RELAXED);
}

void cs_backend_drop(void *dev)
{
    free(dev);  /* the streams it points to are the context's, kept */
}

bool cs_backend_grant_peer(void *dev, CUdevice peer)
{
    backend_dev *b = dev;
    if (peer < 0 || peer >= 64 || peer == b->device)
        return false;
    uint64_t bit = 1ull << peer;
    return !(__atomic_fetch_or(&b->peers, bit, __ATOMIC_ACQ_REL) & bit);
}

void cs_backend_ungrant_peer(void *dev, CUdevice peer)
{
    backend_dev *b = dev;
    if (peer >= 0 && peer < 64 && peer != b->device)
        __atomic_fetch_and(&b->peers, ~(1ull << peer), __ATOMIC_ACQ_REL);
}
