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
/* The driver freed it: uncharged and forgotten. False when it was not remembered. */
bool cs_outside_freed(cs_outside_kind kind, uint64_t id);
/* A pointer the driver freed: pitched, managed or stream-ordered. */
void cs_outside_pointer_freed(uint64_t ptr);
/* A cuMemCreate handle's memory goes once every reference to it is released (the creation,
 * each cuMemRetainAllocationHandle) and its last mapping is unmapped; counted until then.
 * The driver mapped [va, va + size) to the handle; it unmapped every mapping that starts in
 * [va, va + size); it handed out one more reference to the handle mapped at addr; it
 * released one reference. */
void cs_outside_mapped(uint64_t handle, uint64_t va, uint64_t size);
void cs_outside_unmapped(uint64_t va, uint64_t size);
void cs_outside_retained(uint64_t handle, uint64_t addr);
void cs_outside_released(uint64_t handle);
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
