/* The cache: size classes, idle lists, the pointer registry, fences, cap, release threshold,
 * OOM recovery and statistics. Pure C: no CUDA types and no I/O. It reaches the device only
 * through cs_backend_ops, so tests drive it with a fake backend. */
#ifndef CS_CACHE_H
#define CS_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cacheshim.h"
#include "cs_pool.h"

#define CS_MAX_DEVICES 64
#define CS_NUM_CLASSES 576
#define CS_UNLIMITED UINT64_MAX


/* The device as the cache sees it: one per heap (one heap per driver context). `dev` is the
 * backend's own state for that heap. Raw driver codes travel as int.
 *
 * Fences are epochs: fence() returns an epoch that covers all work issued so far that can
 * touch the heap's memory; epochs complete in order. None of these calls may block except
 * wait(). The cache calls alloc, free and wait without holding its lock, and fence, reached
 * and order_after from several threads at once (its per-thread fast paths do not take the
 * cache's lock): all must be thread-safe. */
typedef struct cs_backend_ops {
    int (*alloc)(void *dev, uint64_t size, uint64_t *addr, int *raw);
    int (*free)(void *dev, uint64_t addr, int *raw);
    uint64_t (*fence)(void *dev);
    /* 1 when all work up to epoch has completed, else 0 (it may also be unknowable). */
    int (*reached)(void *dev, uint64_t epoch);
    /* Blocks until epoch has completed: 0, or -1 when that cannot be known. */
    int (*wait)(void *dev, uint64_t epoch);
    /* Every stream's next work will wait for epoch on the GPU (stream-ordered reuse): 0, or
     * -1 when that cannot be arranged now. */
    int (*order_after)(void *dev, uint64_t epoch);
    /* How many streams have work whose fence has not been seen complete (NULL: one). */
    int (*busy_streams)(void *dev);
    /* Pooled physical memory (cs_pool.h) instead of alloc and free: NULL for none. */
    const cs_vmm_ops *vmm;
} cs_backend_ops;

/* How a freed block whose fence has not completed may be reused. */
typedef enum {
    CS_REUSE_ORDERED = 0,  /* at once, with streams made to wait for its fence (default) */
    CS_REUSE_COMPLETED,    /* only once its fence has completed */
} cs_reuse_mode;

/* Why memory went back to the driver, for the release hook and statistics. */
typedef enum {
    CS_RELEASE_THRESHOLD,
    CS_RELEASE_CAP,
    CS_RELEASE_OOM,
    CS_RELEASE_TRIM,
    CS_RELEASE_MOVE,  /* a pooled block's memory moves to a new block: nothing given back */
} cs_release_reason;

typedef struct cs_cache_config {
    /* Per-device limits; CS_UNLIMITED for none. Resolved per device by the caller through
     * the limit callbacks, since percentages depend on the device's size. */
    uint64_t (*cap_for)(void *arg, uint64_t device_total);
    uint64_t (*threshold_for)(void *arg, uint64_t device_total);
    void *limit_arg;
    /* Told about every block given back to the driver (may be NULL), and about a pool's free
     * memory given back (addr 0, size its bytes). Called under the lock. */
    void (*on_release)(void *arg, int device, uint64_t addr, uint64_t size, cs_release_reason why);
    void *release_arg;
    cs_reuse_mode reuse;
    /* Does a stream capture run anywhere in the process? While one does, the cache gives
     * nothing back to the driver (a free could break it); the cap then refuses what it
     * cannot fit without a release. May be NULL (never). */
    bool (*capturing)(void);
    /* Pooled heaps: memory held may exceed the program's peak by this much (per mille)
     * before misses move idle memory instead of taking new memory. */
    unsigned pool_headroom_permille;
    /* A cap shared with other processes (cs_group.h), NULL for none. What the device holds
     * is charged to the group before it is taken (false: the group's total would exceed cap,
     * *short_by bytes short; idle memory is then given back as for the cap) and uncharged once
     * given back; group_others is what the other members hold, for the memory view. Called
     * under the lock; must not block. */
    bool (*group_charge)(void *arg, int device, uint64_t bytes, uint64_t cap,
                         uint64_t *short_by);
    void (*group_uncharge)(void *arg, int device, uint64_t bytes);
    uint64_t (*group_others)(void *arg, int device);
    void *group_arg;
} cs_cache_config;

