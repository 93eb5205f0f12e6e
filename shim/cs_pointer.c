/* Honest pointers: the queries a program can make of a pointer answer for the block the shim
 * handed out as if the driver had allocated it. The driver itself knows a classic block by
 * its class size and a pooled block only by the pool's ranges and chunks; a freed block is
 * still memory to it. Here: a block's range is its base and the size the program asked for;
 * its buffer id is new each time it is handed out; a freed block, or a pointer past what the
 * program asked for, answers as memory the driver does not know. Peer access reaches pooled
 * memory; a pooled block is exported (cuIpcGetMemHandle) by cs_ipc.c, the driver's IPC
 * handles cannot carry it. */
#include "cs_exports.h"

#include <stdint.h>
#include <string.h>

#include "cs_backend.h"
#include "cs_ipc.h"
#include "cs_shim.h"

#define REAL(d, name) \
    const cs_driver *d = cs_driver_get(); \
    if (!d->name) \
        return CUDA_ERROR_NOT_INITIALIZED

/* Buffer ids of the shim's blocks: apart from the driver's own, which count up from 1. */
#define BUFFER_ID_BASE (1ull << 63)

typedef enum { PTR_UNKNOWN, PTR_BLOCK, PTR_FREED } ptr_kind;

/* What a pointer query describes: a block of the cache, or another process's block this one
 * opened (cs_ipc.c). */
typedef struct {
    cs_block_info b;
    bool imported;
} block;

/* Another process's block this one opened (cs_ipc.c): described as a block too, though the
 * range mapped for it is whole chunks. It cannot be exported again. */
static ptr_kind find_import(CUdeviceptr ptr, block *info)
{
    uint64_t base, size;
    CUcontext ctx;
    if (!cs_ipc_find_import((uint64_t)ptr, &base, &size, &ctx))
        return PTR_UNKNOWN;
    *info = (block){.b = {.base = base, .requested = size, .size = size, .key = ctx,
                          .pooled = true},
                    .imported = true};
    return (uint64_t)ptr >= base && (uint64_t)ptr < base + size ? PTR_BLOCK : PTR_FREED;
}

/* What ptr is to the program: in a block it holds (info filled), in a block it freed or past
 * its size, or not the shim's. */
static ptr_kind find_block(const cs_driver *d, CUdeviceptr ptr, block *info)
{
    cs_shim *s = cs_shim_get();
    if (ptr == 0)
        return PTR_UNKNOWN;
    info->imported = false;
    ptr_kind imported = find_import(ptr, info);
    if (imported != PTR_UNKNOWN || s->disabled || !s->cache)
        return imported;
    cs_block_state st = cs_cache_find(s->cache, (uint64_t)ptr, &info->b);
    if (st == CS_BLOCK_UNKNOWN && d->cuMemGetAddressRange_v2) {
        /* Inside a classic block: the driver knows its allocation. */
        CUdeviceptr base = 0;
        size_t size = 0;
        if (d->cuMemGetAddressRange_v2(&base, &size, ptr) == CUDA_SUCCESS && base != ptr)
            st = cs_cache_find(s->cache, (uint64_t)base, &info->b);
    }
    if (st == CS_BLOCK_UNKNOWN)
        return PTR_UNKNOWN;
    if (st == CS_BLOCK_IDLE || (uint64_t)ptr >= info->b.base + info->b.requested)
        return PTR_FREED;
    return PTR_BLOCK;
}

/* Can a block be exported: a pooled one when its context's chunks are made exportable. */
static bool exportable(const block *info)
{
    if (info->imported)
        return false;
    return !info->b.pooled || (info->b.dev && cs_backend_exportable(info->b.dev));
}

/* A host address the driver knows nothing of: what it answers there is what it answers for
 * memory that is not its (the right error, the right defaults, each of the right size). */
static CUdeviceptr unknown_pointer(void)
{
    static const char nothing;
    return (CUdeviceptr)(uintptr_t)&nothing;
}

/* The attributes answered for the block; false for the driver's to answer. */
static bool block_attribute(CUpointer_attribute a, void *data, const block *info)
{
    uint64_t v;
    switch (a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        /* The context it was allocated in, as for cuMemAlloc memory (the driver answers NULL
         * for virtual memory, which no context owns). */
        v = (uint64_t)(uintptr_t)info->b.key;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
        v = info->b.base;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
        v = info->b.requested;
        break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
        if (info->imported) {
            /* The driver's id of the mapping under the block's first byte: one id for the
             * whole block, though each chunk under it is a mapping of its own. */
            const cs_driver *d = cs_driver_get();
            return d->cuPointerGetAttribute &&
                   d->cuPointerGetAttribute(data, a, (CUdeviceptr)info->b.base) == CUDA_SUCCESS;
        }
        v = BUFFER_ID_BASE | info->b.serial;
        break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: {
        /* Exported as a block (cs_ipc.c), not as the chunks under it: cuMemAlloc memory's
         * answers, where pooled chunks can be exported at all. */
        uint32_t w = a == CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES ? CU_MEM_HANDLE_TYPE_NONE
                                                                    : exportable(info);
        memcpy(data, &w, sizeof w);
        return true;
    }
    default:
        return false;
    }
    memcpy(data, &v, sizeof v);  /* each of these is 8 bytes: a pointer, size_t, ull */
    return true;
}

