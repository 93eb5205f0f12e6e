/* The cache core's own structures, shared by the locked core (cs_cache.c) and the per-thread
 * caches in front of it (cs_tcache.c). Callers use cs_cache.h only.
 *
 * Who may touch what:
 *   - the cache's lock (cs_cache.lock) guards the registry, the heaps' idle lists, the device
 *     counters and every block no thread cache owns;
 *   - a thread cache's lock guards its idle lists, its map and the blocks it owns (a block's
 *     owner is its thread cache, or NULL). Its own thread takes it on every fast-path call;
 *     anyone else takes it only with the cache's lock held (lock order: cache, then thread
 *     cache), so a block changes owner only with the cache's lock held;
 *   - the fields marked atomic are read by the fast paths without the cache's lock. */
#ifndef CS_CACHE_INT_H
#define CS_CACHE_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "cs_cache.h"

/* What the fast paths write is kept off the lines other threads write: 128 bytes, since Intel
 * cores fetch lines in pairs (the adjacent-line prefetcher). */
#define CS_LINE 128

/* BLOCK_WAITING: taken out of the idle lists while a thread waits for its fence without the
 * cache's lock. */
enum { BLOCK_IN_USE = 1, BLOCK_IDLE = 2, BLOCK_WAITING = 3 };

typedef struct cs_tcache cs_tcache;

typedef struct cs_block {
    _Alignas(CS_LINE) uint64_t addr;
    uint64_t size;       /* class bytes: what the driver allocated */
    uint64_t requested;  /* what the program asked for, for honest address ranges */
    uint64_t epoch;      /* the fence epoch covering all work issued before its free */
    uint64_t serial;     /* a number of its own each time it is handed out (buffer ids) */
    cs_heap *heap;
    struct cs_block *hash_next;           /* registry chain */
    struct cs_block *cls_prev, *cls_next; /* idle list of its class (the heap's or a thread's) */
    struct cs_block *lru_prev, *lru_next; /* idle list of its heap, oldest first */
    struct cs_block *map_next;            /* its owner's map chain */
    cs_tcache *owner;    /* atomic: the thread cache holding it (in use or idle), or NULL */
    uint16_t cls;
    uint8_t state;       /* atomic: BLOCK_IN_USE, BLOCK_IDLE or BLOCK_WAITING */
} cs_block;

typedef struct {
    cs_block *head, *tail;
} block_list;

struct cs_heap {
    /* Read on every fast-path call; never written after creation. */
    _Alignas(CS_LINE) const cs_backend_ops *ops;
    void *dev;
    int device;
    bool tcache;   /* per-thread caching on (no release threshold on its device) */
    bool ordered;  /* config.reuse == CS_REUSE_ORDERED */
    uint64_t gran;      /* the device's granularity: classic large blocks are whole granules */
    uint64_t slab_max;  /* the largest small block (a size class; a slab's slot if pooled) */
    cs_pool *pool;      /* physical memory pooled (cs_pool.h), or NULL: a driver
                           allocation per block */
    /* Atomic; written only when an epoch newer than known shows up. */
    _Alignas(CS_LINE) uint64_t safe_epoch;  /* every epoch up to this one is known complete */
    uint64_t last_epoch;  /* the newest epoch seen from fence(), for the statistics */
    /* Under the cache's lock. */
    _Alignas(CS_LINE) const void *key;
    cs_heap *next;
    bool dead;     /* its context is gone: kept (a thread without the lock may hold it) */
    uint64_t spare_bytes;  /* its pool's memory outside blocks (free chunks, free slots) */
    block_list classes[CS_NUM_CLASSES];
    cs_block *lru_head, *lru_tail;
};

/* Bytes of a device. In use = in_use + the in-use bytes thread caches own; cached = idle_bytes
 * + the idle bytes thread caches own + spare_bytes; held (what the cap bounds, the physical
 * memory) = base + idle_bytes + spare_bytes + pending_bytes + outside_bytes, exact under the lock since
 * blocks change owner only under it. */
