/* Fake CUDA driver: who may touch which device bytes. Copies, memsets and kernels name device
 * bytes by address; this file checks that they may touch them and turns them into touches
 * (struct fake_touch): the memory behind the bytes, which the timeline's race check
 * compares, and through which mapping, which the unmap check looks for.
 *
 * Device memory is cuMemAlloc memory, or VMM memory once it is mapped and its device was
 * given access (cuMemSetAccess). A copy or memset must lie inside one allocation, or in
 * mapped memory, across as many adjacent mappings as it likes, that the copying context's
 * device may read (the source) or read and write (the destination); else it fails with
 * CUDA_ERROR_INVALID_VALUE, as on the real driver. A kernel must touch memory inside one
 * allocation or one reservation (else CUDA_ERROR_INVALID_VALUE, the fake's rule since
 * before VMM); touching bytes its device may not read and write is what faults on a GPU, so
 * the launch succeeds and the fault is counted (fake_access_faults) once it is submitted.
 *
 * Peers. A kernel may touch cuMemAlloc memory of another device only if its context enabled
 * peer access to the memory's context (cuCtxEnablePeerAccess). That does not reach VMM
 * memory, which another device may touch only once cuMemSetAccess granted it, as on the real
 * driver. Copies between devices need neither for cuMemAlloc memory (unified addressing). */
#include "fake_internal.h"

#include <stdio.h>
#include <stdlib.h>

void fake_touches_free(struct fake_touches *t)
{
    free(t->v);
    *t = (struct fake_touches){0};
}

/* Empty touches are dropped: they touch nothing. */
static CUresult add(struct fake_touches *t, struct fake_touch x)
{
    if (x.n == 0)
        return CUDA_SUCCESS;
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 4;
        struct fake_touch *v = realloc(t->v, (size_t)cap * sizeof *v);
        if (!v)
            return CUDA_ERROR_OUT_OF_MEMORY;
        t->v = v;
        t->cap = cap;
    }
    t->v[t->n++] = x;
    return CUDA_SUCCESS;
}

/* The allocation holding all n bytes at p, or NULL. */
static const fake_alloc *in_alloc(CUdeviceptr p, size_t n)
{
    const fake_alloc *a = fake_mem_find(p);
    return a && n <= a->base + a->size - p ? a : NULL;
}

/* cuMemAlloc memory is named by its address. */
static struct fake_touch plain(CUdeviceptr p, size_t n)
{
    return (struct fake_touch){.va = p, .n = n, .space = 0, .at = p, .mapping = 0};
}

static bool allows(unsigned char have, bool write)
{
    unsigned need = write ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ;
    return (have & need) == need;
}

/* VMM memory: walk the len bytes at p mapping by mapping, adding a touch of the physical
 * allocation behind each piece (none if `record` is false). Stops at the first byte that
 * device dev may not access so (outside a reservation, unmapped, or without that access)
 * and puts its address in *bad; *bad = 0 when there is none. */
static CUresult walk(struct fake_touches *t, CUdeviceptr p, size_t len, bool record, int dev,
                     bool write, CUdeviceptr *bad)
{
    *bad = 0;
    for (CUdeviceptr at = p; at < p + len;) {
        struct fake_vmm_at v;
        if (!fake_vmm_at(at, &v) || !v.mapped || !allows(v.access[dev], write)) {
            *bad = at;
            return CUDA_SUCCESS;
        }
        CUdeviceptr end = v.map_base + v.map_size < p + len ? v.map_base + v.map_size : p + len;
        struct fake_touch x = {.va = at, .n = record ? end - at : 0, .space = v.handle,
                               .at = v.offset, .mapping = v.map_id};
        CUresult rc = add(t, x);
        if (rc != CUDA_SUCCESS)
            return rc;
        at = end;
    }
    return CUDA_SUCCESS;
}

/* A zero-byte copy still names a byte that must exist: the one at p. */
CUresult fake_access_copy(struct fake_touches *t, const struct fake_range *r, int dev)
{
    size_t len = r->n ? r->n : 1;
    if (len > UINT64_MAX - r->p)
        return CUDA_ERROR_INVALID_VALUE;
    if (in_alloc(r->p, len))
        return add(t, plain(r->p, r->n));
    CUdeviceptr bad;
    CUresult rc = walk(t, r->p, len, r->n > 0, dev, r->write, &bad);
    if (rc == CUDA_SUCCESS && bad)
        rc = CUDA_ERROR_INVALID_VALUE;
    return rc;
}