/* ---------------------------------------------------------------- ranges */

CS_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    REAL(d, cuMemGetAddressRange_v2);
    block info;
    switch (find_block(d, dptr, &info)) {
    case PTR_BLOCK:
        if (pbase)
            *pbase = (CUdeviceptr)info.b.base;
        if (psize)
            *psize = (size_t)info.b.requested;
        return CUDA_SUCCESS;
    case PTR_FREED:
        return CUDA_ERROR_NOT_FOUND;
    default:
        return d->cuMemGetAddressRange_v2(pbase, psize, dptr);
    }
}

/* The v1 entry point takes 32-bit pointers (CUDA before 3.2): a block it can describe is
 * described; anything else is the driver's. */
CS_EXPORT CUresult cuMemGetAddressRange(unsigned int *pbase, unsigned int *psize,
                                        unsigned int dptr)
{
    REAL(d, cuMemGetAddressRange);
    block info;
    switch (find_block(d, (CUdeviceptr)dptr, &info)) {
    case PTR_BLOCK:
        if (info.b.base > UINT32_MAX || info.b.requested > UINT32_MAX)
            break;
        if (pbase)
            *pbase = (unsigned int)info.b.base;
        if (psize)
            *psize = (unsigned int)info.b.requested;
        return CUDA_SUCCESS;
    case PTR_FREED:
        return CUDA_ERROR_NOT_FOUND;
    default:
        break;
    }
    return d->cuMemGetAddressRange(pbase, psize, dptr);
}

/* ---------------------------------------------------------------- attributes */

CS_EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute,
                                         CUdeviceptr ptr)
{
    REAL(d, cuPointerGetAttribute);
    block info;
    switch (find_block(d, ptr, &info)) {
    case PTR_BLOCK:
        if (data && block_attribute(attribute, data, &info))
            return CUDA_SUCCESS;
        break;
    case PTR_FREED:
        return d->cuPointerGetAttribute(data, attribute, unknown_pointer());
    default:
        break;
    }
    return d->cuPointerGetAttribute(data, attribute, ptr);
}

CS_EXPORT CUresult cuPointerGetAttributes(unsigned int numAttributes,
                                          CUpointer_attribute *attributes, void **data,
                                          CUdeviceptr ptr)
{
    REAL(d, cuPointerGetAttributes);
    block info;
    ptr_kind kind = find_block(d, ptr, &info);
    if (kind == PTR_FREED)
        return d->cuPointerGetAttributes(numAttributes, attributes, data, unknown_pointer());
    CUresult r = d->cuPointerGetAttributes(numAttributes, attributes, data, ptr);
    if (r == CUDA_SUCCESS && kind == PTR_BLOCK && attributes && data)
        for (unsigned int i = 0; i < numAttributes; i++)
            if (data[i])
                block_attribute(attributes[i], data[i], &info);
    return r;
}

/* ---------------------------------------------------------------- IPC and peers */

CS_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    REAL(d, cuIpcGetMemHandle);
    block info;
    switch (find_block(d, dptr, &info)) {
    case PTR_FREED:
        return CUDA_ERROR_INVALID_VALUE;
    case PTR_BLOCK:
        if (info.imported)
            return CUDA_ERROR_INVALID_VALUE;  /* IPC memory is not exported again */
        if (info.b.pooled)  /* the driver cannot export virtual memory this way: cs_ipc.c */
            return (uint64_t)dptr == info.b.base && pHandle
                       ? cs_ipc_export(pHandle, &info.b, exportable(&info))
                       : CUDA_ERROR_INVALID_VALUE;
        break;
    default:
        break;
    }
    return d->cuIpcGetMemHandle(pHandle, dptr);
}

/* Peer access reaches a classic block by itself; a pooled block's mappings must grant the
 * peer device: now, and on every mapping made from now on. */
CS_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
    REAL(d, cuCtxEnablePeerAccess);
    CUresult r = d->cuCtxEnablePeerAccess(peerContext, Flags);
    cs_shim *s = cs_shim_get();
    CUdevice me;
    if (r != CUDA_SUCCESS || s->disabled || !s->cache || !d->cuCtxGetDevice ||
        d->cuCtxGetDevice(&me) != CUDA_SUCCESS)
        return r;
    cs_heap *h = cs_shim_heap_of(d, peerContext);
    if (h && cs_cache_heap_pooled(h) && cs_backend_grant_peer(cs_cache_heap_dev(h), me)) {
        int raw = cs_cache_regrant(h);
        if (raw)
            cs_backend_ungrant_peer(cs_cache_heap_dev(h), me);
        if (raw)
            cs_log("peer access: granting device %d the pooled memory failed (CUresult %d); "
                   "CACHESHIM_BACKEND=classic avoids it",
                   (int)me, raw);
    }
    return r;
}
