/* Fake CUDA driver: what a pointer is. cuMemGetAddressRange, cuPointerGetAttribute(s) and the
 * IPC memory handles, answered as the real driver (CUDA 13, driver 580) answers them, for
 * cuMemAlloc memory and for VMM memory alike. A shim that hands out blocks of its own must
 * answer these for its blocks as the driver would for an allocation; these are the answers
 * it is compared with.
 *
 * The two kinds differ, measured on an H100 (DESIGN.md, "Pooling physical memory"):
 *  - cuMemGetAddressRange: the allocation; for VMM memory the one mapping holding the
 *    pointer. Anything else: CUDA_ERROR_NOT_FOUND.
 *  - RANGE_START_ADDR / RANGE_SIZE: the allocation; for VMM memory the whole reservation
 *    (which the real driver documents too), also for an address that is reserved but not
 *    mapped, where MAPPED is 0.
 *  - IS_LEGACY_CUDA_IPC_CAPABLE: 1 for cuMemAlloc memory, 0 for VMM memory, and
 *    cuIpcGetMemHandle of VMM memory fails with CUDA_ERROR_INVALID_VALUE.
 * Not measured, chosen from the documentation: BUFFER_ID is unique per cuMemAlloc allocation
 * and per mapping, never reused; CONTEXT of VMM memory is NULL (no context owns it, as none
 * owns stream-ordered allocations); MEMORY_BLOCK_ID is the physical allocation's handle;
 * ALLOWED_HANDLE_TYPES is 0 for cuMemAlloc memory; IS_GPU_DIRECT_RDMA_CAPABLE is 0.
 *
 * Values are written as the CUDA Python bindings read them: booleans, MEMORY_TYPE,
 * ACCESS_FLAGS and ALLOWED_HANDLE_TYPES as unsigned int, DEVICE_ORDINAL as int, BUFFER_ID
 * and MEMORY_BLOCK_ID as unsigned long long, RANGE_SIZE and MAPPING_SIZE as size_t, the rest
 * as pointers. P2P_TOKENS and SYNC_MEMOPS are not modelled: CUDA_ERROR_NOT_SUPPORTED. */
#include "fake_internal.h"

#include <limits.h>
#include <string.h>
#include <unistd.h>

/* What the driver knows about an address. */
struct ptr {
    enum { UNKNOWN, ALLOC, RESERVED, MAPPED } kind;
    const fake_alloc *a;  /* ALLOC */
    struct fake_vmm_at v; /* RESERVED, MAPPED */
};

static void look_up(CUdeviceptr p, struct ptr *out)
{
    memset(out, 0, sizeof *out);
    if ((out->a = fake_mem_find(p)))
        out->kind = ALLOC;
    else if (fake_vmm_at(p, &out->v))
        out->kind = out->v.mapped ? MAPPED : RESERVED;
}

/* ---- cuMemGetAddressRange ------------------------------------------------------------------- */

static CUresult address_range(CUdeviceptr *pbase, size_t *psize, CUdeviceptr p)
{
    fake_ctx *c;
    CUresult rc = fake_current_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct ptr x;
    look_up(p, &x);
    CUdeviceptr base;
    size_t size;
    if (x.kind == ALLOC) {
        base = x.a->base;
        size = x.a->size;
    } else if (x.kind == MAPPED) {
        base = x.v.map_base;
        size = x.v.map_size;
    } else {
        return CUDA_ERROR_NOT_FOUND;
    }
    if (pbase)
        *pbase = base;
    if (psize)
        *psize = size;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    ENTER(cuMemGetAddressRange_v2);
    LOCKED(address_range(pbase, psize, dptr));
}

/* The CUDA 3.0 original, with 32-bit pointers: only memory in the low 4 GiB can be named,
 * which cuMemAlloc never gives but a reservation with a low hint can. Sizes clamp, as in the
 * fake's other 32-bit originals. */
FAKE_API CUresult cuMemGetAddressRange(CUdeviceptr_v1 *pbase, unsigned int *psize,
                                       CUdeviceptr_v1 dptr)
{
    ENTER(cuMemGetAddressRange);
    CUdeviceptr base = 0;
    size_t size = 0;
    fake_lock();
    CUresult rc = address_range(&base, &size, dptr);
    fake_unlock();
    if (rc == CUDA_SUCCESS && pbase)
        *pbase = (CUdeviceptr_v1)base; /* base <= dptr, so it fits */
    if (rc == CUDA_SUCCESS && psize)
        *psize = size > UINT_MAX ? UINT_MAX : (unsigned int)size;
    return rc;
}

/* ---- pointer attributes -------------------------------------------------------------------- */

