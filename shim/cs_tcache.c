/* Per-thread caches in front of the locked core: the fast path.
 *
 * Each thread that uses a cache has a thread cache for it. Per heap, it keeps a few idle
 * blocks per size class; and it owns every block it handed out or holds idle (block->owner),
 * found by address in its own map. A same-thread free of such a block pushes it onto the
 * thread's idle list of its class; a same-thread allocation takes the oldest block that fits
 * by the core's rule (cs_class_fits, cs_block_fits: its class, a small request also a larger
 * class within an eighth, a large one only its exact size) that is ready by exactly the core's
 * test (cs_epoch_ready_or_ordered: epoch <= the heap's known-safe epoch, else, unless ordered
 * reuse with one stream busy, backend reached()), else in ordered mode the oldest that fits,
 * after order_after(). Neither takes the cache's lock or writes a line another thread writes
 * (but for a batch of buffer ids every 1024 hand-outs, next_serial): the thread cache's own
 * lock is contended only by a thread reclaiming from it, which holds the cache's lock first.
 * Everything else (a miss, a full class, another thread's block, a foreign pointer, a double
 * free of an unowned block) goes to the locked core, which sees owned blocks through their
 * owner's lock.
 *
 * Large blocks of a pooled heap are not kept here: freed, their memory joins the pool's free
 * spans (cs_cache_free), which a thread cache would keep cut into whole blocks.
 *
 * Bounds, per thread and heap: at most TC_PER_CLASS (4) idle blocks a class, only classes up
 * to 256 MiB (TC_CLASSES), at most TC_MAX_IDLE (1 GiB) idle in all. Four covers the blocks a
 * loop frees before it allocates them again (double or quad buffering, a layer's few
 * temporaries) without parking more. Above 256 MiB a block costs the driver far more than the
 * lock (a 1 GiB free is about 300 µs) and such blocks are few: they stay in the core, visible
 * to every thread at once. 1 GiB bounds what one thread can park; parked bytes are not lost:
 * they count as cached, another thread's miss takes them before asking the driver
 * (cs_tc_steal), and the cap, OOM recovery and trim reclaim them. No per-thread caching on a
 * device with a release threshold: the threshold is checked at every free, against all idle
 * bytes.
 *
 * Statistics: counters are per thread and heap (slot), summed under the locks when read.
 * Bytes are exact when read; the held bytes (what the cap bounds) do not change when a block
 * moves between in use and a thread's idle lists, so the core keeps them exact under its
 * lock. The peaks are raised by each allocation with what it sees: base (in use outside the
 * thread caches + all bytes the thread caches own) less its own thread's idle bytes. With one
 * thread that is exact. With several, peak_in_use can exceed the true peak by the bytes the
 * other threads hold idle in their own caches at that moment (at most 1 GiB per other thread
 * and heap), and peak_requested as well by the rounding of the blocks other threads own (a
 * block is up to twice the request); either can fall short by the bytes other threads free
 * through the locked path in the few instructions between an allocation and its reading
 * (a block per thread). */
#include "cs_tcache.h"

#include <stdlib.h>
#include <string.h>

#include "cs_libc.h"

enum { TC_CLASSES = 256, TC_PER_CLASS = 4, TC_SERIALS = 1024 };
#define TC_MAX_IDLE (1ull << 30)

typedef struct {
    cs_block *head, *tail;  /* oldest first, linked by cls_next */
    uint32_t n;
} tc_list;

/* One heap's share of a thread cache. */
typedef struct tc_slot {
    _Alignas(CS_LINE) cs_heap *heap;
    struct tc_slot *next;
    uint64_t idle, in_use, requested;  /* bytes of the blocks of this heap it owns */
    uint64_t requests, hits, ordered_hits, frees, fences;  /* not yet folded into the device */
    tc_list cls[TC_CLASSES];
} tc_slot;

