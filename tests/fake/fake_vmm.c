/* Fake CUDA driver: virtual memory management (cuMemCreate, cuMemAddressReserve, cuMemMap,
 * cuMemSetAccess and the rest), real on host memory.
 *
 * A physical allocation (cuMemCreate) is a memfd of its size: sparse, so it costs nothing
 * until touched, and counted against its device like cuMemAlloc memory. A reservation
 * (cuMemAddressReserve) is an anonymous PROT_NONE mapping of the host address space. A
 * mapping (cuMemMap) replaces part of a reservation with a MAP_SHARED view of a memfd, still
 * PROT_NONE: as on the GPU, memory is only usable once cuMemSetAccess has made it so, and
 * two mappings of one allocation see the same bytes. cuMemUnmap puts PROT_NONE anonymous
 * memory back, so the reservation stays whole. An allocation is freed once its handle has
 * been released (cuMemRelease, once per cuMemCreate and cuMemRetainAllocationHandle) and no
 * mapping of it remains.
 *
 * Access is recorded per device on each mapping (fake_access.c checks it for copies and
 * kernels); the host protection of a mapping is the widest access any device has, so the
 * fake itself can move the bytes of any copy some device may make.
 *
 * Unmapping a range that pending work still touches is what crashes a real GPU (the real
 * cuMemUnmap does not wait for work): the timeline counts it (fake_unmap_check). */
#include "fake_internal.h"

#include <fcntl.h>
#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

#define DEFAULT_GRANULARITY (2u << 20) /* an H100's (DESIGN.md); answered for both options */
/* Handles are ids in this range, so that small integers are never valid handles. */
#define HANDLE_BASE 0xfa4e000000000000ull

struct phys {
    uint64_t handle; /* the CUmemGenericAllocationHandle; unique for the process's life */
    size_t size;
    int device;
    int fd;
    bool imported; /* cuMemImportFromShareableHandle: the memory is counted where it was made */
    CUmemAllocationProp prop;
    long refs; /* handle references not yet released; 0: the handle is invalid */
    long maps; /* live mappings */
};

struct reservation {
    CUdeviceptr base;
    size_t size;
    long maps; /* live mappings inside it */
};

struct mapping {
    CUdeviceptr va;
    size_t size;
    uint64_t id; /* unique for the process's life (the pointer attribute BUFFER_ID) */
    struct phys *phys;
    struct reservation *res;
    unsigned char access[FAKE_MAX_DEVICES]; /* CUmemAccess_flags, by device */
};

/* Under the lock. */
static void *g_phys, *g_res, *g_maps; /* trees: by handle; by address range (twice) */
static long g_nphys, g_nres;
static uint64_t g_granularity = DEFAULT_GRANULARITY;
static bool g_supported = true, g_supported_set;

/* ---- lookups ------------------------------------------------------------------------------ */

static int cmp_handle(const void *a, const void *b)
{
    uint64_t x = ((const struct phys *)a)->handle, y = ((const struct phys *)b)->handle;
    return x < y ? -1 : x > y;
}

/* Ranges in one tree never overlap, so a one-byte key finds the range holding an address. */
static int cmp_res(const void *a, const void *b)
{
    const struct reservation *x = a, *y = b;
    if (x->base + x->size <= y->base)
        return -1;
    return y->base + y->size <= x->base ? 1 : 0;
}

static int cmp_map(const void *a, const void *b)
{
    const struct mapping *x = a, *y = b;
    if (x->va + x->size <= y->va)
        return -1;
    return y->va + y->size <= x->va ? 1 : 0;
}

/* A handle the caller may use: created and not yet released. */
static struct phys *find_handle(CUmemGenericAllocationHandle h)
{
    struct phys key = {.handle = h};
    void **node = tfind(&key, &g_phys, cmp_handle);
    struct phys *ph = node ? *node : NULL;
    return ph && ph->refs > 0 ? ph : NULL;
}

static struct reservation *find_res(CUdeviceptr p)
{
    struct reservation key = {.base = p, .size = 1};
    void **node = tfind(&key, &g_res, cmp_res);
    return node ? *node : NULL;
}

static struct mapping *find_map(CUdeviceptr p)
{
    struct mapping key = {.va = p, .size = 1};
    void **node = tfind(&key, &g_maps, cmp_map);
    return node ? *node : NULL;
}

/* The mappings that exactly cover [p, p + size), in address order, into *out (malloc'd, NULL
 * unless CUDA_SUCCESS): CUDA_ERROR_INVALID_VALUE if the range is empty, has a hole or cuts
 * a mapping, or CUDA_ERROR_OUT_OF_MEMORY. */
