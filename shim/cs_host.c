/* Pinned host memory: a cache core of its own (cs_cache.h) whose backend allocates with
 * cuMemHostAlloc. One heap per context and flags value, so blocks of different flags (portable,
 * mapped, write-combined) never serve each other; all heaps are the cache's "device" 0, so
 * CACHESHIM_HOST_CAP bounds them together, as a share of the machine's memory.
 *
 * Reuse waits for the block's fence (CS_REUSE_COMPLETED): unlike device memory, the program
 * writes a pinned block from the CPU the moment it has it, so a stream made to wait would not
 * protect an asynchronous copy still reading it. Fences are every context's (see "fences"): a
 * pinned block is every context's to copy from and into. */
#include "cs_exports.h"

#include "cs_host.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cs_shim.h"
#include "cs_streams.h"

#define HOST_GRANULARITY 4096u  /* blocks above the small classes are whole pages */

static cs_cache *host;
static cs_size_spec host_cap, host_threshold;

/* The backend's state of one heap: a context and the flags its memory is allocated with. It is
 * also the heap's key. Kept for the process's life, like the heaps. */
typedef struct host_heap {
    CUcontext ctx;
    unsigned flags;
    cs_ctx_streams *streams;
    cs_heap *heap;
    struct host_heap *next;
} host_heap;

static pthread_mutex_t heaps_lock = PTHREAD_MUTEX_INITIALIZER;
static host_heap *heaps;
static uint64_t generation;  /* atomic: bumped whenever a heap is forgotten */

static _Thread_local struct {
    CUcontext ctx;
    unsigned flags;
    cs_heap *heap;
    uint64_t generation;
} last;

/* ---------------------------------------------------------------- backend */

static int be_code(CUresult r, int *raw)
{
    *raw = r;
    return r == CUDA_SUCCESS ? CS_BE_OK : r == CUDA_ERROR_OUT_OF_MEMORY ? CS_BE_OOM : CS_BE_ERROR;
}

static int host_alloc(void *dev, uint64_t size, uint64_t *addr, int *raw)
{
    host_heap *hh = dev;
    bool pushed;
    if (cs_streams_dead(hh->streams) || !cs_ctx_enter(hh->ctx, &pushed)) {
        *raw = CUDA_ERROR_INVALID_CONTEXT;
        return CS_BE_ERROR;
    }
    void *p = NULL;
    CUresult r = cs_driver_get()->cuMemHostAlloc(&p, (size_t)size, hh->flags);
    cs_ctx_leave(pushed);
    if (r == CUDA_SUCCESS)
        *addr = (uint64_t)(uintptr_t)p;
    return be_code(r, raw);
}

static int host_free(void *dev, uint64_t addr, int *raw)
{
    host_heap *hh = dev;
    bool pushed;
    if (cs_streams_dead(hh->streams) || !cs_ctx_enter(hh->ctx, &pushed)) {
        *raw = CUDA_ERROR_INVALID_CONTEXT;
        return CS_BE_ERROR;
    }
    CUresult r = cs_driver_get()->cuMemFreeHost((void *)(uintptr_t)addr);
    cs_ctx_leave(pushed);
    return be_code(r, raw);
}

/* ---------------------------------------------------------------- fences
 *
 * A pinned block is every context's: memory of cuMemAllocHost is "accessible to all contexts
 * on all devices which support unified addressing" (cuda.h), so a copy on a stream of another
 * context than the block's may still read or write it after its free. A host fence is the
 * fences of every live context taken at once (cs_streams_fence: nothing is recorded on a
 * context without work since its last), numbered in a sequence of its own; it completes once
 * each of them has or its context went, with its work. A context's epochs only grow, so host
 * fences complete in order, as the cache wants. The pending ones wait in a list, oldest
 * first; the newest stays when done, so that frees with no work since take its number. A
 * fence that found no host memory for its record has a number and no record: a later one
 * covers its work (a wait takes one). */
typedef struct {
    cs_ctx_streams *cs;
    uint64_t epoch;
} ctx_fence;