typedef enum {
    CS_OK = 0,
    CS_OOM,        /* driver out of memory after recovery, or the cap refused it */
    CS_ERROR,      /* the driver failed otherwise: see raw */
    CS_FOREIGN,    /* free: not a pointer the cache handed out */
    CS_NOT_IN_USE, /* free: a block the program already freed */
    CS_GONE,       /* alloc: the heap's context was destroyed meanwhile */
} cs_result;

/* Filled when an allocation fails, for the one-line report. */
typedef struct cs_alloc_failure {
    uint64_t requested, in_use, cached, cap;
    int device;
    bool by_cap;   /* refused by the cap (or the group's), not by the driver */
} cs_alloc_failure;

typedef struct cs_cache cs_cache;
typedef struct cs_heap cs_heap;

cs_cache *cs_cache_create(const cs_cache_config *config);
/* Frees the cache's own memory only: no backend call (the driver may be gone). No thread may
 * be using the cache; each thread frees its own small per-thread part later. */
void cs_cache_destroy(cs_cache *cache);

/* The heap for one driver context, made on first use. `key` identifies the context.
 * Returns NULL if memory for it cannot be had or the device ordinal is out of range. */
cs_heap *cs_cache_heap(cs_cache *cache, const void *key);
/* granularity: the device's allocation granularity (a power of two; 0 for the default, 2 MiB):
 * classic large blocks are whole granules, pooled ones CS_POOL_ALIGN bytes (chunks are whole
 * granules). With ops->vmm the heap pools physical memory. */
#define CS_DEFAULT_GRANULARITY (2ull << 20)
cs_heap *cs_cache_add_heap(cs_cache *cache, const void *key, int device, uint64_t device_total,
                           const cs_backend_ops *ops, void *dev, uint64_t granularity);
/* The backend state a heap was made with; its key; whether its physical memory is pooled. */
void *cs_cache_heap_dev(const cs_heap *heap);
const void *cs_cache_heap_key(const cs_heap *heap);
bool cs_cache_heap_pooled(const cs_heap *heap);
/* The device of a heap; a heap of a device whose context lives (NULL: none). */
int cs_cache_heap_device(const cs_heap *heap);
cs_heap *cs_cache_device_heap(cs_cache *cache, int device);
/* The devices allowed to use a pooled heap's memory changed: grant every mapping again
 * (cs_pool_regrant). 0, or the raw driver code of the first failure. */
int cs_cache_regrant(cs_heap *heap);
/* The context is gone with all its memory: forget its blocks without driver calls, except
 * that a pooled heap's memory (virtual memory, which outlives the context) is given back. */
void cs_cache_forget_heap(cs_cache *cache, const void *key);


cs_result cs_cache_alloc(cs_cache *cache, cs_heap *heap, uint64_t size, uint64_t *addr,
                         int *raw, cs_alloc_failure *failure);
cs_result cs_cache_free(cs_cache *cache, uint64_t addr);
typedef enum { CS_BLOCK_UNKNOWN = 0, CS_BLOCK_IN_USE, CS_BLOCK_IDLE } cs_block_state;
/* Is addr the base of a block the cache handed out? If so, the size the program asked for. */
cs_block_state cs_cache_lookup(cs_cache *cache, uint64_t addr, uint64_t *requested);

