/* The cache core. One mutex guards everything: the hot path is a hash lookup and a few list
 * operations, so an uncontended lock costs less than anything finer would save.
 *
 * Every block is its own driver allocation (never split), so the driver's answers about a
 * pointer stay true. A freed block waits in its class's idle list; it may be handed out again
 * once a fence recorded after its free has completed (see the "fences" section). */
#include "cs_cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { BLOCK_IN_USE = 1, BLOCK_IDLE = 2 };

/* Unfinished fences a heap keeps at most; past that the GPU is far behind and a miss is
 * better than another fence. */
#define MAX_FENCES 32

typedef struct cs_block {
    uint64_t addr;
    uint64_t size;       /* class bytes: what the driver allocated */
    uint64_t requested;  /* what the program asked for, for honest address ranges */
    uint64_t free_seq;   /* the heap's free counter when this block was freed */
    cs_heap *heap;
    struct cs_block *hash_next;
    struct cs_block *cls_prev, *cls_next; /* idle list of its class, oldest first */
    struct cs_block *lru_prev, *lru_next; /* idle list of its heap, oldest first */
    /* Set when the block leaves the cache to be freed outside the lock: its heap may be
     * gone by then, its backend state never is. */
    const cs_backend_ops *release_ops;
    void *release_dev;
    uint16_t cls;
    uint8_t state;
} cs_block;

typedef struct {
    cs_block *head, *tail;
} block_list;

typedef struct {
    void *handle;
    uint64_t seq;  /* covers every block with free_seq <= seq */
} fence_slot;

struct cs_heap {
    const void *key;
    int device;
    const cs_backend_ops *ops;
    void *dev;
    cs_heap *next;
    block_list classes[CS_NUM_CLASSES];
    cs_block *lru_head, *lru_tail;
    uint64_t free_seq;   /* frees so far */
    uint64_t safe_seq;   /* every block freed at or before this is ready */
    fence_slot fences[MAX_FENCES]; /* ring, oldest first */
    unsigned fence_first;  /* unsigned: % MAX_FENCES (a power of two) is then one AND */
    int fence_count;
};

typedef struct {
    bool present;
    uint64_t total, cap, threshold;
    uint64_t idle_bytes;
    uint64_t releasing_bytes;  /* left the cache, not yet freed: still held */
    cacheshim_stats st;
} device_state;

struct cs_cache {
    pthread_mutex_t lock;
    cs_cache_config config;
    cs_heap *heaps;
    cs_heap *last_heap;      /* most programs use one context: skip the search */
    cs_block **buckets;
    size_t nbuckets, nblocks;
    bool capturing;  /* a stream capture is running: no fences, no releases */
    uint64_t foreign_frees;
    device_state devices[CS_MAX_DEVICES];
};

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