static void fault(struct fake_touches *t, CUdeviceptr at)
{
    if (t->faults++ == 0)
        t->fault_at = at;
}

/* The touch kernel reads and writes. */
CUresult fake_access_kernel(struct fake_touches *t, CUdeviceptr p, size_t n, const fake_ctx *ctx)
{
    if (n > UINT64_MAX - p)
        return CUDA_ERROR_INVALID_VALUE;
    const fake_alloc *a = fake_mem_find(p);
    if (a) {
        if (n > a->base + a->size - p)
            return CUDA_ERROR_INVALID_VALUE;
        if (!fake_ctx_reaches(ctx, a->ctx))
            fault(t, p);
        return add(t, plain(p, n));
    }
    struct fake_vmm_at v;
    if (!fake_vmm_at(p, &v) || n > v.res_base + v.res_size - p)
        return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr bad;
    CUresult rc = walk(t, p, n, true, ctx->device, true, &bad);
    if (rc == CUDA_SUCCESS && bad)
        fault(t, bad);
    return rc;
}

/* ---- access faults ---------------------------------------------------------------------- */

atomic_long fake_access_fault_count;

void fake_access_faulted(const char *name, const fake_stream *s, const struct fake_touches *t)
{
    if (!t->faults)
        return;
    atomic_fetch_add(&fake_access_fault_count, 1);
    fprintf(stderr,
            "fake cuda: access fault: %s on stream %p (device %d) touches 0x%llx, which that "
            "device may not access\n",
            name, (const void *)s, s->ctx->device, (unsigned long long)t->fault_at);
}

FAKE_API long fake_access_faults(void) { return atomic_load(&fake_access_fault_count); }

/* ---- peer access -------------------------------------------------------------------------- */

static int peer_index(const fake_ctx *c, const fake_ctx *peer)
{
    for (int i = 0; i < c->npeers; i++)
        if (c->peers[i] == peer)
            return i;
    return -1;
}

bool fake_ctx_reaches(const fake_ctx *by, const fake_ctx *owner)
{
    return by->device == owner->device || (!owner->destroyed && peer_index(by, owner) >= 0);
}

/* Any two distinct devices may be peers; a device is never its own. */
static CUresult can_access_peer(int *can, CUdevice dev, CUdevice peer)
{
    if (!can)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= fake_device_count || peer < 0 || peer >= fake_device_count)
        return CUDA_ERROR_INVALID_DEVICE;
    *can = dev != peer;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
    ENTER(cuDeviceCanAccessPeer);
    LOCKED(can_access_peer(canAccessPeer, dev, peerDev));
}

/* The current context and a live peer context. */
static CUresult ctx_pair(CUcontext h, fake_ctx **c, fake_ctx **peer)
{
    CUresult rc = fake_current_ctx(c);
    if (rc != CUDA_SUCCESS)
        return rc;
    *peer = fake_reg_find(h, KIND_CTX);
    return *peer && !(*peer)->destroyed ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

static CUresult enable_peer(CUcontext h, unsigned flags)
{
    fake_ctx *c, *peer;
    CUresult rc = ctx_pair(h, &c, &peer);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (flags)
        return CUDA_ERROR_INVALID_VALUE;
    if (peer->device == c->device)
        return CUDA_ERROR_INVALID_DEVICE; /* cuDeviceCanAccessPeer says 0 */
    /* Destroyed peers free their slots. */
    int k = 0;
    for (int i = 0; i < c->npeers; i++)
        if (!c->peers[i]->destroyed)
            c->peers[k++] = c->peers[i];
    c->npeers = k;
    if (peer_index(c, peer) >= 0)
        return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    if (c->npeers == FAKE_MAX_PEERS)
        return CUDA_ERROR_TOO_MANY_PEERS;
    c->peers[c->npeers++] = peer;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
    ENTER(cuCtxEnablePeerAccess);
    LOCKED(enable_peer(peerContext, Flags));
}

static CUresult disable_peer(CUcontext h)
{
    fake_ctx *c, *peer;
    CUresult rc = ctx_pair(h, &c, &peer);
    if (rc != CUDA_SUCCESS)
        return rc;
    int i = peer_index(c, peer);
    if (i < 0)
        return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
    c->peers[i] = c->peers[--c->npeers];
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxDisablePeerAccess(CUcontext peerContext)
{
    ENTER(cuCtxDisablePeerAccess);
    LOCKED(disable_peer(peerContext));
}
