/* The statistics table printed at exit with CACHESHIM_STATS=1: one block per device. */
#include "cs_shim.h"

#include <inttypes.h>
#include <stdio.h>

static void row_count(const char *key, uint64_t n)
{
    cs_log("  %-22s %" PRIu64, key, n);
}

static void row_bytes(const char *key, uint64_t n)
{
    char b[32];
    cs_bytes_format(n, b, sizeof b);
    cs_log("  %-22s %s", key, b);
}

void cs_report_stats(cs_cache *cache)
{
    int devices[CS_MAX_DEVICES];
    int n = cs_cache_devices(cache, devices, CS_MAX_DEVICES);
    if (n == 0) {
        cs_log("statistics: no device memory was allocated through the shim");
        return;
    }
    for (int i = 0; i < n; i++) {
        cacheshim_stats s;
        if (!cs_cache_stats(cache, devices[i], &s))
            continue;
        cs_log("statistics for device %d", devices[i]);
        row_count("requests", s.requests);
        cs_log("  %-22s %" PRIu64 " (%.1f%%)", "hits", s.hits,
               s.requests ? 100.0 * (double)s.hits / (double)s.requests : 0.0);
        row_count("misses", s.misses);
        row_count("frees", s.frees);
        row_bytes("in use now", s.bytes_in_use);
        row_bytes("cached now", s.bytes_cached);
        row_bytes("peak requested", s.peak_requested);
        row_bytes("peak in use", s.peak_in_use);
        row_bytes("peak reserved", s.peak_reserved);
        row_count("driver allocations", s.driver_allocs);
        row_count("driver frees", s.driver_frees);
        row_count("releases", s.releases);
        row_count("fences", s.fences);
        row_count("fence waits", s.fence_waits);
        row_count("OOM recoveries", s.oom_recoveries);
        row_count("OOM failures", s.oom_failures);
        row_count("cap refusals", s.cap_refusals);
        if (s.cap_bytes == CS_UNLIMITED)
            cs_log("  %-22s %s", "cap", "none");
        else
            row_bytes("cap", s.cap_bytes);
    }
    cacheshim_stats all;
    cs_cache_stats(cache, -1, &all);
    if (all.foreign_frees)
        cs_log("  %-22s %" PRIu64 " (pointers the shim did not allocate, passed to the driver)",
               "foreign frees", all.foreign_frees);
}