/* The block size of a class index (the inverse of cs_size_class). */
static uint64_t class_bytes_of(int idx)
{
    if (idx < 16)
        return (uint64_t)(idx + 1) * 512;
    int e = 13 + (idx - 16) / 16, m = (idx - 16) % 16;
    return (uint64_t)(16 + m + 1) << (e - 4);
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

/* ---------------------------------------------------------------- fences
 *
 * A block freed as the heap's n-th free may be reused once a fence recorded after that free
 * has completed. Fences are recorded lazily, when an allocation wants such a block, and one
 * fence covers every free before it; the backend makes a later fence imply the earlier ones,
 * so one completed fence makes everything freed before it ready (safe_seq). */

static fence_slot *fence_at(cs_heap *h, int i)
{
    return &h->fences[(h->fence_first + (unsigned)i) % MAX_FENCES];
}

static void fence_drop_oldest(cs_heap *h)
{
    fence_slot *f = fence_at(h, 0);
    h->ops->fence_destroy(h->dev, f->handle);
    h->fence_first = (h->fence_first + 1) % MAX_FENCES;
    h->fence_count--;
}

/* The index of the oldest fence that covers a free at `seq`, recorded now if there is none;
 * -1 if none can be had (capture running, too many in flight, or the record failed). */
static int covering_fence(cs_cache *c, cs_heap *h, uint64_t seq)
{
    int i = 0;
    while (i < h->fence_count && fence_at(h, i)->seq < seq)
        i++;
    if (i < h->fence_count)
        return i;
    if (c->capturing || h->fence_count == MAX_FENCES)
        return -1;
    void *handle;
    if (h->ops->fence_record(h->dev, &handle) != 0)
        return -1;
    *fence_at(h, h->fence_count) = (fence_slot){handle, h->free_seq};
    h->fence_count++;
    c->devices[h->device].st.fences++;
    return i;
}

/* Fence i completed: everything it covers is ready, and so are the fences before it. */
static void fence_completed(cs_heap *h, int i)
{
    h->safe_seq = fence_at(h, i)->seq;
    for (int k = 0; k <= i; k++)
        fence_drop_oldest(h);
}

/* Is a block freed at `seq` ready? May record or query fences, never waits. */
static bool seq_ready(cs_cache *c, cs_heap *h, uint64_t seq)
{
    if (seq <= h->safe_seq)
        return true;
    if (c->capturing)
        return false;  /* even an event query may break a capture in global mode */
    int i = covering_fence(c, h, seq);
    if (i < 0 || h->ops->fence_query(h->dev, fence_at(h, i)->handle) != 1)
        return false;
    fence_completed(h, i);
    return true;
}

/* Block until a block freed at `seq` is ready; false if that cannot be known. */
static bool wait_seq(cs_cache *c, cs_heap *h, uint64_t seq)
{
    if (seq_ready(c, h, seq))
        return true;
    int i = c->capturing ? -1 : covering_fence(c, h, seq);
    if (i < 0)
        return false;
    c->devices[h->device].st.fence_waits++;
    if (h->ops->fence_wait(h->dev, fence_at(h, i)->handle) != 0)
        return false;
    fence_completed(h, i);
    return true;
}

/* ---------------------------------------------------------------- accounting */

static uint64_t held(const device_state *d)
{
    return d->st.bytes_in_use + d->idle_bytes + d->releasing_bytes;
}

static void note_in_use(device_state *d, cs_block *b)
{
    d->st.bytes_in_use += b->size;
    d->st.bytes_requested += b->requested;
    if (d->st.bytes_in_use > d->st.peak_in_use)
        d->st.peak_in_use = d->st.bytes_in_use;
    if (d->st.bytes_requested > d->st.peak_requested)
        d->st.peak_requested = d->st.bytes_requested;
    uint64_t reserved = held(d);
    if (reserved > d->st.peak_reserved)
        d->st.peak_reserved = reserved;
}

/* ---------------------------------------------------------------- release */

/* Give an idle block back to the driver. The driver's free waits for the device itself, so
 * this is safe whether or not the block's fence completed. */
static void detach_idle(cs_cache *c, cs_block *b)
{
    cs_heap *h = b->heap;
    idle_unlink(h, b);
    registry_remove(c, b);
    c->devices[h->device].idle_bytes -= b->size;
    c->devices[h->device].st.bytes_cached = c->devices[h->device].idle_bytes;
}

static void count_release(cs_cache *c, int device, cs_block *b, cs_release_reason why)
{
    device_state *d = &c->devices[device];
    d->st.driver_frees++;
    d->st.releases++;
    if (c->config.on_release)
        c->config.on_release(c->config.release_arg, device, b->addr, b->size, why);
}

static void release_block(cs_cache *c, cs_block *b, cs_release_reason why)
{
    cs_heap *h = b->heap;
    detach_idle(c, b);
    int raw;
    h->ops->free(h->dev, b->addr, &raw);  /* a failure leaves nothing we could do better */
    count_release(c, h->device, b, why);
    free(b);
}

/* Detach a block to be freed after the lock is dropped (finish_releases): a driver free
 * waits for the whole device, and other threads need not wait with it. */
static void defer_release(cs_cache *c, cs_block *b, cs_block **list)
{
    cs_heap *h = b->heap;
    detach_idle(c, b);
    c->devices[h->device].releasing_bytes += b->size;
    b->release_ops = h->ops;
    b->release_dev = h->dev;
    b->hash_next = *list;
    *list = b;
}

/* Called without the lock: free what defer_release detached. */
static void finish_releases(cs_cache *c, int device, cs_block *list, cs_release_reason why)
{
    while (list) {
        cs_block *b = list;
        list = b->hash_next;
        int raw;
        b->release_ops->free(b->release_dev, b->addr, &raw);
        pthread_mutex_lock(&c->lock);
        c->devices[device].releasing_bytes -= b->size;
        count_release(c, device, b, why);
        pthread_mutex_unlock(&c->lock);
        free(b);
    }
}

/* Release idle blocks of a device, oldest first, until at most target_idle bytes are idle.
 * With ready_only, only blocks whose fence completed (found without waiting). With
 * `deferred`, blocks are only detached onto that list. Returns bytes released. */
static uint64_t release_idle_to(cs_cache *c, int device, bool ready_only, uint64_t target_idle,
                                cs_release_reason why, cs_block **deferred)
{
    device_state *d = &c->devices[device];
    uint64_t released = 0;
    for (cs_heap *h = c->heaps; h && d->idle_bytes > target_idle; h = h->next) {
        if (h->device != device)
            continue;
        cs_block *b = h->lru_head;
        while (b && d->idle_bytes > target_idle) {
            cs_block *next = b->lru_next;
            if (!ready_only || seq_ready(c, h, b->free_seq)) {
                released += b->size;
                if (deferred)
                    defer_release(c, b, deferred);
                else
                    release_block(c, b, why);
            }
            b = next;
        }
    }
    return released;
}

static uint64_t release_idle(cs_cache *c, int device, bool ready_only, uint64_t target_idle,
                             cs_release_reason why)
{
    return release_idle_to(c, device, ready_only, target_idle, why, NULL);
}

/* ---------------------------------------------------------------- heaps */

cs_cache *cs_cache_create(const cs_cache_config *config)
{
    cs_cache *c = calloc(1, sizeof *c);
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
    cs_heap *h = c->heaps;
    while (h) {
        cs_heap *next = h->next;
        free(h);
        h = next;
    }
    c->heaps = c->last_heap = NULL;
}

void cs_cache_destroy(cs_cache *c)
{
    if (!c)
        return;
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
                           const cs_backend_ops *ops, void *dev)
{
    if (device < 0 || device >= CS_MAX_DEVICES)
        return NULL;
    pthread_mutex_lock(&c->lock);
    cs_heap *h = find_heap(c, key);
    if (!h && (h = calloc(1, sizeof *h))) {
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
        }
    }
    pthread_mutex_unlock(&c->lock);
    return h;
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
                if (b->state == BLOCK_IDLE) {
                    d->idle_bytes -= b->size;
                } else {
                    d->st.bytes_in_use -= b->size;
                    d->st.bytes_requested -= b->requested;
                }
                free(b);
            }
        }
        d->st.bytes_cached = d->idle_bytes;
        while (h->fence_count)
            fence_drop_oldest(h);
        free(h);
    }
    pthread_mutex_unlock(&c->lock);
}

