/* What the entry-point files share: the shim's state, made on first use. */
#ifndef CS_SHIM_H
#define CS_SHIM_H

#include <cuda.h>
#include <stdbool.h>

#include "cs_cache.h"
#include "cs_driver.h"
#include "cs_options.h"

#define CS_EXPORT __attribute__((visibility("default")))

typedef struct cs_shim {
    cs_options opts;
    cs_cache *cache;
    bool disabled;  /* CACHESHIM_DISABLE, or the cache could not be made */
} cs_shim;

/* Options read, cache made (thread-safe, once). Never calls the driver. */
cs_shim *cs_shim_get(void);

/* The cache heap of the calling thread's current context, made on first use; NULL when no
 * context is current or the context cannot be served (the call then goes to the driver). */
cs_heap *cs_shim_current_heap(const cs_driver *d, CUcontext *ctx_out);
/* The heap of any context, made on first use (NULL when it cannot be). */
cs_heap *cs_shim_heap_of(const cs_driver *d, CUcontext ctx);

/* A context and all its memory are gone. */
void cs_shim_context_gone(CUcontext ctx);

/* A failed allocation, reported on stderr when CACHESHIM_VERBOSE >= 1. */
void cs_shim_report_failure(const cs_driver *d, const cs_alloc_failure *f);

/* A failed pinned host allocation, likewise. */
void cs_shim_report_host_failure(const cs_alloc_failure *f);

/* The one-line messages of the shim ("cacheshim: ..."), written to stderr at once. */
void cs_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The wrapper the shim hands out for a driver function `real` that the driver resolved for
 * `name` (a versioned exported name, or a base name with cudaVersion and flags, as
 * cuGetProcAddress takes). Returns `real` itself when the shim does not wrap it. */
void *cs_wrap_symbol(const char *name, void *real, int cuda_version, cuuint64_t flags);
/* The wrapper the shim defines under the exported driver name `name`, or NULL. */
void *cs_wrapper_named(const char *name);

/* fork, when the shim is an audit module (cs_bind.c): the handlers pthread_atfork would run,
 * since the program's fork is not the audit namespace's. */
void cs_shim_before_fork(void);
void cs_shim_after_fork_parent(void);
void cs_shim_after_fork_child(void);

#endif
