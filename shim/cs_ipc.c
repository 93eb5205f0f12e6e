/* IPC of the shim's blocks. A classic block is a cuMemAlloc allocation: the driver exports it.
 * A pooled block's memory is chunks mapped in the pool's ranges, which the driver's IPC
 * handles cannot carry; the handle the shim makes names the block instead (its process and
 * that process's server, its base, the number it was handed out as), and a process that
 * opens it, under the shim too, asks the exporter for the chunks as file descriptors
 * (cs_fdpass.h), imports them and maps them whole into a range of its own. The exporter
 * answers only while the block is in use: a handle of a block freed meanwhile opens as a
 * stale handle does, with an error. An importer's mapping keeps the chunks alive until it
 * closes the handle, even once the exporter gave them back to the driver (while the exporter
 * holds them, a block it frees may be handed out anew, as with the driver's handles). */
#include "cs_exports.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cs_fdpass.h"
#include "cs_ipc.h"
#include "cs_shim.h"

#define MAGIC "csIPCv02"  /* v01: no token (2026-11-25, never released) */

/* What a pooled block's handle carries (64 bytes at most: CUipcMemHandle). */
typedef struct {
    char magic[8];
    uint32_t pid;    /* the exporting process */
    int32_t device;  /* where the memory is */
    uint64_t token;  /* its server's (cs_fdpass.h) */
    uint64_t base, serial, size;  /* the block, the number it was handed out as, its size */
} wire;

_Static_assert(sizeof(wire) <= sizeof(CUipcMemHandle), "the handle holds the wire");

/* A request to the exporter, and its reply: where the block starts in its first chunk, then
 * each chunk's place from the first chunk's start and its size, one descriptor each. */
typedef struct {
    char magic[8];
    uint64_t base, serial;
} request;

typedef struct {
    int32_t status;  /* CUresult */
    uint32_t n;
    uint64_t offset;
} reply_head;

typedef struct {
    uint64_t at, size;
} reply_chunk;

#define MAX_CHUNKS ((CS_FDPASS_MAX_DATA - sizeof(reply_head)) / sizeof(reply_chunk))

/* ---------------------------------------------------------------- exporting */

/* The chunks of a block, gathered under the cache's and the pool's locks (cs_cache_chunks):
 * with `msg`, each exported as a descriptor into it; without, only counted (what
 * cuIpcGetMemHandle checks: no driver call under those locks). */
typedef struct {
    const cs_driver *d;
    cs_fdpass_msg *msg;
    uint64_t first;     /* the first chunk's address */
    uint32_t n;
    CUresult failed;
} gather;