static CUresult whole_mappings(CUdeviceptr p, size_t size, struct mapping ***out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (size == 0 || size > UINT64_MAX - p)
        return CUDA_ERROR_INVALID_VALUE;
    size_t cap = 0;
    CUresult rc = CUDA_SUCCESS;
    for (CUdeviceptr at = p; at < p + size && rc == CUDA_SUCCESS;) {
        struct mapping *m = find_map(at);
        if (!m || m->va != at || m->size > p + size - at) {
            rc = CUDA_ERROR_INVALID_VALUE;
            break;
        }
        if (*n == cap) {
            cap = cap ? 2 * cap : 4;
            struct mapping **grown = realloc(*out, cap * sizeof *grown);
            if (!grown) {
                rc = CUDA_ERROR_OUT_OF_MEMORY;
                break;
            }
            *out = grown;
        }
        (*out)[(*n)++] = m;
        at += m->size;
    }
    if (rc != CUDA_SUCCESS) {
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return rc;
}

bool fake_vmm_at(CUdeviceptr p, struct fake_vmm_at *out)
{
    struct reservation *r = find_res(p);
    if (!r)
        return false;
    *out = (struct fake_vmm_at){.res_base = r->base, .res_size = r->size};
    struct mapping *m = find_map(p);
    if (!m)
        return true;
    out->mapped = true;
    out->map_base = m->va;
    out->map_size = m->size;
    out->map_id = m->id;
    out->handle = m->phys->handle;
    out->offset = p - m->va;
    out->device = m->phys->device;
    out->handle_types = m->phys->prop.requestedHandleTypes;
    for (int d = 0; d < FAKE_MAX_DEVICES; d++)
        out->access[d] = m->access[d];
    return true;
}

bool fake_vmm_supported(void) { return g_supported; }

void fake_vmm_environment(bool supported)
{
    if (!g_supported_set)
        g_supported = supported;
}

/* ---- allocation properties and granularity ------------------------------------------------ */

static bool valid_device(int dev) { return dev >= 0 && dev < fake_device_count; }

/* Pinned device memory on a device that exists. Host locations are not offered (the device
 * attributes for them say 0); of the handle types only a POSIX file descriptor is (Windows
 * handles do not exist on Linux, fabric handles need IMEX channels). */
static CUresult check_prop(const CUmemAllocationProp *prop)
{
    if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->win32HandleMetaData)
        return CUDA_ERROR_INVALID_VALUE;
    switch (prop->location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE: break;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA: return CUDA_ERROR_NOT_SUPPORTED;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    if (!valid_device(prop->location.id))
        return CUDA_ERROR_INVALID_DEVICE;
    unsigned types = (unsigned)prop->requestedHandleTypes;
    const unsigned known = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_WIN32 |
                           CU_MEM_HANDLE_TYPE_WIN32_KMT | CU_MEM_HANDLE_TYPE_FABRIC;
    if (types & ~known)
        return CUDA_ERROR_INVALID_VALUE;
    if (types & ~(unsigned)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    return CUDA_SUCCESS;
}

static CUresult granularity(size_t *out, const CUmemAllocationProp *prop,
                            CUmemAllocationGranularity_flags option)
{
    if (!out || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                 option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = check_prop(prop);
    if (rc == CUDA_SUCCESS)
        *out = (size_t)g_granularity;
    return rc;
}

/* Every VMM entry point answers CUDA_ERROR_NOT_SUPPORTED while VMM is off. */
#define VMM_LOCKED(expr) LOCKED(g_supported ? (expr) : CUDA_ERROR_NOT_SUPPORTED)

FAKE_API CUresult cuMemGetAllocationGranularity(size_t *granularity_out,
                                                const CUmemAllocationProp *prop,
                                                CUmemAllocationGranularity_flags option)
{
    ENTER(cuMemGetAllocationGranularity);
    VMM_LOCKED(granularity(granularity_out, prop, option));
}

/* ---- physical allocations ------------------------------------------------------------------ */

static CUresult create(CUmemGenericAllocationHandle *handle, size_t size,
                       const CUmemAllocationProp *prop, unsigned long long flags)
{
    if (!handle || flags)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = check_prop(prop);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (size == 0 || size % g_granularity)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = prop->location.id;
    uint64_t budget = fake_budget(dev), used = fake_devices[dev].used;
    if (used > budget || size > budget - used)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct phys *ph = calloc(1, sizeof *ph);
    if (!ph)
        return CUDA_ERROR_OUT_OF_MEMORY;
    /* The name carries the device, for a process that imports the memory (import()). */
    char name[32];
    snprintf(name, sizeof name, "fake-cuda-vmm-d%d", dev);
    ph->fd = memfd_create(name, MFD_CLOEXEC);
    if (ph->fd < 0 || ftruncate(ph->fd, (off_t)size) != 0) {
        if (ph->fd >= 0)
            close(ph->fd);
        free(ph);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ph->handle = HANDLE_BASE | fake_next_id();
    ph->size = size;
    ph->device = dev;
    ph->prop = *prop;
    /* What this memory is, as cuMemGetAllocationPropertiesFromHandle tells: not compressible
     * and not GPUDirect RDMA capable, whatever was asked (the device attributes say so). */
    ph->prop.allocFlags.compressionType = 0;
    ph->prop.allocFlags.gpuDirectRDMACapable = 0;
    ph->refs = 1;
    if (!tsearch(ph, &g_phys, cmp_handle)) {
        close(ph->fd);
        free(ph);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    fake_devices[dev].used += size;
    g_nphys++;
    *handle = ph->handle;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                              const CUmemAllocationProp *prop, unsigned long long flags)
{
    ENTER(cuMemCreate);
    VMM_LOCKED(create(handle, size, prop, flags));
}

/* The memory goes once no handle reference and no mapping is left. */
static void phys_put(struct phys *ph)
{
    if (ph->refs > 0 || ph->maps > 0)
        return;
    tdelete(ph, &g_phys, cmp_handle);
    close(ph->fd);
    if (!ph->imported)
        fake_devices[ph->device].used -= ph->size;
    g_nphys--;
    free(ph);
}

static CUresult release(CUmemGenericAllocationHandle h)
{
    struct phys *ph = find_handle(h);
    if (!ph)
        return CUDA_ERROR_INVALID_VALUE;
    ph->refs--;
    phys_put(ph);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    ENTER(cuMemRelease);
    VMM_LOCKED(release(handle));
}

static CUresult properties(CUmemAllocationProp *prop, CUmemGenericAllocationHandle h)
{
    struct phys *ph = find_handle(h);
    if (!prop || !ph)
        return CUDA_ERROR_INVALID_VALUE;
    *prop = ph->prop;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                         CUmemGenericAllocationHandle handle)
{
    ENTER(cuMemGetAllocationPropertiesFromHandle);
    VMM_LOCKED(properties(prop, handle));
}

/* ---- shareable handles ------------------------------------------------------------------- */

/* A POSIX file descriptor of the memory (the memfd itself, duplicated), for memory created
 * with that handle type requested; the caller closes it. As the driver: the descriptor keeps
 * the memory alive until it is closed or imported and released. */
static CUresult export_handle(void *out, CUmemGenericAllocationHandle h,
                              CUmemAllocationHandleType type, unsigned long long flags)
{
    struct phys *ph = find_handle(h);
    if (!out || !ph || flags || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_INVALID_VALUE;
    if (!(ph->prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        return CUDA_ERROR_NOT_PERMITTED;
    int fd = fcntl(ph->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *(int *)out = fd;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemExportToShareableHandle(void *shareableHandle,
                                               CUmemGenericAllocationHandle handle,
                                               CUmemAllocationHandleType handleType,
                                               unsigned long long flags)
{
    ENTER(cuMemExportToShareableHandle);
    VMM_LOCKED(export_handle(shareableHandle, handle, handleType, flags));
}

/* A new handle of the memory behind a descriptor from cuMemExportToShareableHandle (in this
 * process or another: a memfd of the fake's, whose name says its device). The caller keeps
 * its descriptor. */
static CUresult import(CUmemGenericAllocationHandle *handle, void *os_handle,
                       CUmemAllocationHandleType type)
{
    int fd = (int)(intptr_t)os_handle, dev = -1;
    char link[64], target[128];
    struct stat st;
    if (!handle || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || fstat(fd, &st) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    target[n > 0 ? n : 0] = 0;
    if (sscanf(target, "/memfd:fake-cuda-vmm-d%d", &dev) != 1 || !valid_device(dev) ||
        st.st_size <= 0 || (uint64_t)st.st_size % g_granularity)
        return CUDA_ERROR_INVALID_VALUE;
    struct phys *ph = calloc(1, sizeof *ph);
    if (!ph)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ph->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (ph->fd < 0) {
        free(ph);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ph->handle = HANDLE_BASE | fake_next_id();
    ph->size = (size_t)st.st_size;
    ph->device = dev;
    ph->imported = true;
    ph->prop = (CUmemAllocationProp){.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                     .requestedHandleTypes =
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                     .location = {CU_MEM_LOCATION_TYPE_DEVICE, dev}};
    ph->refs = 1;
    if (!tsearch(ph, &g_phys, cmp_handle)) {
        close(ph->fd);
        free(ph);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    g_nphys++;
    *handle = ph->handle;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                                 void *osHandle,
                                                 CUmemAllocationHandleType shHandleType)
{
    ENTER(cuMemImportFromShareableHandle);
    VMM_LOCKED(import(handle, osHandle, shHandleType));
}

/* Any address in a mapping gives the handle mapped there, one more reference to release. */
static CUresult retain(CUmemGenericAllocationHandle *handle, void *addr)
{
    struct mapping *m = find_map((CUdeviceptr)(uintptr_t)addr);
    if (!handle || !m)
        return CUDA_ERROR_INVALID_VALUE;
    m->phys->refs++;
    *handle = m->phys->handle;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    ENTER(cuMemRetainAllocationHandle);
    VMM_LOCKED(retain(handle, addr));
}

/* ---- address reservations ------------------------------------------------------------------ */

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

/* size bytes of PROT_NONE address space aligned to align (a power of two, at least a page),
 * at hint if that is aligned and free; NULL if none. */
static void *reserve_space(size_t size, size_t align, CUdeviceptr hint)
{
    const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    if (hint && hint % align == 0) {
        void *want = (void *)(uintptr_t)hint;
        void *p = mmap(want, size, PROT_NONE, flags | MAP_FIXED_NOREPLACE, -1, 0);
        if (p == want)
            return p;
        /* Taken, or a kernel without MAP_FIXED_NOREPLACE that placed it elsewhere. */
        if (p != MAP_FAILED)
            munmap(p, size);
    }
    if (size > SIZE_MAX - align)
        return NULL;
    char *p = mmap(NULL, size + align, PROT_NONE, flags, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    char *start = (char *)(((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1));
    if (start > p)
        munmap(p, (size_t)(start - p));
    munmap(start + size, (size_t)(p + size + align - (start + size)));
    return start;
}

/* The real driver documents size and hint as multiples of the host page size and the
 * alignment as 0 (the default) or a power of two; the fake aligns to at least the
 * granularity. */
static CUresult reserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                        unsigned long long flags)
{
    size_t page = page_size();
    if (!ptr || flags || size == 0 || size % page || addr % page ||
        (alignment & (alignment - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    size_t align = alignment > g_granularity ? alignment : (size_t)g_granularity;
    struct reservation *r = calloc(1, sizeof *r);
    void *p = r ? reserve_space(size, align, addr) : NULL;
    if (!p) {
        free(r);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    r->base = (CUdeviceptr)(uintptr_t)p;
    r->size = size;
    if (!tsearch(r, &g_res, cmp_res)) {
        munmap(p, size);
        free(r);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    g_nres++;
    *ptr = r->base;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                      CUdeviceptr addr, unsigned long long flags)
{
    ENTER(cuMemAddressReserve);
    VMM_LOCKED(reserve(ptr, size, alignment, addr, flags));
}

/* The whole reservation, as reserved. (Fake: refused while anything is mapped in it.) */
static CUresult address_free(CUdeviceptr ptr, size_t size)
{
    struct reservation *r = ptr ? find_res(ptr) : NULL;
    if (!r || r->base != ptr || r->size != size || r->maps > 0)
        return CUDA_ERROR_INVALID_VALUE;
    tdelete(r, &g_res, cmp_res);
    munmap((void *)(uintptr_t)r->base, r->size);
    g_nres--;
    free(r);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    ENTER(cuMemAddressFree);
    VMM_LOCKED(address_free(ptr, size));
}

/* ---- mappings ------------------------------------------------------------------------------ */

static CUresult map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                    unsigned long long flags)
{
    /* The real driver documents that the offset into the allocation "currently must be
     * zero". */
    if (flags || offset)
        return CUDA_ERROR_INVALID_VALUE;
    struct phys *ph = find_handle(h);
    if (!ph || size == 0 || ptr % g_granularity || size % g_granularity || size > ph->size)
        return CUDA_ERROR_INVALID_VALUE;
    struct reservation *r = find_res(ptr);
    if (!r || size > r->base + r->size - ptr)
        return CUDA_ERROR_INVALID_VALUE;
    /* Only where nothing is mapped yet. */
    struct mapping key = {.va = ptr, .size = size};
    if (tfind(&key, &g_maps, cmp_map))
        return CUDA_ERROR_INVALID_VALUE;
    struct mapping *m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *want = (void *)(uintptr_t)ptr;
    if (mmap(want, size, PROT_NONE, MAP_SHARED | MAP_FIXED, ph->fd, 0) != want) {
        free(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *m = (struct mapping){.va = ptr, .size = size, .id = fake_next_id(), .phys = ph, .res = r};
    if (!tsearch(m, &g_maps, cmp_map)) {
        mmap(want, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
             0);
        free(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ph->maps++;
    r->maps++;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                           CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    ENTER(cuMemMap);
    VMM_LOCKED(map(ptr, size, offset, handle, flags));
}

/* Back to reserved address space: PROT_NONE anonymous memory over the range. */
static void unmap_one(struct mapping *m)
{
    fake_unmap_check(m->id, m->va, m->size);
    void *p = (void *)(uintptr_t)m->va;
    if (mmap(p, m->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
             0) != p)
        mprotect(p, m->size, PROT_NONE); /* cannot fail in practice; stays inaccessible */
    tdelete(m, &g_maps, cmp_map);
    m->res->maps--;
    m->phys->maps--;
    phys_put(m->phys);
    free(m);
}

/* Whole mappings only, as the real driver requires; several adjacent ones may go at once. */
static CUresult unmap(CUdeviceptr ptr, size_t size)
{
    struct mapping **v;
    size_t n;
    CUresult rc = whole_mappings(ptr, size, &v, &n);
    if (rc != CUDA_SUCCESS)
        return rc;
    for (size_t i = 0; i < n; i++)
        unmap_one(v[i]);
    free(v);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    ENTER(cuMemUnmap);
    VMM_LOCKED(unmap(ptr, size));
}

static bool valid_flags(CUmemAccess_flags f)
{
    return f == CU_MEM_ACCESS_FLAGS_PROT_NONE || f == CU_MEM_ACCESS_FLAGS_PROT_READ ||
           f == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

/* The host protection: the widest access any device has. */
static int host_prot(const struct mapping *m)
{
    unsigned widest = 0;
    for (int d = 0; d < FAKE_MAX_DEVICES; d++)
        widest |= m->access[d];
    if ((widest & CU_MEM_ACCESS_FLAGS_PROT_READWRITE) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        return PROT_READ | PROT_WRITE;
    return widest & CU_MEM_ACCESS_FLAGS_PROT_READ ? PROT_READ : PROT_NONE;
}

static CUresult set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                           size_t count)
{
    if (!desc || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_flags(desc[i].flags))
            return CUDA_ERROR_INVALID_VALUE;
        if (!valid_device(desc[i].location.id))
            return CUDA_ERROR_INVALID_DEVICE;
    }
    struct mapping **v;
    size_t n;
    CUresult rc = whole_mappings(ptr, size, &v, &n);
    if (rc != CUDA_SUCCESS)
        return rc;
    for (size_t k = 0; k < n; k++) {
        for (size_t i = 0; i < count; i++)
            v[k]->access[desc[i].location.id] = (unsigned char)desc[i].flags;
        mprotect((void *)(uintptr_t)v[k]->va, v[k]->size, host_prot(v[k]));
    }
    free(v);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                 size_t count)
{
    ENTER(cuMemSetAccess);
    VMM_LOCKED(set_access(ptr, size, desc, count));
}

static CUresult get_access(unsigned long long *flags, const CUmemLocation *location,
                           CUdeviceptr ptr)
{
    if (!flags || !location || location->type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(location->id))
        return CUDA_ERROR_INVALID_DEVICE;
    struct mapping *m = find_map(ptr);
    if (!m)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = m->access[location->id];
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location,
                                 CUdeviceptr ptr)
{
    ENTER(cuMemGetAccess);
    VMM_LOCKED(get_access(flags, location, ptr));
}

/* ---- control API ----------------------------------------------------------------------------- */

FAKE_API void fake_set_vmm_granularity(uint64_t bytes)
{
    if (bytes < page_size() || (bytes & (bytes - 1)) || bytes > (1ull << 40))
        fake_die("fake_set_vmm_granularity: want a power of two, a page to 1 TiB", NULL);
    fake_lock();
    g_granularity = bytes;
    fake_unlock();
}

FAKE_API void fake_set_vmm_supported(int on)
{
    fake_lock();
    g_supported = on != 0;
    g_supported_set = true;
    fake_unlock();
}

FAKE_API long fake_vmm_allocations(void)
{
    fake_lock();
    long n = g_nphys;
    fake_unlock();
    return n;
}

FAKE_API long fake_vmm_reservations(void)
{
    fake_lock();
    long n = g_nres;
    fake_unlock();
    return n;
}
