/* Tests of the fake CUDA driver's virtual memory management, pointer queries and peer access,
 * linked directly against it. test_fake.c tests the rest; these have a file of their own to
 * keep each one readable. */
#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "fake_control.h"

#define KiB 1024ull
#define MiB (1024ull * KiB)
#define GiB (1024ull * MiB)
#define DEFAULT_BYTES (16 * GiB)
#define G (64 * KiB) /* the granularity every test but the first runs with */

static CUcontext g_ctx; /* device 0's primary context, current in every test */

/* ---- fixtures --------------------------------------------------------------------------- */

static int setup(void **state)
{
    (void)state;
    if (cuDevicePrimaryCtxRetain(&g_ctx, 0) != CUDA_SUCCESS)
        return -1;
    if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS)
        return -1;
    fake_set_vmm_granularity(G);
    fake_reset_counters();
    return 0;
}

/* Leave nothing behind: no work, no context, no memory of either kind, the device as at
 * start. */
static int teardown(void **state)
{
    (void)state;
    fake_retire_all();
    int n = 0;
    cuDeviceGetCount(&n);
    for (int d = 0; d < n; d++)
        cuDevicePrimaryCtxReset(d);
    while (cuCtxPopCurrent(NULL) == CUDA_SUCCESS)
        ;
    fake_set_device_count(1);
    fake_set_device_bytes(0, DEFAULT_BYTES);
    fake_set_vmm_supported(1);
    bool clean = fake_live_allocations() == 0 && fake_device_used(0) == 0 &&
                 fake_vmm_allocations() == 0 && fake_vmm_reservations() == 0;
    return clean ? 0 : -1;
}

static int group_setup(void **state)
{
    (void)state;
    return cuInit(0) == CUDA_SUCCESS ? 0 : -1;
}

