/* cacheshim public API: statistics and control for programs that want them.
 *
 * These functions live in libcacheshim.so. A program that should run with or without the
 * shim finds them at run time instead of linking them:
 *
 *     int (*get)(int, cacheshim_stats *, size_t) =
 *         (int (*)(int, cacheshim_stats *, size_t))dlsym(RTLD_DEFAULT, "cacheshim_get_stats");
 *     cacheshim_stats s;
 *     if (get && get(-1, &s, sizeof s) == 0) printf("hits %llu\n", (unsigned long long)s.hits);
 */
#ifndef CACHESHIM_H
#define CACHESHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CACHESHIM_VERSION "0.1.0"

typedef struct cacheshim_stats {
    uint64_t requests;          /* allocation requests the cache saw */
    uint64_t hits;              /* served from cached blocks */
    uint64_t misses;            /* went to the driver */
    uint64_t frees;             /* frees of blocks the shim handed out */
    uint64_t foreign_frees;     /* frees passed to the driver: pointers the shim did not hand out */
    uint64_t bytes_in_use;      /* bytes of blocks the program holds now (block sizes) */
    uint64_t bytes_requested;   /* bytes the program asked for, of blocks it holds now */
    uint64_t bytes_cached;      /* idle bytes the cache holds now */
    uint64_t peak_in_use;       /* highest bytes_in_use */
    uint64_t peak_requested;    /* highest bytes_requested: the program's own peak */
    uint64_t peak_reserved;     /* highest in use + cached: what the process held through the shim */
    uint64_t driver_allocs;     /* cuMemAlloc calls made by the shim */
    uint64_t driver_frees;      /* cuMemFree calls made by the shim */
    uint64_t releases;          /* blocks given back to the driver (threshold, cap, OOM, trim) */
    uint64_t fences;            /* stream fences recorded */
    uint64_t fence_waits;       /* times the shim had to wait for a fence */
    uint64_t oom_recoveries;    /* driver out-of-memory answers followed by a successful retry */
    uint64_t oom_failures;      /* allocations that failed after recovery */
    uint64_t cap_refusals;      /* allocations refused because of the cap */
    uint64_t cap_bytes;         /* the cap in force (UINT64_MAX: none) */
} cacheshim_stats;

/* Statistics of one device (its ordinal), or the sum of all devices with device = -1
 * (peaks are then summed: an upper bound). size is sizeof(cacheshim_stats) as the caller
 * compiled it. Returns 0, or -1 when the shim has not seen that device or is disabled
 * (CACHESHIM_DISABLE=1). foreign_frees is counted for the whole process only (device -1). */
int cacheshim_get_stats(int device, cacheshim_stats *out, size_t size);

/* Give every idle cached block whose last use has completed back to the driver. Returns the
 * number of bytes released. */
uint64_t cacheshim_trim(void);

#ifdef __cplusplus
}
#endif
#endif
