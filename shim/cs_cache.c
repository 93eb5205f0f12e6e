/* The cache core. One mutex guards the bookkeeping; it is never held across a driver call
 * that waits for the device (allocation, free, a host wait for a fence): those run after the
 * lock is dropped, with their bytes counted as held meanwhile, so a thread waiting on the
 * driver never stalls the others. The backend's fence, reached and order_after (event records,
 * queries) may run under it.
 *
 * A block is one driver allocation (the classic backend), or a range or slab slot of the
 * heap's physical pool (cs_pool.h): the shim answers pointer queries for it (cs_cache_find).
 * A freed block waits in its class's idle list with the fence epoch the backend gave at its
 * free. It is reused once that epoch has completed or, in ordered mode,
 * at once, after the backend has arranged that every stream's next work waits for the epoch
 * on the GPU (see "reuse").
 *
 * A large block of a pooled heap does not wait whole: at its free its memory joins the pool's
 * free spans, with its epoch (joins_at_free), and a large request is carved out of the
 * smallest free span it fits (carve_block), ordered after the work on it as a block reused
 * whole is. Only with several busy streams, or its work pending with completed reuse, does a
 * large block wait in the idle lists. A miss then first moves the memory of idle blocks whose
 * fences completed, oldest first, to the new block (see "moves") and takes memory from the
 * driver only for the rest; in ordered mode, idle blocks the GPU still works on may move
 * too (a small one's slot back to its slab, a block from its range ordered after that work).
 *
 * In front of this core sit per-thread caches (cs_tcache.c): a thread's allocation of a block
 * it freed itself, and its free of a block it holds, take no lock here. What they own the
 * core sees through their owner's lock: the trim, the cap, OOM recovery, statistics, lookups
 * and a free from another thread. */
#include "cs_cache.h"

#include <stdlib.h>
#include <string.h>

#include "cs_cache_int.h"
#include "cs_tcache.h"

/* ---------------------------------------------------------------- size classes */

int cs_size_class(uint64_t size, uint64_t *class_bytes)
{
    if (size <= 8192) {
        uint64_t steps = size == 0 ? 1 : (size + 511) / 512;
        *class_bytes = steps * 512;
        return (int)steps - 1;
    }
    uint64_t s = size - 1;
    int e = 63 - __builtin_clzll(s);            /* 2^e <= s < 2^(e+1), e >= 13 */
    uint64_t step = (uint64_t)1 << (e - 4);
    int idx = 16 + (e - 13) * 16 + (int)((s >> (e - 4)) & 15);
    if (idx >= CS_NUM_CLASSES)
        return -1;
    *class_bytes = (s | (step - 1)) + 1;
    return idx;
}

/* ---------------------------------------------------------------- registry */

static size_t bucket_of(const cs_cache *c, uint64_t addr)
{
    /* Driver pointers are 512-byte aligned at least; mix the rest. */
    return (size_t)(((addr >> 9) * 0x9E3779B97F4A7C15ull) >> 20) & (c->nbuckets - 1);
}

static bool registry_grow(cs_cache *c)
{
    size_t n = c->nbuckets ? c->nbuckets * 2 : 1024;
    cs_block **nb = calloc(n, sizeof *nb);
    if (!nb)
        return false;
    cs_block **old = c->buckets;
    size_t oldn = c->nbuckets;
    c->buckets = nb;
    c->nbuckets = n;
    for (size_t i = 0; i < oldn; i++) {
        cs_block *b = old[i];
        while (b) {
            cs_block *next = b->hash_next;
            size_t k = bucket_of(c, b->addr);
            b->hash_next = nb[k];
            nb[k] = b;
            b = next;
        }
    }
    free(old);
    return true;
}

static bool registry_add(cs_cache *c, cs_block *b)
{
    if (c->nblocks >= c->nbuckets && !registry_grow(c))
        return false;
    size_t k = bucket_of(c, b->addr);
    b->hash_next = c->buckets[k];
    c->buckets[k] = b;
    c->nblocks++;
    return true;
}

static cs_block *registry_find(const cs_cache *c, uint64_t addr)
{
    if (!c->nbuckets)
        return NULL;
    for (cs_block *b = c->buckets[bucket_of(c, addr)]; b; b = b->hash_next)
        if (b->addr == addr)
            return b;
    return NULL;
}

static void registry_remove(cs_cache *c, cs_block *b)
{
    cs_block **p = &c->buckets[bucket_of(c, b->addr)];
    while (*p != b)
        p = &(*p)->hash_next;
    *p = b->hash_next;
    c->nblocks--;
}

/* ---------------------------------------------------------------- idle lists */

static void idle_push(cs_heap *h, cs_block *b)
{
    block_list *l = &h->classes[b->cls];
    b->cls_next = NULL;
    b->cls_prev = l->tail;
    if (l->tail)
        l->tail->cls_next = b;
    else
        l->head = b;
    l->tail = b;

    b->lru_next = NULL;
    b->lru_prev = h->lru_tail;
    if (h->lru_tail)
        h->lru_tail->lru_next = b;
    else
        h->lru_head = b;
    h->lru_tail = b;
}

static void idle_unlink(cs_heap *h, cs_block *b)
{
    block_list *l = &h->classes[b->cls];
    if (b->cls_prev)
        b->cls_prev->cls_next = b->cls_next;
    else
        l->head = b->cls_next;
    if (b->cls_next)
        b->cls_next->cls_prev = b->cls_prev;
    else
        l->tail = b->cls_prev;

    if (b->lru_prev)
        b->lru_prev->lru_next = b->lru_next;
    else
        h->lru_head = b->lru_next;
    if (b->lru_next)
        b->lru_next->lru_prev = b->lru_prev;
    else
        h->lru_tail = b->lru_prev;
}

/* A block back from a thread cache: its epoch may be older than blocks freed since, so it
 * goes where its epoch puts it (lists stay oldest first: if a head is not ready, no block
 * behind it is). */
void cs_core_idle_return(cs_cache *c, cs_block *b)
{
    cs_heap *h = b->heap;
    block_list *l = &h->classes[b->cls];
    cs_block *after = l->tail;
    while (after && after->epoch > b->epoch)
        after = after->cls_prev;
    b->cls_prev = after;
    b->cls_next = after ? after->cls_next : l->head;
    if (b->cls_next)
        b->cls_next->cls_prev = b;
    else
        l->tail = b;
    if (after)
        after->cls_next = b;
    else
        l->head = b;

    after = h->lru_tail;
    while (after && after->epoch > b->epoch)
        after = after->lru_prev;
    b->lru_prev = after;
    b->lru_next = after ? after->lru_next : h->lru_head;
    if (b->lru_next)
        b->lru_next->lru_prev = b;
    else
        h->lru_tail = b;
    if (after)
        after->lru_next = b;
    else
        h->lru_head = b;
    c->devices[h->device].idle_bytes += b->size;
}

/* ---------------------------------------------------------------- readiness */

/* Has the work before this block's free completed? Asks the backend (never blocks). */
static bool block_ready(cs_heap *h, const cs_block *b)
{
    return cs_epoch_ready(h, b->epoch);
}

/* ---------------------------------------------------------------- accounting */

/* In use or idle, here or in a thread cache, or in a driver call: what the cap bounds. Blocks
 * change owner only under the lock, so this is exact under it. */
static uint64_t held(const device_state *d)
{
    return cs_load(&d->base) + d->idle_bytes + d->spare_bytes + d->pending_bytes +
           d->outside_bytes;
}

/* The group is charged exactly what the device holds (memory went back). Lock held. */
static void group_settle(cs_cache *c, int device)
{
    device_state *d = &c->devices[device];
    uint64_t now = held(d), over = 0;
    if (!c->config.group_charge || now == d->group_charged)
        return;
    if (now < d->group_charged)
        c->config.group_uncharge(c->config.group_arg, device, d->group_charged - now);
    else  /* never expected: held grows only through over_cap; counted all the same */
        c->config.group_charge(c->config.group_arg, device, now - d->group_charged,
                               CS_UNLIMITED, &over);
    d->group_charged = now;
}

/* In use and cached, with what the thread caches hold (their locks taken): exact. */
static void device_bytes(cs_cache *c, int device, uint64_t *in_use, uint64_t *cached)
{
    cacheshim_stats t;
    memset(&t, 0, sizeof t);
    cs_tc_add_stats(c, device, &t);
    *in_use = c->devices[device].in_use + t.bytes_in_use;
    *cached = c->devices[device].idle_bytes + c->devices[device].spare_bytes + t.bytes_cached;
}

