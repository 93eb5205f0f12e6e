/* Memory the program takes from the driver past the cache: cuMemAllocPitch, cuMemAllocManaged,
 * cuMemAllocAsync, cuMemAllocFromPoolAsync and cuMemCreate. Each is charged against the cap
 * of its device before the driver is asked (cs_outside_alloc: the one place these paths meet
 * the cap), retried once after the cache gave its idle memory back when the driver is out of
 * memory, and remembered by pointer or handle until its free uncharges it. */
#ifndef CS_OUTSIDE_H
#define CS_OUTSIDE_H

#include <cuda.h>
#include <stdbool.h>
#include <stdint.h>

#include "cs_cache.h"

/* What a remembered allocation is known by. */
typedef enum {
    CS_OUTSIDE_POINTER,  /* freed by cuMemFree or cuMemFreeAsync; gone with its context */
    CS_OUTSIDE_ASYNC,    /* stream-ordered: freed by cuMemFree(Async); outlives its context */
    CS_OUTSIDE_HANDLE,   /* a cuMemCreate handle, freed by its last cuMemRelease and
                          * cuMemUnmap (cs_outside_mapped and the rest, below) */
} cs_outside_kind;

/* The driver call that takes the memory, made by cs_outside_alloc (once, or twice after an
 * out-of-memory answer); it writes the pointer or handle into *id. */
typedef CUresult (*cs_outside_call)(void *args, uint64_t *id);

/* Charges `bytes` on the heap's device, makes the call, and remembers the result as `kind`.
 * An allocation the cap refuses never reaches the driver: CUDA_ERROR_OUT_OF_MEMORY, reported
 * like a refused cuMemAlloc. */
CUresult cs_outside_alloc(cs_heap *heap, cs_outside_kind kind, uint64_t bytes,
                          cs_outside_call call, void *args);
/* The bytes charged for an allocation changed after the driver answered (a pitch larger than
 * estimated): false, nothing changed, when the cap refuses the extra bytes. */
bool cs_outside_adjust(cs_outside_kind kind, uint64_t id, uint64_t bytes);
/* A free in two steps. Before the driver is asked, the allocation is taken out of the map
 * (still charged), so that one the driver gives the same pointer or handle meanwhile (in
 * another thread) is not taken for it; after, it is uncharged if the driver freed it, else
 * put back. Pointers (pitched, managed, stream-ordered): NULL when not remembered. */
typedef struct cs_outside_entry cs_outside_entry;
cs_outside_entry *cs_outside_free_begin(uint64_t ptr);
void cs_outside_free_end(cs_outside_entry *e, bool freed);
/* A cuMemCreate handle's memory goes once every reference to it is released (the creation,
 * each cuMemRetainAllocationHandle) and its last mapping is unmapped; counted until then.
 * The driver mapped [va, va + size) to the handle; it unmapped every mapping that starts in
 * [va, va + size); it handed out one more reference to the handle mapped at addr. */
void cs_outside_mapped(uint64_t handle, uint64_t va, uint64_t size);
void cs_outside_unmapped(uint64_t va, uint64_t size);
void cs_outside_retained(uint64_t handle, uint64_t addr);
/* cuMemRelease in two steps, as a free: begin returns the handle's entry when this is its
 * last reference (taken out of reach of its number), end is told whether the driver
 * released it. */
cs_outside_entry *cs_outside_release_begin(uint64_t handle);
void cs_outside_release_end(uint64_t handle, cs_outside_entry *last, bool released);
/* Where the program's memory pools keep their memory (cuMemAllocFromPoolAsync's pool may be
 * another device's than the stream's, or the host's): a device ordinal, or CS_OUTSIDE_NO_DEVICE.
 * Remembered as they are made (cuMemPoolCreate) or recognised (a device's default pool),
 * forgotten when destroyed: pool_gone returns where it was, false when not remembered. */
#define CS_OUTSIDE_NO_DEVICE (-1)
void cs_outside_pool_made(uint64_t pool, int device);
bool cs_outside_pool_gone(uint64_t pool, int *device);
bool cs_outside_pool_device(uint64_t pool, int *device);
/* Is it remembered? */
bool cs_outside_known(cs_outside_kind kind, uint64_t id);
/* The context is gone and with it its CS_OUTSIDE_POINTER allocations. */
void cs_outside_context_gone(const void *ctx);
/* Held across fork (taken before the cache's lock); in the child, nothing of the parent's
 * is ours: forget all and release. */
void cs_outside_lock(void);
void cs_outside_unlock(void);
void cs_outside_reset_after_fork(void);

#endif
