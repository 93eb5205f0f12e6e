/* Pinned host memory cached: cuMemAllocHost, cuMemHostAlloc and cuMemFreeHost (what
 * cudaMallocHost, cudaHostAlloc and cudaFreeHost reach) served by a second cache core with a
 * host backend, under CACHESHIM_HOST_CAP and CACHESHIM_HOST_RELEASE_THRESHOLD. */
#ifndef CS_HOST_H
#define CS_HOST_H

#include <cuda.h>
#include <stdbool.h>

#include "cs_cache.h"
#include "cs_options.h"

/* Made at the shim's start (no driver call); false when out of host memory (then every host
 * call goes to the driver). */
bool cs_host_init(const cs_options *opts, void (*on_release)(void *, int, uint64_t, uint64_t,
                                                             cs_release_reason));
/* The machine's memory: what a percentage in CACHESHIM_HOST_CAP is of. */
uint64_t cs_host_total(void);
/* The host cache, or NULL. */
cs_cache *cs_host_cache(void);
/* The context is gone, and the pinned memory allocated in it with it. */
void cs_host_context_gone(CUcontext ctx);
/* Across fork, after the device cache's lock (cs_cache_lock_also); in the child, before the
 * device cache's reset. */
void cs_host_lock(void);
void cs_host_unlock(void);
void cs_host_reset_after_fork(void);

#endif