struct cs_tcache {
    _Alignas(CS_LINE) pthread_mutex_t lock;
    cs_cache *cache;          /* atomic: NULL once detached (cache destroyed, fork) */
    tc_slot *slots, *last;
    cs_block **map;           /* the blocks it owns, by address, chained by map_next */
    size_t map_mask, map_count;
    cs_tcache *cache_next;    /* the cache's list (the cache's lock) */
    cs_tcache *all_prev, *all_next;  /* every thread cache of the process (the registry) */
    cs_tcache *mine_next;     /* its thread's list (that thread only) */
    uint64_t serial_next, serial_end;  /* buffer ids of its own to hand out, [next, end) */
};

/* The registry keeps every thread cache reachable until its thread frees it, and orders
 * thread exit against cache destruction and fork. Lock order: registry, cache, thread cache. */
static pthread_mutex_t registry = PTHREAD_MUTEX_INITIALIZER;
static cs_tcache *all_tcaches;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t exit_key;
static bool exit_key_ok;

static _Thread_local cs_tcache *tls_last;  /* the one this thread used last */
static _Thread_local cs_tcache *tls_mine;  /* all of this thread's, one per cache */

void cs_tc_registry_lock(void) { pthread_mutex_lock(&registry); }
void cs_tc_registry_unlock(void) { pthread_mutex_unlock(&registry); }

/* ---------------------------------------------------------------- lists and map */

static cs_block *list_pop(tc_list *l)
{
    cs_block *b = l->head;
    l->head = b->cls_next;
    if (!l->head)
        l->tail = NULL;
    l->n--;
    return b;
}

static void list_push(tc_list *l, cs_block *b)
{
    b->cls_next = NULL;
    if (l->tail)
        l->tail->cls_next = b;
    else
        l->head = b;
    l->tail = b;
    l->n++;
}

/* The oldest block of l that fits `bytes` (a large class holds blocks of several sizes), and
 * the block before it (NULL when it is the head). At most TC_PER_CLASS to look at. */
static cs_block *list_fit(const tc_list *l, const cs_heap *h, uint64_t bytes, cs_block **prev)
{
    *prev = NULL;
    for (cs_block *b = l->head; b; *prev = b, b = b->cls_next)
        if (cs_block_fits(h, b, bytes))
            return b;
    return NULL;
}

/* Takes b, found by list_fit with prev, out of l. */
static cs_block *list_take(tc_list *l, cs_block *b, cs_block *prev)
{
    if (!prev)
        return list_pop(l);
    prev->cls_next = b->cls_next;
    if (l->tail == b)
        l->tail = prev;
    l->n--;
    return b;
}

static size_t map_index(const cs_tcache *tc, uint64_t addr)
{
    return (size_t)(((addr >> 9) * 0x9E3779B97F4A7C15ull) >> 32) & tc->map_mask;
}

static cs_block *map_find(const cs_tcache *tc, uint64_t addr)
{
    if (!tc->map)
        return NULL;
    for (cs_block *b = tc->map[map_index(tc, addr)]; b; b = b->map_next)
        if (b->addr == addr)
            return b;
    return NULL;
}

static bool map_add(cs_tcache *tc, cs_block *b)
{
    if (!tc->map || tc->map_count > tc->map_mask) {
        size_t n = tc->map ? (tc->map_mask + 1) * 2 : 64;
        cs_block **m = calloc(n, sizeof *m);
        if (!m)
            return false;
        cs_block **old = tc->map;
        size_t oldn = old ? tc->map_mask + 1 : 0;
        tc->map = m;
        tc->map_mask = n - 1;
        for (size_t i = 0; i < oldn; i++) {
            for (cs_block *x = old[i], *next; x; x = next) {
                next = x->map_next;
                size_t k = map_index(tc, x->addr);
                x->map_next = m[k];
                m[k] = x;
            }
        }
        free(old);
    }
    size_t k = map_index(tc, b->addr);
    b->map_next = tc->map[k];
    tc->map[k] = b;
    tc->map_count++;
    return true;
}