static void put_uint(void *data, unsigned v) { memcpy(data, &v, sizeof v); }
static void put_int(void *data, int v) { memcpy(data, &v, sizeof v); }
static void put_u64(void *data, unsigned long long v) { memcpy(data, &v, sizeof v); }
static void put_size(void *data, size_t v) { memcpy(data, &v, sizeof v); }
static void put_ptr(void *data, const void *v) { memcpy(data, &v, sizeof v); }

/* The attributes the fake answers, and the size each one's value has. */
static size_t value_size(CUpointer_attribute attr)
{
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: return sizeof(void *);
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: return sizeof(CUdeviceptr);
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID: return sizeof(unsigned long long);
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: return sizeof(size_t);
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: return sizeof(int);
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_MAPPED:
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE: return sizeof(unsigned);
    default: return 0;
    }
}

/* Attributes of an address reserved but not mapped: the reservation, and that it is not
 * mapped; nothing else applies. */
static CUresult reserved_attribute(void *data, CUpointer_attribute attr, const struct ptr *x)
{
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: put_u64(data, x->v.res_base); break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: put_size(data, x->v.res_size); break;
    case CU_POINTER_ATTRIBUTE_MAPPED: put_uint(data, 0); break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* The access the current context's device has: for cuMemAlloc memory, full if the context
 * reaches the owner's (same device, or peer access enabled), else none. */
static CUresult access_flags(const struct ptr *x, unsigned *out)
{
    fake_ctx *c;
    CUresult rc = fake_current_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (x->kind == ALLOC)
        *out = fake_ctx_reaches(c, x->a->ctx) ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE
                                              : CU_POINTER_ATTRIBUTE_ACCESS_FLAG_NONE;
    else
        *out = x->v.access[c->device]; /* the CUmemAccess_flags values are the same */
    return CUDA_SUCCESS;
}

/* One attribute of p: CUDA_ERROR_INVALID_VALUE where it does not apply (unknown memory, the
 * host pointer of device memory), CUDA_ERROR_INVALID_CONTEXT where the current context is
 * needed and there is none. The attribute is known (value_size > 0). */
static CUresult attribute(void *data, CUpointer_attribute attr, CUdeviceptr p,
                          const struct ptr *x)
{
    if (x->kind == UNKNOWN)
        return CUDA_ERROR_INVALID_VALUE;
    if (x->kind == RESERVED)
        return reserved_attribute(data, attr, x);
    bool alloc = x->kind == ALLOC;
    fake_ctx *c;
    unsigned flags;
    CUresult rc;
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: put_ptr(data, alloc ? x->a->ctx : NULL); break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: put_uint(data, CU_MEMORYTYPE_DEVICE); break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        if ((rc = fake_current_ctx(&c)) != CUDA_SUCCESS)
            return rc;
        put_u64(data, p);
        break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER: return CUDA_ERROR_INVALID_VALUE;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: put_u64(data, alloc ? x->a->id : x->v.map_id); break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: put_uint(data, 0); break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        put_int(data, alloc ? (x->a->device >= 0 ? x->a->device : x->a->ctx->device)
                            : x->v.device);
        break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: put_uint(data, alloc); break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        put_u64(data, alloc ? x->a->base : x->v.res_base);
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: put_size(data, alloc ? x->a->size : x->v.res_size); break;
    case CU_POINTER_ATTRIBUTE_MAPPED: put_uint(data, 1); break;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
        put_uint(data, alloc ? CU_MEM_HANDLE_TYPE_NONE : (unsigned)x->v.handle_types);
        break;
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE: put_uint(data, 0); break;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
        if ((rc = access_flags(x, &flags)) != CUDA_SUCCESS)
            return rc;
        put_uint(data, flags);
        break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: put_ptr(data, NULL); break;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
        put_size(data, alloc ? x->a->size : x->v.map_size);
        break;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
        put_ptr(data, (void *)(uintptr_t)(alloc ? x->a->base : x->v.map_base));
        break;
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
        put_u64(data, alloc ? x->a->id : x->v.handle);
        break;
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE: put_uint(data, 0); break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

static bool not_modelled(CUpointer_attribute attr)
{
    return attr == CU_POINTER_ATTRIBUTE_P2P_TOKENS || attr == CU_POINTER_ATTRIBUTE_SYNC_MEMOPS;
}

static CUresult get_attribute(void *data, CUpointer_attribute attr, CUdeviceptr p)
{
    if (not_modelled(attr))
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!data || !value_size(attr))
        return CUDA_ERROR_INVALID_VALUE;
    struct ptr x;
    look_up(p, &x);
    return attribute(data, attr, p, &x);
}

FAKE_API CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute_,
                                        CUdeviceptr ptr)
{
    ENTER(cuPointerGetAttribute);
    LOCKED(get_attribute(data, attribute_, ptr));
}