typedef struct {
    /* Atomic: read by the fast paths, written under the lock (base, base_req) or by anyone
     * raising a peak. */
    _Alignas(CS_LINE) uint64_t base;  /* in_use + the block bytes thread caches own */
    uint64_t base_req;                /* requested + the block bytes thread caches own */
    uint64_t peak_in_use, peak_requested;
    /* Under the lock. */
    _Alignas(CS_LINE) bool present;
    bool tcache;                      /* per-thread caching (threshold == CS_UNLIMITED) */
    uint64_t total, cap, threshold;
    uint64_t in_use, requested;       /* of in-use blocks no thread cache owns */
    uint64_t idle_bytes;              /* the heaps' idle lists */
    uint64_t spare_bytes;             /* the heaps' pools: memory outside any block */
    /* Bytes in driver calls made without the lock: allocations under way (reserved against
     * the cap) and blocks being given back. Held all the same. */
    uint64_t pending_bytes;
    /* Memory the program holds through driver calls the cache does not serve (cuMemAllocPitch,
     * cuMemAllocManaged, cuMemAllocAsync, cuMemCreate...): charged against the cap
     * (cs_cache_charge), held like the rest. */
    uint64_t outside_bytes;
    /* What the group (config.group_charge) was charged: held, once settled. */
    uint64_t group_charged;
    /* The counters, less what thread caches counted and have not folded in yet. Its byte
     * and peak fields are filled only when read (cs_cache_stats). */
    cacheshim_stats st;
} device_state;

struct cs_cache {
    pthread_mutex_t lock;
    cs_cache_config config;
    cs_heap *heaps;
    cs_heap *dead_heaps;     /* forgotten heaps, freed with the cache */
    cs_heap *last_heap;      /* most programs use one context: skip the search */
    cs_block **buckets;
    size_t nbuckets, nblocks;
    uint64_t foreign_frees;
    uint64_t serial;         /* atomic: the last buffer id given out (cs_block.serial), to a
                                block or to a thread cache's batch of them */
    cs_tcache *tcaches;      /* every thread cache of this cache */
    device_state devices[CS_MAX_DEVICES];
};

/* ---------------------------------------------------------------- shared helpers */

static inline uint64_t cs_load(const uint64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}

/* For an atomic field whose writers all hold the same lock. */
static inline void cs_store_add(uint64_t *p, int64_t delta)
{
    __atomic_store_n(p, __atomic_load_n(p, __ATOMIC_RELAXED) + (uint64_t)delta, __ATOMIC_RELAXED);
}

