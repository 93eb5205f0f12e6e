/* cacheshim public API: statistics and control for programs that want them.
 *
 * cacheshim_get_stats and cacheshim_trim live in libcacheshim.so, which is loaded with
 * LD_PRELOAD (or `cacheshim run`), not linked. A program that should run with or without the
 * shim calls the helpers at the end of this file instead: they find the functions at run
 * time and answer CACHESHIM_NOT_LOADED when the shim is absent, so the program needs no link
 * flag for cacheshim (pkg-config --cflags cacheshim is all it takes):
 *
 *     cacheshim_stats s;
 *     if (cacheshim_get_stats_if_loaded(-1, &s) == 0)
 *         printf("hits %llu\n", (unsigned long long)s.hits);
 */
#ifndef CACHESHIM_H
#define CACHESHIM_H

#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CACHESHIM_VERSION "0.1.0"

typedef struct cacheshim_stats {
    uint64_t requests;          /* allocation requests the cache saw */
    uint64_t hits;              /* served without a driver call: a cached block, or (pooled
                                   backend) a block carved out of the pool's free memory */
    uint64_t misses;            /* went to the driver */
    uint64_t frees;             /* frees of blocks the shim handed out */
    uint64_t foreign_frees;     /* frees passed to the driver: pointers the shim did not hand out */
    uint64_t bytes_in_use;      /* bytes of blocks the program holds now (block sizes) */
    uint64_t bytes_requested;   /* bytes the program asked for, of blocks it holds now */
    uint64_t bytes_cached;      /* idle bytes the cache holds now (idle blocks, and the pooled
                                   backend's memory outside any block) */
    uint64_t peak_in_use;       /* highest bytes_in_use (approximate while several threads
                                   allocate at once: docs/usage.md says by how much) */
    uint64_t peak_requested;    /* highest bytes_requested: the program's own peak (idem) */
    uint64_t peak_reserved;     /* highest in use + cached: the device memory the process held
                                   through the shim */
    uint64_t driver_allocs;     /* allocations that took new memory from the driver (a
                                   cuMemAlloc, or cuMemCreate calls of the pooled backend) */
    uint64_t driver_frees;      /* times memory went back to the driver (a cuMemFree, or
                                   cuMemRelease calls of the pooled backend) */
    uint64_t releases;          /* blocks or spare memory given back to the driver (threshold,
                                   cap, OOM, trim) */
    uint64_t fences;            /* stream fences recorded */
    uint64_t fence_waits;       /* times the shim had to wait for a fence */
    uint64_t oom_recoveries;    /* driver out-of-memory answers followed by a successful retry */
    uint64_t oom_failures;      /* allocations that failed after recovery */
    uint64_t cap_refusals;      /* allocations refused because of the cap */
    uint64_t cap_bytes;         /* the cap in force (UINT64_MAX: none) */
    uint64_t ordered_hits;      /* hits reused before the shim saw their fence complete, the
                                   streams made to wait for it on the GPU (CACHESHIM_REUSE=
                                   ordered; with one stream busy the shim does not ask) */
    uint64_t work_calls;        /* driver calls that put work on a stream, seen by the shim
                                   (whole process only: device -1) */
    uint64_t moves;             /* idle blocks that went back to the pool at a miss (a small
                                   one's slot to its slab, a large one's span to the free
                                   space) instead of new memory (pooled backend) */
    uint64_t bytes_outside;     /* bytes the program holds now through allocation calls the
                                   cache passes to the driver (cuMemAllocPitch, managed, async,
                                   cuMemCreate): counted against the cap */
} cacheshim_stats;

/* Statistics of one device (its ordinal), or the sum of all devices with device = -1
 * (peaks are then summed: an upper bound). size is sizeof(cacheshim_stats) as the caller
 * compiled it. Returns 0, or -1 when the shim has not seen that device or is disabled
 * (CACHESHIM_DISABLE=1). foreign_frees and work_calls are counted for the whole process only
 * (device -1). */
int cacheshim_get_stats(int device, cacheshim_stats *out, size_t size);

/* Statistics of the pinned host memory cache (cudaMallocHost, cudaHostAlloc): the same fields,
 * for the whole process. Returns 0, or -1 when no pinned memory went through the shim yet or
 * the shim is disabled. */
int cacheshim_get_host_stats(cacheshim_stats *out, size_t size);

/* Give every idle cached block whose last use has completed back to the driver, pinned host
 * blocks included. Returns the number of bytes released. */
uint64_t cacheshim_trim(void);

/* ---- debug modes and scopes (docs/usage.md, "Debug modes and scopes") -------------------- */

/* With CACHESHIM_DEBUG=uaf or uaf-report: synchronizes the contexts of the quarantined blocks
 * and checks every one of them now (they stay quarantined). Returns how many were written
 * after their free (each reported on stderr; with uaf, the first one aborts the program), or
 * -1 when neither mode is on. While a stream capture runs it reads nothing back (that would
 * invalidate the capture) and returns 0: the blocks are checked later. */
int cacheshim_debug_check(void);

/* A scope's statistics: what the calling thread allocated between begin and end (inner scopes
 * included), and what of it was freed, by any thread, while the scope was open. */
typedef struct cacheshim_scope_stats {
    uint64_t allocs;            /* allocations made in the scope */
    uint64_t bytes_allocated;   /* bytes they asked for */
    uint64_t peak;              /* highest bytes of those held at once */
    uint64_t held_at_end;       /* bytes of those not freed at the scope's end */
    uint64_t frees;             /* of those, how many were freed in the scope */
    uint64_t bytes_freed;       /* their bytes */
    uint64_t released;          /* bytes given back to the driver at the end
                                   (CACHESHIM_SCOPE_RELEASE) */
} cacheshim_scope_stats;