/* A block as pointer queries must describe it. */
typedef struct cs_block_info {
    uint64_t base;       /* where the block starts */
    uint64_t requested;  /* what the program asked for (in use; 0 when idle) */
    uint64_t size;       /* the block's bytes */
    uint64_t serial;     /* a number of its own for each time it was handed out */
    int device;
    const void *key;     /* its heap's key (the shim's: the context it was allocated in) */
    void *dev;           /* its heap's backend state (kept for the process's life) */
    bool pooled;         /* in a pooled heap: the driver's answers are about the pool's ranges */
} cs_block_info;
/* The block containing addr (any byte of it), if the cache knows one there; CS_BLOCK_IDLE also
 * for a pooled heap's memory that is in no block (nothing the program holds). */
cs_block_state cs_cache_find(cs_cache *cache, uint64_t addr, cs_block_info *out);

/* The physical memory of a pooled block in use that starts at addr and was handed out as
 * `serial` (cs_block_info): each chunk mapped under it, as cs_pool_chunks, with the cache's
 * lock held too (the block's memory stays in the pool meanwhile, even if the thread that
 * owns it frees it; `each` must not call into the cache).
 * CS_OK; CS_NOT_IN_USE when there is no such block (freed, handed out again, not pooled);
 * CS_ERROR when `each` failed. */
cs_result cs_cache_chunks(cs_cache *cache, uint64_t addr, uint64_t serial, cs_pool_chunk_fn each,
                          void *arg);

/* Memory the program takes from the driver past the cache (cuMemAllocPitch, managed, async,
 * cuMemCreate...) counts against the heap's device's cap. charge reserves `bytes` under the
 * cap (giving idle cached memory back to make room, as a miss does): CS_OK, or CS_OOM with
 * *failure filled (may be NULL) when even an empty cache would not make room. uncharge takes
 * them off once the driver freed them. */
cs_result cs_cache_charge(cs_cache *cache, cs_heap *heap, uint64_t bytes,
                          cs_alloc_failure *failure);
void cs_cache_uncharge(cs_cache *cache, cs_heap *heap, uint64_t bytes);
/* Out of memory elsewhere: give every idle block and spare chunk of the heap's device back to
 * the driver, waiting for their fences. Returns the bytes released. */
uint64_t cs_cache_release_idle(cs_cache *cache, cs_heap *heap);

/* What a capped program should see of the device, given the driver's own numbers. */
void cs_cache_mem_view(cs_cache *cache, int device, uint64_t driver_free, uint64_t driver_total,
                       uint64_t *free, uint64_t *total);
/* Give back idle blocks whose fences completed; returns bytes released. Calls the driver
 * without the lock. */
uint64_t cs_cache_trim(cs_cache *cache);

/* Statistics of one device, or all with device = -1; false if that device has no heap. */
bool cs_cache_stats(cs_cache *cache, int device, cacheshim_stats *out);
/* Devices that have a heap, in ascending order; returns how many were written. */
int cs_cache_devices(cs_cache *cache, int *devices, int max);

/* After fork() in the child: the parent's device memory is not ours to use; forget all.
 * The child must hold the lock (cs_cache_lock before fork); this releases it. */
void cs_cache_reset_after_fork(cs_cache *cache);
/* For pthread_atfork: hold the lock across fork so no other thread holds it then (with the
 * process-wide registry of per-thread caches: one cache at a time). */
void cs_cache_lock(cs_cache *cache);
void cs_cache_unlock(cs_cache *cache);
/* A second cache across the same fork, locked after the first (whose cs_cache_lock holds the
 * registry) and reset in the child before the first. */
void cs_cache_lock_also(cs_cache *cache);
void cs_cache_unlock_also(cs_cache *cache);
void cs_cache_reset_after_fork_also(cs_cache *cache);

/* Size classes: 512-byte steps up to 8 KiB, then 16 steps per power of two (at most 6.25 %
 * rounding). Exposed for tests and the replay tools. */
int cs_size_class(uint64_t size, uint64_t *class_bytes);

#endif