typedef struct fence_rec {
    uint64_t epoch;
    struct fence_rec *next;
    int n;
    ctx_fence f[];
} fence_rec;

#define FENCE_CONTEXTS 16  /* contexts listed on the stack */

static pthread_mutex_t fence_lock = PTHREAD_MUTEX_INITIALIZER;
static fence_rec *fences, *newest;  /* oldest first; newest, the last, kept when done */
static uint64_t fence_epoch;        /* the newest host fence's number */
static uint64_t fence_done;         /* atomic: every host fence up to this one completed */

static bool ctx_done(const ctx_fence *f)
{
    return cs_streams_dead(f->cs) || cs_streams_reached(f->cs, f->epoch) == 1;
}

/* Asks whether the fences up to `upto` completed, in order; the completed ones leave the list
 * (the newest stays). Never blocks. fence_lock held. */
static void fences_advance(uint64_t upto)
{
    fence_rec *h;
    while ((h = fences) && h->epoch <= upto) {
        if (h->epoch > __atomic_load_n(&fence_done, __ATOMIC_RELAXED)) {
            for (int i = 0; i < h->n; i++)
                if (!ctx_done(&h->f[i]))
                    return;
            __atomic_store_n(&fence_done, h->epoch, __ATOMIC_RELEASE);
        }
        if (h == newest)
            return;
        fences = h->next;
        free(h);
    }
}

static bool same_fences(const fence_rec *a, const ctx_fence *f, int n)
{
    if (a->n != n)
        return false;
    for (int i = 0; i < n; i++)
        if (a->f[i].cs != f[i].cs || a->f[i].epoch != f[i].epoch)
            return false;
    return true;
}

/* The contexts' fences are taken on the stack; a record is made only for a new host fence,
 * not for a free with no work since the newest (the usual one in a loop of frees). */
static uint64_t host_fence(void *dev)
{
    (void)dev;
    cs_ctx_streams *local[FENCE_CONTEXTS], **all = local;
    int cap = FENCE_CONTEXTS, n;
    while ((n = cs_streams_all(all, cap)) > cap) {
        if (all != local)
            free(all);
        cap = n + FENCE_CONTEXTS;
        if (!(all = malloc((size_t)cap * sizeof *all)))
            break;
    }
    ctx_fence local_f[FENCE_CONTEXTS], *f = NULL;
    if (all)
        f = n <= FENCE_CONTEXTS ? local_f : malloc((size_t)n * sizeof *f);
    for (int i = 0; f && i < n; i++)
        f[i] = (ctx_fence){all[i], cs_streams_fence(all[i])};
    if (all != local)
        free(all);
    pthread_mutex_lock(&fence_lock);
    uint64_t epoch;
    if (f && newest && same_fences(newest, f, n)) {
        epoch = newest->epoch;  /* no work since: its fence covers this free */
    } else {
        epoch = ++fence_epoch;
        fence_rec *h = f ? malloc(sizeof *h + (size_t)n * sizeof *h->f) : NULL;
        if (h) {
            h->epoch = epoch;
            h->next = NULL;
            h->n = n;
            memcpy(h->f, f, (size_t)n * sizeof *f);
            if (newest)
                newest->next = h;
            else
                fences = h;
            newest = h;
        }
    }
    pthread_mutex_unlock(&fence_lock);
    if (f != local_f)
        free(f);
    return epoch;
}

static int host_reached(void *dev, uint64_t epoch)
{
    (void)dev;
    if (epoch <= __atomic_load_n(&fence_done, __ATOMIC_ACQUIRE))
        return 1;
    pthread_mutex_lock(&fence_lock);
    fences_advance(epoch);
    pthread_mutex_unlock(&fence_lock);
    return epoch <= __atomic_load_n(&fence_done, __ATOMIC_ACQUIRE);
}

/* Waits for the first fence from epoch on (one taken now if there is none: it covers the
 * work of a fence without a record too), each context's without the lock. */