static int in_child(void (*fn)(void))
{
    pid_t pid = fork();
    if (pid == 0) {
        fn();
        _exit(99);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

/* ---- helpers ---------------------------------------------------------------------------- */

static CUmemAllocationProp prop_on(int dev)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    return p;
}

static CUmemGenericAllocationHandle new_chunk(size_t size, int dev)
{
    CUmemAllocationProp p = prop_on(dev);
    CUmemGenericAllocationHandle h = 0;
    assert_int_equal(cuMemCreate(&h, size, &p, 0), CUDA_SUCCESS);
    return h;
}

static CUdeviceptr new_range(size_t size)
{
    CUdeviceptr p = 0;
    assert_int_equal(cuMemAddressReserve(&p, size, 0, 0, 0), CUDA_SUCCESS);
    return p;
}

static CUmemAccessDesc access_for(int dev, CUmemAccess_flags flags)
{
    CUmemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = dev;
    d.flags = flags;
    return d;
}

static void set_access(CUdeviceptr p, size_t size, int dev, CUmemAccess_flags flags)
{
    CUmemAccessDesc d = access_for(dev, flags);
    assert_int_equal(cuMemSetAccess(p, size, &d, 1), CUDA_SUCCESS);
}

/* Map h at p and give device dev read-write access: usable device memory. */
static void map_rw(CUdeviceptr p, size_t size, CUmemGenericAllocationHandle h, int dev)
{
    assert_int_equal(cuMemMap(p, size, 0, h, 0), CUDA_SUCCESS);
    set_access(p, size, dev, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
}

static CUstream new_stream(unsigned flags)
{
    CUstream s = NULL;
    assert_int_equal(cuStreamCreate(&s, flags), CUDA_SUCCESS);
    return s;
}

static CUevent new_event(void)
{
    CUevent e = NULL;
    assert_int_equal(cuEventCreate(&e, 0), CUDA_SUCCESS);
    return e;
}

/* The fake's touch kernel over [p, p + n) on stream s. */
static CUresult touch(CUstream s, CUdeviceptr p, size_t n)
{
    void *params[] = {&p, &n};
    return cuLaunchKernel(fake_touch_kernel(), 1, 1, 1, 32, 1, 1, 0, s, params, NULL);
}

/* ---- granularity, the device attribute, allocation properties ----------------------------- */

static void test_granularity_and_attribute(void **state)
{
    (void)state;
    int v = -1;
    size_t g = 0;
    CUmemAllocationProp p = prop_on(0);
    assert_int_equal(
        cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0),
        CUDA_SUCCESS);
    assert_int_equal(v, 1);
    fake_set_vmm_granularity(2 * MiB); /* the default, which setup changed */
    assert_int_equal(cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                     CUDA_SUCCESS);
    assert_int_equal(g, 2 * MiB);
    assert_int_equal(
        cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
        CUDA_SUCCESS);
    assert_int_equal(g, 2 * MiB);
    fake_set_vmm_granularity(G);
    assert_int_equal(cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                     CUDA_SUCCESS);
    assert_int_equal(g, G);

    /* What the properties may say. */
    assert_int_equal(cuMemGetAllocationGranularity(NULL, &p, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemGetAllocationGranularity(&g, NULL, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemGetAllocationGranularity(&g, &p, (CUmemAllocationGranularity_flags)7),
                     CUDA_ERROR_INVALID_VALUE);
    p.location.id = 1;
    assert_int_equal(cuMemGetAllocationGranularity(&g, &p, 0), CUDA_ERROR_INVALID_DEVICE);
    p = prop_on(0);
    p.type = CU_MEM_ALLOCATION_TYPE_MANAGED;
    assert_int_equal(cuMemGetAllocationGranularity(&g, &p, 0), CUDA_ERROR_INVALID_VALUE);
    p = prop_on(0);
    p.location.type = CU_MEM_LOCATION_TYPE_HOST;
    assert_int_equal(cuMemGetAllocationGranularity(&g, &p, 0), CUDA_ERROR_NOT_SUPPORTED);
    p = prop_on(0);
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
    assert_int_equal(cuMemGetAllocationGranularity(&g, &p, 0), CUDA_ERROR_NOT_SUPPORTED);
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    assert_int_equal(cuMemGetAllocationGranularity(&g, &p, 0), CUDA_SUCCESS);
    assert_int_equal(fake_calls("cuMemGetAllocationGranularity"), 11);
}

/* cuMemCreate counts against the device exactly like cuMemAlloc. */
static void test_create_and_release(void **state)
{
    (void)state;
    CUmemAllocationProp p = prop_on(0), q;
    CUmemGenericAllocationHandle h = 0, h2 = 0;
    size_t free_b = 0, total = 0;
    assert_int_equal(cuMemCreate(&h, G + 4096, &p, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemCreate(&h, 0, &p, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemCreate(&h, G, &p, 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemCreate(NULL, G, &p, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemCreate(&h, G, NULL, 0), CUDA_ERROR_INVALID_VALUE);
    p.location.id = 3;
    assert_int_equal(cuMemCreate(&h, G, &p, 0), CUDA_ERROR_INVALID_DEVICE);
    assert_int_equal(fake_vmm_allocations(), 0);

    p = prop_on(0);
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    p.allocFlags.usage = 0;
    assert_int_equal(cuMemCreate(&h, 4 * G, &p, 0), CUDA_SUCCESS);
    assert_true(h != 0);
    assert_int_equal(fake_device_used(0), 4 * G);
    assert_int_equal(fake_vmm_allocations(), 1);
    assert_int_equal(fake_live_allocations(), 0); /* cuMemAlloc allocations only */
    assert_int_equal(cuMemGetInfo(&free_b, &total), CUDA_SUCCESS);
    assert_int_equal(free_b, DEFAULT_BYTES - 4 * G);
    assert_int_equal(cuMemGetAllocationPropertiesFromHandle(&q, h), CUDA_SUCCESS);
    assert_int_equal(q.type, CU_MEM_ALLOCATION_TYPE_PINNED);
    assert_int_equal(q.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
    assert_int_equal(q.location.id, 0);
    assert_int_equal(q.requestedHandleTypes, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    assert_int_equal(cuMemGetAllocationPropertiesFromHandle(NULL, h), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemGetAllocationPropertiesFromHandle(&q, 12345),
                     CUDA_ERROR_INVALID_VALUE);

    /* Out of memory when it does not fit, whatever holds the rest. */
    CUdeviceptr a = 0;
    fake_set_device_bytes(0, 8 * G);
    assert_int_equal(cuMemAlloc(&a, 2 * G), CUDA_SUCCESS);
    assert_int_equal(cuMemCreate(&h2, 4 * G, &p, 0), CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(cuMemCreate(&h2, 2 * G, &p, 0), CUDA_SUCCESS);
    CUdeviceptr b = 0;
    assert_int_equal(cuMemAlloc(&b, 1), CUDA_ERROR_OUT_OF_MEMORY); /* full */
    assert_int_equal(cuMemGetInfo(&free_b, &total), CUDA_SUCCESS);
    assert_int_equal(free_b, 0);
    assert_int_equal(cuMemRelease(h2), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(a), CUDA_SUCCESS);
    fake_set_device_bytes(0, DEFAULT_BYTES);

    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(fake_device_used(0), 0);
    assert_int_equal(fake_vmm_allocations(), 0);
    assert_int_equal(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemGetAllocationPropertiesFromHandle(&q, h), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemRelease(0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(fake_calls("cuMemCreate"), 9);
    assert_int_equal(fake_calls("cuMemRelease"), 4);
}

/* ---- reservations and mappings ------------------------------------------------------------ */

static void test_reserve_and_free(void **state)
{
    (void)state;
    CUdeviceptr p = 0, q = 0, r = 0;
    assert_int_equal(cuMemAddressReserve(&p, 4 * G, 0, 0, 0), CUDA_SUCCESS);
    assert_int_equal(p % G, 0);
    assert_int_equal(fake_vmm_reservations(), 1);
    assert_int_equal(fake_device_used(0), 0); /* address space is not memory */
    /* A larger alignment is honoured. */
    assert_int_equal(cuMemAddressReserve(&q, G, 16 * MiB, 0, 0), CUDA_SUCCESS);
    assert_int_equal(q % (16 * MiB), 0);
    assert_int_equal(cuMemAddressFree(q, G), CUDA_SUCCESS);
    /* A free hint is honoured; one that is taken is not. */
    assert_int_equal(cuMemAddressReserve(&r, G, 0, q, 0), CUDA_SUCCESS);
    assert_true(r == q);
    assert_int_equal(cuMemAddressReserve(&q, G, 0, r, 0), CUDA_SUCCESS);
    assert_true(q != r);
    assert_int_equal(cuMemAddressFree(q, G), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(r, G), CUDA_SUCCESS);

    /* What the real driver documents: sizes and hints of whole pages, alignment a power of
     * two, flags 0. */
    assert_int_equal(cuMemAddressReserve(&q, 100, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemAddressReserve(&q, 0, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemAddressReserve(&q, G, 3 * G, 0, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemAddressReserve(&q, G, 0, p + 1, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemAddressReserve(&q, G, 0, 0, 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemAddressReserve(NULL, G, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);

    /* Freed whole, as reserved. */
    assert_int_equal(cuMemAddressFree(p, 2 * G), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemAddressFree(p + G, 3 * G), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemAddressFree(p, 4 * G), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(p, 4 * G), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(fake_vmm_reservations(), 0);
}

static void test_map_rules(void **state)
{
    (void)state;
    CUdeviceptr p = new_range(4 * G);
    CUmemGenericAllocationHandle h = new_chunk(2 * G, 0);
    /* The offset "currently must be zero", as the real driver documents. */
    assert_int_equal(cuMemMap(p, 2 * G, G, h, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemMap(p, 2 * G, 0, h, 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemMap(p + 4096, G, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemMap(p, G + 4096, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemMap(p, 4 * G, 0, h, 0), CUDA_ERROR_INVALID_VALUE); /* past h */
    assert_int_equal(cuMemMap(p + 3 * G, 2 * G, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemMap(p, 2 * G, 0, h + 1, 0), CUDA_ERROR_INVALID_VALUE);
    /* Not in a reservation: a stack address rounded to the granularity. */
    CUdeviceptr stack = (CUdeviceptr)(uintptr_t)&h & ~(CUdeviceptr)(G - 1);
    assert_int_equal(cuMemMap(stack, G, 0, h, 0), CUDA_ERROR_INVALID_VALUE);

    assert_int_equal(cuMemMap(p + G, 2 * G, 0, h, 0), CUDA_SUCCESS);
    /* Never over a mapping. */
    assert_int_equal(cuMemMap(p, 2 * G, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemMap(p + 2 * G, G, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    /* A part of an allocation may be mapped, and one allocation in two places. */
    assert_int_equal(cuMemMap(p, G, 0, h, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemMap(p + 3 * G, G, 0, h, 0), CUDA_SUCCESS);

    /* cuMemUnmap and cuMemSetAccess take whole mappings. */
    CUmemAccessDesc d = access_for(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    assert_int_equal(cuMemUnmap(p + G, G), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemUnmap(p + 2 * G, 2 * G), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemSetAccess(p + G, G, &d, 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemSetAccess(p, 4 * G, &d, 1), CUDA_SUCCESS); /* three at once */
    assert_int_equal(cuMemAddressFree(p, 4 * G), CUDA_ERROR_INVALID_VALUE); /* still mapped */
    assert_int_equal(cuMemUnmap(p, 3 * G), CUDA_SUCCESS); /* two at once */
    assert_int_equal(cuMemUnmap(p, G), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemUnmap(p + 3 * G, G), CUDA_SUCCESS);
    assert_int_equal(cuMemUnmap(p + 3 * G, G), CUDA_ERROR_INVALID_VALUE);
    /* The reservation stays, and maps again. */
    assert_int_equal(cuMemMap(p, 2 * G, 0, h, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemUnmap(p, 2 * G), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(p, 4 * G), CUDA_SUCCESS);
    assert_int_equal(fake_calls("cuMemMap"), 14);
    assert_int_equal(fake_calls("cuMemUnmap"), 7);
}

/* The memory goes when the handle is released and no mapping is left, in either order. */
static void test_release_while_mapped(void **state)
{
    (void)state;
    CUdeviceptr p = new_range(2 * G);
    CUmemGenericAllocationHandle h = new_chunk(G, 0), h2 = 0;
    map_rw(p, G, h, 0);
    assert_int_equal(cuMemsetD8(p, 0x5a, G), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(fake_vmm_allocations(), 1);
    assert_int_equal(fake_device_used(0), G);
    /* The handle is gone, the memory is not. */
    assert_int_equal(cuMemMap(p + G, G, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    unsigned char b = 0;
    assert_int_equal(cuMemcpyDtoH(&b, p + 100, 1), CUDA_SUCCESS);
    assert_int_equal(b, 0x5a);
    /* Any address in the mapping gives the handle back, one reference more. */
    assert_int_equal(cuMemRetainAllocationHandle(&h2, (void *)(uintptr_t)(p + 77)),
                     CUDA_SUCCESS);
    assert_true(h2 == h);
    assert_int_equal(cuMemRetainAllocationHandle(&h2, (void *)(uintptr_t)(p + G)),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemRetainAllocationHandle(NULL, (void *)(uintptr_t)p),
                     CUDA_ERROR_INVALID_VALUE);
    map_rw(p + G, G, h, 0); /* valid again */
    assert_int_equal(cuMemUnmap(p, 2 * G), CUDA_SUCCESS);
    assert_int_equal(fake_vmm_allocations(), 1); /* retained */
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(fake_vmm_allocations(), 0);
    assert_int_equal(fake_device_used(0), 0);

    /* Released first, then the last mapping goes. */
    h = new_chunk(G, 0);
    map_rw(p, G, h, 0);
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(fake_vmm_allocations(), 1);
    assert_int_equal(cuMemUnmap(p, G), CUDA_SUCCESS);
    assert_int_equal(fake_vmm_allocations(), 0);
    assert_int_equal(fake_device_used(0), 0);
    assert_int_equal(cuMemAddressFree(p, 2 * G), CUDA_SUCCESS);
}

/* ---- access: mapped is not enough ------------------------------------------------------- */

static void test_access_and_copies(void **state)
{
    (void)state;
    CUdeviceptr p = new_range(4 * G);
    CUmemGenericAllocationHandle h1 = new_chunk(G, 0), h2 = new_chunk(G, 0);
    unsigned char in[256], out[256];
    memset(in, 0x3c, sizeof in);
    unsigned long long flags = 99;
    CUmemLocation loc = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0};

    /* Mapped without access: not device memory yet. */
    assert_int_equal(cuMemMap(p, G, 0, h1, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemMap(p + G, G, 0, h2, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemGetAccess(&flags, &loc, p), CUDA_SUCCESS);
    assert_int_equal(flags, CU_MEM_ACCESS_FLAGS_PROT_NONE);
    assert_int_equal(cuMemsetD8(p, 1, 16), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemcpyHtoD(p, in, 16), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemcpyDtoH(out, p, 16), CUDA_ERROR_INVALID_VALUE);

    /* Read-only: it may be read, not written. */
    set_access(p, G, 0, CU_MEM_ACCESS_FLAGS_PROT_READ);
    assert_int_equal(cuMemGetAccess(&flags, &loc, p + 5), CUDA_SUCCESS);
    assert_int_equal(flags, CU_MEM_ACCESS_FLAGS_PROT_READ);
    assert_int_equal(cuMemcpyDtoH(out, p, 16), CUDA_SUCCESS);
    assert_int_equal(out[0], 0); /* fresh memory reads as zeros */
    assert_int_equal(cuMemsetD8(p, 1, 16), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemcpyHtoD(p, in, 16), CUDA_ERROR_INVALID_VALUE);

    /* Read-write on both: copies and memsets work, across the two mappings too. */
    set_access(p, 2 * G, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    assert_int_equal(cuMemsetD8(p, 0x11, 2 * G), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyHtoD(p + G - 128, in, 256), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoH(out, p + G - 128, 256), CUDA_SUCCESS);
    assert_memory_equal(in, out, 256);
    assert_int_equal(cuMemcpyDtoD(p, p + G - 128, 256), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoH(out, p, 256), CUDA_SUCCESS);
    assert_memory_equal(in, out, 256);
    CUstream s = new_stream(CU_STREAM_NON_BLOCKING);
    assert_int_equal(cuMemsetD8Async(p + G - 1, 0x22, 2, s), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoHAsync(out, p + G - 1, 2, s), CUDA_SUCCESS);
    assert_int_equal(out[0], 0x22);
    assert_int_equal(out[1], 0x22);
    assert_int_equal(cuStreamSynchronize(s), CUDA_SUCCESS);
    /* Not past the mapped memory, not into a hole, not outside any reservation. */
    assert_int_equal(cuMemsetD8(p + 2 * G - 1, 0, 2), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemcpyDtoH(out, p + 3 * G, 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemcpyDtoD(p + 3 * G, p, 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemcpyHtoDAsync(p + 2 * G, in, 1, s), CUDA_ERROR_INVALID_VALUE);

    /* Two mappings of one allocation see the same bytes. */
    assert_int_equal(cuMemMap(p + 3 * G, G, 0, h1, 0), CUDA_SUCCESS);
    set_access(p + 3 * G, G, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    assert_int_equal(cuMemcpyDtoH(out, p + 3 * G, 256), CUDA_SUCCESS);
    assert_memory_equal(in, out, 256);

    /* cuMemGetAccess: mapped addresses, devices that exist. */
    assert_int_equal(cuMemGetAccess(&flags, &loc, p + 2 * G), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemGetAccess(NULL, &loc, p), CUDA_ERROR_INVALID_VALUE);
    loc.id = 1;
    assert_int_equal(cuMemGetAccess(&flags, &loc, p), CUDA_ERROR_INVALID_DEVICE);
    /* cuMemSetAccess: known flags, device locations, devices that exist. */
    CUmemAccessDesc d = access_for(0, (CUmemAccess_flags)2);
    assert_int_equal(cuMemSetAccess(p, G, &d, 1), CUDA_ERROR_INVALID_VALUE);
    d = access_for(1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    assert_int_equal(cuMemSetAccess(p, G, &d, 1), CUDA_ERROR_INVALID_DEVICE);
    d.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    assert_int_equal(cuMemSetAccess(p, G, &d, 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemSetAccess(p, G, NULL, 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemSetAccess(p, G, &d, 0), CUDA_ERROR_INVALID_VALUE);

    /* Unmapped: no longer device memory, though the reservation stays. */
    assert_int_equal(cuMemUnmap(p, 2 * G), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoH(out, p, 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemsetD8(p + G, 0, 1), CUDA_ERROR_INVALID_VALUE);
    /* A new mapping starts with no access, as the real driver documents. */
    assert_int_equal(cuMemMap(p, G, 0, h2, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoH(out, p, 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemUnmap(p, G), CUDA_SUCCESS);
    assert_int_equal(cuMemUnmap(p + 3 * G, G), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h1), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h2), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(p, 4 * G), CUDA_SUCCESS);
    assert_int_equal(fake_races(), 0);
    assert_int_equal(fake_unmap_faults(), 0);
    cuStreamDestroy(s);
}

/* A kernel faults on what its device may not touch; the launch itself succeeds. */
static void test_kernel_access_faults(void **state)
{
    (void)state;
    CUstream s = new_stream(CU_STREAM_NON_BLOCKING);
    CUdeviceptr p = new_range(4 * G);
    CUmemGenericAllocationHandle h1 = new_chunk(G, 0), h2 = new_chunk(G, 0);
    map_rw(p, G, h1, 0);
    map_rw(p + G, G, h2, 0);
    assert_int_equal(touch(s, p + G - 8, 16), CUDA_SUCCESS); /* across both mappings */
    assert_int_equal(fake_access_faults(), 0);
    /* Into the hole after them, from inside and from the start. */
    assert_int_equal(touch(s, p + 2 * G - 8, 16), CUDA_SUCCESS);
    assert_int_equal(fake_access_faults(), 1);
    assert_int_equal(touch(s, p + 3 * G, 8), CUDA_SUCCESS);
    assert_int_equal(fake_access_faults(), 2);
    /* Read-only or no access for this device. */
    set_access(p + G, G, 0, CU_MEM_ACCESS_FLAGS_PROT_READ);
    assert_int_equal(touch(s, p + G, 8), CUDA_SUCCESS);
    assert_int_equal(fake_access_faults(), 3);
    set_access(p + G, G, 0, CU_MEM_ACCESS_FLAGS_PROT_NONE);
    assert_int_equal(touch(s, p, 2 * G), CUDA_SUCCESS);
    assert_int_equal(fake_access_faults(), 4);
    assert_int_equal(fake_stream_pending(s), 5);
    /* Past the reservation, or where nothing is: refused, as before VMM. */
    assert_int_equal(touch(s, p + 4 * G - 8, 16), CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr stack = (CUdeviceptr)(uintptr_t)&h1;
    assert_int_equal(touch(s, stack, 8), CUDA_ERROR_INVALID_VALUE);
    /* A captured launch does not run: no fault. */
    CUgraph graph = NULL;
    assert_int_equal(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    assert_int_equal(touch(s, p + G, 8), CUDA_SUCCESS);
    assert_int_equal(cuStreamEndCapture(s, &graph), CUDA_SUCCESS);
    assert_int_equal(fake_access_faults(), 4);
    fake_reset_counters();
    assert_int_equal(fake_access_faults(), 0);
    assert_int_equal(cuStreamSynchronize(s), CUDA_SUCCESS);
    assert_int_equal(cuMemUnmap(p, 2 * G), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h1), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h2), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(p, 4 * G), CUDA_SUCCESS);
    assert_int_equal(fake_unmap_faults(), 0);
    cuStreamDestroy(s);
}

/* ---- what crashes a GPU: unmapping under pending work ------------------------------------- */

static void test_unmap_faults(void **state)
{
    (void)state;
    CUstream s = new_stream(CU_STREAM_NON_BLOCKING);
    CUevent e = new_event();
    CUdeviceptr p = new_range(2 * G);
    CUmemGenericAllocationHandle h = new_chunk(G, 0);

    /* Correct use: the work is known to be done before the unmap. */
    map_rw(p, G, h, 0);
    assert_int_equal(touch(s, p, G), CUDA_SUCCESS);
    assert_int_equal(cuEventRecord(e, s), CUDA_SUCCESS);
    assert_int_equal(cuEventSynchronize(e), CUDA_SUCCESS);
    assert_int_equal(cuMemUnmap(p, G), CUDA_SUCCESS);
    map_rw(p, G, h, 0);
    assert_int_equal(cuMemsetD8Async(p, 1, 64, s), CUDA_SUCCESS);
    assert_int_equal(cuStreamSynchronize(s), CUDA_SUCCESS);
    assert_int_equal(cuMemUnmap(p, G), CUDA_SUCCESS);
    assert_int_equal(fake_unmap_faults(), 0);

    /* A kernel still pending: the unmap does not wait, and the GPU would fault. */
    map_rw(p, G, h, 0);
    assert_int_equal(touch(s, p + 100, 8), CUDA_SUCCESS);
    assert_int_equal(cuMemUnmap(p, G), CUDA_SUCCESS);
    assert_int_equal(fake_unmap_faults(), 1);
    assert_int_equal(fake_stream_pending(s), 1); /* and the fake carries on */
    fake_stream_retire(s, -1);

    /* An asynchronous memset and copy, both pending: two faults. */
    unsigned char host[8];
    map_rw(p, G, h, 0);
    assert_int_equal(cuMemsetD8Async(p, 1, 8, s), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoHAsync(host, p, 8, s), CUDA_SUCCESS);
    assert_int_equal(cuMemUnmap(p, G), CUDA_SUCCESS);
    assert_int_equal(fake_unmap_faults(), 3);
    fake_stream_retire(s, -1);

    /* Work through another mapping of the same memory is no fault for this one. */
    CUdeviceptr q = new_range(G);
    map_rw(p, G, h, 0);
    map_rw(q, G, h, 0);
    assert_int_equal(touch(s, q, 8), CUDA_SUCCESS);
    assert_int_equal(cuMemUnmap(p, G), CUDA_SUCCESS);
    assert_int_equal(fake_unmap_faults(), 3);
    /* The unmap that frees a released allocation under pending work. */
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(cuMemUnmap(q, G), CUDA_SUCCESS);
    assert_int_equal(fake_unmap_faults(), 4);
    assert_int_equal(fake_vmm_allocations(), 0);
    fake_stream_retire(s, -1);
    assert_int_equal(cuMemAddressFree(q, G), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(p, 2 * G), CUDA_SUCCESS);
    cuEventDestroy(e);
    cuStreamDestroy(s);
}

/* ---- the race check follows physical memory --------------------------------------------- */

static void test_physical_races(void **state)
{
    (void)state;
    CUstream a = new_stream(CU_STREAM_NON_BLOCKING), b = new_stream(CU_STREAM_NON_BLOCKING);
    CUevent e = new_event();
    CUdeviceptr p = new_range(2 * G), q = new_range(2 * G);
    CUmemGenericAllocationHandle h = new_chunk(G, 0), other = new_chunk(G, 0);

    /* One allocation mapped twice: unordered work through the two addresses races. */
    map_rw(p, G, h, 0);
    map_rw(q, G, h, 0);
    assert_int_equal(touch(a, p + 64, 64), CUDA_SUCCESS);
    assert_int_equal(touch(b, q + 100, 8), CUDA_SUCCESS);
    assert_int_equal(fake_races(), 1);
    /* Other offsets of the same memory do not. */
    assert_int_equal(touch(b, q + 4096, 8), CUDA_SUCCESS);
    assert_int_equal(fake_races(), 1);
    /* Ordered by an event: no race. */
    assert_int_equal(cuEventRecord(e, a), CUDA_SUCCESS);
    assert_int_equal(cuStreamWaitEvent(b, e, 0), CUDA_SUCCESS);
    assert_int_equal(touch(b, q + 64, 64), CUDA_SUCCESS);
    assert_int_equal(fake_races(), 1);
    /* A synchronous copy from the host through the other address races with pending work. */
    unsigned char host[8];
    assert_int_equal(touch(a, p, 8), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoH(host, q, 8), CUDA_SUCCESS);
    assert_int_equal(fake_races(), 2);
    fake_retire_all();
    assert_int_equal(cuMemUnmap(q, G), CUDA_SUCCESS);
    fake_reset_counters();

    /* A chunk moved to another address while work on the old one is pending: the new
     * owner's work races with it (and the unmap itself faults). */
    assert_int_equal(touch(a, p, G), CUDA_SUCCESS);
    assert_int_equal(cuMemUnmap(p, G), CUDA_SUCCESS);
    assert_int_equal(fake_unmap_faults(), 1);
    map_rw(q + G, G, h, 0);
    assert_int_equal(touch(b, q + G + 10, 10), CUDA_SUCCESS);
    assert_int_equal(fake_races(), 1);
    /* Other memory at the old address is other memory: no race. */
    map_rw(p, G, other, 0);
    assert_int_equal(touch(b, p, G), CUDA_SUCCESS);
    assert_int_equal(fake_races(), 1);
    fake_retire_all();
    assert_int_equal(cuMemUnmap(p, G), CUDA_SUCCESS);
    assert_int_equal(cuMemUnmap(q + G, G), CUDA_SUCCESS);
    fake_reset_counters();

    /* The same move done right: fence, wait on the host, unmap, map, and no race. */
    map_rw(p, G, h, 0);
    assert_int_equal(touch(a, p, G), CUDA_SUCCESS);
    assert_int_equal(cuEventRecord(e, a), CUDA_SUCCESS);
    assert_int_equal(cuEventSynchronize(e), CUDA_SUCCESS);
    assert_int_equal(cuMemUnmap(p, G), CUDA_SUCCESS);
    map_rw(q, G, h, 0);
    assert_int_equal(touch(b, q, G), CUDA_SUCCESS);
    assert_int_equal(fake_races(), 0);
    assert_int_equal(fake_unmap_faults(), 0);
    /* And with the proof off, the check can fail: b waits on nothing. */
    fake_set_ignore_stream_waits(1);
    assert_int_equal(cuEventRecord(e, b), CUDA_SUCCESS);
    assert_int_equal(cuStreamWaitEvent(a, e, 0), CUDA_SUCCESS);
    assert_int_equal(touch(a, q, 8), CUDA_SUCCESS);
    assert_int_equal(fake_races(), 1);
    fake_set_ignore_stream_waits(0);
    fake_retire_all();

    assert_int_equal(cuMemUnmap(q, G), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(other), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(p, 2 * G), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(q, 2 * G), CUDA_SUCCESS);
    cuEventDestroy(e);
    cuStreamDestroy(a);
    cuStreamDestroy(b);
}

/* cuMemAlloc memory is still keyed by address: as before VMM. */
static void test_plain_memory_races_unchanged(void **state)
{
    (void)state;
    CUstream a = new_stream(CU_STREAM_NON_BLOCKING), b = new_stream(CU_STREAM_NON_BLOCKING);
    CUdeviceptr x = 0, y = 0;
    assert_int_equal(cuMemAlloc(&x, 4096), CUDA_SUCCESS);
    assert_int_equal(cuMemAlloc(&y, 4096), CUDA_SUCCESS);
    assert_int_equal(touch(a, x, 4096), CUDA_SUCCESS);
    assert_int_equal(touch(b, y, 4096), CUDA_SUCCESS);
    assert_int_equal(fake_races(), 0);
    assert_int_equal(touch(b, x + 4095, 1), CUDA_SUCCESS);
    assert_int_equal(fake_races(), 1);
    fake_retire_all();
    assert_int_equal(cuMemFree(x), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(y), CUDA_SUCCESS);
    cuStreamDestroy(a);
    cuStreamDestroy(b);
}

/* ---- peers ---------------------------------------------------------------------------------- */

static void test_peer_access_calls(void **state)
{
    (void)state;
    int can = -1;
    CUcontext c1 = NULL, c2 = NULL, cur = NULL;
    assert_int_equal(cuDeviceCanAccessPeer(&can, 0, 1), CUDA_ERROR_INVALID_DEVICE);
    fake_set_device_count(2);
    assert_int_equal(cuDeviceCanAccessPeer(&can, 0, 1), CUDA_SUCCESS);
    assert_int_equal(can, 1);
    assert_int_equal(cuDeviceCanAccessPeer(&can, 1, 0), CUDA_SUCCESS);
    assert_int_equal(can, 1);
    assert_int_equal(cuDeviceCanAccessPeer(&can, 1, 1), CUDA_SUCCESS);
    assert_int_equal(can, 0);
    assert_int_equal(cuDeviceCanAccessPeer(NULL, 0, 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuDeviceCanAccessPeer(&can, 0, 2), CUDA_ERROR_INVALID_DEVICE);

    assert_int_equal(cuDevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
    assert_int_equal(cuCtxEnablePeerAccess(c1, 0), CUDA_SUCCESS);
    assert_int_equal(cuCtxEnablePeerAccess(c1, 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    assert_int_equal(cuCtxDisablePeerAccess(c1), CUDA_SUCCESS);
    assert_int_equal(cuCtxDisablePeerAccess(c1), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
    assert_int_equal(cuCtxEnablePeerAccess(c1, 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuCtxEnablePeerAccess(g_ctx, 0), CUDA_ERROR_INVALID_DEVICE); /* itself */
    assert_int_equal(cuCtxEnablePeerAccess((CUcontext)&can, 0), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cuCtxDisablePeerAccess((CUcontext)&can), CUDA_ERROR_INVALID_CONTEXT);
    /* Another context of the same device is no peer either. */
    assert_int_equal(cuCtxCreate(&c2, NULL, 0, 0), CUDA_SUCCESS);
    assert_int_equal(cuCtxPopCurrent(&cur), CUDA_SUCCESS);
    assert_ptr_equal(cur, c2);
    assert_int_equal(cuCtxEnablePeerAccess(c2, 0), CUDA_ERROR_INVALID_DEVICE);
    assert_int_equal(cuCtxDestroy(c2), CUDA_SUCCESS);
    /* A destroyed peer context is not enabled and cannot be. */
    assert_int_equal(cuCtxEnablePeerAccess(c1, 0), CUDA_SUCCESS);
    assert_int_equal(cuDevicePrimaryCtxReset(1), CUDA_SUCCESS);
    assert_int_equal(cuCtxEnablePeerAccess(c1, 0), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cuCtxDisablePeerAccess(c1), CUDA_ERROR_INVALID_CONTEXT);
    /* Without a current context. */
    assert_int_equal(cuDevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
    assert_int_equal(cuCtxPopCurrent(&cur), CUDA_SUCCESS);
    assert_int_equal(cuCtxEnablePeerAccess(c1, 0), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cuCtxPushCurrent(g_ctx), CUDA_SUCCESS);
    /* An injected failure enables nothing. */
    fake_fail_nth("cuCtxEnablePeerAccess", 1, CUDA_ERROR_TOO_MANY_PEERS);
    assert_int_equal(cuCtxEnablePeerAccess(c1, 0), CUDA_ERROR_TOO_MANY_PEERS);
    assert_int_equal(cuCtxDisablePeerAccess(c1), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
    fake_fail_nth("cuDeviceCanAccessPeer", 1, CUDA_ERROR_UNKNOWN);
    assert_int_equal(cuDeviceCanAccessPeer(&can, 0, 1), CUDA_ERROR_UNKNOWN);
    const char *s = NULL;
    assert_int_equal(cuGetErrorName(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, &s), CUDA_SUCCESS);
    assert_string_equal(s, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED");
    assert_int_equal(fake_calls("cuCtxEnablePeerAccess"), 10);
    assert_int_equal(fake_calls("cuCtxDisablePeerAccess"), 5);
}

/* A kernel on device 1 touching device 0's memory: cuMemAlloc memory needs peer access from
 * its context; VMM memory needs cuMemSetAccess for device 1, and peer access does not give
 * it. */
static void test_peer_kernels_and_copies(void **state)
{
    (void)state;
    fake_set_device_count(2);
    CUcontext c1 = NULL;
    CUdeviceptr x = 0, y = 0;
    unsigned char buf[16] = {0};
    assert_int_equal(cuMemAlloc(&x, 4096), CUDA_SUCCESS); /* device 0 */
    CUdeviceptr p = new_range(G);
    CUmemGenericAllocationHandle h = new_chunk(G, 0);
    map_rw(p, G, h, 0);
    assert_int_equal(cuDevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
    assert_int_equal(cuCtxPushCurrent(c1), CUDA_SUCCESS);
    assert_int_equal(cuMemAlloc(&y, 4096), CUDA_SUCCESS); /* device 1 */

    assert_int_equal(touch(NULL, y, 16), CUDA_SUCCESS); /* its own: fine */
    assert_int_equal(fake_access_faults(), 0);
    assert_int_equal(touch(NULL, x, 16), CUDA_SUCCESS);
    assert_int_equal(fake_access_faults(), 1);
    assert_int_equal(touch(NULL, p, 16), CUDA_SUCCESS);
    assert_int_equal(fake_access_faults(), 2);

    assert_int_equal(cuCtxEnablePeerAccess(g_ctx, 0), CUDA_SUCCESS);
    assert_int_equal(touch(NULL, x, 16), CUDA_SUCCESS);
    assert_int_equal(fake_access_faults(), 2);
    assert_int_equal(touch(NULL, p, 16), CUDA_SUCCESS); /* peer access is not VMM access */
    assert_int_equal(fake_access_faults(), 3);
    /* VMM copies need access too; cuMemAlloc copies between devices never need peers. */
    assert_int_equal(cuMemcpyDtoH(buf, p, 16), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemcpyDtoD(y, x, 16), CUDA_SUCCESS);

    set_access(p, G, 1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    assert_int_equal(touch(NULL, p, 16), CUDA_SUCCESS);
    assert_int_equal(fake_access_faults(), 3);
    assert_int_equal(cuMemcpyDtoH(buf, p, 16), CUDA_SUCCESS);
    unsigned long long flags = 0;
    CUmemLocation loc = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 1};
    assert_int_equal(cuMemGetAccess(&flags, &loc, p), CUDA_SUCCESS);
    assert_int_equal(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    /* Device 0's access is its own. */
    loc.id = 0;
    assert_int_equal(cuMemGetAccess(&flags, &loc, p), CUDA_SUCCESS);
    assert_int_equal(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    set_access(p, G, 0, CU_MEM_ACCESS_FLAGS_PROT_NONE);
    assert_int_equal(touch(NULL, p, 16), CUDA_SUCCESS);
    assert_int_equal(fake_access_faults(), 3);

    assert_int_equal(cuCtxDisablePeerAccess(g_ctx), CUDA_SUCCESS);
    assert_int_equal(touch(NULL, x, 16), CUDA_SUCCESS);
    assert_int_equal(fake_access_faults(), 4);
    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(y), CUDA_SUCCESS);
    assert_int_equal(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(x), CUDA_SUCCESS);
    assert_int_equal(cuMemUnmap(p, G), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(p, G), CUDA_SUCCESS);
    assert_int_equal(fake_races(), 0);
    assert_int_equal(fake_unmap_faults(), 0);
}

/* ---- pointer queries ------------------------------------------------------------------------ */

static unsigned attr_uint(CUpointer_attribute a, CUdeviceptr p)
{
    unsigned v = 0xdeadbeef;
    assert_int_equal(cuPointerGetAttribute(&v, a, p), CUDA_SUCCESS);
    return v;
}

static unsigned long long attr_u64(CUpointer_attribute a, CUdeviceptr p)
{
    unsigned long long v = 0xdeadbeef;
    assert_int_equal(cuPointerGetAttribute(&v, a, p), CUDA_SUCCESS);
    return v;
}

static void *attr_ptr(CUpointer_attribute a, CUdeviceptr p)
{
    void *v = (void *)&v;
    assert_int_equal(cuPointerGetAttribute(&v, a, p), CUDA_SUCCESS);
    return v;
}

static size_t attr_size(CUpointer_attribute a, CUdeviceptr p)
{
    size_t v = 12345;
    assert_int_equal(cuPointerGetAttribute(&v, a, p), CUDA_SUCCESS);
    return v;
}

static void test_address_range(void **state)
{
    (void)state;
    CUdeviceptr x = 0, base = 0, p = new_range(4 * G);
    size_t size = 0;
    CUmemGenericAllocationHandle h1 = new_chunk(G, 0), h2 = new_chunk(2 * G, 0);
    assert_int_equal(cuMemAlloc(&x, 1000), CUDA_SUCCESS);
    map_rw(p, G, h1, 0);
    map_rw(p + G, 2 * G, h2, 0);
    /* cuMemAlloc memory: the allocation. */
    assert_int_equal(cuMemGetAddressRange(&base, &size, x + 999), CUDA_SUCCESS);
    assert_true(base == x);
    assert_int_equal(size, 1000);
    assert_int_equal(cuMemGetAddressRange(&base, &size, x + 1000), CUDA_ERROR_NOT_FOUND);
    /* VMM memory: the one mapping, not the reservation nor its neighbours. */
    assert_int_equal(cuMemGetAddressRange(&base, &size, p + G + 5), CUDA_SUCCESS);
    assert_true(base == p + G);
    assert_int_equal(size, 2 * G);
    assert_int_equal(cuMemGetAddressRange(&base, NULL, p + G - 1), CUDA_SUCCESS);
    assert_true(base == p);
    assert_int_equal(cuMemGetAddressRange(NULL, &size, p), CUDA_SUCCESS);
    assert_int_equal(size, G);
    /* Mapped without access is still a mapping. */
    set_access(p, G, 0, CU_MEM_ACCESS_FLAGS_PROT_NONE);
    assert_int_equal(cuMemGetAddressRange(&base, &size, p), CUDA_SUCCESS);
    /* Reserved, not mapped; nothing at all. */
    assert_int_equal(cuMemGetAddressRange(&base, &size, p + 3 * G), CUDA_ERROR_NOT_FOUND);
    assert_int_equal(cuMemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)&size),
                     CUDA_ERROR_NOT_FOUND);
    /* A context is needed, as on the real driver. */
    CUcontext c = NULL;
    assert_int_equal(cuCtxPopCurrent(&c), CUDA_SUCCESS);
    assert_int_equal(cuMemGetAddressRange(&base, &size, x), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cuCtxPushCurrent(c), CUDA_SUCCESS);
    assert_int_equal(cuMemUnmap(p, 3 * G), CUDA_SUCCESS);
    assert_int_equal(cuMemGetAddressRange(&base, &size, p + G), CUDA_ERROR_NOT_FOUND);
    assert_int_equal(cuMemRelease(h1), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h2), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(p, 4 * G), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(x), CUDA_SUCCESS);
}

/* The 32-bit original can only name memory below 4 GiB: a reservation placed there. */
static void test_address_range_v1(void **state)
{
    (void)state;
    typedef CUresult (*range_v1_t)(unsigned int *, unsigned int *, unsigned int);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    range_v1_t range_v1 = (range_v1_t)(uintptr_t)dlsym(lib, "cuMemGetAddressRange");
    assert_non_null(range_v1);
    void *fn = NULL;
    assert_int_equal(cuGetProcAddress("cuMemGetAddressRange", &fn, 3010, 0, NULL),
                     CUDA_SUCCESS);
    assert_ptr_equal(fn, (void *)(uintptr_t)range_v1);
    unsigned int base = 0, size = 0;
    CUdeviceptr x = 0;
    assert_int_equal(cuMemAlloc(&x, 64), CUDA_SUCCESS);
    assert_int_equal(range_v1(&base, &size, (unsigned int)x), CUDA_ERROR_NOT_FOUND);

    /* An address below 4 GiB that is free now (checked by mapping it ourselves first). */
    const CUdeviceptr low = 0x20000000;
    void *probe = mmap((void *)(uintptr_t)low, 2 * G, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (probe != (void *)(uintptr_t)low)
        skip();
    munmap(probe, 2 * G);
    CUdeviceptr p = 0;
    assert_int_equal(cuMemAddressReserve(&p, 2 * G, 0, low, 0), CUDA_SUCCESS);
    assert_true(p == low);
    CUmemGenericAllocationHandle h = new_chunk(G, 0);
    map_rw(p + G, G, h, 0);
    assert_int_equal(range_v1(&base, &size, (unsigned int)(p + G + 7)), CUDA_SUCCESS);
    assert_int_equal(base, (unsigned int)(p + G));
    assert_int_equal(size, G);
    assert_int_equal(range_v1(&base, &size, (unsigned int)p), CUDA_ERROR_NOT_FOUND);
    assert_int_equal(fake_calls("cuMemGetAddressRange"), 3);
    assert_int_equal(fake_calls("cuMemGetAddressRange_v2"), 0);
    assert_int_equal(cuMemUnmap(p + G, G), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(p, 2 * G), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(x), CUDA_SUCCESS);
    dlclose(lib);
}

static void test_pointer_attributes_plain(void **state)
{
    (void)state;
    CUdeviceptr x = 0, y = 0;
    assert_int_equal(cuMemAlloc(&x, 3000), CUDA_SUCCESS);
    assert_int_equal(cuMemAlloc(&y, 10), CUDA_SUCCESS);
    CUdeviceptr in = x + 1234;
    assert_ptr_equal(attr_ptr(CU_POINTER_ATTRIBUTE_CONTEXT, in), g_ctx);
    assert_int_equal(attr_uint(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, in), CU_MEMORYTYPE_DEVICE);
    assert_true(attr_u64(CU_POINTER_ATTRIBUTE_DEVICE_POINTER, in) == in);
    void *hp = NULL;
    assert_int_equal(cuPointerGetAttribute(&hp, CU_POINTER_ATTRIBUTE_HOST_POINTER, in),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(attr_uint(CU_POINTER_ATTRIBUTE_IS_MANAGED, in), 0);
    int ordinal = -1;
    assert_int_equal(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, in),
                     CUDA_SUCCESS);
    assert_int_equal(ordinal, 0);
    assert_int_equal(attr_uint(CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, in), 1);
    assert_true(attr_u64(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, in) == x);
    assert_int_equal(attr_size(CU_POINTER_ATTRIBUTE_RANGE_SIZE, in), 3000);
    assert_int_equal(attr_uint(CU_POINTER_ATTRIBUTE_MAPPED, in), 1);
    assert_int_equal(attr_uint(CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, in), 0);
    assert_int_equal(attr_uint(CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, in), 0);
    assert_int_equal(attr_uint(CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, in),
                     CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE);
    assert_null(attr_ptr(CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, in));
    assert_ptr_equal(attr_ptr(CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, in), (void *)(uintptr_t)x);
    assert_int_equal(attr_size(CU_POINTER_ATTRIBUTE_MAPPING_SIZE, in), 3000);
    assert_int_equal(attr_uint(CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE, in), 0);

    /* Buffer ids: one per allocation, never reused, even at the same address. */
    unsigned long long idx = attr_u64(CU_POINTER_ATTRIBUTE_BUFFER_ID, in);
    assert_true(idx == attr_u64(CU_POINTER_ATTRIBUTE_BUFFER_ID, x));
    assert_true(idx == attr_u64(CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, x));
    assert_true(idx != attr_u64(CU_POINTER_ATTRIBUTE_BUFFER_ID, y));
    assert_int_equal(cuMemFree(x), CUDA_SUCCESS);
    CUdeviceptr again = 0;
    assert_int_equal(cuMemAlloc(&again, 3000), CUDA_SUCCESS);
    assert_true(attr_u64(CU_POINTER_ATTRIBUTE_BUFFER_ID, again) != idx);

    /* What the fake does not know, or does not model. */
    unsigned v = 7;
    assert_int_equal(cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, y + 10),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_MAPPED,
                                           (CUdeviceptr)(uintptr_t)&v),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(v, 7);
    assert_int_equal(cuPointerGetAttribute(NULL, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, y),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuPointerGetAttribute(&v, (CUpointer_attribute)99, y),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, y),
                     CUDA_ERROR_NOT_SUPPORTED);
    /* The device pointer and the access flags are for the current context. */
    CUcontext c = NULL;
    CUdeviceptr dp = 0;
    assert_int_equal(cuCtxPopCurrent(&c), CUDA_SUCCESS);
    assert_int_equal(cuPointerGetAttribute(&dp, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, y),
                     CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, y),
                     CUDA_ERROR_INVALID_CONTEXT);
    assert_ptr_equal(attr_ptr(CU_POINTER_ATTRIBUTE_CONTEXT, y), c);
    assert_int_equal(cuCtxPushCurrent(c), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(y), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(again), CUDA_SUCCESS);
}

static void test_pointer_attributes_vmm(void **state)
{
    (void)state;
    CUdeviceptr p = new_range(8 * G), q = new_range(G);
    CUmemAllocationProp prop = prop_on(0);
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUmemGenericAllocationHandle h = 0, h2 = new_chunk(G, 0);
    assert_int_equal(cuMemCreate(&h, 2 * G, &prop, 0), CUDA_SUCCESS);
    map_rw(p + 2 * G, 2 * G, h, 0);
    map_rw(p + 4 * G, G, h2, 0);
    CUdeviceptr in = p + 3 * G + 17;

    assert_null(attr_ptr(CU_POINTER_ATTRIBUTE_CONTEXT, in));
    assert_int_equal(attr_uint(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, in), CU_MEMORYTYPE_DEVICE);
    assert_true(attr_u64(CU_POINTER_ATTRIBUTE_DEVICE_POINTER, in) == in);
    void *hp = NULL;
    assert_int_equal(cuPointerGetAttribute(&hp, CU_POINTER_ATTRIBUTE_HOST_POINTER, in),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(attr_uint(CU_POINTER_ATTRIBUTE_IS_MANAGED, in), 0);
    assert_int_equal(attr_uint(CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, in), 0);
    /* The range is the whole reservation; the mapping is asked for separately. */
    assert_true(attr_u64(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, in) == p);
    assert_int_equal(attr_size(CU_POINTER_ATTRIBUTE_RANGE_SIZE, in), 8 * G);
    assert_ptr_equal(attr_ptr(CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, in),
                     (void *)(uintptr_t)(p + 2 * G));
    assert_int_equal(attr_size(CU_POINTER_ATTRIBUTE_MAPPING_SIZE, in), 2 * G);
    assert_int_equal(attr_uint(CU_POINTER_ATTRIBUTE_MAPPED, in), 1);
    assert_int_equal(attr_uint(CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, in),
                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    assert_int_equal(attr_uint(CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, p + 4 * G), 0);
    assert_int_equal(attr_uint(CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, in), 0);
    assert_null(attr_ptr(CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, in));
    assert_true(attr_u64(CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, in) == h);
    assert_int_equal(attr_uint(CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, in),
                     CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE);
    set_access(p + 2 * G, 2 * G, 0, CU_MEM_ACCESS_FLAGS_PROT_READ);
    assert_int_equal(attr_uint(CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, in),
                     CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ);

    /* Buffer ids: per mapping, so two mappings of one chunk differ, and a new mapping of
     * the same chunk at the same address is a new buffer. */
    unsigned long long id = attr_u64(CU_POINTER_ATTRIBUTE_BUFFER_ID, in);
    assert_true(id == attr_u64(CU_POINTER_ATTRIBUTE_BUFFER_ID, p + 2 * G));
    assert_true(id != attr_u64(CU_POINTER_ATTRIBUTE_BUFFER_ID, p + 4 * G));
    map_rw(q, G, h, 0);
    assert_true(id != attr_u64(CU_POINTER_ATTRIBUTE_BUFFER_ID, q));
    assert_true(attr_u64(CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, q) == h);
    assert_int_equal(cuMemUnmap(p + 2 * G, 2 * G), CUDA_SUCCESS);
    map_rw(p + 2 * G, 2 * G, h, 0);
    assert_true(id != attr_u64(CU_POINTER_ATTRIBUTE_BUFFER_ID, in));

    /* Reserved, not mapped: the reservation, and MAPPED 0; nothing else applies. */
    CUdeviceptr hole = p + 6 * G;
    assert_true(attr_u64(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, hole) == p);
    assert_int_equal(attr_size(CU_POINTER_ATTRIBUTE_RANGE_SIZE, hole), 8 * G);
    assert_int_equal(attr_uint(CU_POINTER_ATTRIBUTE_MAPPED, hole), 0);
    unsigned v = 7;
    assert_int_equal(cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, hole),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_BUFFER_ID, hole),
                     CUDA_ERROR_INVALID_VALUE);

    assert_int_equal(cuMemUnmap(p + 2 * G, 3 * G), CUDA_SUCCESS);
    assert_int_equal(cuMemUnmap(q, G), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h2), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(p, 8 * G), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(q, G), CUDA_SUCCESS);
}

/* The cudart set of attributes and the range, in one call, for each kind of pointer. */
struct attrs {
    CUcontext ctx;
    unsigned type;
    CUdeviceptr dev;
    void *host;
    unsigned managed;
    int ordinal;
    CUdeviceptr start;
    size_t size;
    unsigned mapped, legacy_ipc;
    unsigned long long buffer;
};

static CUresult get_all(CUdeviceptr p, struct attrs *a)
{
    memset(a, 0xa5, sizeof *a); /* so that every field written is seen */
    CUpointer_attribute which[] = {
        CU_POINTER_ATTRIBUTE_CONTEXT,         CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        CU_POINTER_ATTRIBUTE_DEVICE_POINTER,  CU_POINTER_ATTRIBUTE_HOST_POINTER,
        CU_POINTER_ATTRIBUTE_IS_MANAGED,      CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        CU_POINTER_ATTRIBUTE_MAPPED,          CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
        CU_POINTER_ATTRIBUTE_BUFFER_ID,
    };
    void *data[] = {&a->ctx,     &a->type,  &a->dev,   &a->host,   &a->managed, &a->ordinal,
                    &a->start,   &a->size,  &a->mapped, &a->legacy_ipc, &a->buffer};
    return cuPointerGetAttributes(sizeof which / sizeof which[0], which, data, p);
}

static void test_pointer_attributes_plural(void **state)
{
    (void)state;
    struct attrs a;
    CUdeviceptr x = 0, p = new_range(4 * G);
    CUmemGenericAllocationHandle h = new_chunk(G, 0);
    assert_int_equal(cuMemAlloc(&x, 100), CUDA_SUCCESS);
    map_rw(p, G, h, 0);

    /* cuMemAlloc memory: the host pointer of device memory is NULL here, not an error. */
    assert_int_equal(get_all(x + 5, &a), CUDA_SUCCESS);
    assert_ptr_equal(a.ctx, g_ctx);
    assert_int_equal(a.type, CU_MEMORYTYPE_DEVICE);
    assert_true(a.dev == x + 5);
    assert_null(a.host);
    assert_int_equal(a.managed, 0);
    assert_int_equal(a.ordinal, 0);
    assert_true(a.start == x);
    assert_int_equal(a.size, 100);
    assert_int_equal(a.mapped, 1);
    assert_int_equal(a.legacy_ipc, 1);
    assert_true(a.buffer == attr_u64(CU_POINTER_ATTRIBUTE_BUFFER_ID, x));

    /* VMM memory. */
    assert_int_equal(get_all(p + 9, &a), CUDA_SUCCESS);
    assert_null(a.ctx);
    assert_int_equal(a.type, CU_MEMORYTYPE_DEVICE);
    assert_true(a.dev == p + 9);
    assert_null(a.host);
    assert_int_equal(a.ordinal, 0);
    assert_true(a.start == p);
    assert_int_equal(a.size, 4 * G);
    assert_int_equal(a.mapped, 1);
    assert_int_equal(a.legacy_ipc, 0);
    assert_true(a.buffer == attr_u64(CU_POINTER_ATTRIBUTE_BUFFER_ID, p));

    /* Reserved, not mapped: the range and MAPPED 0, the rest zeros. */
    assert_int_equal(get_all(p + 2 * G, &a), CUDA_SUCCESS);
    assert_true(a.start == p);
    assert_int_equal(a.size, 4 * G);
    assert_int_equal(a.mapped, 0);
    assert_null(a.ctx);
    assert_int_equal(a.type, 0);
    assert_true(a.dev == 0);
    assert_int_equal(a.buffer, 0);

    /* Not a CUDA pointer: success, MEMORY_TYPE 0, CONTEXT NULL, zeros, as documented. */
    int on_stack = 0;
    assert_int_equal(get_all((CUdeviceptr)(uintptr_t)&on_stack, &a), CUDA_SUCCESS);
    assert_null(a.ctx);
    assert_int_equal(a.type, 0);
    assert_true(a.dev == 0);
    assert_null(a.host);
    assert_int_equal(a.managed, 0);
    assert_int_equal(a.ordinal, 0);
    assert_true(a.start == 0);
    assert_int_equal(a.size, 0);
    assert_int_equal(a.mapped, 0);
    assert_int_equal(a.legacy_ipc, 0);
    assert_int_equal(a.buffer, 0);

    /* What the call itself refuses. */
    CUpointer_attribute bad[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUpointer_attribute)99};
    CUpointer_attribute p2p[] = {CU_POINTER_ATTRIBUTE_P2P_TOKENS};
    unsigned v1 = 0, v2 = 0;
    void *data[] = {&v1, &v2};
    assert_int_equal(cuPointerGetAttributes(2, bad, data, x), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuPointerGetAttributes(1, p2p, data, x), CUDA_ERROR_NOT_SUPPORTED);
    assert_int_equal(cuPointerGetAttributes(0, bad, data, x), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuPointerGetAttributes(1, bad, NULL, x), CUDA_ERROR_INVALID_VALUE);
    void *null_data[] = {NULL};
    assert_int_equal(cuPointerGetAttributes(1, bad, null_data, x), CUDA_ERROR_INVALID_VALUE);

    assert_int_equal(cuMemUnmap(p, G), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(p, 4 * G), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(x), CUDA_SUCCESS);
}

/* ACCESS_FLAGS and DEVICE_ORDINAL from another device's context. */
static void test_pointer_attributes_peers(void **state)
{
    (void)state;
    fake_set_device_count(2);
    CUcontext c1 = NULL;
    CUdeviceptr x = 0, p = new_range(G);
    CUmemGenericAllocationHandle h = new_chunk(G, 1);
    assert_int_equal(cuMemAlloc(&x, 64), CUDA_SUCCESS);
    map_rw(p, G, h, 1);
    assert_int_equal(attr_uint(CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, p),
                     CU_POINTER_ATTRIBUTE_ACCESS_FLAG_NONE); /* device 0 was given none */
    int ordinal = -1;
    assert_int_equal(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p),
                     CUDA_SUCCESS);
    assert_int_equal(ordinal, 1);
    assert_int_equal(cuDevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
    assert_int_equal(cuCtxPushCurrent(c1), CUDA_SUCCESS);
    assert_int_equal(attr_uint(CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, p),
                     CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE);
    assert_int_equal(attr_uint(CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, x),
                     CU_POINTER_ATTRIBUTE_ACCESS_FLAG_NONE);
    assert_int_equal(cuCtxEnablePeerAccess(g_ctx, 0), CUDA_SUCCESS);
    assert_int_equal(attr_uint(CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, x),
                     CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE);
    assert_ptr_equal(attr_ptr(CU_POINTER_ATTRIBUTE_CONTEXT, x), g_ctx);
    assert_int_equal(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
    assert_int_equal(fake_device_used(1), G);
    assert_int_equal(cuMemUnmap(p, G), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(fake_device_used(1), 0);
    assert_int_equal(cuMemAddressFree(p, G), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(x), CUDA_SUCCESS);
}

/* ---- IPC handles ---------------------------------------------------------------------------- */

static CUipcMemHandle g_child_handle;

static void child_open_parents_handle(void)
{
    CUdeviceptr q = 0;
    _exit(cuIpcOpenMemHandle(&q, g_child_handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) ==
                  CUDA_ERROR_NOT_SUPPORTED
              ? 0
              : 1);
}

static void test_ipc_handles(void **state)
{
    (void)state;
    CUipcMemHandle a, b, junk;
    CUdeviceptr x = 0, q = 0, p = new_range(G);
    CUmemGenericAllocationHandle h = new_chunk(G, 0);
    map_rw(p, G, h, 0);
    assert_int_equal(cuMemAlloc(&x, 4096), CUDA_SUCCESS);
    assert_int_equal(cuIpcGetMemHandle(&a, x), CUDA_SUCCESS);
    assert_int_equal(cuIpcGetMemHandle(&b, x), CUDA_SUCCESS);
    assert_memory_equal(&a, &b, sizeof a); /* lightweight, repeatable */
    /* The base of a cuMemAlloc allocation only: not inside one, not VMM memory. */
    assert_int_equal(cuIpcGetMemHandle(&b, x + 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuIpcGetMemHandle(&b, p), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuIpcGetMemHandle(&b, (CUdeviceptr)(uintptr_t)&b), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuIpcGetMemHandle(NULL, x), CUDA_ERROR_INVALID_VALUE);

    /* Not in the process that made it. */
    assert_int_equal(cuIpcOpenMemHandle(&q, a, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                     CUDA_ERROR_INVALID_CONTEXT);
    typedef CUresult (*open_v1_t)(CUdeviceptr *, CUipcMemHandle, unsigned int);
    open_v1_t open_v1 = (open_v1_t)(uintptr_t)fake_real_symbol("cuIpcOpenMemHandle");
    assert_non_null(open_v1);
    assert_int_equal(open_v1(&q, a, 0), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cuIpcOpenMemHandle(&q, a, 2), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuIpcOpenMemHandle(NULL, a, 0), CUDA_ERROR_INVALID_VALUE);
    memset(&junk, 0x5c, sizeof junk);
    assert_int_equal(cuIpcOpenMemHandle(&q, junk, 0), CUDA_ERROR_INVALID_VALUE);
    g_child_handle = a;
    assert_int_equal(in_child(child_open_parents_handle), 0);
    /* Nothing was opened, so nothing closes. */
    assert_int_equal(cuIpcCloseMemHandle(x), CUDA_ERROR_INVALID_VALUE);
    assert_true(q == 0);

    /* A new allocation at the same address gets a new handle. */
    assert_int_equal(cuMemFree(x), CUDA_SUCCESS);
    CUdeviceptr y = 0;
    assert_int_equal(cuMemAlloc(&y, 4096), CUDA_SUCCESS);
    assert_int_equal(cuIpcGetMemHandle(&b, y), CUDA_SUCCESS);
    assert_memory_not_equal(&a, &b, sizeof a);

    CUcontext c = NULL;
    assert_int_equal(cuCtxPopCurrent(&c), CUDA_SUCCESS);
    assert_int_equal(cuIpcGetMemHandle(&b, y), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cuIpcOpenMemHandle(&q, b, 0), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cuIpcCloseMemHandle(y), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cuCtxPushCurrent(c), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(y), CUDA_SUCCESS);
    assert_int_equal(cuMemUnmap(p, G), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(p, G), CUDA_SUCCESS);
    assert_int_equal(fake_calls("cuIpcOpenMemHandle_v2"), 5); /* the child's is its own */
    assert_int_equal(fake_calls("cuIpcOpenMemHandle"), 1);
}

/* Injected failures of the queries: the failure, counted, and nothing written. */
static void test_query_injection(void **state)
{
    (void)state;
    CUdeviceptr x = 0, base = 0;
    size_t size = 0;
    unsigned v = 7;
    CUipcMemHandle ipc;
    memset(&ipc, 0, sizeof ipc);
    assert_int_equal(cuMemAlloc(&x, 64), CUDA_SUCCESS);
    fake_fail_nth("cuMemGetAddressRange_v2", 1, CUDA_ERROR_UNKNOWN);
    assert_int_equal(cuMemGetAddressRange(&base, &size, x), CUDA_ERROR_UNKNOWN);
    assert_true(base == 0);
    fake_fail_nth("cuPointerGetAttribute", 1, CUDA_ERROR_UNKNOWN);
    assert_int_equal(cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_MAPPED, x),
                     CUDA_ERROR_UNKNOWN);
    CUpointer_attribute which[] = {CU_POINTER_ATTRIBUTE_MAPPED};
    void *data[] = {&v};
    fake_fail_nth("cuPointerGetAttributes", 1, CUDA_ERROR_UNKNOWN);
    assert_int_equal(cuPointerGetAttributes(1, which, data, x), CUDA_ERROR_UNKNOWN);
    assert_int_equal(v, 7);
    fake_fail_nth("cuIpcGetMemHandle", 1, CUDA_ERROR_MAP_FAILED);
    assert_int_equal(cuIpcGetMemHandle(&ipc, x), CUDA_ERROR_MAP_FAILED);
    fake_fail_nth("cuIpcCloseMemHandle", 1, CUDA_ERROR_MAP_FAILED);
    assert_int_equal(cuIpcCloseMemHandle(x), CUDA_ERROR_MAP_FAILED);
    CUdeviceptr q = 0;
    fake_fail_nth("cuIpcOpenMemHandle_v2", 1, CUDA_ERROR_TOO_MANY_PEERS);
    assert_int_equal(cuIpcOpenMemHandle(&q, ipc, 0), CUDA_ERROR_TOO_MANY_PEERS);
    typedef CUresult (*open_v1_t)(CUdeviceptr *, CUipcMemHandle, unsigned int);
    open_v1_t open_v1 = (open_v1_t)(uintptr_t)fake_real_symbol("cuIpcOpenMemHandle");
    fake_fail_nth("cuIpcOpenMemHandle", 1, CUDA_ERROR_TOO_MANY_PEERS);
    assert_int_equal(open_v1(&q, ipc, 0), CUDA_ERROR_TOO_MANY_PEERS);
    assert_true(q == 0);
    typedef CUresult (*range_v1_t)(unsigned int *, unsigned int *, unsigned int);
    range_v1_t range_v1 = (range_v1_t)(uintptr_t)fake_real_symbol("cuMemGetAddressRange");
    unsigned int b32 = 0, s32 = 0;
    fake_fail_nth("cuMemGetAddressRange", 1, CUDA_ERROR_UNKNOWN);
    assert_int_equal(range_v1(&b32, &s32, 0x1000), CUDA_ERROR_UNKNOWN);
    assert_int_equal(range_v1(&b32, &s32, 0x1000), CUDA_ERROR_NOT_FOUND);
    fake_set_device_count(2);
    CUcontext c1 = NULL;
    assert_int_equal(cuDevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
    assert_int_equal(cuCtxEnablePeerAccess(c1, 0), CUDA_SUCCESS);
    fake_fail_nth("cuCtxDisablePeerAccess", 1, CUDA_ERROR_UNKNOWN);
    assert_int_equal(cuCtxDisablePeerAccess(c1), CUDA_ERROR_UNKNOWN);
    assert_int_equal(cuCtxEnablePeerAccess(c1, 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    assert_int_equal(cuCtxDisablePeerAccess(c1), CUDA_SUCCESS);

    assert_int_equal(cuPointerGetAttributes(1, which, data, x), CUDA_SUCCESS);
    assert_int_equal(v, 1);
    assert_int_equal(fake_calls("cuPointerGetAttributes"), 2);
    assert_int_equal(fake_calls("cuPointerGetAttribute"), 1);
    assert_int_equal(fake_calls("cuIpcOpenMemHandle_v2"), 1);
    assert_int_equal(fake_calls("cuIpcOpenMemHandle"), 1);
    assert_int_equal(fake_calls("cuMemGetAddressRange"), 2);
    assert_int_equal(cuMemFree(x), CUDA_SUCCESS);
}

/* ---- VMM off ------------------------------------------------------------------------------- */

struct vmm_call {
    const char *name;
    CUresult (*call)(void);
};

static CUresult c_granularity(void)
{
    size_t g;
    CUmemAllocationProp p = prop_on(0);
    return cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
}
static CUresult c_create(void)
{
    CUmemGenericAllocationHandle h;
    CUmemAllocationProp p = prop_on(0);
    CUresult rc = cuMemCreate(&h, G, &p, 0);
    if (rc == CUDA_SUCCESS)
        cuMemRelease(h);
    return rc;
}
static CUresult c_release(void) { return cuMemRelease(1); }
static CUresult c_props(void)
{
    CUmemAllocationProp p;
    return cuMemGetAllocationPropertiesFromHandle(&p, 1);
}
static CUresult c_retain(void)
{
    CUmemGenericAllocationHandle h;
    return cuMemRetainAllocationHandle(&h, &h);
}
static CUresult c_reserve(void)
{
    CUdeviceptr p;
    CUresult rc = cuMemAddressReserve(&p, G, 0, 0, 0);
    if (rc == CUDA_SUCCESS)
        cuMemAddressFree(p, G);
    return rc;
}
static CUresult c_address_free(void) { return cuMemAddressFree(G, G); }
static CUresult c_map(void) { return cuMemMap(G, G, 0, 1, 0); }
static CUresult c_unmap(void) { return cuMemUnmap(G, G); }
static CUresult c_set_access(void)
{
    CUmemAccessDesc d = access_for(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    return cuMemSetAccess(G, G, &d, 1);
}
static CUresult c_get_access(void)
{
    unsigned long long f;
    CUmemLocation loc = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0};
    return cuMemGetAccess(&f, &loc, G);
}

static const struct vmm_call g_vmm_calls[] = {
    {"cuMemGetAllocationGranularity", c_granularity},
    {"cuMemCreate", c_create},
    {"cuMemRelease", c_release},
    {"cuMemGetAllocationPropertiesFromHandle", c_props},
    {"cuMemRetainAllocationHandle", c_retain},
    {"cuMemAddressReserve", c_reserve},
    {"cuMemAddressFree", c_address_free},
    {"cuMemMap", c_map},
    {"cuMemUnmap", c_unmap},
    {"cuMemSetAccess", c_set_access},
    {"cuMemGetAccess", c_get_access},
};
#define NCALLS (sizeof g_vmm_calls / sizeof g_vmm_calls[0])

static void test_vmm_off(void **state)
{
    (void)state;
    int v = -1;
    fake_set_vmm_supported(0);
    assert_int_equal(
        cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0),
        CUDA_SUCCESS);
    assert_int_equal(v, 0);
    for (size_t i = 0; i < NCALLS; i++)
        if (g_vmm_calls[i].call() != CUDA_ERROR_NOT_SUPPORTED)
            fail_msg("%s answered with VMM off", g_vmm_calls[i].name);
    fake_set_vmm_supported(1);
    assert_int_equal(
        cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0),
        CUDA_SUCCESS);
    assert_int_equal(v, 1);
    assert_int_equal(c_create(), CUDA_SUCCESS);
    assert_int_equal(fake_calls("cuMemCreate"), 2);
}

static void child_no_vmm(void)
{
    setenv("FAKE_CUDA_NO_VMM", "1", 1);
    int v = -1;
    if (cuInit(0) ||
        cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0) ||
        v != 0 || c_reserve() != CUDA_ERROR_NOT_SUPPORTED)
        _exit(1);
    /* A value set by the control call wins over the environment. */
    fake_set_vmm_supported(1);
    if (cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0) ||
        v != 1)
        _exit(2);
    _exit(0);
}

static void child_vmm_set_before_init(void)
{
    setenv("FAKE_CUDA_NO_VMM", "0", 1);
    fake_set_vmm_supported(0);
    int v = -1;
    if (cuInit(0) ||
        cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0) ||
        v != 0)
        _exit(1);
    _exit(0);
}

static void test_environment(void **state)
{
    (void)state;
    assert_int_equal(in_child(child_no_vmm), 0);
    assert_int_equal(in_child(child_vmm_set_before_init), 0);
}

/* ---- discovery and failure injection ----------------------------------------------------- */

/* By base name, as cuGetProcAddress takes them. */
static const char *const g_other_entries[] = {
    "cuDeviceCanAccessPeer", "cuCtxEnablePeerAccess", "cuCtxDisablePeerAccess",
    "cuPointerGetAttribute", "cuPointerGetAttributes", "cuIpcGetMemHandle",
    "cuIpcCloseMemHandle",
};

static void test_discovery_and_injection(void **state)
{
    (void)state;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    assert_non_null(h);
    for (size_t i = 0; i < NCALLS; i++) {
        const char *name = g_vmm_calls[i].name;
        void *fn = NULL, *sym = dlsym(h, name);
        assert_non_null(sym);
        assert_ptr_equal(sym, fake_real_symbol(name));
        assert_int_equal(cuGetProcAddress(name, &fn, 13000, 0, NULL), CUDA_SUCCESS);
        assert_ptr_equal(fn, sym);
        /* Older than the VMM API: not found. */
        assert_int_equal(cuGetProcAddress(name, &fn, 10010, 0, NULL), CUDA_ERROR_NOT_FOUND);
        /* An injected failure does nothing and is counted. */
        long before = fake_calls(name);
        fake_fail_nth(name, 1, CUDA_ERROR_UNKNOWN);
        if (g_vmm_calls[i].call() != CUDA_ERROR_UNKNOWN)
            fail_msg("%s: the injected failure did not fire", name);
        assert_int_equal(fake_calls(name), before + 1);
        fake_fail_always(name, CUDA_ERROR_OUT_OF_MEMORY);
        if (g_vmm_calls[i].call() != CUDA_ERROR_OUT_OF_MEMORY)
            fail_msg("%s: fail_always did not fire", name);
        fake_fail_always(name, CUDA_SUCCESS);
    }
    assert_int_equal(fake_vmm_allocations(), 0);
    assert_int_equal(fake_vmm_reservations(), 0);
    /* The other new entry points: the same function by every path. */
    for (size_t i = 0; i < sizeof g_other_entries / sizeof g_other_entries[0]; i++) {
        const char *name = g_other_entries[i];
        void *fn = NULL, *sym = dlsym(h, name);
        assert_non_null(sym);
        assert_ptr_equal(sym, fake_real_symbol(name));
        if (cuGetProcAddress(name, &fn, 13000, 0, NULL) != CUDA_SUCCESS || fn != sym)
            fail_msg("cuGetProcAddress(%s) is not dlsym's", name);
    }
    /* cuIpcOpenMemHandle: the _v2 form from CUDA 11.0 on. */
    void *fn = NULL;
    assert_int_equal(cuGetProcAddress("cuIpcOpenMemHandle", &fn, 13000, 0, NULL), CUDA_SUCCESS);
    assert_ptr_equal(fn, dlsym(h, "cuIpcOpenMemHandle_v2"));
    assert_int_equal(cuGetProcAddress("cuIpcOpenMemHandle", &fn, 10020, 0, NULL), CUDA_SUCCESS);
    assert_ptr_equal(fn, dlsym(h, "cuIpcOpenMemHandle"));
    assert_true(dlsym(h, "cuIpcOpenMemHandle") != dlsym(h, "cuIpcOpenMemHandle_v2"));
    /* Injected failures leave state alone: a failed cuMemMap maps nothing, a failed
     * cuMemUnmap unmaps nothing, a failed cuMemRelease frees nothing. */
    CUdeviceptr p = new_range(G);
    CUmemGenericAllocationHandle m = new_chunk(G, 0);
    fake_fail_nth("cuMemMap", 1, CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(cuMemMap(p, G, 0, m, 0), CUDA_ERROR_OUT_OF_MEMORY);
    map_rw(p, G, m, 0);
    fake_fail_nth("cuMemSetAccess", 1, CUDA_ERROR_UNKNOWN);
    CUmemAccessDesc d = access_for(0, CU_MEM_ACCESS_FLAGS_PROT_NONE);
    assert_int_equal(cuMemSetAccess(p, G, &d, 1), CUDA_ERROR_UNKNOWN);
    assert_int_equal(cuMemsetD8(p, 1, 8), CUDA_SUCCESS); /* access unchanged */
    fake_fail_nth("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN);
    assert_int_equal(cuMemUnmap(p, G), CUDA_ERROR_UNKNOWN);
    assert_int_equal(cuMemsetD8(p, 1, 8), CUDA_SUCCESS);
    fake_fail_nth("cuMemRelease", 1, CUDA_ERROR_UNKNOWN);
    assert_int_equal(cuMemRelease(m), CUDA_ERROR_UNKNOWN);
    assert_int_equal(cuMemUnmap(p, G), CUDA_SUCCESS);
    assert_int_equal(fake_vmm_allocations(), 1);
    assert_int_equal(cuMemRelease(m), CUDA_SUCCESS);
    fake_fail_nth("cuMemAddressFree", 1, CUDA_ERROR_UNKNOWN);
    assert_int_equal(cuMemAddressFree(p, G), CUDA_ERROR_UNKNOWN);
    assert_int_equal(fake_vmm_reservations(), 1);
    assert_int_equal(cuMemAddressFree(p, G), CUDA_SUCCESS);
    dlclose(h);
}

/* ---- threads ------------------------------------------------------------------------------- */

#define VMM_THREADS 6
#define VMM_ROUNDS 300

struct vmm_worker {
    int failures;
};

/* Each thread moves its own chunk between two addresses of its own reservation, touching it
 * on its own stream with a fence before each move: no race, no fault, whatever the others do. */
static void *vmm_loop(void *arg)
{
    struct vmm_worker *w = arg;
    if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS)
        w->failures++;
    CUstream s = NULL;
    CUevent e = NULL;
    CUdeviceptr p = 0;
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp prop = prop_on(0);
    CUmemAccessDesc d = access_for(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) || cuEventCreate(&e, 0) ||
        cuMemAddressReserve(&p, 2 * G, 0, 0, 0) || cuMemCreate(&h, G, &prop, 0)) {
        w->failures++;
        return NULL;
    }
    for (int i = 0; i < VMM_ROUNDS; i++) {
        CUdeviceptr at = p + (CUdeviceptr)(i % 2) * G;
        if (cuMemMap(at, G, 0, h, 0) || cuMemSetAccess(at, G, &d, 1) ||
            cuMemsetD8Async(at, (unsigned char)i, 64, s) || touch(s, at, G) ||
            cuEventRecord(e, s) || cuEventSynchronize(e) || cuMemUnmap(at, G))
            w->failures++;
    }
    if (cuMemRelease(h) || cuMemAddressFree(p, 2 * G) || cuEventDestroy(e) ||
        cuStreamDestroy(s))
        w->failures++;
    return NULL;
}

static void test_vmm_threads(void **state)
{
    (void)state;
    pthread_t t[VMM_THREADS];
    struct vmm_worker w[VMM_THREADS];
    memset(w, 0, sizeof w);
    for (int i = 0; i < VMM_THREADS; i++)
        pthread_create(&t[i], NULL, vmm_loop, &w[i]);
    for (int i = 0; i < VMM_THREADS; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < VMM_THREADS; i++)
        assert_int_equal(w[i].failures, 0);
    assert_int_equal(fake_races(), 0);
    assert_int_equal(fake_unmap_faults(), 0);
    assert_int_equal(fake_access_faults(), 0);
    assert_int_equal(fake_calls("cuMemMap"), VMM_THREADS * VMM_ROUNDS);
}

int main(void)
{
    const struct CMUnitTest before_init[] = {
        cmocka_unit_test(test_environment),
    };
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_granularity_and_attribute),
        T(test_create_and_release),
        T(test_reserve_and_free),
        T(test_map_rules),
        T(test_release_while_mapped),
        T(test_access_and_copies),
        T(test_kernel_access_faults),
        T(test_unmap_faults),
        T(test_physical_races),
        T(test_plain_memory_races_unchanged),
        T(test_peer_access_calls),
        T(test_peer_kernels_and_copies),
        T(test_address_range),
        T(test_address_range_v1),
        T(test_pointer_attributes_plain),
        T(test_pointer_attributes_vmm),
        T(test_pointer_attributes_plural),
        T(test_pointer_attributes_peers),
        T(test_ipc_handles),
        T(test_query_injection),
        T(test_vmm_off),
        T(test_discovery_and_injection),
        T(test_vmm_threads),
    };
#undef T
    int failed = cmocka_run_group_tests_name("before cuInit", before_init, NULL, NULL);
    failed += cmocka_run_group_tests_name("fake driver: VMM", tests, group_setup, NULL);
    return failed ? 1 : 0;
}