/* ---------------------------------------------------------------- release
 *
 * Blocks leave the cache outside the lock: a driver free waits for the whole device (which
 * also makes it safe whether or not the block's fence completed), an unmap must first wait
 * for the block's fence, and other threads need not wait with either. Under the lock a block
 * is only detached onto a list; its bytes stay held (pending) until the backend returned.
 * What a pool keeps (a move, or a slab's slot) becomes its heap's spare. */

static void detach_idle(cs_cache *c, cs_block *b)
{
    cs_heap *h = b->heap;
    idle_unlink(h, b);
    registry_remove(c, b);
    c->devices[h->device].idle_bytes -= b->size;
}

static void defer_release(cs_cache *c, cs_block *b, cs_block **list)
{
    detach_idle(c, b);
    c->devices[b->heap->device].pending_bytes += b->size;
    b->hash_next = *list;
    *list = b;
}

/* The heap's pool kept `kept` bytes (may be negative: it gave spare back). Lock held. */
static void spare_add(cs_cache *c, cs_heap *h, int64_t kept)
{
    h->spare_bytes += (uint64_t)kept;
    c->devices[h->device].spare_bytes += (uint64_t)kept;
}

/* One block leaves: to the driver, or (keep, pooled heaps) to its pool's spare. Returns the
 * bytes given back to the driver; *waited (may be NULL) is set when the host waited for the
 * block's fence. Without the lock. A heap is never freed before the cache, so b->heap stays
 * readable even when its context went meanwhile. */
static uint64_t backend_free(cs_heap *h, cs_block *b, bool keep, bool *waited)
{
    int raw;
    if (!h->pool) {
        h->ops->free(h->dev, b->addr, &raw); /* nothing better to do on error */
        return b->size;
    }
    if (h->dead)
        return b->size;  /* the context took its memory with it */
    /* Unmapping does not wait for the GPU: the fence first. A block that stays in the pool
     * joins its free memory at once, with its fence (cs_pool.h): nobody waits. */
    bool done = cs_epoch_ready(h, b->epoch);
    if (!done && !keep) {
        done = h->ops->wait(h->dev, b->epoch) == 0;
        if (waited)
            *waited = true;
    }
    uint64_t released = 0;
    cs_pool_free(h->pool, b->addr, keep, done, b->epoch, &released, &raw);
    return released;
}

/* Called without the lock: let go of what defer_release detached. Returns the bytes given
 * back to the driver (pooled heaps: what the pool released, which may be more or less than
 * the blocks' bytes). */
static uint64_t finish_releases(cs_cache *c, int device, cs_block *list, cs_release_reason why)
{
    uint64_t total = 0;
    while (list) {
        cs_block *b = list;
        list = b->hash_next;
        cs_heap *h = b->heap;
        device_state *d = &c->devices[device];
        /* A pooled block's memory is the pool's spare from the moment the pool may hand it
         * to another thread's block: counted so before, never after (held stays exact). */
        bool spare_first = h->pool != NULL;
        if (spare_first) {
            pthread_mutex_lock(&c->lock);
            d->pending_bytes -= b->size;
            if (!h->dead)
                spare_add(c, h, (int64_t)b->size);
            pthread_mutex_unlock(&c->lock);
        }
        bool waited = false;
        uint64_t released = backend_free(h, b, why == CS_RELEASE_MOVE, &waited);
        total += released;
        pthread_mutex_lock(&c->lock);
        if (!spare_first)
            d->pending_bytes -= b->size;
        if (waited)
            d->st.fence_waits++;
        if (!h->dead)
            spare_add(c, h, (spare_first ? 0 : (int64_t)b->size) - (int64_t)released);
        if (why == CS_RELEASE_MOVE)
            d->st.moves++;
        if (released) {
            d->st.driver_frees++;
            d->st.releases++;
            if (c->config.on_release)
                c->config.on_release(c->config.release_arg, device, b->addr, b->size, why);
        }
        group_settle(c, device);
        pthread_mutex_unlock(&c->lock);
        free(b);
    }
    return total;
}

/* Does a stream capture run anywhere in the process? Then nothing goes back to the driver and
 * nothing waits for the device (either could break it). */
static bool capture_running(const cs_cache *c)
{
    return c->config.capturing && c->config.capturing();
}

/* The pools' spare chunks of a device: what trim_spare can give back. Lock held. */
static uint64_t trimmable_spare(cs_cache *c, int device)
{
    uint64_t n = 0;
    for (cs_heap *h = c->heaps; h; h = h->next)
        if (h->device == device && h->pool && !h->dead && h->spare_bytes) {
            cs_pool_counts k;
            cs_pool_counts_get(h->pool, &k);
            n += k.spare;
        }
    return n;
}

/* Give the pools' spare memory of a device back to the driver, up to `bytes`. Called with the
 * lock held, returns with it held (dropped around the driver calls). Bytes released. Free
 * memory the GPU still works on goes only after a wait for the whole device, only if `wait`.
 * Nothing while a capture runs: a free or a wait could break it. */
static uint64_t trim_spare(cs_cache *c, int device, uint64_t bytes, bool wait,
                           cs_release_reason why)
{
    uint64_t total = 0;
    if (capture_running(c))
        return 0;
    /* Heaps are never freed, and a forgotten one (dead, on the dead list that h->next may
     * lead to while the lock was dropped) is skipped: the walk ends. */
    for (cs_heap *h = c->heaps; h && total < bytes; h = h->next) {
        if (h->device != device || h->dead || !h->pool || !h->spare_bytes)
            continue;
        pthread_mutex_unlock(&c->lock);
        uint64_t n = cs_pool_trim(h->pool, bytes - total, wait);
        pthread_mutex_lock(&c->lock);
        if (!h->dead)
            spare_add(c, h, -(int64_t)n);
        if (n) {
            total += n;
            c->devices[device].st.driver_frees++;
            c->devices[device].st.releases++;
            if (c->config.on_release)
                c->config.on_release(c->config.release_arg, device, 0, n, why);
        }
    }
    group_settle(c, device);
    return total;
}

/* Detach idle blocks of a device, oldest first, until at most target_idle bytes are idle.
 * With ready_only, only blocks whose fence completed (found without waiting). Nothing while
 * a capture runs. Returns bytes detached. */
static uint64_t release_idle_to(cs_cache *c, int device, bool ready_only, uint64_t target_idle,
                                cs_block **deferred)
{
    device_state *d = &c->devices[device];
    uint64_t released = 0;
    if (capture_running(c))
        return 0;  /* a driver free could break a running capture */
    cs_tc_reclaim(c, device, ready_only);  /* the threads' idle blocks are candidates too */
    for (cs_heap *h = c->heaps; h && d->idle_bytes > target_idle; h = h->next) {
        if (h->device != device)
            continue;
        cs_block *b = h->lru_head;
        while (b && d->idle_bytes > target_idle) {
            cs_block *next = b->lru_next;
            if (!ready_only || block_ready(h, b)) {
                released += b->size;
                defer_release(c, b, deferred);
            }
            b = next;
        }
    }
    return released;
}

/* ---------------------------------------------------------------- heaps */

/* The pool's question (cs_pool_ready_fn): has the heap's work up to epoch completed? */
static bool heap_epoch_ready(void *heap, uint64_t epoch)
{
    return cs_epoch_ready(heap, epoch);
}

/* Zeroed memory on its own cache lines: what the fast paths read stays off lines that
 * something else writes. */
static void *alloc_lines(size_t size)
{
    size = (size + CS_LINE - 1) / CS_LINE * CS_LINE;
    void *p = aligned_alloc(CS_LINE, size);
    if (p)
        memset(p, 0, size);
    return p;
}

cs_cache *cs_cache_create(const cs_cache_config *config)
{
    cs_cache *c = alloc_lines(sizeof *c);
    if (!c)
        return NULL;
    pthread_mutex_init(&c->lock, NULL);
    c->config = *config;
    return c;
}

static void free_all(cs_cache *c)
{
    for (size_t i = 0; i < c->nbuckets; i++) {
        cs_block *b = c->buckets[i];
        while (b) {
            cs_block *next = b->hash_next;
            free(b);
            b = next;
        }
    }
    free(c->buckets);
    c->buckets = NULL;
    c->nbuckets = c->nblocks = 0;
    for (int list = 0; list < 2; list++) {
        cs_heap *h = list ? c->dead_heaps : c->heaps;
        while (h) {
            cs_heap *next = h->next;
            cs_pool_destroy(h->pool);
            free(h);
            h = next;
        }
    }
    c->heaps = c->dead_heaps = c->last_heap = NULL;
}