static int host_wait(void *dev, uint64_t epoch)
{
    if (epoch <= __atomic_load_n(&fence_done, __ATOMIC_ACQUIRE))
        return 0;
    ctx_fence *f = NULL;
    int n = 0;
    uint64_t covering = 0;
    for (int tries = 0; !f && tries < 2; tries++) {
        if (tries)
            host_fence(dev);
        pthread_mutex_lock(&fence_lock);
        const fence_rec *h = fences;
        while (h && h->epoch < epoch)
            h = h->next;
        if (h && (f = malloc(sizeof *f * (size_t)(h->n + 1)))) {
            n = h->n;
            memcpy(f, h->f, sizeof *f * (size_t)n);
            covering = h->epoch;
        }
        pthread_mutex_unlock(&fence_lock);
    }
    if (!f)
        return -1;
    int rc = 0;
    for (int i = 0; i < n; i++)
        if (!cs_streams_dead(f[i].cs) && cs_streams_wait(f[i].cs, f[i].epoch) != 0 &&
            !cs_streams_dead(f[i].cs))
            rc = -1;
    free(f);
    if (rc == 0)
        host_reached(dev, covering);  /* the list moves on */
    return rc;
}

/* Never asked (reuse waits for completion); a stream's wait cannot protect a CPU write. */
static int host_order_after(void *dev, uint64_t epoch)
{
    (void)dev;
    (void)epoch;
    return -1;
}
static int host_busy(void *dev) { return cs_streams_busy(((host_heap *)dev)->streams); }

static const cs_backend_ops host_ops = {
    .alloc = host_alloc,
    .free = host_free,
    .fence = host_fence,
    .reached = host_reached,
    .wait = host_wait,
    .order_after = host_order_after,
    .busy_streams = host_busy,
    .vmm = NULL,
};

/* ---------------------------------------------------------------- the cache */

static uint64_t cap_for(void *arg, uint64_t total)
{
    (void)arg;
    return cs_cap_resolve(&host_cap, total, CS_MIN_HOST_CAP);
}

static uint64_t threshold_for(void *arg, uint64_t total)
{
    (void)arg;
    return cs_size_resolve(&host_threshold, total);
}

bool cs_host_init(const cs_options *opts,
                  void (*on_release)(void *, int, uint64_t, uint64_t, cs_release_reason))
{
    host_cap = opts->host_cap;
    host_threshold = opts->host_release_threshold;
    cs_cache_config config = {
        .cap_for = cap_for,
        .threshold_for = threshold_for,
        .on_release = on_release,
        .reuse = CS_REUSE_COMPLETED,
        .capturing = cs_streams_capturing,
    };
    host = cs_cache_create(&config);
    return host != NULL;
}

cs_cache *cs_host_cache(void)
{
    return host;
}

uint64_t cs_host_total(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : UINT64_MAX;
}

static cs_heap *heap_for(CUcontext ctx, unsigned flags)
{
    uint64_t gen = __atomic_load_n(&generation, __ATOMIC_ACQUIRE);
    if (last.heap && last.ctx == ctx && last.flags == flags && last.generation == gen)
        return last.heap;
    cs_heap *h = NULL;
    pthread_mutex_lock(&heaps_lock);
    host_heap *hh = heaps;
    while (hh && (hh->ctx != ctx || hh->flags != flags))
        hh = hh->next;
    if (!hh && (hh = calloc(1, sizeof *hh))) {
        hh->ctx = ctx;
        hh->flags = flags;
        hh->streams = cs_streams_for(ctx);
        hh->heap = hh->streams ? cs_cache_add_heap(host, hh, 0, cs_host_total(), &host_ops, hh,
                                                   HOST_GRANULARITY)
                               : NULL;
        if (hh->heap) {
            hh->next = heaps;
            heaps = hh;
        } else {
            free(hh);
            hh = NULL;
        }
    }
    if (hh)
        h = hh->heap;
    pthread_mutex_unlock(&heaps_lock);
    if (h) {
        last.ctx = ctx;
        last.flags = flags;
        last.heap = h;
        last.generation = gen;
    }
    return h;
}