void cs_cache_set_capturing(cs_cache *c, bool capturing)
{
    pthread_mutex_lock(&c->lock);
    c->capturing = capturing;
    pthread_mutex_unlock(&c->lock);
}

/* ---------------------------------------------------------------- allocation */

/* The oldest idle block of the class, if its fence completed. */
static cs_block *take_ready(cs_cache *c, cs_heap *h, int cls)
{
    cs_block *b = h->classes[cls].head;
    if (!b || !seq_ready(c, h, b->free_seq))
        return NULL;
    idle_unlink(h, b);
    c->devices[h->device].idle_bytes -= b->size;
    return b;
}

/* The oldest idle block that fits (its class, up to twice the size asked for), once the GPU
 * is done with it: waiting beats giving memory back and asking for more. */
static cs_block *take_waiting(cs_cache *c, cs_heap *h, int cls, uint64_t size)
{
    for (int k = cls; k < CS_NUM_CLASSES && (k == cls || class_bytes_of(k) <= 2 * size); k++) {
        cs_block *b = h->classes[k].head;
        if (b && wait_seq(c, h, b->free_seq)) {
            idle_unlink(h, b);
            c->devices[h->device].idle_bytes -= b->size;
            return b;
        }
    }
    return NULL;
}

/* Make room under the cap for `need` more bytes: release idle blocks. */
static bool fit_cap(cs_cache *c, device_state *d, int device, uint64_t need)
{
    if (d->cap == CS_UNLIMITED || held(d) + need <= d->cap)
        return true;
    if (c->capturing || d->st.bytes_in_use + need > d->cap)
        return false;  /* even an empty cache would not make room */
    uint64_t target = d->cap - d->st.bytes_in_use - need;
    release_idle(c, device, false, target, CS_RELEASE_CAP);
    return held(d) + need <= d->cap;
}

/* Ask the driver; on out-of-memory release the cache step by step and retry. */
static int driver_alloc(cs_cache *c, cs_heap *h, uint64_t size, uint64_t *addr, int *raw)
{
    c->devices[h->device].st.driver_allocs++;
    return h->ops->alloc(h->dev, size, addr, raw);
}