static bool export_chunk(void *arg, uint64_t va, uint64_t size, uint64_t handle)
{
    gather *g = arg;
    int fd = -1;
    if (g->n == 0)
        g->first = va;
    if (g->n >= MAX_CHUNKS || g->n >= CS_FDPASS_MAX_FDS) {
        g->failed = CUDA_ERROR_NOT_SUPPORTED;
        return false;
    }
    if (!g->msg) {
        g->n++;
        return true;
    }
    CUresult r = g->d->cuMemExportToShareableHandle(
        &fd, (CUmemGenericAllocationHandle)handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (r != CUDA_SUCCESS) {
        g->failed = r;
        return false;
    }
    reply_chunk c = {va - g->first, size};
    memcpy(g->msg->data + sizeof(reply_head) + g->n * sizeof c, &c, sizeof c);
    g->msg->fds[g->msg->nfds++] = fd;
    g->n++;
    return true;
}

/* The chunks of a block, or the reason there are none. On failure the descriptors gathered
 * are closed. */
static CUresult gather_chunks(uint64_t base, uint64_t serial, cs_fdpass_msg *msg, gather *g)
{
    cs_shim *s = cs_shim_get();
    *g = (gather){.d = cs_driver_get(), .msg = msg, .failed = CUDA_ERROR_INVALID_VALUE};
    if (!g->d->cuMemExportToShareableHandle)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (s->disabled || !s->cache)
        return CUDA_ERROR_INVALID_VALUE;
    cs_result r = cs_cache_chunks(s->cache, base, serial, export_chunk, g);
    if (r == CS_OK)
        return CUDA_SUCCESS;
    if (msg) {
        for (size_t i = 0; i < msg->nfds; i++)
            close(msg->fds[i]);
        msg->nfds = 0;
    }
    return r == CS_NOT_IN_USE ? CUDA_ERROR_INVALID_VALUE : g->failed;
}

/* The server's answer to another process opening a handle. */
static void answer(const cs_fdpass_msg *in, cs_fdpass_msg *out)
{
    request q;
    memset(&q, 0, sizeof q);
    reply_head h = {.status = CUDA_ERROR_INVALID_VALUE};
    gather g = {0};
    if (in->len == sizeof q) {
        memcpy(&q, in->data, sizeof q);
        if (memcmp(q.magic, MAGIC, sizeof q.magic) == 0)
            h.status = gather_chunks(q.base, q.serial, out, &g);
    }
    if (h.status == CUDA_SUCCESS) {
        h.n = g.n;
        h.offset = q.base - g.first;
    }
    memcpy(out->data, &h, sizeof h);
    out->len = sizeof h + (h.status == CUDA_SUCCESS ? h.n * sizeof(reply_chunk) : 0);
}

static CUresult say_cannot_export(CUresult r, const char *why)
{
    static int said;
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        cs_log("cuIpcGetMemHandle on a pooled block fails (CUresult %d: %s): run programs that "
               "export memory with CACHESHIM_BACKEND=classic",
               (int)r, why);
    return r;
}

CUresult cs_ipc_export(CUipcMemHandle *handle, const cs_block_info *info, bool exportable)
{
    if (!exportable || !cs_driver_get()->cuMemExportToShareableHandle)
        return say_cannot_export(CUDA_ERROR_NOT_SUPPORTED,
                                 "the driver would not make its memory exportable");
    gather g;
    CUresult r = gather_chunks(info->base, info->serial, NULL, &g);
    if (r == CUDA_ERROR_NOT_SUPPORTED)
        return say_cannot_export(r, "it lies in more chunks than one reply can carry");
    if (r != CUDA_SUCCESS)
        return r;  /* freed meanwhile, as the driver answers */
    uint64_t token = 0;
    int e = cs_fdpass_serve(answer, &token);
    if (e)
        return say_cannot_export(CUDA_ERROR_OPERATING_SYSTEM, strerror(e));
    wire w = {.pid = (uint32_t)getpid(), .device = info->device, .token = token,
              .base = info->base, .serial = info->serial, .size = info->requested};
    memcpy(w.magic, MAGIC, sizeof w.magic);
    memset(handle, 0, sizeof *handle);
    memcpy(handle->reserved, &w, sizeof w);
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- importing */

/* A pooled block of another process, mapped here. */
typedef struct import {
    CUdeviceptr ptr;       /* what the program was given */
    size_t block;          /* the block's size, as its exporter's program asked */
    CUdeviceptr va;        /* the range reserved for it */
    size_t size;
    CUcontext ctx;
    size_t n;
    CUmemGenericAllocationHandle *handles;
    struct import *next;
} import;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static import *g_imports;

/* Unmap and give back what an import holds (what of it was made: n handles, size mapped):
 * the first failure. */
static CUresult undo(const cs_driver *d, CUdeviceptr va, size_t size, size_t mapped,
                     CUmemGenericAllocationHandle *h, size_t n)
{
    CUresult r = CUDA_SUCCESS, k;
    if (mapped && (k = d->cuMemUnmap(va, mapped)) != CUDA_SUCCESS && r == CUDA_SUCCESS)
        r = k;
    for (size_t i = 0; i < n; i++)
        if ((k = d->cuMemRelease(h[i])) != CUDA_SUCCESS && r == CUDA_SUCCESS)
            r = k;
    if (va && (k = d->cuMemAddressFree(va, size)) != CUDA_SUCCESS && r == CUDA_SUCCESS)
        r = k;
    return r;
}

static CUresult say_cannot_open(uint32_t pid, int e)
{
    cs_log("cuIpcOpenMemHandle: could not get the block from the process that exported it "
           "(pid %u): %s; it must still run, under cacheshim, as the same user",
           pid, strerror(e));
    return e == EMFILE ? CUDA_ERROR_OPERATING_SYSTEM : CUDA_ERROR_INVALID_VALUE;
}

/* Map the chunks of the reply into a new range, readable and writable by the context's
 * device. The descriptors are closed. */
static CUresult map_import(const cs_driver *d, const cs_fdpass_msg *m, CUdevice dev,
                           uint64_t block, import *im)
{
    reply_head h;
    memcpy(&h, m->data, sizeof h);
    const reply_chunk *c = (const reply_chunk *)(m->data + sizeof h);
    size_t n = h.n, mapped = 0;
    CUresult r = CUDA_SUCCESS;
    im->handles = calloc(n ? n : 1, sizeof *im->handles);
    if (!im->handles)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    for (size_t i = 0; i < n && r == CUDA_SUCCESS; i++) {
        r = d->cuMemImportFromShareableHandle(&im->handles[i], (void *)(intptr_t)m->fds[i],
                                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        im->n += r == CUDA_SUCCESS;
        if (r == CUDA_SUCCESS && c[i].at != im->size)
            r = CUDA_ERROR_INVALID_VALUE;  /* the chunks cover the block end to end */
        im->size += c[i].size;
    }
    for (size_t i = 0; i < m->nfds; i++)
        close(m->fds[i]);
    if (r == CUDA_SUCCESS && (h.offset >= im->size || block > im->size - h.offset))
        r = CUDA_ERROR_INVALID_VALUE;  /* the block lies inside its chunks */
    if (r == CUDA_SUCCESS)
        r = d->cuMemAddressReserve(&im->va, im->size, 0, 0, 0);
    for (size_t i = 0; i < n && r == CUDA_SUCCESS; i++) {
        r = d->cuMemMap(im->va + c[i].at, c[i].size, 0, im->handles[i], 0);
        mapped += r == CUDA_SUCCESS ? c[i].size : 0;
    }
    if (r == CUDA_SUCCESS) {
        CUmemAccessDesc a = {.location = {CU_MEM_LOCATION_TYPE_DEVICE, (int)dev},
                             .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        r = d->cuMemSetAccess(im->va, im->size, &a, 1);
    }
    if (r != CUDA_SUCCESS) {
        undo(d, im->va, im->size, mapped, im->handles, im->n);
        free(im->handles);
        return r;
    }
    im->ptr = im->va + h.offset;
    im->block = block;
    return CUDA_SUCCESS;
}

static CUresult open_pooled(const cs_driver *d, CUdeviceptr *pdptr, const wire *w,
                            unsigned int flags)
{
    CUcontext ctx = NULL;
    CUdevice dev;
    if (!pdptr || (flags & ~(unsigned)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
        return CUDA_ERROR_INVALID_VALUE;
    if (!d->cuMemImportFromShareableHandle || !d->cuMemAddressReserve || !d->cuMemMap ||
        !d->cuMemSetAccess || !d->cuMemUnmap || !d->cuMemRelease || !d->cuMemAddressFree)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (d->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx || d->cuCtxGetDevice(&dev) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (w->pid == (uint32_t)getpid())
        return CUDA_ERROR_INVALID_CONTEXT;  /* the driver's answer in the exporting process */
    cs_fdpass_msg *q = malloc(sizeof *q), *m = malloc(sizeof *m);
    import *im = calloc(1, sizeof *im);
    CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
    if (q && m && im) {
        request req = {.base = w->base, .serial = w->serial};
        memcpy(req.magic, MAGIC, sizeof req.magic);
        memcpy(q->data, &req, sizeof req);
        q->len = sizeof req;
        q->nfds = 0;
        reply_head h;
        int e = cs_fdpass_ask((pid_t)w->pid, w->token, q, m);
        if (e) {
            r = say_cannot_open(w->pid, e);
        } else if (m->len < sizeof h) {
            r = say_cannot_open(w->pid, EPROTO);
            for (size_t i = 0; i < m->nfds; i++)
                close(m->fds[i]);
        } else {
            memcpy(&h, m->data, sizeof h);
            if (h.status == CUDA_SUCCESS &&
                (h.n == 0 || h.n != m->nfds || m->len != sizeof h + h.n * sizeof(reply_chunk)))
                h.status = say_cannot_open(w->pid, EPROTO);
            if (h.status != CUDA_SUCCESS)
                for (size_t i = 0; i < m->nfds; i++)
                    close(m->fds[i]);
            r = h.status == CUDA_SUCCESS ? map_import(d, m, dev, w->size, im)
                                         : (CUresult)h.status;
        }
    }
    if (r == CUDA_SUCCESS) {
        im->ctx = ctx;
        pthread_mutex_lock(&g_lock);
        im->next = g_imports;
        __atomic_store_n(&g_imports, im, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&g_lock);
        *pdptr = im->ptr;
    } else {
        free(im);
    }
    free(q);
    free(m);
    return r;
}

static bool is_pooled_handle(const CUipcMemHandle *h, wire *w)
{
    memcpy(w, h->reserved, sizeof *w);
    return memcmp(w->magic, MAGIC, sizeof w->magic) == 0;
}

bool cs_ipc_find_import(uint64_t ptr, uint64_t *base, uint64_t *size, CUcontext *ctx)
{
    if (!__atomic_load_n(&g_imports, __ATOMIC_ACQUIRE))
        return false;  /* none: every pointer query asks, keep it cheap */
    pthread_mutex_lock(&g_lock);
    import *im = g_imports;
    while (im && !(ptr >= im->va && ptr < im->va + im->size))
        im = im->next;
    if (im) {
        *base = im->ptr;
        *size = im->block;
        *ctx = im->ctx;
    }
    pthread_mutex_unlock(&g_lock);
    return im != NULL;
}

void cs_ipc_after_fork_child(void)
{
    /* The parent's imports are not the child's (nor is its CUDA); a fork while a thread held
     * the lock left it held. */
    pthread_mutex_init(&g_lock, NULL);
    __atomic_store_n(&g_imports, NULL, __ATOMIC_RELEASE);
    cs_fdpass_after_fork_child();
}

typedef CUresult (*open_fn)(CUdeviceptr *, CUipcMemHandle, unsigned int);

/* A pooled block's handle is the shim's to open; any other is the driver's (`real`). */
static CUresult open_handle(open_fn real, CUdeviceptr *pdptr, CUipcMemHandle handle,
                            unsigned int flags)
{
    wire w;
    if (is_pooled_handle(&handle, &w))
        return open_pooled(cs_driver_get(), pdptr, &w, flags);
    return real ? real(pdptr, handle, flags) : CUDA_ERROR_NOT_INITIALIZED;
}

CS_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                         unsigned int Flags)
{
    return open_handle(cs_driver_get()->cuIpcOpenMemHandle_v2, pdptr, handle, Flags);
}

/* The form before CUDA 11.0, the same arguments. */
CS_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                      unsigned int Flags)
{
    return open_handle(cs_driver_get()->cuIpcOpenMemHandle, pdptr, handle, Flags);
}

/* Closing waits for the work of the context that opened it (unmapping memory a kernel still
 * uses would fault), then unmaps it and lets go of its memory. */
CS_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    const cs_driver *d = cs_driver_get();
    pthread_mutex_lock(&g_lock);
    import **p = &g_imports;
    while (*p && (*p)->ptr != dptr)
        p = &(*p)->next;
    import *im = *p;
    if (im)
        __atomic_store_n(p, im->next, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_lock);
    if (!im)
        return d->cuIpcCloseMemHandle ? d->cuIpcCloseMemHandle(dptr) : CUDA_ERROR_NOT_INITIALIZED;
    bool pushed;
    CUresult r = CUDA_ERROR_INVALID_CONTEXT;  /* gone: no work of it can be left */
    if (cs_ctx_enter(im->ctx, &pushed)) {
        r = d->cuCtxSynchronize();
        cs_ctx_leave(pushed);
    }
    CUresult u = undo(d, im->va, im->size, im->size, im->handles, im->n);
    free(im->handles);
    free(im);
    return r != CUDA_SUCCESS ? r : u;
}