/* *p = max(*p, v); true when this call raised it. */
static inline bool cs_raise(uint64_t *p, uint64_t v)
{
    uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v > cur)
        if (__atomic_compare_exchange_n(p, &cur, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            return true;
    return false;
}

static inline int cs_block_state_of(const cs_block *b)
{
    return __atomic_load_n(&b->state, __ATOMIC_RELAXED);
}

static inline void cs_block_set_state(cs_block *b, int state)
{
    __atomic_store_n(&b->state, (uint8_t)state, __ATOMIC_RELAXED);
}

/* Has the work before a free at this epoch completed? Asks the backend (never blocks). The
 * same test on the locked and the fast paths. */
static inline bool cs_epoch_ready(cs_heap *h, uint64_t epoch)
{
    if (epoch <= __atomic_load_n(&h->safe_epoch, __ATOMIC_ACQUIRE))
        return true;
    if (h->ops->reached(h->dev, epoch) != 1)
        return false;
    cs_raise(&h->safe_epoch, epoch);
    return true;
}

/* A free got this epoch: count it among the fences if it is new. */
static inline bool cs_epoch_new(cs_heap *h, uint64_t epoch)
{
    return epoch > cs_load(&h->last_epoch) && cs_raise(&h->last_epoch, epoch);
}

/* The block size of a class index (the inverse of cs_size_class). */
static inline uint64_t cs_class_bytes(int idx)
{
    if (idx < 16)
        return (uint64_t)(idx + 1) * 512;
    int e = 13 + (idx - 16) / 16, m = (idx - 16) % 16;
    return (uint64_t)(16 + m + 1) << (e - 4);
}

/* Block sizes. Up to the slab limit (half the granularity) a block is its size class: at most
 * a sixteenth over the request from 8 KiB, 511 bytes below. Above it, a pooled block is carved
 * to the request (CS_POOL_ALIGN bytes); a classic one is whole granules, at most one granule
 * over (the driver's own rounding, made visible so that a replay is true). */
static inline int cs_block_bytes(const cs_heap *h, uint64_t size, uint64_t *bytes)
{
    if (size <= h->slab_max)
        return cs_size_class(size, bytes);
    if (size > UINT64_MAX - h->gran)
        return -1;
    uint64_t unit = h->pool ? CS_POOL_ALIGN : h->gran;
    *bytes = (size + unit - 1) / unit * unit;
    uint64_t ignored;
    return cs_size_class(*bytes, &ignored);
}

/* May blocks of class k serve a request of `size` whose own block is of class cls? Its own
 * class; small blocks also from a larger class within an eighth of the size (511 bytes
 * below 4 KiB): no request costs more. Large blocks: only their own class, and there only a
 * block of exactly the request's granules (cs_block_fits). */
static inline bool cs_class_fits(const cs_heap *h, int k, int cls, uint64_t size)
{
    if (k == cls)
        return true;
    uint64_t kb = cs_class_bytes(k);
    uint64_t slack = size / 8 > 511 ? size / 8 : 511;
    return kb <= h->slab_max && kb <= size + slack;
}

static inline bool cs_block_fits(const cs_heap *h, const cs_block *b, uint64_t bytes)
{
    return b->size == bytes || (b->size <= h->slab_max && bytes <= h->slab_max);
}

/* The oldest block from `b` on (a class list, oldest first) that fits. */
static inline cs_block *cs_list_fit(const cs_heap *h, cs_block *b, uint64_t bytes)
{
    while (b && !cs_block_fits(h, b, bytes))
        b = b->cls_next;
    return b;
}

/* Streams with work in flight now, as the backend counts them (1 when it cannot). */
static inline int cs_busy_streams(const cs_heap *h)
{
    return h->ops->busy_streams ? h->ops->busy_streams(h->dev) : 1;
}

/* Readiness where a busy block can be taken ordered after its work instead (hits, carving,
 * joining the pool): only what is known counts while at most one stream is busy. Ordered
 * reuse then makes no stream wait that a query would have spared: a stream never waits on its
 * own events, and any other stream asks the GPU itself before it waits (cs_streams.c). So the
 * query, a driver call of 1-2 us on an H100 at nearly every allocation, is left out. */
static inline bool cs_epoch_ready_or_ordered(cs_heap *h, uint64_t epoch)
{
    if (epoch <= __atomic_load_n(&h->safe_epoch, __ATOMIC_ACQUIRE))
        return true;
    if (h->ordered && cs_busy_streams(h) <= 1)
        return false;
    return cs_epoch_ready(h, epoch);
}

/* Ordered reuse takes the oldest idle block of a size only once the class holds a pending
 * block of that size for each busy stream (at most CS_ORDERED_DEPTH); until then a miss takes
 * new memory.
 * One busy stream: its last block comes back at once, with no wait at all. Work spread over
 * N streams: the block reused is the one freed N frees ago, most likely last used on the same
 * stream, so the other streams' waits reach only work that is well behind them and the
 * streams keep running side by side. Memory stays bounded by the number of busy streams,
 * never by how far the GPU lags. `first` is the oldest idle block of the size; `most` the
 * depth at most: CS_ORDERED_DEPTH in the shared lists, a thread cache's own bound in its. */
#define CS_ORDERED_DEPTH 8
static inline bool cs_class_deep_enough(const cs_heap *h, const cs_block *first, int most)
{
    int want = cs_busy_streams(h);
    if (want > most)
        want = most;
    int n = 0;
    for (const cs_block *b = first; b && n < want; b = b->cls_next)
        n += b->size == first->size;
    return n >= want;
}

/* Peaks, raised by whoever allocates. in_use and requested are what that caller sees: exact
 * with one thread, see cs_tcache.c with several. */
static inline void cs_note_peaks(device_state *d, uint64_t in_use, uint64_t requested)
{
    if (in_use > cs_load(&d->peak_in_use))
        cs_raise(&d->peak_in_use, in_use);
    if (requested > cs_load(&d->peak_requested))
        cs_raise(&d->peak_requested, requested);
}

/* ---------------------------------------------------------------- core, for cs_tcache.c */

/* An idle block no thread owns any more joins its heap's idle lists, in epoch order.
 * With the lock held. */
void cs_core_idle_return(cs_cache *c, cs_block *b);

#endif