/* The driver said out of memory: release the cache step by step and retry. */
static int recover_oom(cs_cache *c, cs_heap *h, uint64_t size, uint64_t *addr, int *raw)
{
    device_state *d = &c->devices[h->device];
    int r = CS_BE_OOM;
    /* Step 1: idle blocks the GPU is done with. */
    if (release_idle(c, h->device, true, 0, CS_RELEASE_OOM) > 0) {
        d->st.driver_allocs++;
        r = h->ops->alloc(h->dev, size, addr, raw);
        if (r == CS_BE_OK)
            d->st.oom_recoveries++;
        if (r != CS_BE_OOM)
            return r;
    }
    /* Step 2: wait for every pending fence of the device, then give back all idle memory. */
    if (d->idle_bytes > 0) {
        for (cs_heap *o = c->heaps; o; o = o->next)
            if (o->device == h->device)
                wait_seq(c, o, o->free_seq);
        release_idle(c, h->device, false, 0, CS_RELEASE_OOM);
        d->st.driver_allocs++;
        r = h->ops->alloc(h->dev, size, addr, raw);
        if (r == CS_BE_OK)
            d->st.oom_recoveries++;
    }
    return r;
}

/* Bookkeeping for memory the driver just gave; NULL (and the memory given back) when the
 * host has no memory for it. */
static cs_block *new_block(cs_cache *c, cs_heap *h, uint64_t addr, uint64_t bytes, int cls)
{
    cs_block *b = calloc(1, sizeof *b);
    if (b) {
        b->addr = addr;
        b->size = bytes;
        b->heap = h;
        b->cls = (uint16_t)cls;
        if (registry_add(c, b))
            return b;
        free(b);
    }
    int raw;
    h->ops->free(h->dev, addr, &raw);
    return NULL;
}

static void fill_failure(cs_alloc_failure *f, const device_state *d, uint64_t size, bool by_cap)
{
    if (!f)
        return;
    f->requested = size;
    f->in_use = d->st.bytes_in_use;
    f->cached = d->idle_bytes;
    f->cap = d->cap;
    f->by_cap = by_cap;
}

cs_result cs_cache_alloc(cs_cache *c, cs_heap *h, uint64_t size, uint64_t *addr, int *raw,
                         cs_alloc_failure *failure)
{
    uint64_t bytes;
    int cls = cs_size_class(size, &bytes);
    pthread_mutex_lock(&c->lock);
    device_state *d = &c->devices[h->device];
    d->st.requests++;
    if (cls < 0) {
        /* Larger than any class (2^47 bytes): no device has it. */
        d->st.oom_failures++;
        fill_failure(failure, d, size, false);
        pthread_mutex_unlock(&c->lock);
        return CS_OOM;
    }

    cs_block *b = take_ready(c, h, cls);
    /* A ready block of a larger class, up to twice the size asked for, beats a new one: the
     * memory is already reserved, and replays of real traces hold less and hit more so. */
    for (int k = cls + 1; !b && k < CS_NUM_CLASSES && class_bytes_of(k) <= 2 * size; k++)
        b = take_ready(c, h, k);
    /* At the cap, a block still in use by the GPU is worth waiting for. */
    if (!b && d->cap != CS_UNLIMITED && held(d) + bytes > d->cap)
        b = take_waiting(c, h, cls, size);
    if (b) {
        d->st.hits++;
    } else {
        d->st.misses++;
        if (!fit_cap(c, d, h->device, bytes)) {
            d->st.cap_refusals++;
            fill_failure(failure, d, size, true);
            pthread_mutex_unlock(&c->lock);
            return CS_OOM;
        }
        uint64_t a = 0;
        int r = driver_alloc(c, h, bytes, &a, raw);
        if (r == CS_BE_OOM && !c->capturing) {
            /* Out of memory. Step 0: a cached block that fits, once the GPU is done with it. */
            if ((b = take_waiting(c, h, cls, size))) {
                d->st.oom_recoveries++;
                r = CS_BE_OK;
            } else {
                r = recover_oom(c, h, bytes, &a, raw);
            }
        }
        if (r == CS_BE_OK && !b && !(b = new_block(c, h, a, bytes, cls)))
            r = CS_BE_OOM;
        if (r != CS_BE_OK) {
            if (r == CS_BE_OOM) {
                d->st.oom_failures++;
                fill_failure(failure, d, size, false);
            }
            pthread_mutex_unlock(&c->lock);
            return r == CS_BE_OOM ? CS_OOM : CS_ERROR;
        }
    }
    b->state = BLOCK_IN_USE;
    b->requested = size;
    note_in_use(d, b);
    d->st.bytes_cached = d->idle_bytes;
    *addr = b->addr;
    pthread_mutex_unlock(&c->lock);
    return CS_OK;
}