/* Unlike cuPointerGetAttribute, never an error for what does not apply: as the real driver
 * documents, a pointer it does not know gets "default NULL values" (MEMORY_TYPE 0, CONTEXT
 * NULL, zeros), and so does an attribute that does not apply to this memory (the host
 * pointer of device memory is NULL). */
static CUresult get_attributes(unsigned n, const CUpointer_attribute *attrs, void **data,
                               CUdeviceptr p)
{
    if (n == 0 || !attrs || !data)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; i++) {
        if (not_modelled(attrs[i]))
            return CUDA_ERROR_NOT_SUPPORTED;
        if (!data[i] || !value_size(attrs[i]))
            return CUDA_ERROR_INVALID_VALUE;
    }
    struct ptr x;
    look_up(p, &x);
    for (unsigned i = 0; i < n; i++) {
        CUresult rc = attribute(data[i], attrs[i], p, &x);
        if (rc == CUDA_ERROR_INVALID_VALUE)
            memset(data[i], 0, value_size(attrs[i]));
        else if (rc != CUDA_SUCCESS)
            return rc;
    }
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuPointerGetAttributes(unsigned int numAttributes,
                                         CUpointer_attribute *attributes, void **data,
                                         CUdeviceptr ptr)
{
    ENTER(cuPointerGetAttributes);
    LOCKED(get_attributes(numAttributes, attributes, data, ptr));
}

/* ---- IPC memory handles ------------------------------------------------------------------- */

/* What a handle holds, in its 64 bytes: enough to recognise one of the fake's, and whose. */
struct wire {
    char magic[8];
    uint32_t pid;
    int32_t device;
    uint64_t buffer_id, base, size;
};
_Static_assert(sizeof(struct wire) <= CU_IPC_HANDLE_SIZE, "an IPC handle holds the wire form");

static const char g_magic[8] = "fakecuIP";

/* The base of a cuMemAlloc allocation only: an interior pointer, VMM memory (which the real
 * driver refuses so, measured on an H100) or anything else is CUDA_ERROR_INVALID_VALUE. */
static CUresult ipc_get(CUipcMemHandle *h, CUdeviceptr p)
{
    fake_ctx *c;
    CUresult rc = fake_current_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    const fake_alloc *a = fake_mem_find(p);
    if (!h || !a || a->base != p)
        return CUDA_ERROR_INVALID_VALUE;
    struct wire w = {.pid = (uint32_t)getpid(), .device = a->ctx->device, .buffer_id = a->id,
                     .base = a->base, .size = a->size};
    memcpy(w.magic, g_magic, sizeof w.magic);
    memset(h, 0, sizeof *h);
    memcpy(h->reserved, &w, sizeof w);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    ENTER(cuIpcGetMemHandle);
    LOCKED(ipc_get(pHandle, dptr));
}

/* The real driver refuses to open a handle in the process that made it: CUDA_ERROR_INVALID_
 * CONTEXT. (Fake: one from another process cannot be opened either, its memory is private to
 * that process: CUDA_ERROR_NOT_SUPPORTED; bytes that are no handle of the fake's:
 * CUDA_ERROR_INVALID_VALUE.) */
static CUresult ipc_open(CUdeviceptr *pdptr, const CUipcMemHandle *h, unsigned flags)
{
    fake_ctx *c;
    CUresult rc = fake_current_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pdptr || (flags & ~(unsigned)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
        return CUDA_ERROR_INVALID_VALUE;
    struct wire w;
    memcpy(&w, h->reserved, sizeof w);
    if (memcmp(w.magic, g_magic, sizeof w.magic) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return w.pid == (uint32_t)getpid() ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_NOT_SUPPORTED;
}

FAKE_API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                        unsigned int Flags)
{
    ENTER(cuIpcOpenMemHandle_v2);
    LOCKED(ipc_open(pdptr, &handle, Flags));
}

/* The form before CUDA 11.0; the fake answers the same. */
FAKE_API CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                     unsigned int Flags)
{
    ENTER(cuIpcOpenMemHandle);
    LOCKED(ipc_open(pdptr, &handle, Flags));
}

/* Nothing is ever opened here, so nothing can be closed. */
static CUresult ipc_close(CUdeviceptr p)
{
    fake_ctx *c;
    CUresult rc = fake_current_ctx(&c);
    (void)p;
    return rc != CUDA_SUCCESS ? rc : CUDA_ERROR_INVALID_VALUE;
}

FAKE_API CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    ENTER(cuIpcCloseMemHandle);
    LOCKED(ipc_close(dptr));
}