void cs_host_context_gone(CUcontext ctx)
{
    if (!host)
        return;
    __atomic_add_fetch(&generation, 1, __ATOMIC_RELEASE);
    pthread_mutex_lock(&heaps_lock);
    for (host_heap **p = &heaps; *p;) {
        host_heap *hh = *p;
        if (hh->ctx != ctx) {
            p = &hh->next;
            continue;
        }
        *p = hh->next;
        /* Its memory went with the context; the heap is kept by the core, and so is this,
         * its backend state (a thread that dropped the core's lock may still use it). */
        cs_cache_forget_heap(host, hh);
    }
    pthread_mutex_unlock(&heaps_lock);
}

void cs_host_lock(void)
{
    if (host) {
        pthread_mutex_lock(&heaps_lock);
        cs_cache_lock_also(host);
        pthread_mutex_lock(&fence_lock);  /* taken under the cache's lock, before a context's */
    }
}

void cs_host_unlock(void)
{
    if (host) {
        pthread_mutex_unlock(&fence_lock);
        cs_cache_unlock_also(host);
        pthread_mutex_unlock(&heaps_lock);
    }
}

void cs_host_reset_after_fork(void)
{
    if (!host)
        return;
    cs_cache_reset_after_fork_also(host);
    while (fences) {  /* the parent's contexts are not the child's: nothing to wait for */
        fence_rec *h = fences;
        fences = h->next;
        free(h);
    }
    newest = NULL;
    __atomic_store_n(&fence_done, fence_epoch, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&fence_lock);
    while (heaps) {
        host_heap *hh = heaps;
        heaps = hh->next;
        free(hh);
    }
    __atomic_add_fetch(&generation, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&heaps_lock);
}

/* ---------------------------------------------------------------- entry points */

/* The cache's answer, or the driver's when the cache does not serve the call. */
static CUresult host_alloc_call(const cs_driver *d, void **pp, size_t bytesize, unsigned flags,
                                bool plain)
{
    cs_shim *s = cs_shim_get();
    CUcontext ctx = NULL;
    cs_heap *h;
    if (s->disabled || !host || !pp || bytesize == 0 || !d->cuMemHostAlloc ||
        d->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx || !(h = heap_for(ctx, flags)))
        return plain ? d->cuMemAllocHost_v2(pp, bytesize) : d->cuMemHostAlloc(pp, bytesize, flags);
    uint64_t addr;
    int raw = CUDA_SUCCESS;
    cs_alloc_failure failure;
    switch (cs_cache_alloc(host, h, bytesize, &addr, &raw, &failure)) {
    case CS_OK:
        *pp = (void *)(uintptr_t)addr;
        return CUDA_SUCCESS;
    case CS_OOM:
        cs_shim_report_host_failure(&failure);
        return CUDA_ERROR_OUT_OF_MEMORY;
    case CS_GONE:
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    default:
        return (CUresult)raw;
    }
}

CS_EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    const cs_driver *d = cs_driver_get();
    if (!d->cuMemAllocHost_v2)
        return CUDA_ERROR_NOT_INITIALIZED;
    return host_alloc_call(d, pp, bytesize, 0, true);
}

CS_EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    const cs_driver *d = cs_driver_get();
    if (!d->cuMemHostAlloc)
        return CUDA_ERROR_NOT_INITIALIZED;
    return host_alloc_call(d, pp, bytesize, Flags, false);
}

CS_EXPORT CUresult cuMemFreeHost(void *p)
{
    const cs_driver *d = cs_driver_get();
    if (!d->cuMemFreeHost)
        return CUDA_ERROR_NOT_INITIALIZED;
    cs_shim *s = cs_shim_get();
    if (s->disabled || !host || !p)
        return d->cuMemFreeHost(p);
    switch (cs_cache_free(host, (uint64_t)(uintptr_t)p)) {
    case CS_OK:
        if (s->opts.sync_free && d->cuCtxSynchronize)
            return d->cuCtxSynchronize();
        return CUDA_SUCCESS;
    case CS_NOT_IN_USE:
        return CUDA_ERROR_INVALID_VALUE;
    default:
        return d->cuMemFreeHost(p);
    }
}