cs_result cs_cache_free(cs_cache *c, uint64_t addr)
{
    pthread_mutex_lock(&c->lock);
    cs_block *b = registry_find(c, addr);
    if (!b) {
        c->foreign_frees++;  /* no device can be told from a pointer we never saw */
        pthread_mutex_unlock(&c->lock);
        return CS_FOREIGN;
    }
    if (b->state != BLOCK_IN_USE) {
        pthread_mutex_unlock(&c->lock);
        return CS_NOT_IN_USE;
    }
    cs_heap *h = b->heap;
    device_state *d = &c->devices[h->device];
    b->state = BLOCK_IDLE;
    b->free_seq = ++h->free_seq;
    d->st.frees++;
    d->st.bytes_in_use -= b->size;
    d->st.bytes_requested -= b->requested;
    d->idle_bytes += b->size;
    idle_push(h, b);
    cs_block *released = NULL;
    int device = h->device;
    if (d->idle_bytes > d->threshold && !c->capturing)
        release_idle_to(c, device, false, d->threshold, CS_RELEASE_THRESHOLD, &released);
    d->st.bytes_cached = d->idle_bytes;
    pthread_mutex_unlock(&c->lock);
    finish_releases(c, device, released, CS_RELEASE_THRESHOLD);
    return CS_OK;
}

cs_block_state cs_cache_lookup(cs_cache *c, uint64_t addr, uint64_t *requested)
{
    pthread_mutex_lock(&c->lock);
    cs_block *b = registry_find(c, addr);
    cs_block_state st = !b ? CS_BLOCK_UNKNOWN : b->state == BLOCK_IN_USE ? CS_BLOCK_IN_USE
                                                                      : CS_BLOCK_IDLE;
    if (st == CS_BLOCK_IN_USE)
        *requested = b->requested;
    pthread_mutex_unlock(&c->lock);
    return st;
}

/* ---------------------------------------------------------------- views and statistics */

void cs_cache_mem_view(cs_cache *c, int device, uint64_t driver_free, uint64_t driver_total,
                       uint64_t *free_out, uint64_t *total_out)
{
    pthread_mutex_lock(&c->lock);
    uint64_t idle = 0, in_use = 0, cap = CS_UNLIMITED;
    if (device >= 0 && device < CS_MAX_DEVICES && c->devices[device].present) {
        device_state *d = &c->devices[device];
        idle = d->idle_bytes;
        in_use = d->st.bytes_in_use;
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
    pthread_mutex_lock(&c->lock);
    for (int i = 0; i < CS_MAX_DEVICES && !c->capturing; i++)
        if (c->devices[i].present) {
            released += release_idle(c, i, true, 0, CS_RELEASE_TRIM);
            c->devices[i].st.bytes_cached = c->devices[i].idle_bytes;
        }
    pthread_mutex_unlock(&c->lock);
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
}

bool cs_cache_stats(cs_cache *c, int device, cacheshim_stats *out)
{
    bool found = false;
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&c->lock);
    if (device >= 0) {
        if (device < CS_MAX_DEVICES && c->devices[device].present) {
            *out = c->devices[device].st;
            found = true;
        }
    } else {
        out->cap_bytes = 0;
        for (int i = 0; i < CS_MAX_DEVICES; i++) {
            if (!c->devices[i].present)
                continue;
            add_stats(out, &c->devices[i].st);
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

void cs_cache_lock(cs_cache *c)
{
    pthread_mutex_lock(&c->lock);
}

void cs_cache_unlock(cs_cache *c)
{
    pthread_mutex_unlock(&c->lock);
}

void cs_cache_reset_after_fork(cs_cache *c)
{
    /* Called in the child, which holds the lock: its only thread is the one that took it
     * in the fork's prepare hook. */
    free_all(c);
    memset(c->devices, 0, sizeof c->devices);
    c->foreign_frees = 0;
    c->capturing = false;
    pthread_mutex_unlock(&c->lock);
}