/* At the scope's end, give idle cached memory whose work has finished back to the driver
 * (cacheshim_trim), which includes what the scope freed. */
#define CACHESHIM_SCOPE_RELEASE 1u

/* Opens a scope on the calling thread, inside the one open there (nestable). name (its first
 * 63 bytes) groups the scope's statistics in the exit report (CACHESHIM_STATS=1). Returns 0,
 * or -1 when the shim is disabled or out of host memory. */
int cacheshim_scope_begin(const char *name, unsigned flags);
/* Closes the calling thread's innermost scope and writes its statistics to out (may be NULL;
 * size is sizeof(cacheshim_scope_stats) as the caller compiled it). Returns 0, or -1 when
 * the thread has no open scope. */
int cacheshim_scope_end(cacheshim_scope_stats *out, size_t size);
/* PyTorch's pluggable allocator (torch.cuda.memory.CUDAPluggableAllocator loads these by name
 * from libcacheshim.so; docs/usage.md shows how): device memory from the cache, for `device`,
 * to be used on `stream` (a cudaStream_t). NULL when it cannot be had. */
#include <sys/types.h>
void *cacheshim_torch_alloc(ssize_t size, int device, void *stream);
void cacheshim_torch_free(void *ptr, ssize_t size, int device, void *stream);

/* ---- with or without the shim: run-time lookups ---------------------------------------------
 * dlsym(RTLD_DEFAULT, ...) finds the functions when libcacheshim.so is loaded (preloaded, or
 * dlopened with RTLD_GLOBAL). Each call looks them up again: they are not for hot paths.
 * glibc before 2.34 needs -ldl for dlsym. */

#define CACHESHIM_NOT_LOADED (-2)

/* RTLD_DEFAULT needs _GNU_SOURCE on glibc; its value there (and on musl) is 0. */
#ifdef RTLD_DEFAULT
#define CACHESHIM_RTLD_DEFAULT_ RTLD_DEFAULT
#else
#define CACHESHIM_RTLD_DEFAULT_ ((void *)0)
#endif

/* 1 when libcacheshim.so is loaded in this process, else 0. */
static inline int cacheshim_loaded(void)
{
    return dlsym(CACHESHIM_RTLD_DEFAULT_, "cacheshim_get_stats") != NULL;
}

/* cacheshim_get_stats(device, out, sizeof *out) when the shim is loaded (0, or -1 as it
 * answers); CACHESHIM_NOT_LOADED, out untouched, when it is not. */
static inline int cacheshim_get_stats_if_loaded(int device, cacheshim_stats *out)
{
    int (*get)(int, cacheshim_stats *, size_t);
    void *sym = dlsym(CACHESHIM_RTLD_DEFAULT_, "cacheshim_get_stats");
    if (!sym)
        return CACHESHIM_NOT_LOADED;
    memcpy(&get, &sym, sizeof get); /* object to function pointer, without a cast ISO C forbids */
    return get(device, out, sizeof *out);
}

/* cacheshim_trim() when the shim is loaded: 0, and the bytes released in *released (when
 * released is not NULL); CACHESHIM_NOT_LOADED, *released = 0, when it is not. */
static inline int cacheshim_trim_if_loaded(uint64_t *released)
{
    uint64_t (*trim)(void);
    uint64_t bytes = 0;
    void *sym = dlsym(CACHESHIM_RTLD_DEFAULT_, "cacheshim_trim");
    if (sym) {
        memcpy(&trim, &sym, sizeof trim);
        bytes = trim();
    }
    if (released)
        *released = bytes;
    return sym ? 0 : CACHESHIM_NOT_LOADED;
}

/* cacheshim_scope_begin(name, flags) when the shim is loaded; CACHESHIM_NOT_LOADED when not. */
static inline int cacheshim_scope_begin_if_loaded(const char *name, unsigned flags)
{
    int (*begin)(const char *, unsigned);
    void *sym = dlsym(CACHESHIM_RTLD_DEFAULT_, "cacheshim_scope_begin");
    if (!sym)
        return CACHESHIM_NOT_LOADED;
    memcpy(&begin, &sym, sizeof begin);
    return begin(name, flags);
}

/* cacheshim_scope_end(out, sizeof *out) when the shim is loaded; CACHESHIM_NOT_LOADED, out
 * untouched, when not. */
static inline int cacheshim_scope_end_if_loaded(cacheshim_scope_stats *out)
{
    int (*end)(cacheshim_scope_stats *, size_t);
    void *sym = dlsym(CACHESHIM_RTLD_DEFAULT_, "cacheshim_scope_end");
    if (!sym)
        return CACHESHIM_NOT_LOADED;
    memcpy(&end, &sym, sizeof end);
    return end(out, out ? sizeof *out : 0);
}

/* cacheshim_debug_check() when the shim is loaded; CACHESHIM_NOT_LOADED when not. */
static inline int cacheshim_debug_check_if_loaded(void)
{
    int (*check)(void);
    void *sym = dlsym(CACHESHIM_RTLD_DEFAULT_, "cacheshim_debug_check");
    if (!sym)
        return CACHESHIM_NOT_LOADED;
    memcpy(&check, &sym, sizeof check);
    return check();
}

#ifdef __cplusplus
}
#endif
#endif
