/* Per-thread caches in front of the locked core (cs_tcache.c). Internal to the cache core:
 * cs_cache.c calls these; callers of the cache see only cs_cache.h. */
#ifndef CS_TCACHE_H
#define CS_TCACHE_H

#include "cs_cache_int.h"

/* ---- fast paths: without the cache's lock */

/* A block that fits (cs_class_fits, cs_block_fits: class cls, block bytes) idle in this
 * thread's cache and ready (or, in ordered mode, ordered after): handed out, true. False: ask
 * the locked core. */
bool cs_tc_alloc(cs_cache *c, cs_heap *h, int cls, uint64_t size, uint64_t bytes, uint64_t *addr);

/* CS_OK or CS_NOT_IN_USE when addr is a block this thread's cache holds; CS_TC_NOT_MINE when
 * the locked core must decide (another thread's block, a foreign pointer, a full cache). */
enum { CS_TC_NOT_MINE = -1 };
int cs_tc_free(cs_cache *c, uint64_t addr);

/* ---- with the cache's lock held (they take thread caches' locks themselves) */

/* What this thread's cache holds on one device, for the peaks. */
typedef struct {
    uint64_t idle, owned, requested;
} cs_tc_mine;

/* b was just handed out by the locked core: this thread's cache owns it from now when the
 * heap allows it and it is no large block of a pooled heap (then its free needs no lock).
 * Fills *mine either way. */
bool cs_tc_adopt(cs_cache *c, cs_block *b, cs_tc_mine *mine);
/* The free of a block a thread cache owns, on the locked path: CS_NOT_IN_USE if it is idle;
 * else it leaves its owner (its bytes leave the device's owned bytes) and CS_OK. */
cs_result cs_tc_disown_in_use(cs_cache *c, cs_block *b);
/* An idle block of another thread's cache that fits, ready (or ordered after, when
 * `ordered`): taken from it, owned by nobody. */
cs_block *cs_tc_steal(cs_cache *c, cs_heap *h, int cls, uint64_t size, uint64_t bytes,
                      bool ordered);
/* Every thread's idle blocks of a device (only the ready ones with ready_only) go back to the
 * heaps' idle lists. */
void cs_tc_reclaim(cs_cache *c, int device, bool ready_only);
/* h is gone: every thread cache forgets its blocks (no backend call); their owner stays set
 * for the caller's accounting. */
void cs_tc_forget_heap(cs_cache *c, cs_heap *h);
/* Adds what the thread caches counted and hold on a device to *st. */
void cs_tc_add_stats(cs_cache *c, int device, cacheshim_stats *st);
/* State of a block a thread cache owns. */
cs_block_state cs_tc_lookup(cs_block *b, uint64_t *requested, uint64_t *serial);

/* ---- lifetime */

/* The cache goes away, or a forked child forgets everything: no thread cache serves it any
 * more (each is freed by its thread later). With the registry held. */
void cs_tc_detach_all(cs_cache *c);
/* The registry of thread caches: taken before any cache's lock; held across fork by
 * cs_cache_lock. */
void cs_tc_registry_lock(void);
void cs_tc_registry_unlock(void);

#endif