void cs_cache_destroy(cs_cache *c)
{
    if (!c)
        return;
    cs_tc_registry_lock();
    cs_tc_detach_all(c);
    cs_tc_registry_unlock();
    free_all(c);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

static cs_heap *find_heap(cs_cache *c, const void *key)
{
    if (c->last_heap && c->last_heap->key == key)
        return c->last_heap;
    for (cs_heap *h = c->heaps; h; h = h->next)
        if (h->key == key)
            return c->last_heap = h;
    return NULL;
}

cs_heap *cs_cache_heap(cs_cache *c, const void *key)
{
    pthread_mutex_lock(&c->lock);
    cs_heap *h = find_heap(c, key);
    pthread_mutex_unlock(&c->lock);
    return h;
}

cs_heap *cs_cache_add_heap(cs_cache *c, const void *key, int device, uint64_t device_total,
                           const cs_backend_ops *ops, void *dev, uint64_t granularity)
{
    if (device < 0 || device >= CS_MAX_DEVICES)
        return NULL;
    if (granularity == 0 || (granularity & (granularity - 1)) || granularity < 1024)
        granularity = CS_DEFAULT_GRANULARITY;
    pthread_mutex_lock(&c->lock);
    cs_heap *h = find_heap(c, key);
    if (!h && (h = alloc_lines(sizeof *h))) {
        h->gran = granularity;
        h->slab_max = cs_pool_slab_max(granularity);
        /* An arena of twice the device's memory: room to carve with little fragmentation. */
        uint64_t arena = device_total && device_total < (1ull << 40) ? 2 * device_total
                                                                      : 1ull << 38;
        if (ops->vmm && !(h->pool = cs_pool_create(ops->vmm, dev, granularity, arena,
                                                   heap_epoch_ready, h))) {
            free(h);
            pthread_mutex_unlock(&c->lock);
            return NULL;
        }
        h->key = key;
        h->device = device;
        h->ops = ops;
        h->dev = dev;
        h->next = c->heaps;
        c->heaps = c->last_heap = h;
        device_state *d = &c->devices[device];
        if (!d->present) {
            d->present = true;
            d->total = device_total;
            d->cap = c->config.cap_for ? c->config.cap_for(c->config.limit_arg, device_total)
                                       : CS_UNLIMITED;
            d->threshold = c->config.threshold_for
                               ? c->config.threshold_for(c->config.limit_arg, device_total)
                               : CS_UNLIMITED;
            d->st.cap_bytes = d->cap;
            /* The threshold is checked at every free against all idle bytes: with one, every
             * free takes the locked path and no thread keeps blocks of its own. */
            d->tcache = d->threshold == CS_UNLIMITED;
        }
        h->tcache = d->tcache;
        h->ordered = c->config.reuse == CS_REUSE_ORDERED;
    }
    pthread_mutex_unlock(&c->lock);
    return h;
}

void *cs_cache_heap_dev(const cs_heap *h)
{
    return h->dev;
}

const void *cs_cache_heap_key(const cs_heap *h)
{
    return h->key;
}

bool cs_cache_heap_pooled(const cs_heap *h)
{
    return h->pool != NULL;
}

int cs_cache_heap_device(const cs_heap *h)
{
    return h->device;
}

cs_heap *cs_cache_device_heap(cs_cache *c, int device)
{
    pthread_mutex_lock(&c->lock);
    cs_heap *h = c->heaps;  /* the living ones: a forgotten heap is on the dead list */
    while (h && h->device != device)
        h = h->next;
    pthread_mutex_unlock(&c->lock);
    return h;
}

int cs_cache_regrant(cs_heap *h)
{
    int raw = 0;
    if (h->pool && cs_pool_regrant(h->pool, &raw) != CS_BE_OK)
        return raw ? raw : -1;
    return 0;
}

void cs_cache_forget_heap(cs_cache *c, const void *key)
{
    pthread_mutex_lock(&c->lock);
    cs_heap **p = &c->heaps;
    while (*p && (*p)->key != key)
        p = &(*p)->next;
    cs_heap *h = *p;
    if (h) {
        *p = h->next;
        if (c->last_heap == h)
            c->last_heap = NULL;
        device_state *d = &c->devices[h->device];
        cs_tc_forget_heap(c, h);  /* out of every thread's lists and map; still owned */
        for (size_t i = 0; i < c->nbuckets; i++) {
            cs_block **bp = &c->buckets[i];
            while (*bp) {
                cs_block *b = *bp;
                if (b->heap != h) {
                    bp = &b->hash_next;
                    continue;
                }
                *bp = b->hash_next;
                c->nblocks--;
                if (cs_block_state_of(b) == BLOCK_WAITING)
                    continue;  /* its waiter frees it (its bytes are pending there) */
                if (__atomic_load_n(&b->owner, __ATOMIC_RELAXED)) {
                    cs_store_add(&d->base, -(int64_t)b->size);
                    cs_store_add(&d->base_req, -(int64_t)b->size);
                } else if (cs_block_state_of(b) == BLOCK_IDLE) {
                    d->idle_bytes -= b->size;
                } else {
                    d->in_use -= b->size;
                    d->requested -= b->requested;
                    cs_store_add(&d->base, -(int64_t)b->size);
                    cs_store_add(&d->base_req, -(int64_t)b->requested);
                }
                free(b);
            }
        }
        /* Its idle blocks were freed above: a thread that still holds the heap finds its
         * lists empty, not pointing at them. */
        memset(h->classes, 0, sizeof h->classes);
        h->lru_head = h->lru_tail = NULL;
        d->spare_bytes -= h->spare_bytes;
        h->spare_bytes = 0;
        group_settle(c, h->device);
        /* Kept: a thread that dropped the lock around a driver call may still hold it. */
        h->dead = true;
        h->next = c->dead_heaps;
        c->dead_heaps = h;
    }
    pthread_mutex_unlock(&c->lock);
    /* A classic heap's memory went with the context; a pooled heap's is virtual memory, which
     * belongs to no context: it goes back now, blocks in use included (their context is gone).
     * (A thread still building a range for this heap leaves that one behind.) */
    if (h && h->pool && cs_pool_release_all(h->pool)) {
        pthread_mutex_lock(&c->lock);
        c->devices[h->device].st.driver_frees++;
        c->devices[h->device].st.releases++;
        pthread_mutex_unlock(&c->lock);
    }
}


/* ---------------------------------------------------------------- reuse
 *
 * A large request of a pooled heap is first carved out of the pool's free memory
 * (carve_block); then, as for every other request, an idle block serves it: the oldest of
 * its size (a small request also takes a block of a larger class within an eighth of its
 * size, cs_class_fits). The oldest has the
 * smallest epoch, so if it is not ready, none of its size is. First a block whose fence
 * completed (with one stream busy in ordered mode: known to have completed, without asking
 * the GPU, cs_epoch_ready_or_ordered); else, in ordered mode, the oldest block that fits, once
 * the backend has made every stream's next work wait for its epoch: reuse never waits on the
 * host and memory never grows with how far the GPU lags behind. */

static void take(cs_cache *c, cs_heap *h, cs_block *b)
{
    idle_unlink(h, b);
    c->devices[h->device].idle_bytes -= b->size;
}

static cs_block *take_ready(cs_cache *c, cs_heap *h, int cls, uint64_t size, uint64_t bytes)
{
    for (int k = cls; k < CS_NUM_CLASSES && cs_class_fits(h, k, cls, size); k++) {
        cs_block *b = cs_list_fit(h, h->classes[k].head, bytes);
        if (b && cs_epoch_ready_or_ordered(h, b->epoch)) {
            take(c, h, b);
            return b;
        }
    }
    return NULL;
}

static cs_block *take_ordered(cs_cache *c, cs_heap *h, int cls, uint64_t size, uint64_t bytes)
{
    for (int k = cls; k < CS_NUM_CLASSES && cs_class_fits(h, k, cls, size); k++) {
        cs_block *b = cs_list_fit(h, h->classes[k].head, bytes);
        if (b && cs_class_deep_enough(h, b, CS_ORDERED_DEPTH) &&
            h->ops->order_after(h->dev, b->epoch) == 0) {
            take(c, h, b);
            c->devices[h->device].st.ordered_hits++;
            return b;
        }
    }
    return NULL;
}

/* The oldest idle block that fits, taken out of the lists to be waited for (without the
 * lock): at the cap or out of memory, waiting beats failing. */
static cs_block *take_any(cs_cache *c, cs_heap *h, int cls, uint64_t size, uint64_t bytes)
{
    for (int k = cls; k < CS_NUM_CLASSES && cs_class_fits(h, k, cls, size); k++) {
        cs_block *b = cs_list_fit(h, h->classes[k].head, bytes);
        if (b) {
            take(c, h, b);
            return b;
        }
    }
    return NULL;
}


/* Hand b (owned by nobody, out of every list) to the program. This thread's cache owns it
 * from now when it can, so that its free takes no lock. */
static void give(cs_cache *c, cs_heap *h, cs_block *b, uint64_t size, uint64_t *addr)
{
    device_state *d = &c->devices[h->device];
    cs_block_set_state(b, BLOCK_IN_USE);
    b->requested = size;
    b->serial = __atomic_add_fetch(&c->serial, 1, __ATOMIC_RELAXED);
    cs_tc_mine mine;
    if (cs_tc_adopt(c, b, &mine)) {
        cs_store_add(&d->base, (int64_t)b->size);
        cs_store_add(&d->base_req, (int64_t)b->size);
    } else {
        d->in_use += b->size;
        d->requested += size;
        cs_store_add(&d->base, (int64_t)b->size);
        cs_store_add(&d->base_req, (int64_t)size);
    }
    /* Exact with one thread; see cs_tcache.c for several. */
    cs_note_peaks(d, cs_load(&d->base) - mine.idle,
                  cs_load(&d->base_req) - mine.owned + mine.requested);
    uint64_t reserved = held(d);
    if (reserved > d->st.peak_reserved)
        d->st.peak_reserved = reserved;
    *addr = b->addr;
}

/* Called with the lock held; returns with it held. Waits for a busy idle block that fits
 * (dropping the lock meanwhile) and hands it out. */
static bool wait_for_block(cs_cache *c, cs_heap *h, int cls, uint64_t size, uint64_t bytes,
                           uint64_t *addr)
{
    cs_block *b = take_any(c, h, cls, size, bytes);
    if (!b)
        return false;
    device_state *d = &c->devices[h->device];
    d->pending_bytes += b->size;  /* out of the lists, still held */
    d->st.fence_waits++;
    cs_block_set_state(b, BLOCK_WAITING);
    pthread_mutex_unlock(&c->lock);
    bool ok = h->ops->wait(h->dev, b->epoch) == 0;
    pthread_mutex_lock(&c->lock);
    d->pending_bytes -= b->size;
    if (h->dead) {  /* the context went meanwhile, and the block with it */
        free(b);
        return false;
    }
    cs_block_set_state(b, BLOCK_IDLE);
    if (!ok) {
        cs_core_idle_return(c, b);  /* where its epoch puts it in its lists */
        return false;
    }
    cs_raise(&h->safe_epoch, b->epoch);
    give(c, h, b, size, addr);
    return true;
}

/* ---------------------------------------------------------------- allocation */

static void fill_failure(cs_alloc_failure *f, cs_cache *c, int device, uint64_t size,
                         bool by_cap)
{
    if (!f)
        return;
    f->requested = size;
    f->device = device;
    device_bytes(c, device, &f->in_use, &f->cached);
    f->cap = c->devices[device].cap;
    f->by_cap = by_cap;
}

/* May a pooled block take free memory whose work is still under way, its streams then made
 * to wait for it? In ordered mode, while no capture runs. */
static bool pool_ordered(const cs_cache *c, const cs_heap *h)
{
    return h->ordered && !capture_running(c);
}

/* Memory just taken from the heap's pool at addr, the work on it completing at `epoch` (from
 * the pool; 0: none): every stream's next work is made to wait for that work, as for a block
 * reused whole, *pending then its epoch (0: nothing to wait for). False when nothing can be
 * ordered after it now (a fence lost, a capture began): the memory is back in the pool, still
 * pending, and reuse does not wait on the host. */
static bool order_taken(cs_heap *h, uint64_t addr, uint64_t epoch, uint64_t *pending)
{
    *pending = 0;
    if (!epoch || cs_epoch_ready_or_ordered(h, epoch))
        return true;
    if (h->ops->order_after(h->dev, epoch) == 0) {
        *pending = epoch;
        return true;
    }
    uint64_t back;
    int ignored;
    cs_pool_free(h->pool, addr, true, false, epoch, &back, &ignored);
    return false;
}

/* A block from the heap's pool (see backend_take). busy_ok: it may take free memory whose
 * work is still under way (move_busy decided). *pending: the epoch of that work, every
 * stream's next work made to wait for it (0: none). */
static int pool_take(cs_cache *c, cs_heap *h, uint64_t bytes, uint64_t need, bool busy_ok,
                     uint64_t *addr, uint64_t *created, uint64_t *released, bool *carved,
                     uint64_t *pending, int *raw)
{
    uint64_t epoch = 0;
    int r = cs_pool_alloc(h->pool, bytes, need, busy_ok && pool_ordered(c, h), addr, created,
                          released, carved, &epoch, raw);
    if (r != CS_BE_OK || order_taken(h, *addr, epoch, pending))
        return r;
    /* Not ordered: the block is made of memory whose work is done, or new. */
    uint64_t more = 0, gone = 0;
    r = cs_pool_alloc(h->pool, bytes, need > *created ? need - *created : 0, false, addr, &more,
                      &gone, carved, NULL, raw);
    *created += more;
    *released += gone;
    return r;
}

/* A new block from the backend: a driver allocation, or the heap's pool, taking at most
 * `need` bytes of new memory (the reservation made under the cap) and, with busy_ok, free
 * memory whose work is still under way; *carved (may be NULL): the
 * pool carved it out of free memory with no driver call; *pending: the epoch of work still
 * under way on its memory, every stream ordered after it (0: none; a block given back must
 * not be unmapped before it completes). Called without the lock; returns with it held and
 * the memory accounted: the reservation dropped, the pool's spare changed by what the pool
 * took from the driver, gave back, and put into the block. */
static int backend_take(cs_cache *c, cs_heap *h, uint64_t bytes, uint64_t need, bool busy_ok,
                        uint64_t *addr, bool *carved, uint64_t *pending, int *raw)
{
    uint64_t created = 0, released = 0;
    int r;
    bool ignored, *no_call = carved ? carved : &ignored;
    *no_call = false;
    *pending = 0;
    if (!h->pool) {
        r = h->ops->alloc(h->dev, bytes, addr, raw);
        created = r == CS_BE_OK ? bytes : 0;
    } else {
        r = pool_take(c, h, bytes, need, busy_ok, addr, &created, &released, no_call, pending,
                      raw);
    }
    pthread_mutex_lock(&c->lock);
    device_state *d = &c->devices[h->device];
    d->pending_bytes -= need;
    if (created)
        d->st.driver_allocs++;
    if (released)
        d->st.driver_frees++;
    if (!h->dead)
        spare_add(c, h, (int64_t)created - (int64_t)released -
                            (r == CS_BE_OK ? (int64_t)bytes : 0));
    return r;
}

/* Bytes over the cap if `need` more were held: the process's own cap, then the group's,
 * which is charged what held(d) + need adds to what it was charged (0: charged). Lock held. */
static uint64_t over_cap(cs_cache *c, device_state *d, int device, uint64_t need)
{
    uint64_t now = held(d), over = 0;
    /* A size near 2^64 (cuMemAllocManaged, cuMemCreate) must not wrap the sum under the cap. */
    if (d->cap != CS_UNLIMITED && (now > d->cap || need > d->cap - now))
        return need > UINT64_MAX - now ? UINT64_MAX : now + need - d->cap;
    uint64_t target = now + need;
    if (!c->config.group_charge)
        return 0;
    if (target <= d->group_charged)
        c->config.group_uncharge(c->config.group_arg, device, d->group_charged - target);
    else if (!c->config.group_charge(c->config.group_arg, device, target - d->group_charged,
                                     d->cap, &over))
        return over ? over : 1;
    d->group_charged = target;
    return 0;
}

/* Reserve `need` bytes under the cap (and the group's), giving idle memory back to make room.
 * Called with the lock held and returns with it held; the lock is dropped while memory goes
 * to the driver. False when even an empty cache would not make room. */
static bool reserve_under_cap(cs_cache *c, device_state *d, int device, uint64_t need)
{
    uint64_t over;
    while ((over = over_cap(c, d, device, need)) != 0) {
        /* Spare memory first: no block loses its memory for it. */
        if (d->spare_bytes && trim_spare(c, device, over, true, CS_RELEASE_CAP))
            continue;
        /* With the threads' idle blocks back here, base is what is in use (and what a thread
         * freed to its own cache since, counted as in use: room is never overstated), and
         * held - need - over is what may stay. */
        cs_tc_reclaim(c, device, false);
        if (over > d->idle_bytes)
            return false;
        cs_block *released = NULL;
        release_idle_to(c, device, false, d->idle_bytes - over, &released);
        if (!released)
            return false;  /* nothing idle can go now (a capture runs) */
        pthread_mutex_unlock(&c->lock);
        finish_releases(c, device, released, CS_RELEASE_CAP);
        pthread_mutex_lock(&c->lock);
    }
    d->pending_bytes += need;
    return true;
}

/* The most new memory a block of `bytes` can take from the driver. */
static uint64_t most_new(const cs_heap *h, uint64_t bytes)
{
    return h->pool ? cs_pool_most_new(h->pool, bytes) : bytes;
}

/* The driver is out of memory: first, where the miss left the pool's free memory the GPU
 * still works on for new memory (busy_tried false: move_busy), a block out of it, ordered
 * after that work, with no new memory (giving that memory back would wait for the whole
 * device, or fail where it shares a granule with a block in use). Then give idle memory back
 * and retry at the same size: first the blocks and spare the GPU is done with (no wait), then
 * all (their fences, and the device for busy spare, waited for). With the lock held; it is
 * dropped meanwhile. */
static int recover_oom(cs_cache *c, cs_heap *h, uint64_t bytes, bool busy_tried,
                       uint64_t *addr, uint64_t *pending, int *raw)
{
    device_state *d = &c->devices[h->device];
    int r = CS_BE_OOM, ignored;
    if (!busy_tried && h->pool && pool_ordered(c, h)) {
        pthread_mutex_unlock(&c->lock);
        if (backend_take(c, h, bytes, 0, true, addr, NULL, pending, &ignored) == CS_BE_OK) {
            d->st.oom_recoveries++;
            return CS_BE_OK;
        }
    }
    for (int step = 1; step <= 2 && r == CS_BE_OOM; step++) {
        cs_block *released = NULL;
        uint64_t n = release_idle_to(c, h->device, step == 1, 0, &released);
        pthread_mutex_unlock(&c->lock);
        finish_releases(c, h->device, released, CS_RELEASE_OOM);
        pthread_mutex_lock(&c->lock);
        n += trim_spare(c, h->device, UINT64_MAX, step == 2, CS_RELEASE_OOM);
        uint64_t most = most_new(h, bytes);
        if (n == 0 || !reserve_under_cap(c, d, h->device, most))
            continue;
        pthread_mutex_unlock(&c->lock);
        if ((r = backend_take(c, h, bytes, most, true, addr, NULL, pending, raw)) == CS_BE_OK)
            d->st.oom_recoveries++;
    }
    return r;
}

/* Bookkeeping for memory the backend just gave, under the lock; NULL when the host has no
 * memory for it (the caller gives the memory back). */
static cs_block *new_block(cs_cache *c, cs_heap *h, uint64_t addr, uint64_t bytes, int cls)
{
    cs_block *b = alloc_lines(sizeof *b);  /* a thread may write it often: on lines of its own */
    if (!b)
        return NULL;
    b->addr = addr;
    b->size = bytes;
    b->heap = h;
    b->cls = (uint16_t)cls;
    if (registry_add(c, b))
        return b;
    free(b);
    return NULL;
}

/* ---------------------------------------------------------------- moves
 *
 * A pooled heap holds at most a headroom over the program's peak (config.pool_headroom_permille
 * of its peak in use): a miss that would hold more first moves idle memory. Idle
 * blocks whose fences completed leave their ranges, oldest first and large ones first (a
 * slab's slot frees memory only with its whole slab), until their bytes cover the excess;
 * the pool builds the block from their chunks and takes from the driver only the rest.
 * Before that, whatever the headroom: when no free span takes a large block, large idle
 * blocks join the pool's free spans (in ordered mode busy ones too: move_busy), and before
 * any new memory, idle small blocks whose fences completed give their slots back to their
 * slabs. Nothing moves while a capture runs. */

/* What a pooled heap may hold: the program's peak in use and the headroom over it. */
static uint64_t headroom_budget(const cs_cache *c, const device_state *d)
{
    uint64_t peak = cs_load(&d->peak_in_use);
    uint64_t permille = c->config.pool_headroom_permille;
    return peak + peak / 1000 * permille + peak % 1000 * permille / 1000;
}

/* What the heap's device may hold under the cap: the cap less what a group's other members
 * hold (UINT64_MAX without a cap). */
static uint64_t cap_room(const cs_cache *c, const cs_heap *h)
{
    const device_state *d = &c->devices[h->device];
    if (d->cap == CS_UNLIMITED)
        return UINT64_MAX;
    uint64_t others =
        c->config.group_others ? c->config.group_others(c->config.group_arg, h->device) : 0;
    return d->cap > others ? d->cap - others : 0;
}

/* Ordered, may the large idle blocks the GPU still works on join the free space for a block
 * of `bytes`? A block carved from their memory makes every stream's next work wait for
 * theirs. With one busy stream that is what the stream does anyway (PyTorch's allocator
 * reuses a stream's memory at once); with several, the wait ties them together, so only when
 * new memory would pass the headroom and two blocks of this size for each busy stream (the
 * count changes from one call to the next; at most CS_ORDERED_DEPTH blocks), as whole blocks
 * are kept one per busy stream before ordered reuse (cs_class_deep_enough): memory is bounded
 * by the busy streams, never by how far the GPU lags behind. Also when new memory would pass
 * the cap (a group's other members' memory counted): memory would first go back, busy free
 * memory only after a wait for the whole device, or not at all where it shares a granule
 * with a block in use (a refusal). Lock held. */
static bool move_busy(cs_cache *c, cs_heap *h, uint64_t bytes, uint64_t budget)
{
    if (!pool_ordered(c, h))
        return false;
    int busy = cs_busy_streams(h);
    if (busy <= 1)
        return true;
    const device_state *d = &c->devices[h->device];
    uint64_t after = held(d) + bytes;
    if (after > cap_room(c, h))
        return true;
    int spare_blocks = 2 * busy > CS_ORDERED_DEPTH ? CS_ORDERED_DEPTH - 1 : 2 * busy - 1;
    return after > budget + (uint64_t)spare_blocks * bytes;
}

/* Idle blocks of one kind go back to the pool, oldest first, until `enough` bytes went: small
 * ones (slab slots) or large ones (arena spans), those the GPU is done with or, with
 * busy_too, all of them (once one is not ready, none after it is). No driver call: a slot
 * goes back to its slab, a slab whose slots are all free gives its pages to slabs of other
 * sizes, and a span joins the free spans beside it. Returns the bytes that went. Lock held,
 * dropped meanwhile. */
static uint64_t idle_to_pool(cs_cache *c, cs_heap *h, bool small, bool busy_too, uint64_t enough)
{
    cs_tc_reclaim(c, h->device, !busy_too);
    cs_block *list = NULL;
    uint64_t got = 0;
    for (cs_block *b = h->lru_head; b && got < enough && (busy_too || block_ready(h, b));) {
        cs_block *next = b->lru_next;
        if ((b->size <= h->slab_max) == small) {
            got += b->size;
            defer_release(c, b, &list);
        }
        b = next;
    }
    if (!list)
        return 0;
    pthread_mutex_unlock(&c->lock);
    finish_releases(c, h->device, list, CS_RELEASE_MOVE);
    pthread_mutex_lock(&c->lock);
    return got;
}

/* Make room for a pooled block of `bytes` as above. Called with the lock held, returns with
 * it held; returns the new bytes the block still needs, and *busy_ok: whether the block may
 * take free memory whose work is still under way (move_busy: memory that joined the free
 * space busy while one stream was busy waits, as a busy block kept whole does, once several
 * are). */
static uint64_t move_for(cs_cache *c, cs_heap *h, uint64_t bytes, bool *busy_ok)
{
    device_state *d = &c->devices[h->device];
    uint64_t budget = headroom_budget(c, d);
    bool ordered = *busy_ok = move_busy(c, h, bytes, budget);
    /* No free span takes a large block: every large idle block the GPU is done with (ordered:
     * every one) goes back to the pool first, where it joins the free spans beside it. A
     * block carved from free spans is as cheap as a hit. */
    if (bytes > h->slab_max && !cs_pool_fits(h->pool, bytes, ordered) && !capture_running(c))
        idle_to_pool(c, h, false, ordered, UINT64_MAX);
    /* Before new memory, idle small blocks give their slots back (those the GPU is done with;
     * ordered, all of them: a block from their ranges is ordered after their work), so a small
     * size that comes and goes keeps no memory of its own however far behind the GPU is
     * (GPT-2's replay 200 ms behind: 2.02 reserved / live when only the finished ones went
     * back, 1.10 now); before a large block's too, which cannot use their slabs' memory, but
     * small blocks of other sizes then take their slots instead of new memory (GPT-2's replay
     * 20 ms behind, when only finished slots went back: 1.117 reserved / live, 1.123
     * returning them before small blocks' new memory only). Within the headroom over the program's own peak, new memory fills the
     * pool's holes (it stays, free, for blocks of other sizes later); beyond it, memory moves:
     * free chunks of the pool into the holes (ordered, busy ones too), then idle blocks'
     * memory. */
    uint64_t grow = cs_pool_need(h->pool, bytes, false, ordered);
    if (grow && !capture_running(c) &&
        idle_to_pool(c, h, true, ordered, UINT64_MAX))
        grow = cs_pool_need(h->pool, bytes, false, ordered);
    /* New memory must fit under the cap too (a group's other members' memory counted): over
     * it, a free span outside the block's zone beats a trim or a refusal. While a capture
     * runs nothing moves, but a carve there is no driver call. */
    uint64_t room = cap_room(c, h), limit = room < budget ? room : budget;
    if (grow && held(d) + grow > limit && capture_running(c) && bytes > h->slab_max &&
        cs_pool_fits_anywhere(h->pool, bytes, ordered))
        return 0;
    if (!grow || held(d) + grow <= limit || capture_running(c))
        return grow;
    uint64_t need = cs_pool_need(h->pool, bytes, true, ordered);
    uint64_t after = held(d) + need;
    if (!need || after <= budget)
        return need;
    /* The excess from idle blocks the GPU is done with: large ones first (a small block's
     * slot frees memory only with its whole slab). */
    uint64_t excess = after - budget < need ? after - budget : need;
    uint64_t got = idle_to_pool(c, h, false, false, excess);
    if (got < excess)
        got += idle_to_pool(c, h, true, false, excess - got);
    return got ? cs_pool_need(h->pool, bytes, true, ordered) : need;
}

/* ---------------------------------------------------------------- joins
 *
 * Does a freed block's memory join its pool's free memory at once? A large pooled block
 * whose work is done, or, in ordered mode with one busy stream, whose work that stream still
 * runs (a block carved from it is ordered after that work, as a block reused whole is). Its
 * span joins the free spans beside it, so the next request of any size takes the smallest
 * free span it fits, a span of its own size first: freed memory coalesces as in PyTorch's
 * expandable segments, where whole idle blocks reused in place kept the free space cut into
 * pieces (the replays: resnet 1.098 reserved / live with headroom, 1.23 without). With
 * several busy streams, or a release threshold, a busy block stays whole (reused by its
 * stream, moved at a miss, or given back over the threshold). Lock held. */
static bool one_busy_stream(cs_heap *h)
{
    return cs_busy_streams(h) <= 1;
}

static bool joins_at_free(cs_cache *c, cs_heap *h, const cs_block *b)
{
    if (!h->pool || h->dead || b->size <= h->slab_max || capture_running(c))
        return false;
    /* With a release threshold, busy memory stays a block: over the threshold it goes back
     * after a wait for its own fence, where busy free memory would need the whole device. */
    bool busy_may_join = pool_ordered(c, h) && one_busy_stream(h) &&
                         c->devices[h->device].threshold == CS_UNLIMITED;
    return busy_may_join || block_ready(h, b);
}

/* The freed block b (in no list, its bytes no longer in use) leaves the cache: its span joins
 * the pool's free memory, with its epoch, and its bytes are the pool's spare. No driver call
 * (a fence query at most), so under the lock. False, b untouched, when the pool refused it. */
static bool join_pool(cs_cache *c, cs_heap *h, cs_block *b)
{
    uint64_t released;
    int raw;
    bool done = cs_epoch_ready_or_ordered(h, b->epoch);
    if (cs_pool_free(h->pool, b->addr, true, done, b->epoch, &released, &raw) != CS_BE_OK)
        return false;
    registry_remove(c, b);
    spare_add(c, h, (int64_t)b->size);
    free(b);
    return true;
}

/* A large pooled block carved out of a free span under the lock, no driver call (its memory's
 * work ordered before the block's, as for a block reused whole); NULL when none fits, or the
 * order cannot be made, or the host has no memory for the bookkeeping: then the miss's path.
 * Busy free memory is taken only with one busy stream: with several, the miss's path decides. */
static cs_block *carve_block(cs_cache *c, cs_heap *h, int cls, uint64_t bytes)
{
    uint64_t addr, epoch, pending, released;
    int raw;
    if (!cs_pool_carve(h->pool, bytes, pool_ordered(c, h) && one_busy_stream(h), &addr,
                       &epoch) ||
        !order_taken(h, addr, epoch, &pending))
        return NULL;
    cs_block *b = new_block(c, h, addr, bytes, cls);
    if (!b) {
        cs_pool_free(h->pool, addr, true, !pending, pending, &released, &raw);  /* as it was */
        return NULL;
    }
    spare_add(c, h, -(int64_t)bytes);
    c->devices[h->device].st.ordered_hits += pending != 0;
    return b;
}

/* A miss: called with the lock held, returns with it released. */
static cs_result alloc_miss(cs_cache *c, cs_heap *h, uint64_t size, uint64_t bytes, int cls,
                            uint64_t *addr, int *raw, cs_alloc_failure *failure)
{
    device_state *d = &c->devices[h->device];
    uint64_t a = 0, pending = 0;
    int r = CS_BE_SHORT;
    bool carved = false, busy_ok = true;
    for (int attempt = 0; r == CS_BE_SHORT; attempt++) {
        /* The pool's spare may go to another thread meanwhile (CS_BE_SHORT): after a few
         * tries, reserve the whole block. */
        busy_ok = true;  /* a whole new block: whatever memory it can get */
        uint64_t need = h->pool && attempt < 3 ? move_for(c, h, bytes, &busy_ok)
                                               : most_new(h, bytes);
        /* At the cap, a busy block worth waiting for beats a refusal (the threads' too). */
        if (d->cap != CS_UNLIMITED && held(d) + need > d->cap) {
            cs_tc_reclaim(c, h->device, false);
            if (wait_for_block(c, h, cls, size, bytes, addr)) {
                d->st.hits++;
                pthread_mutex_unlock(&c->lock);
                return CS_OK;
            }
        }
        if (!reserve_under_cap(c, d, h->device, need)) {
            d->st.misses++;
            d->st.cap_refusals++;
            fill_failure(failure, c, h->device, size, true);
            pthread_mutex_unlock(&c->lock);
            return CS_OOM;
        }
        pthread_mutex_unlock(&c->lock);
        r = backend_take(c, h, bytes, need, busy_ok, &a, &carved, &pending, raw);
    }
    /* A miss once it is the backend's (a wait at the cap on a retry above is a hit), unless
     * the pool carved the block out of free memory: no driver call, a hit as well (an ordered
     * one when that memory's work is still under way). */
    if (r == CS_BE_OK && carved) {
        d->st.hits++;
        d->st.ordered_hits += pending != 0;
    } else {
        d->st.misses++;
    }
    if (r == CS_BE_OOM && !h->dead) {
        /* Out of memory. First a cached block that fits, once the GPU is done with it: no
         * memory changes hands. Then free memory the GPU works on, ordered, or give idle
         * memory back and retry. */
        cs_tc_reclaim(c, h->device, false);
        if (wait_for_block(c, h, cls, size, bytes, addr)) {
            d->st.oom_recoveries++;
            pthread_mutex_unlock(&c->lock);
            return CS_OK;
        }
        r = recover_oom(c, h, bytes, busy_ok, &a, &pending, raw);
    }
    if (h->dead) {
        /* The context was destroyed while the driver was asked: whatever it gave went with
         * it. */
        group_settle(c, h->device);
        pthread_mutex_unlock(&c->lock);
        return CS_GONE;
    }
    cs_block *b = NULL;
    if (r == CS_BE_OK && !(b = new_block(c, h, a, bytes, cls))) {
        /* No host memory for the bookkeeping: the memory goes back, unmapped only once the
         * work still under way on it (pending) has completed. */
        d->pending_bytes += bytes;
        pthread_mutex_unlock(&c->lock);
        cs_block tmp = {.addr = a, .size = bytes, .heap = h, .epoch = pending};
        uint64_t released = backend_free(h, &tmp, false, NULL);
        pthread_mutex_lock(&c->lock);
        d->pending_bytes -= bytes;
        if (!h->dead)
            spare_add(c, h, (int64_t)bytes - (int64_t)released);
        r = CS_BE_OOM;
    }
    if (r != CS_BE_OK) {
        if (r == CS_BE_OOM) {
            d->st.oom_failures++;
            fill_failure(failure, c, h->device, size, false);
        }
        group_settle(c, h->device);
        pthread_mutex_unlock(&c->lock);
        return r == CS_BE_OOM ? CS_OOM : CS_ERROR;
    }
    give(c, h, b, size, addr);
    pthread_mutex_unlock(&c->lock);
    return CS_OK;
}

cs_result cs_cache_alloc(cs_cache *c, cs_heap *h, uint64_t size, uint64_t *addr, int *raw,
                         cs_alloc_failure *failure)
{
    uint64_t bytes = 0;
    int cls = cs_block_bytes(h, size, &bytes);
    if (cls >= 0 && h->tcache && cs_tc_alloc(c, h, cls, size, bytes, addr))
        return CS_OK;  /* a block this thread freed, no lock taken */
    pthread_mutex_lock(&c->lock);
    /* The heap's context went (a thread that looked the heap up before): its lists are empty,
     * but its pool is released only after cs_cache_forget_heap dropped the lock, and a block
     * carved from it meanwhile would be counted on no heap and unmapped under the program. */
    if (h->dead) {
        pthread_mutex_unlock(&c->lock);
        return CS_GONE;
    }
    device_state *d = &c->devices[h->device];
    d->st.requests++;
    if (cls < 0) {
        /* Larger than any class (2^47 bytes): no device has it. */
        d->st.oom_failures++;
        fill_failure(failure, c, h->device, size, false);
        pthread_mutex_unlock(&c->lock);
        return CS_OOM;
    }
    /* A large pooled block out of free memory first; then ready blocks, here or idle in
     * another thread's cache; then ordered ones. */
    cs_block *b = h->pool && bytes > h->slab_max ? carve_block(c, h, cls, bytes) : NULL;
    if (!b)
        b = take_ready(c, h, cls, size, bytes);
    if (!b && h->tcache)
        b = cs_tc_steal(c, h, cls, size, bytes, false);
    if (!b && h->ordered) {
        b = take_ordered(c, h, cls, size, bytes);
        if (!b && h->tcache && (b = cs_tc_steal(c, h, cls, size, bytes, true)))
            d->st.ordered_hits++;
    }
    if (__builtin_expect(!b, 0))
        return alloc_miss(c, h, size, bytes, cls, addr, raw, failure);
    d->st.hits++;
    give(c, h, b, size, addr);
    pthread_mutex_unlock(&c->lock);
    return CS_OK;
}

/* Does addr lie in a heap's pool outside every block (free memory)? Lock held. */
static bool in_pool_only(cs_cache *c, uint64_t addr)
{
    for (cs_heap *h = c->heaps; h; h = h->next) {
        uint64_t base, size;
        if (h->pool && cs_pool_find(h->pool, addr, &base, &size))
            return size == 0;
    }
    return false;
}

cs_result cs_cache_free(cs_cache *c, uint64_t addr)
{
    int fast = cs_tc_free(c, addr);
    if (fast != CS_TC_NOT_MINE)
        return (cs_result)fast;  /* a block this thread holds, no lock taken */
    pthread_mutex_lock(&c->lock);
    cs_block *b = registry_find(c, addr);
    if (!b) {
        /* In a pool's free memory: a large block freed already, whose memory joined the free
         * space (a double free). Not the driver's. Inside a block: the driver decides. */
        bool pooled = in_pool_only(c, addr);
        c->foreign_frees += !pooled;  /* no device can be told from a pointer we never saw */
        pthread_mutex_unlock(&c->lock);
        return pooled ? CS_NOT_IN_USE : CS_FOREIGN;
    }
    /* Another thread's block (or ours, its class full in our cache): its owner lets go. */
    bool owned = __atomic_load_n(&b->owner, __ATOMIC_RELAXED) != NULL;
    cs_result r = owned ? cs_tc_disown_in_use(c, b)
                        : cs_block_state_of(b) == BLOCK_IN_USE ? CS_OK : CS_NOT_IN_USE;
    if (r != CS_OK) {
        pthread_mutex_unlock(&c->lock);
        return r;
    }
    cs_heap *h = b->heap;
    device_state *d = &c->devices[h->device];
    b->epoch = h->ops->fence(h->dev);
    if (cs_epoch_new(h, b->epoch))
        d->st.fences++;
    cs_block_set_state(b, BLOCK_IDLE);
    d->st.frees++;
    if (!owned) {  /* an owned block's bytes left the owned ones already */
        d->in_use -= b->size;
        d->requested -= b->requested;
        cs_store_add(&d->base, -(int64_t)b->size);
        cs_store_add(&d->base_req, -(int64_t)b->requested);
    }
    int device = h->device;
    if (!joins_at_free(c, h, b) || !join_pool(c, h, b)) {
        d->idle_bytes += b->size;
        idle_push(h, b);
    }
    cs_block *released = NULL;
    /* Spare chunks count, free slots of slabs in use do not: nothing can give them back.
     * All the spare is the bound that needs no pool's lock. */
    uint64_t spare = d->idle_bytes + d->spare_bytes > d->threshold ? trimmable_spare(c, device)
                                                                    : 0;
    if (d->idle_bytes + spare > d->threshold) {
        /* Spare memory first (what needs no wait: a free never waits for the whole device),
         * then the blocks the GPU is done with: giving back a busy one waits for it. */
        if (spare)
            trim_spare(c, device, d->idle_bytes + spare - d->threshold, false,
                       CS_RELEASE_THRESHOLD);
        spare = trimmable_spare(c, device);
        if (d->idle_bytes + spare > d->threshold) {
            uint64_t target = spare < d->threshold ? d->threshold - spare : 0;
            release_idle_to(c, device, true, target, &released);
            release_idle_to(c, device, false, target, &released);
        }
    }
    pthread_mutex_unlock(&c->lock);
    finish_releases(c, device, released, CS_RELEASE_THRESHOLD);
    return CS_OK;
}

cs_block_state cs_cache_lookup(cs_cache *c, uint64_t addr, uint64_t *requested)
{
    pthread_mutex_lock(&c->lock);
    cs_block *b = registry_find(c, addr);
    cs_block_state st = CS_BLOCK_UNKNOWN;
    if (b && __atomic_load_n(&b->owner, __ATOMIC_RELAXED)) {
        uint64_t serial;
        st = cs_tc_lookup(b, requested, &serial);
    } else if (b) {
        st = cs_block_state_of(b) == BLOCK_IN_USE ? CS_BLOCK_IN_USE : CS_BLOCK_IDLE;
        if (st == CS_BLOCK_IN_USE)
            *requested = b->requested;
    }
    pthread_mutex_unlock(&c->lock);
    return st;
}

/* The block that contains addr, in use or idle: its base is addr itself, or (pooled heaps) found
 * through the pool's ranges; a classic block's interior pointers are the caller's to map to
 * its base (the driver knows the allocation). Memory of a pool in no block (a free span, such
 * as a freed large block's, a free slot, a slab's tail, a page no slab has, a hole) is the
 * pool's, and the program holds nothing there: idle. */
cs_block_state cs_cache_find(cs_cache *c, uint64_t addr, cs_block_info *out)
{
    pthread_mutex_lock(&c->lock);
    cs_block *b = registry_find(c, addr);
    cs_heap *in_pool = NULL;  /* its pool holds addr in no block */
    for (cs_heap *h = c->heaps; !b && !in_pool && h; h = h->next) {
        uint64_t base, size;
        if (h->pool && cs_pool_find(h->pool, addr, &base, &size) &&
            !(size && (b = registry_find(c, base))))
            in_pool = h;
    }
    cs_block_state st = CS_BLOCK_UNKNOWN;
    if (b) {
        uint64_t requested = 0, serial = 0;
        if (__atomic_load_n(&b->owner, __ATOMIC_RELAXED)) {
            st = cs_tc_lookup(b, &requested, &serial);  /* its owner's lock */
        } else {
            serial = b->serial;  /* a block no thread owns: the cache's lock */
            st = cs_block_state_of(b) == BLOCK_IN_USE ? CS_BLOCK_IN_USE : CS_BLOCK_IDLE;
            if (st == CS_BLOCK_IN_USE)
                requested = b->requested;
        }
        out->base = b->addr;
        out->size = b->size;
        out->requested = st == CS_BLOCK_IN_USE ? requested : 0;
        out->serial = serial;
        out->dev = b->heap->dev;
        out->device = b->heap->device;
        out->key = b->heap->key;
        out->pooled = b->heap->pool != NULL;
    } else if (in_pool) {
        *out = (cs_block_info){.base = addr, .device = in_pool->device, .key = in_pool->key,
                               .dev = in_pool->dev, .pooled = true};
        st = CS_BLOCK_IDLE;
    }
    pthread_mutex_unlock(&c->lock);
    return st;
}

cs_result cs_cache_chunks(cs_cache *c, uint64_t addr, uint64_t serial, cs_pool_chunk_fn each,
                          void *arg)
{
    pthread_mutex_lock(&c->lock);
    cs_block *b = registry_find(c, addr);
    uint64_t requested = 0, now = 0;
    bool in_use = false;
    if (b && b->heap->pool && __atomic_load_n(&b->owner, __ATOMIC_RELAXED))
        in_use = cs_tc_lookup(b, &requested, &now) == CS_BLOCK_IN_USE && now == serial;
    else if (b && b->heap->pool)
        in_use = cs_block_state_of(b) == BLOCK_IN_USE && b->serial == serial;
    /* The cache's lock keeps the block in the pool (a block a thread owns may be freed to its
     * thread meanwhile, but its memory stays where it is); the pool's, its chunks in place. */
    cs_result r = !in_use ? CS_NOT_IN_USE
                  : cs_pool_chunks(b->heap->pool, b->addr, b->size, each, arg) ? CS_OK
                                                                                : CS_ERROR;
    pthread_mutex_unlock(&c->lock);
    return r;
}

/* ---------------------------------------------------------------- memory outside the cache */

cs_result cs_cache_charge(cs_cache *c, cs_heap *h, uint64_t bytes, cs_alloc_failure *failure)
{
    pthread_mutex_lock(&c->lock);
    device_state *d = &c->devices[h->device];
    if (!reserve_under_cap(c, d, h->device, bytes)) {
        d->st.cap_refusals++;
        fill_failure(failure, c, h->device, bytes, true);
        pthread_mutex_unlock(&c->lock);
        return CS_OOM;
    }
    d->pending_bytes -= bytes;  /* reserved: now held outside the cache */
    d->outside_bytes += bytes;
    if (held(d) > d->st.peak_reserved)
        d->st.peak_reserved = held(d);
    pthread_mutex_unlock(&c->lock);
    return CS_OK;
}

void cs_cache_uncharge(cs_cache *c, cs_heap *h, uint64_t bytes)
{
    pthread_mutex_lock(&c->lock);
    device_state *d = &c->devices[h->device];
    d->outside_bytes -= bytes < d->outside_bytes ? bytes : d->outside_bytes;
    group_settle(c, h->device);  /* the other members have the room at once */
    pthread_mutex_unlock(&c->lock);
}

uint64_t cs_cache_release_idle(cs_cache *c, cs_heap *h)
{
    int device = h->device;
    cs_block *list = NULL;
    pthread_mutex_lock(&c->lock);
    if (c->devices[device].present)
        release_idle_to(c, device, false, 0, &list);
    pthread_mutex_unlock(&c->lock);
    uint64_t released = finish_releases(c, device, list, CS_RELEASE_OOM);
    pthread_mutex_lock(&c->lock);
    if (c->devices[device].present)
        released += trim_spare(c, device, UINT64_MAX, true, CS_RELEASE_OOM);
    pthread_mutex_unlock(&c->lock);
    return released;
}

/* ---------------------------------------------------------------- views and statistics */

void cs_cache_mem_view(cs_cache *c, int device, uint64_t driver_free, uint64_t driver_total,
                       uint64_t *free_out, uint64_t *total_out)
{
    pthread_mutex_lock(&c->lock);
    uint64_t idle = 0, in_use = 0, cap = CS_UNLIMITED;
    if (device >= 0 && device < CS_MAX_DEVICES && c->devices[device].present) {
        device_state *d = &c->devices[device];
        device_bytes(c, device, &in_use, &idle);
        in_use += d->pending_bytes + d->outside_bytes;
        if (c->config.group_others)  /* the group's other members hold their part of the cap */
            in_use += c->config.group_others(c->config.group_arg, device);
        cap = d->cap;
    }
    pthread_mutex_unlock(&c->lock);

    uint64_t total = driver_total;
    uint64_t avail = driver_free + idle;  /* cached idle memory is the program's to have */
    if (cap != CS_UNLIMITED) {
        if (cap < total)
            total = cap;
        uint64_t room = cap > in_use ? cap - in_use : 0;
        if (room < avail)
            avail = room;
    }
    if (avail > total)
        avail = total;
    *free_out = avail;
    *total_out = total;
}

uint64_t cs_cache_trim(cs_cache *c)
{
    uint64_t released = 0;
    for (int i = 0; i < CS_MAX_DEVICES; i++) {
        cs_block *list = NULL;
        pthread_mutex_lock(&c->lock);
        if (c->devices[i].present)
            release_idle_to(c, i, true, 0, &list);  /* the threads' ready ones too */
        pthread_mutex_unlock(&c->lock);
        /* What went back to the driver: a pooled block's slot may free a whole granule, or
         * nothing while its slab holds other blocks. */
        released += finish_releases(c, i, list, CS_RELEASE_TRIM);
        pthread_mutex_lock(&c->lock);
        if (c->devices[i].present)
            released += trim_spare(c, i, UINT64_MAX, true, CS_RELEASE_TRIM);
        pthread_mutex_unlock(&c->lock);
    }
    return released;
}

static void add_stats(cacheshim_stats *to, const cacheshim_stats *from)
{
    /* Peaks of different devices happen at different times: their sum is an upper bound,
     * which is what a "whole process" figure can honestly say. */
    uint64_t *t = (uint64_t *)to;
    const uint64_t *f = (const uint64_t *)from;
    size_t n = offsetof(cacheshim_stats, cap_bytes) / sizeof(uint64_t);
    for (size_t i = 0; i < n; i++)
        t[i] += f[i];
    to->ordered_hits += from->ordered_hits;  /* after cap_bytes, which is not a sum */
    to->moves += from->moves;
    to->bytes_outside += from->bytes_outside;
}

/* One device's statistics: the core's counters and bytes plus the thread caches'. Lock held. */
static void device_stats(cs_cache *c, int device, cacheshim_stats *out)
{
    device_state *d = &c->devices[device];
    *out = d->st;
    out->bytes_in_use = d->in_use;
    out->bytes_requested = d->requested;
    out->bytes_cached = d->idle_bytes + d->spare_bytes;
    out->bytes_outside = d->outside_bytes;
    cs_tc_add_stats(c, device, out);
    out->peak_in_use = cs_load(&d->peak_in_use);
    out->peak_requested = cs_load(&d->peak_requested);
}

bool cs_cache_stats(cs_cache *c, int device, cacheshim_stats *out)
{
    bool found = false;
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&c->lock);
    if (device >= 0) {
        if (device < CS_MAX_DEVICES && c->devices[device].present) {
            device_stats(c, device, out);
            found = true;
        }
    } else {
        out->cap_bytes = 0;
        for (int i = 0; i < CS_MAX_DEVICES; i++) {
            if (!c->devices[i].present)
                continue;
            cacheshim_stats one;
            device_stats(c, i, &one);
            add_stats(out, &one);
            uint64_t cap = c->devices[i].st.cap_bytes;
            out->cap_bytes = (cap == CS_UNLIMITED || out->cap_bytes == CS_UNLIMITED)
                                 ? CS_UNLIMITED
                                 : out->cap_bytes + cap;
            found = true;
        }
        if (!found)
            out->cap_bytes = CS_UNLIMITED;
        out->foreign_frees = c->foreign_frees;
        found = true;  /* the whole process always has statistics, zero before any use */
    }
    pthread_mutex_unlock(&c->lock);
    return found;
}

