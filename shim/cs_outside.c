/* Memory outside the cache, charged against the cap (cs_outside.h): a small map from pointer
 * or handle to what was charged, under one lock. These calls are slow in the driver already
 * (a cuMemCreate or a managed allocation costs tens of microseconds): a lock costs nothing
 * next to them. */
#include "cs_outside.h"

#include <pthread.h>
#include <stdlib.h>

#include "cs_shim.h"

#define BUCKETS 1024

/* Besides the kinds of cs_outside.h, kept here: a mapping of a handle's memory (id: its
 * address, bytes: its size, owner: the handle's entry, not charged), a handle whose
 * references were all released while it was still mapped (found by no handle: the driver
 * may give its number to a new allocation), and a memory pool (id: its handle, device: where
 * its memory is; nothing charged). */
#define MAPPING ((cs_outside_kind)100)
#define RELEASED ((cs_outside_kind)101)
#define POOL ((cs_outside_kind)102)

struct cs_outside_entry {
    uint64_t id;
    cs_outside_kind kind;
    cs_heap *heap;
    uint64_t bytes;
    uint64_t refs, maps;  /* a handle's references and mappings */
    int device;           /* a pool's */
    struct cs_outside_entry *owner;  /* a mapping's handle */
    struct cs_outside_entry *next;
};
typedef struct cs_outside_entry entry;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static entry *buckets[BUCKETS];
/* Mappings recorded (atomic, changed under the lock): an unmap or a retain looks for them by
 * address, over every bucket, only where there are any. */
static uint64_t nmappings;

static size_t bucket_of(uint64_t id)
{
    return (size_t)((id >> 9) ^ (id >> 21) ^ id) % BUCKETS;
}

/* The entry's link, or where it would be linked. Lock held. */
static entry **find(cs_outside_kind kind, uint64_t id)
{
    entry **e = &buckets[bucket_of(id)];
    while (*e && ((*e)->id != id || (*e)->kind != kind))
        e = &(*e)->next;
    return e;
}

