/* Shared by the real-GPU check programs (C and CUDA C++): is libcacheshim.so loaded, and
 * what do its statistics say. The shim is found at run time, never linked. */
#ifndef SHIM_PROBE_H
#define SHIM_PROBE_H

#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "../../shim/cacheshim.h"

typedef int (*shim_get_stats_fn)(int, cacheshim_stats *, size_t);

static inline shim_get_stats_fn shim_probe(void)
{
    shim_get_stats_fn f;
    void *p = dlsym(RTLD_DEFAULT, "cacheshim_get_stats");
    memcpy(&f, &p, sizeof f);
    return f;
}

/* Statistics of all devices; 0 when the shim is loaded and answered. */
static inline int shim_stats(cacheshim_stats *s)
{
    shim_get_stats_fn f = shim_probe();
    memset(s, 0, sizeof *s);
    return f && f(-1, s, sizeof *s) == 0 ? 0 : -1;
}

/* One line: "PROG: shim: not loaded", "PROG: shim: loaded, no statistics yet" (the shim
 * answers -1 until its cache exists) or "PROG: shim: requests=... ...". Returns 1 when
 * loaded. */
static inline int shim_report(const char *prog)
{
    cacheshim_stats s;
    if (!shim_probe()) {
        printf("%s: shim: not loaded\n", prog);
        return 0;
    }
    if (shim_stats(&s) != 0) {
        printf("%s: shim: loaded, no statistics yet\n", prog);
        return 1;
    }
    printf("%s: shim: requests=%" PRIu64 " hits=%" PRIu64 " misses=%" PRIu64 " frees=%" PRIu64
           " foreign_frees=%" PRIu64 " driver_allocs=%" PRIu64 " driver_frees=%" PRIu64
           " releases=%" PRIu64 " fences=%" PRIu64 " fence_waits=%" PRIu64
           " oom_recoveries=%" PRIu64 " oom_failures=%" PRIu64 " cap_refusals=%" PRIu64
           " bytes_in_use=%" PRIu64 " bytes_cached=%" PRIu64 " peak_reserved=%" PRIu64
           " cap_bytes=%" PRIu64 "\n",
           prog, s.requests, s.hits, s.misses, s.frees, s.foreign_frees, s.driver_allocs,
           s.driver_frees, s.releases, s.fences, s.fence_waits, s.oom_recoveries, s.oom_failures,
           s.cap_refusals, s.bytes_in_use, s.bytes_cached, s.peak_reserved, s.cap_bytes);
    fflush(stdout);
    return 1;
}

/* --require-shim: fail when the shim is not there (a bad LD_PRELOAD path only warns). */
static inline int shim_require(const char *prog, int required)
{
    int loaded = shim_report(prog);
    if (required && !loaded) {
        printf("FAIL %s: --require-shim given but cacheshim_get_stats is not found "
               "(LD_PRELOAD not in effect?)\n", prog);
        return 1;
    }
    return 0;
}

#endif
