/* The backend: the cache's device operations on one real driver context. Classic blocks are
 * cuMemAlloc allocations; pooled ones the pool's (cs_pool.h) virtual memory calls; fences are
 * the stream layer's (cs_streams.h). */
#ifndef CS_BACKEND_H
#define CS_BACKEND_H

#include <cuda.h>
#include <stdbool.h>

#include "cs_cache.h"

extern const cs_backend_ops cs_cuda_ops;         /* a cuMemAlloc per block */
extern const cs_backend_ops cs_cuda_pooled_ops;  /* physical memory pooled */

/* The device's allocation granularity when it supports virtual memory management (and the
 * driver has the calls), else 0: the classic backend then. */
uint64_t cs_backend_granularity(CUdevice device);

/* Can the context's pooled blocks be exported (cuIpcGetMemHandle, cs_ipc.c)? False once the
 * driver refused to make its chunks exportable as file descriptors (chunks are then made
 * without, from then on). */
bool cs_backend_exportable(void *dev);

/* The backend state of a context (its `dev` for the cache), made on first use; NULL if out
 * of host memory. */
void *cs_backend_for(CUcontext ctx, CUdevice device);
/* State from cs_backend_for that no heap took (another thread made the context's heap first). */
void cs_backend_drop(void *dev);

/* Pooled memory of this context is to be reachable from device `peer` from now on (its
 * mappings must then be granted again: cs_cache_regrant). True when that is new. */
bool cs_backend_grant_peer(void *dev, CUdevice peer);
/* The grant failed: forget it, so that the next cuCtxEnablePeerAccess tries again. */
void cs_backend_ungrant_peer(void *dev, CUdevice peer);

#endif