static void map_remove(cs_tcache *tc, cs_block *b)
{
    cs_block **p = &tc->map[map_index(tc, b->addr)];
    while (*p != b)
        p = &(*p)->map_next;
    *p = b->map_next;
    tc->map_count--;
}

/* ---------------------------------------------------------------- slots */

static tc_slot *slot_search(cs_tcache *tc, const cs_heap *h)
{
    for (tc_slot *s = tc->slots; s; s = s->next)
        if (s->heap == h)
            return tc->last = s;
    return NULL;
}

static inline tc_slot *slot_find(cs_tcache *tc, const cs_heap *h)
{
    if (__builtin_expect(tc->last && tc->last->heap == h, 1))
        return tc->last;
    return slot_search(tc, h);
}

static tc_slot *slot_get(cs_tcache *tc, cs_heap *h)
{
    tc_slot *s = slot_find(tc, h);
    if (s || !(s = aligned_alloc(CS_LINE, sizeof *s)))
        return s;
    memset(s, 0, sizeof *s);
    s->heap = h;
    s->next = tc->slots;
    tc->slots = tc->last = s;
    return s;
}

/* What tc holds on a device (usually one slot). */
static void sum_mine(const cs_tcache *tc, int device, cs_tc_mine *m)
{
    memset(m, 0, sizeof *m);
    for (const tc_slot *s = tc->slots; s; s = s->next) {
        if (s->heap->device != device)
            continue;
        m->idle += s->idle;
        m->owned += s->idle + s->in_use;
        m->requested += s->requested;
    }
}

/* After an allocation from slot s. What the thread holds in other slots of the device can
 * only lower the figures (idle bytes, and owned bytes >= their requests), so s alone gives
 * upper bounds: when they do not pass the peaks, nothing needs summing. */
static void note_peaks(cs_cache *c, const cs_tcache *tc, const tc_slot *s, int device)
{
    device_state *d = &c->devices[device];
    uint64_t base = cs_load(&d->base), base_req = cs_load(&d->base_req);
    if (base - s->idle <= cs_load(&d->peak_in_use) &&
        base_req - s->idle - s->in_use + s->requested <= cs_load(&d->peak_requested))
        return;
    cs_tc_mine m;
    sum_mine(tc, device, &m);
    cs_note_peaks(d, base - m.idle, base_req - m.owned + m.requested);
}

/* Counters into the device; the slot's bytes leave with its blocks. Cache's lock held. */
static void fold_counters(cs_cache *c, tc_slot *s)
{
    cacheshim_stats *st = &c->devices[s->heap->device].st;
    st->requests += s->requests;
    st->hits += s->hits;
    st->ordered_hits += s->ordered_hits;
    st->frees += s->frees;
    st->fences += s->fences;
    s->requests = s->hits = s->ordered_hits = s->frees = s->fences = 0;
}

/* ---------------------------------------------------------------- this thread's cache */

static void tc_free_memory(cs_tcache *tc)
{
    for (tc_slot *s = tc->slots, *next; s; s = next) {
        next = s->next;
        free(s);
    }
    free(tc->map);
    pthread_mutex_destroy(&tc->lock);
    free(tc);
}

/* Out of the registry and freed: a detached cache, or its thread's end. Registry held. */
static void tc_unregister(cs_tcache *tc)
{
    if (tc->all_prev)
        tc->all_prev->all_next = tc->all_next;
    else
        all_tcaches = tc->all_next;
    if (tc->all_next)
        tc->all_next->all_prev = tc->all_prev;
    tc_free_memory(tc);
}

static void thread_exit(void *unused);

static void make_key(void)
{
    exit_key_ok = cs_libc_key_create(&exit_key, thread_exit) == 0;
}