int cs_cache_devices(cs_cache *c, int *devices, int max)
{
    int n = 0;
    pthread_mutex_lock(&c->lock);
    for (int i = 0; i < CS_MAX_DEVICES && n < max; i++)
        if (c->devices[i].present)
            devices[n++] = i;
    pthread_mutex_unlock(&c->lock);
    return n;
}

/* ---------------------------------------------------------------- fork */

/* The thread caches' registry too: a thread ending or starting to use the cache takes it
 * first. (So one cache at a time: the registry is the process's.) */
void cs_cache_lock(cs_cache *c)
{
    cs_tc_registry_lock();
    pthread_mutex_lock(&c->lock);
}

void cs_cache_unlock(cs_cache *c)
{
    pthread_mutex_unlock(&c->lock);
    cs_tc_registry_unlock();
}

void cs_cache_lock_also(cs_cache *c)
{
    pthread_mutex_lock(&c->lock);
}

void cs_cache_unlock_also(cs_cache *c)
{
    pthread_mutex_unlock(&c->lock);
}

void cs_cache_reset_after_fork_also(cs_cache *c)
{
    cs_tc_detach_all(c);
    free_all(c);
    memset(c->devices, 0, sizeof c->devices);
    c->foreign_frees = 0;
    pthread_mutex_unlock(&c->lock);
}

void cs_cache_reset_after_fork(cs_cache *c)
{
    /* Called in the child, which holds the locks: its only thread is the one that took them
     * in the fork's prepare hook. The other threads' caches are not touched (one may have
     * been half-way through its fast path): only cut loose. */
    cs_cache_reset_after_fork_also(c);
    cs_tc_registry_unlock();
}
