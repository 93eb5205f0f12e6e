/* The statistics printed at exit with CACHESHIM_STATS=1 (docs/usage.md, "Statistics"). Reads
 * the cache's statistics and writes lines, without the "cacheshim: " prefix, through a
 * callback: no CUDA and no I/O of its own, so unit tests read exactly what a user sees. */
#ifndef CS_REPORT_H
#define CS_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cs_cache.h"
#include "cs_options.h"

/* What one driver call the cache saved is worth, for the "est. time saved" row: a 1 MiB
 * cudaMalloc and cudaFree measured on an H100, driver 580 (DESIGN.md). An estimate: larger
 * blocks cost more (a 1 GiB cudaFree about 300 us) and other GPUs differ. */
#define CS_REPORT_ALLOC_NS 45000
#define CS_REPORT_FREE_NS 31000

/* Devices side by side in one table; more devices make more tables, one below the other. */
#define CS_REPORT_COLUMNS 4

/* The summary table (a column per device), with details the other counters below it, then
 * the process's foreign frees if there were any. */
void cs_report_stats(cs_cache *cache, bool details, cs_report_fn emit, void *arg);

/* The same table for the pinned host cache (cs_host.h), one column "pinned host"; nothing when
 * no pinned memory went through it. The "other paths now" row is 0 there, and "est. time
 * saved" is "-": the costs above are device memory's. */
void cs_report_host_stats(cs_cache *host, bool details, cs_report_fn emit, void *arg);

/* "355 us", "1.23 ms", "105 ms", "7.60 s", "-45.0 us": three significant digits. */
void cs_duration_format(int64_t ns, char *buf, size_t len);

#endif