static cs_tcache *tc_new(cs_cache *c)
{
    pthread_once(&key_once, make_key);
    cs_tcache *tc = aligned_alloc(CS_LINE, sizeof *tc);
    if (!tc)
        return NULL;
    memset(tc, 0, sizeof *tc);
    pthread_mutex_init(&tc->lock, NULL);
    pthread_mutex_lock(&registry);
    tc->all_next = all_tcaches;
    if (all_tcaches)
        all_tcaches->all_prev = tc;
    all_tcaches = tc;
    pthread_mutex_lock(&c->lock);
    tc->cache_next = c->tcaches;
    c->tcaches = tc;
    __atomic_store_n(&tc->cache, c, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&c->lock);
    pthread_mutex_unlock(&registry);
    tc->mine_next = tls_mine;
    tls_mine = tls_last = tc;
    if (exit_key_ok)
        cs_libc_setspecific(exit_key, tc);  /* any non-NULL value: the exit hook runs */
    return tc;
}

/* This thread's cache for c, made if need be (NULL without host memory). Drops the ones of
 * caches gone. Never with a cache's lock held: it takes the registry. */
static cs_tcache *tc_get_slow(cs_cache *c)
{
    for (cs_tcache **p = &tls_mine, *tc; (tc = *p);) {
        cs_cache *of = __atomic_load_n(&tc->cache, __ATOMIC_ACQUIRE);
        if (of == c)
            return tls_last = tc;
        if (of) {
            p = &tc->mine_next;
            continue;
        }
        *p = tc->mine_next;
        if (tls_last == tc)
            tls_last = NULL;
        pthread_mutex_lock(&registry);
        tc_unregister(tc);
        pthread_mutex_unlock(&registry);
    }
    return tc_new(c);
}

static inline cs_tcache *tc_get(cs_cache *c)
{
    cs_tcache *tc = tls_last;
    if (__builtin_expect(tc && __atomic_load_n(&tc->cache, __ATOMIC_RELAXED) == c, 1))
        return tc;
    return tc_get_slow(c);
}

static cs_tcache *tc_mine_search(cs_cache *c)
{
    for (cs_tcache *tc = tls_mine; tc; tc = tc->mine_next)
        if (__atomic_load_n(&tc->cache, __ATOMIC_ACQUIRE) == c)
            return tc;
    return NULL;
}

/* This thread's cache for c if it has one; takes no lock. */
static inline cs_tcache *tc_mine(cs_cache *c)
{
    cs_tcache *tc = tls_last;
    if (__builtin_expect(tc && __atomic_load_n(&tc->cache, __ATOMIC_RELAXED) == c, 1))
        return tc;
    return tc_mine_search(c);
}

/* ---------------------------------------------------------------- fast paths */

/* The oldest ready block that fits, else (ordered mode) the oldest that fits, as the core's
 * take_ready and take_ordered choose (ready meaning known complete while one stream is busy,
 * cs_epoch_ready_or_ordered): in a
 * class of several sizes (large classes), the oldest of the request's size. The locked core
 * never looks at this thread's own lists (cs_tc_steal skips them), so what fits here must be
 * found here. */
static cs_block *take(tc_slot *s, cs_heap *h, int cls, uint64_t size, uint64_t bytes)
{
    cs_block *prev;
    for (int k = cls; k < TC_CLASSES && cs_class_fits(h, k, cls, size); k++) {
        cs_block *b = list_fit(&s->cls[k], h, bytes, &prev);
        if (b && cs_epoch_ready_or_ordered(h, b->epoch))
            return list_take(&s->cls[k], b, prev);
    }
    if (!h->ordered)
        return NULL;
    for (int k = cls; k < TC_CLASSES && cs_class_fits(h, k, cls, size); k++) {
        cs_block *b = list_fit(&s->cls[k], h, bytes, &prev);
        if (b && cs_class_deep_enough(h, b, TC_PER_CLASS) &&
            h->ops->order_after(h->dev, b->epoch) == 0) {
            s->ordered_hits++;
            return list_take(&s->cls[k], b, prev);
        }
    }
    return NULL;
}

/* A buffer id for a block handed out (cs_block.serial): from the thread cache's own batch,
 * TC_SERIALS taken from the cache's count at a time, so that a hit writes no line other
 * threads write (one shared counter bumped at every hit held 16 threads to 1.17x one on a
 * 16-core host; on 2 cores, 51.6 M pairs/s against 60.6 M with the batches). Unique in the
 * process; in order only within a batch. Thread cache's lock held. */
