/* The backend: the cache's device operations on one real driver context. Allocation and
 * frees go to the driver; fences are the stream layer's (cs_streams.h). */
#ifndef CS_BACKEND_H
#define CS_BACKEND_H

#include <cuda.h>

#include "cs_cache.h"

extern const cs_backend_ops cs_cuda_ops;

/* The backend state of a context (its `dev` for the cache), made on first use; NULL if out
 * of host memory. */
void *cs_backend_for(CUcontext ctx);

#endif