CUresult cs_outside_alloc(cs_heap *heap, cs_outside_kind kind, uint64_t bytes,
                          cs_outside_call call, void *args)
{
    cs_shim *s = cs_shim_get();
    cs_alloc_failure failure;
    if (cs_cache_charge(s->cache, heap, bytes, &failure) != CS_OK) {
        cs_shim_report_failure(cs_driver_get(), &failure);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    entry *e = malloc(sizeof *e);
    if (!e) {
        cs_cache_uncharge(s->cache, heap, bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uint64_t id = 0;
    CUresult r = call(args, &id);
    if (r == CUDA_ERROR_OUT_OF_MEMORY && cs_cache_release_idle(s->cache, heap) > 0)
        r = call(args, &id);
    if (r != CUDA_SUCCESS) {
        cs_cache_uncharge(s->cache, heap, bytes);
        free(e);
        return r;
    }
    *e = (entry){.id = id, .kind = kind, .heap = heap, .bytes = bytes, .refs = 1};
    pthread_mutex_lock(&lock);
    entry **at = find(kind, id);
    if (*at) {  /* the driver reused an id whose free we missed: the old charge goes */
        entry *old = *at;
        *at = old->next;
        cs_cache_uncharge(s->cache, old->heap, old->bytes);
        free(old);
    }
    e->next = buckets[bucket_of(id)];
    buckets[bucket_of(id)] = e;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

bool cs_outside_adjust(cs_outside_kind kind, uint64_t id, uint64_t bytes)
{
    cs_shim *s = cs_shim_get();
    pthread_mutex_lock(&lock);
    entry *e = *find(kind, id);
    if (!e || bytes <= e->bytes) {
        if (e && bytes < e->bytes) {
            cs_cache_uncharge(s->cache, e->heap, e->bytes - bytes);
            e->bytes = bytes;
        }
        pthread_mutex_unlock(&lock);
        return e != NULL;
    }
    /* More: charged without the lock, as making room may give cached memory back to the
     * driver and wait for it (the other threads' frees must not wait with it). */
    cs_heap *heap = e->heap;
    uint64_t more = bytes - e->bytes;
    pthread_mutex_unlock(&lock);
    bool ok = cs_cache_charge(s->cache, heap, more, NULL) == CS_OK;
    if (ok) {
        pthread_mutex_lock(&lock);
        e = *find(kind, id);
        if (e)
            e->bytes += more;
        else  /* freed meanwhile (by the program, racing with its own allocation) */
            cs_cache_uncharge(s->cache, heap, more);
        pthread_mutex_unlock(&lock);
    }
    return ok;
}

/* Takes e out of its bucket. Lock held. */
static void unlink_entry(entry *e)
{
    entry **at = &buckets[bucket_of(e->id)];
    while (*at != e)
        at = &(*at)->next;
    *at = e->next;
}

static void link_entry(entry *e)
{
    e->next = buckets[bucket_of(e->id)];
    buckets[bucket_of(e->id)] = e;
}

/* A handle's memory is gone once nothing refers to it or maps it: uncharged. Lock held. */
static void handle_check(entry *e)
{
    if (e->refs || e->maps)
        return;
    unlink_entry(e);
    cs_cache_uncharge(cs_shim_get()->cache, e->heap, e->bytes);
    free(e);
}

void cs_outside_mapped(uint64_t handle, uint64_t va, uint64_t size)
{
    pthread_mutex_lock(&lock);
    entry *h = *find(CS_OUTSIDE_HANDLE, handle), *m = h ? malloc(sizeof *m) : NULL;
    if (m) {  /* without host memory, the handle is uncharged at its last release */
        *m = (entry){.id = va, .kind = MAPPING, .bytes = size, .owner = h};
        link_entry(m);
        h->maps++;
        __atomic_add_fetch(&nmappings, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&lock);
}

void cs_outside_unmapped(uint64_t va, uint64_t size)
{
    if (!__atomic_load_n(&nmappings, __ATOMIC_RELAXED))
        return;  /* none recorded: the shim's own pool's unmaps reach the driver directly */
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < BUCKETS; i++) {
        entry **at = &buckets[i];
        while (*at) {
            entry *m = *at;
            if (m->kind != MAPPING || m->id < va || m->id - va >= size) {
                at = &m->next;
                continue;
            }
            *at = m->next;
            entry *h = m->owner;
            free(m);
            h->maps--;
            __atomic_sub_fetch(&nmappings, 1, __ATOMIC_RELAXED);
            if (!h->refs && !h->maps) {
                handle_check(h);
                at = &buckets[i];  /* the handle may have been in this bucket: again */
            }
        }
    }
    pthread_mutex_unlock(&lock);
}

/* The handle's entry mapped at addr, or NULL. Lock held. */
static entry *mapped_at(uint64_t addr)
{
    if (!__atomic_load_n(&nmappings, __ATOMIC_RELAXED))
        return NULL;
    for (size_t i = 0; i < BUCKETS; i++)
        for (entry *m = buckets[i]; m; m = m->next)
            if (m->kind == MAPPING && addr >= m->id && addr - m->id < m->bytes)
                return m->owner;
    return NULL;
}

void cs_outside_retained(uint64_t handle, uint64_t addr)
{
    pthread_mutex_lock(&lock);
    entry *h = mapped_at(addr);
    if (!h)
        h = *find(CS_OUTSIDE_HANDLE, handle);
    if (h) {
        if (h->kind == RELEASED || h->id != handle) {  /* known by this number again */
            unlink_entry(h);
            h->kind = CS_OUTSIDE_HANDLE;
            h->id = handle;
            link_entry(h);
        }
        h->refs++;
    }
    pthread_mutex_unlock(&lock);
}

cs_outside_entry *cs_outside_free_begin(uint64_t ptr)
{
    pthread_mutex_lock(&lock);
    entry **at = find(CS_OUTSIDE_POINTER, ptr);
    if (!*at)
        at = find(CS_OUTSIDE_ASYNC, ptr);
    entry *e = *at;
    if (e)
        *at = e->next;
    pthread_mutex_unlock(&lock);
    return e;
}

void cs_outside_free_end(cs_outside_entry *e, bool freed)
{
    if (!e)
        return;
    if (freed) {
        cs_cache_uncharge(cs_shim_get()->cache, e->heap, e->bytes);
        free(e);
        return;
    }
    pthread_mutex_lock(&lock);
    link_entry(e);  /* the driver kept it: the pointer is still this allocation's */
    pthread_mutex_unlock(&lock);
}

cs_outside_entry *cs_outside_release_begin(uint64_t handle)
{
    pthread_mutex_lock(&lock);
    entry *h = *find(CS_OUTSIDE_HANDLE, handle);
    if (h && h->refs == 1) {  /* the last reference: the number may be the driver's again */
        unlink_entry(h);
        h->kind = RELEASED;
        link_entry(h);
    } else {
        h = NULL;
    }
    pthread_mutex_unlock(&lock);
    return h;
}

void cs_outside_release_end(uint64_t handle, cs_outside_entry *last, bool released)
{
    pthread_mutex_lock(&lock);
    if (last && released) {
        last->refs = 0;
        handle_check(last);  /* gone, unless still mapped */
    } else if (last) {
        unlink_entry(last);
        last->kind = CS_OUTSIDE_HANDLE;
        link_entry(last);
    } else if (released) {
        entry *h = *find(CS_OUTSIDE_HANDLE, handle);
        if (h && h->refs > 1)
            h->refs--;
    }
    pthread_mutex_unlock(&lock);
}

void cs_outside_pool_made(uint64_t pool, int device)
{
    pthread_mutex_lock(&lock);
    entry *e = *find(POOL, pool);
    if (!e && (e = malloc(sizeof *e))) {  /* without host memory, asked again next time */
        *e = (entry){.id = pool, .kind = POOL};
        link_entry(e);
    }
    if (e)
        e->device = device;
    pthread_mutex_unlock(&lock);
}

bool cs_outside_pool_gone(uint64_t pool, int *device)
{
    pthread_mutex_lock(&lock);
    entry **at = find(POOL, pool), *e = *at;
    if (e) {
        *at = e->next;
        *device = e->device;
        free(e);
    }
    pthread_mutex_unlock(&lock);
    return e != NULL;
}

bool cs_outside_pool_device(uint64_t pool, int *device)
{
    pthread_mutex_lock(&lock);
    const entry *e = *find(POOL, pool);
    if (e)
        *device = e->device;
    pthread_mutex_unlock(&lock);
    return e != NULL;
}

bool cs_outside_known(cs_outside_kind kind, uint64_t id)
{
    pthread_mutex_lock(&lock);
    bool known = *find(kind, id) != NULL;
    pthread_mutex_unlock(&lock);
    return known;
}

void cs_outside_context_gone(const void *ctx)
{
    cs_shim *s = cs_shim_get();
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < BUCKETS; i++) {
        entry **at = &buckets[i];
        while (*at) {
            entry *e = *at;
            if (e->kind == CS_OUTSIDE_POINTER && cs_cache_heap_key(e->heap) == ctx) {
                *at = e->next;
                cs_cache_uncharge(s->cache, e->heap, e->bytes);
                free(e);
            } else {
                at = &e->next;
            }
        }
    }
    pthread_mutex_unlock(&lock);
}

void cs_outside_lock(void)
{
    pthread_mutex_lock(&lock);
}

void cs_outside_unlock(void)
{
    pthread_mutex_unlock(&lock);
}

void cs_outside_reset_after_fork(void)
{
    /* The child's only thread holds the lock; the cache's counters were reset already. */
    nmappings = 0;
    for (size_t i = 0; i < BUCKETS; i++) {
        while (buckets[i]) {
            entry *e = buckets[i];
            buckets[i] = e->next;
            free(e);
        }
    }
    pthread_mutex_unlock(&lock);
}