static uint64_t next_serial(cs_cache *c, cs_tcache *tc)
{
    if (__builtin_expect(tc->serial_next == tc->serial_end, 0)) {
        uint64_t last = __atomic_fetch_add(&c->serial, TC_SERIALS, __ATOMIC_RELAXED);
        tc->serial_next = last + 1;
        tc->serial_end = last + 1 + TC_SERIALS;
    }
    return tc->serial_next++;
}

bool cs_tc_alloc(cs_cache *c, cs_heap *h, int cls, uint64_t size, uint64_t bytes, uint64_t *addr)
{
    if (cls >= TC_CLASSES)
        return false;
    cs_tcache *tc = tc_get(c);
    if (!tc)
        return false;
    pthread_mutex_lock(&tc->lock);
    tc_slot *s = slot_get(tc, h);
    cs_block *b = s ? take(s, h, cls, size, bytes) : NULL;
    if (!b) {
        pthread_mutex_unlock(&tc->lock);
        return false;
    }
    b->requested = size;
    b->serial = next_serial(c, tc);
    cs_block_set_state(b, BLOCK_IN_USE);
    s->idle -= b->size;
    s->in_use += b->size;
    s->requested += size;
    s->requests++;
    s->hits++;
    note_peaks(c, tc, s, h->device);
    /* Read under the lock: once it is dropped, the context's end (cs_cache_forget_heap) may
     * free the block. */
    *addr = b->addr;
    pthread_mutex_unlock(&tc->lock);
    return true;
}

int cs_tc_free(cs_cache *c, uint64_t addr)
{
    cs_tcache *tc = tc_mine(c);
    if (!tc)
        return CS_TC_NOT_MINE;
    pthread_mutex_lock(&tc->lock);
    cs_block *b = map_find(tc, addr);
    if (!b || cs_block_state_of(b) != BLOCK_IN_USE) {
        pthread_mutex_unlock(&tc->lock);
        return b ? CS_NOT_IN_USE : CS_TC_NOT_MINE;
    }
    cs_heap *h = b->heap;
    tc_slot *s = slot_find(tc, h);
    tc_list *l = &s->cls[b->cls];
    if (l->n >= TC_PER_CLASS || s->idle + b->size > TC_MAX_IDLE) {
        pthread_mutex_unlock(&tc->lock);
        return CS_TC_NOT_MINE;  /* full: the core takes it from us */
    }
    b->epoch = h->ops->fence(h->dev);
    if (cs_epoch_new(h, b->epoch))
        s->fences++;
    cs_block_set_state(b, BLOCK_IDLE);
    list_push(l, b);
    s->idle += b->size;
    s->in_use -= b->size;
    s->requested -= b->requested;
    s->frees++;
    pthread_mutex_unlock(&tc->lock);
    return CS_OK;
}

/* ---------------------------------------------------------------- for the locked core */

/* b leaves tc (both locks held): out of its map and its slot's bytes, and its bytes out of
 * the device's owned bytes. The caller has taken it off any idle list. */
static void release_block(cs_cache *c, cs_tcache *tc, tc_slot *s, cs_block *b)
{
    device_state *d = &c->devices[b->heap->device];
    map_remove(tc, b);
    if (cs_block_state_of(b) == BLOCK_IDLE) {
        s->idle -= b->size;
    } else {
        s->in_use -= b->size;
        s->requested -= b->requested;
    }
    __atomic_store_n(&b->owner, NULL, __ATOMIC_RELAXED);
    cs_store_add(&d->base, -(int64_t)b->size);
    cs_store_add(&d->base_req, -(int64_t)b->size);
}

