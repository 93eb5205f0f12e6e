/* The backend: the cache's device operations on one real driver context. */
#ifndef CS_BACKEND_H
#define CS_BACKEND_H

#include <cuda.h>
#include <stdbool.h>

#include "cs_cache.h"

typedef struct cs_ctx_dev cs_ctx_dev;

extern const cs_backend_ops cs_cuda_ops;

/* The backend state of a context, made on first use (NULL if out of memory). */
cs_ctx_dev *cs_backend_for(CUcontext ctx);
/* The context was destroyed: drop its state without driver calls. */
void cs_backend_forget(CUcontext ctx);

/* Non-blocking streams must be fenced on their own: track them from creation to destruction. */
void cs_backend_stream_created(CUstream stream, unsigned int flags);
/* Before the real destroy: the stream's pending work outlives it, so remember a marker. */
void cs_backend_stream_destroying(CUstream stream);

/* Held across fork (taken after the cache's lock, as everywhere); in the child, forget
 * everything (the parent's driver state is not ours) and release it. */
void cs_backend_lock(void);
void cs_backend_unlock(void);
void cs_backend_reset_after_fork(void);

#endif