bool cs_tc_adopt(cs_cache *c, cs_block *b, cs_tc_mine *mine)
{
    cs_heap *h = b->heap;
    memset(mine, 0, sizeof *mine);
    cs_tcache *tc = tc_mine(c);
    if (!tc)
        return false;
    bool owned = false;
    pthread_mutex_lock(&tc->lock);
    if (h->tcache && b->cls < TC_CLASSES && !(h->pool && b->size > h->slab_max)) {
        tc_slot *s = slot_get(tc, h);
        if (s && map_add(tc, b)) {
            __atomic_store_n(&b->owner, tc, __ATOMIC_RELAXED);
            s->in_use += b->size;
            s->requested += b->requested;
            owned = true;
        }
    }
    sum_mine(tc, h->device, mine);
    pthread_mutex_unlock(&tc->lock);
    return owned;
}

cs_result cs_tc_disown_in_use(cs_cache *c, cs_block *b)
{
    cs_tcache *tc = __atomic_load_n(&b->owner, __ATOMIC_RELAXED);  /* stable: cache lock */
    pthread_mutex_lock(&tc->lock);
    cs_result r = CS_NOT_IN_USE;
    if (cs_block_state_of(b) == BLOCK_IN_USE) {
        release_block(c, tc, slot_find(tc, b->heap), b);
        r = CS_OK;
    }
    pthread_mutex_unlock(&tc->lock);
    return r;
}

cs_block *cs_tc_steal(cs_cache *c, cs_heap *h, int cls, uint64_t size, uint64_t bytes,
                      bool ordered)
{
    cs_tcache *me = tc_mine(c);
    for (cs_tcache *tc = c->tcaches; tc; tc = tc->cache_next) {
        if (tc == me)
            continue;  /* its own blocks were just tried */
        pthread_mutex_lock(&tc->lock);
        tc_slot *s = slot_find(tc, h);
        for (int k = cls; s && k < TC_CLASSES && cs_class_fits(h, k, cls, size); k++) {
            cs_block *prev, *b = list_fit(&s->cls[k], h, bytes, &prev);
            if (b && (ordered ? cs_class_deep_enough(h, b, TC_PER_CLASS) &&
                                    h->ops->order_after(h->dev, b->epoch) == 0
                              : cs_epoch_ready_or_ordered(h, b->epoch))) {
                list_take(&s->cls[k], b, prev);
                release_block(c, tc, s, b);
                pthread_mutex_unlock(&tc->lock);
                return b;
            }
        }
        pthread_mutex_unlock(&tc->lock);
    }
    return NULL;
}

void cs_tc_reclaim(cs_cache *c, int device, bool ready_only)
{
    if (!c->devices[device].tcache)
        return;
    for (cs_tcache *tc = c->tcaches; tc; tc = tc->cache_next) {
        pthread_mutex_lock(&tc->lock);
        for (tc_slot *s = tc->slots; s; s = s->next) {
            if (s->heap->device != device || !s->idle)
                continue;
            for (int k = 0; k < TC_CLASSES; k++) {
                tc_list *l = &s->cls[k];
                /* Oldest first: once one is not ready, none after it is. */
                while (l->head && (!ready_only || cs_epoch_ready(s->heap, l->head->epoch))) {
                    cs_block *b = list_pop(l);
                    release_block(c, tc, s, b);
                    cs_core_idle_return(c, b);
                }
            }
        }
        pthread_mutex_unlock(&tc->lock);
    }
}

void cs_tc_forget_heap(cs_cache *c, cs_heap *h)
{
    for (cs_tcache *tc = c->tcaches; tc; tc = tc->cache_next) {
        pthread_mutex_lock(&tc->lock);
        for (tc_slot **p = &tc->slots; *p; p = &(*p)->next) {
            if ((*p)->heap != h)
                continue;
            tc_slot *s = *p;
            fold_counters(c, s);
            *p = s->next;
            if (tc->last == s)
                tc->last = NULL;
            free(s);
            break;
        }
        for (size_t i = 0; tc->map && i <= tc->map_mask; i++) {
            for (cs_block **bp = &tc->map[i]; *bp;) {
                if ((*bp)->heap == h) {
                    *bp = (*bp)->map_next;
                    tc->map_count--;
                } else {
                    bp = &(*bp)->map_next;
                }
            }
        }
        pthread_mutex_unlock(&tc->lock);
    }
}

void cs_tc_add_stats(cs_cache *c, int device, cacheshim_stats *st)
{
    for (cs_tcache *tc = c->tcaches; tc; tc = tc->cache_next) {
        pthread_mutex_lock(&tc->lock);
        for (const tc_slot *s = tc->slots; s; s = s->next) {
            if (s->heap->device != device)
                continue;
            st->requests += s->requests;
            st->hits += s->hits;
            st->ordered_hits += s->ordered_hits;
            st->frees += s->frees;
            st->fences += s->fences;
            st->bytes_in_use += s->in_use;
            st->bytes_requested += s->requested;
            st->bytes_cached += s->idle;
        }
        pthread_mutex_unlock(&tc->lock);
    }
}

cs_block_state cs_tc_lookup(cs_block *b, uint64_t *requested, uint64_t *serial)
{
    cs_tcache *tc = __atomic_load_n(&b->owner, __ATOMIC_RELAXED);  /* stable: cache lock */
    pthread_mutex_lock(&tc->lock);
    cs_block_state st = CS_BLOCK_IDLE;
    if (cs_block_state_of(b) == BLOCK_IN_USE) {
        st = CS_BLOCK_IN_USE;
        *requested = b->requested;
    }
    *serial = b->serial;  /* the owner hands the block out anew under this lock */
    pthread_mutex_unlock(&tc->lock);
    return st;
}

/* ---------------------------------------------------------------- lifetime */

void cs_tc_detach_all(cs_cache *c)
{
    /* Only the pointer changes: in a forked child another thread's lock may be held for
     * ever, and its memory is its thread's to free (or stays in the registry, reachable). */
    for (cs_tcache *tc = c->tcaches; tc; tc = tc->cache_next)
        __atomic_store_n(&tc->cache, NULL, __ATOMIC_RELEASE);
    c->tcaches = NULL;
}

/* The thread ends: everything its caches hold goes back to the core. Both locks held. */
static void give_back_all(cs_cache *c, cs_tcache *tc)
{
    for (tc_slot *s = tc->slots; s; s = s->next) {
        fold_counters(c, s);
        for (int k = 0; k < TC_CLASSES; k++) {
            while (s->cls[k].head) {
                cs_block *b = list_pop(&s->cls[k]);
                release_block(c, tc, s, b);
                cs_core_idle_return(c, b);
            }
        }
    }
    /* In use: still the program's, owned by nobody now (another thread may free them). */
    for (size_t i = 0; tc->map && i <= tc->map_mask; i++) {
        while (tc->map[i]) {
            cs_block *b = tc->map[i];
            device_state *d = &c->devices[b->heap->device];
            release_block(c, tc, slot_find(tc, b->heap), b);
            d->in_use += b->size;
            d->requested += b->requested;
            cs_store_add(&d->base, (int64_t)b->size);
            cs_store_add(&d->base_req, (int64_t)b->requested);
        }
    }
}

static void thread_exit(void *unused)
{
    (void)unused;
    pthread_mutex_lock(&registry);
    cs_tcache *tc = tls_mine;
    tls_mine = tls_last = NULL;
    while (tc) {
        cs_tcache *next = tc->mine_next;
        cs_cache *c = __atomic_load_n(&tc->cache, __ATOMIC_ACQUIRE);
        if (c) {  /* alive: the registry keeps it so (destroy detaches under it) */
            pthread_mutex_lock(&c->lock);
            pthread_mutex_lock(&tc->lock);
            give_back_all(c, tc);
            pthread_mutex_unlock(&tc->lock);
            cs_tcache **p = &c->tcaches;
            while (*p != tc)
                p = &(*p)->cache_next;
            *p = tc->cache_next;
            pthread_mutex_unlock(&c->lock);
        }
        tc_unregister(tc);
        tc = next;
    }
    pthread_mutex_unlock(&registry);
}
