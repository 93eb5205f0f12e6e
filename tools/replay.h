/* cacheshim-replay: replays a recorded allocation trace through the real cache core
 * (shim/cs_cache.c) on a simulated device, to see offline what the cache would do with a
 * workload: hits, driver calls, memory held, and what that saves in driver time.
 *
 * replay_trace.c reads traces, replay_sim.c is the simulated device and the replay loop,
 * replay_map.c the pointer map they share, replay_expandable.c a model of PyTorch's
 * expandable segments to compare with (--vs-expandable), replay_plot.c draws sweeps as SVG,
 * replay_main.c is the command line and the reports. */
#ifndef REPLAY_H
#define REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "trace_input.h"

#define REPLAY_NAME "cacheshim-replay"

/* ---------------------------------------------------------------- traces (replay_trace.c) */

typedef struct {
    char kind;      /* 'a' allocation, 'f' free, 'e' failed allocation */
    uint64_t size;  /* 'a', 'e' */
    uint64_t ptr;   /* 'a', 'f' */
    uint64_t ns;    /* trace time */
    uint64_t err;   /* 'e': the CUresult */
} replay_event;

typedef struct {
    const char *path;
    replay_event *ev;
    size_t nev, cap;
} replay_trace;

/* Reads a whole trace, plain or gzipped (by its content, zlib). On a
 * malformed line prints "cacheshim-replay: FILE:LINE: malformed line: TEXT" and returns 2;
 * on an unreadable file a message and 2; 0 on success. */
int replay_trace_load(replay_trace *t, const char *path);
void replay_trace_free(replay_trace *t);
/* Appends e; false when out of memory. */
bool replay_trace_push(replay_trace *t, replay_event e);

/* The pieces of replay_trace_load that cacheshim-report and tests/trace_player share. Parse:
 * one line (cut up in place) into an event; 1 for an event, 0 for a blank or comment line,
 * -1 if malformed. Read: every line of in into t (a cut last line skipped with a note);
 * 0, or 2 after a message. */
int replay_trace_parse_line(char *buf, replay_event *e);
int replay_trace_read(replay_trace *t, tr_input *in);

/* What replay_trace_load_any took from a JSON Lines trace of libcacheaudit.so. */
typedef struct {
    bool jsonl;           /* the file was JSON Lines (else the allocation format) */
    const char *level;    /* "shim" or "driver": whose calls were taken */
    uint64_t skipped;     /* allocations and frees of other calls (cuMemAllocAsync, ...) */
} replay_source;

/* Reads a trace in either format, told apart as cacheshim-report does (the first line that
 * starts with '{' or with "a ", "f ", "e "; JSON Lines are read by cacheshim-report's reader,
 * replay_jsonl.c). From JSON Lines
 * it takes the program's cuMemAlloc/cuMemFree calls, the ones libcacheshim.so serves: those
 * that reached the shim when the trace has any, else those that reached the driver and were
 * not made by the shim. Returns as replay_trace_load. */
int replay_trace_load_any(replay_trace *t, const char *path, replay_source *src);

/* ---------------------------------------------------------------- pointer map (replay_map.c) */

typedef struct {
    uint64_t key;   /* 0: empty (traces and the simulated device never use 0) */
    uint64_t addr;  /* the cache's pointer (replay loop) or the model's block (the model) */
    uint64_t size;  /* requested size */
    bool failed;    /* the replayed allocation failed: its free is dropped */
} replay_slot;

typedef struct {
    replay_slot *s;
    size_t cap, count;  /* cap: a power of two */
} replay_map;

/* Init: an empty map of cap slots (a power of two); false when out of memory. Put: inserts or
 * replaces v by its key, growing as needed; false when out of memory (the map unchanged).
 * Take: removes key into *out; false if absent. */
bool replay_map_init(replay_map *m, size_t cap);
void replay_map_free(replay_map *m);
replay_slot *replay_map_find(replay_map *m, uint64_t key);
bool replay_map_put(replay_map *m, replay_slot v);
bool replay_map_take(replay_map *m, uint64_t key, replay_slot *out);

/* ---------------------------------------------------------------- simulation (replay_sim.c) */

/* Costs of driver calls in microseconds, for the "driver time saved" estimate. */
typedef struct {
    double alloc_us, free_us, fence_record_us, fence_query_us;
    /* The pooled backend's calls: per chunk created, released, mapped (the map and its
     * access grant) and unmapped. */
    double create_us, release_us, map_us, unmap_us;
} replay_costs;

typedef struct {
    uint64_t device_size;  /* bytes; allocations beyond it fail as out of memory */
    uint64_t cap;          /* bytes, UINT64_MAX for none (already resolved) */
    uint64_t threshold;    /* bytes, UINT64_MAX for none */
    uint64_t gpu_lag_ns;   /* a fence recorded at trace time t completes at t + lag */
    bool reuse_completed;  /* CACHESHIM_REUSE=completed: reuse only blocks whose fence completed */
    bool classic;          /* CACHESHIM_BACKEND=classic: a driver allocation per block */
    uint64_t granularity;  /* the device's allocation granularity (2 MiB on an H100) */
    unsigned headroom_pct; /* CACHESHIM_HEADROOM */
    replay_costs costs;
} replay_config;

typedef struct {
    /* The trace itself, independent of the cache. */
    uint64_t events, allocs, frees, skipped_frees, failed_allocs, peak_live;
    /* Replayed allocations that failed on the simulated device (OOM or cap) and frees of
     * them, which are then dropped. */
    uint64_t replay_failures, dropped_frees;
    /* From the cache's statistics. */
    uint64_t hits, misses, driver_allocs, driver_frees, peak_reserved, releases,
        oom_recoveries, oom_failures, cap_refusals, fences, fence_waits;
    uint64_t moves;
    /* From the simulated device. */
    uint64_t fence_queries;
    uint64_t creates, chunk_releases, maps, unmaps;  /* pooled backend's driver calls */
    double hit_rate, reserved_over_live;
    double baseline_us, cached_us, saved_us;
} replay_result;

/* Replays t through a fresh cache on a fresh simulated device; 0, or -1 when the cache could
 * not be created (out of host memory). */
int replay_run(const replay_trace *t, const replay_config *cfg, replay_result *out);

/* ------------------------------------------- PyTorch's expandable segments (replay_expandable.c) */

typedef struct {
    uint64_t peak_mapped;  /* the most bytes both pools' segments had mapped at once */
    uint64_t peak_live;    /* the trace's peak live bytes, every allocation in place */
    double over_live;      /* peak_mapped / peak_live */
} replay_expandable_result;

/* Replays t's allocations and frees through a model of PyTorch's caching allocator with
 * expandable segments (one stream, default settings; the rules in replay_expandable.c). It
 * depends on nothing but the trace. 0, or -1 when out of host memory. */
int replay_expandable_run(const replay_trace *t, replay_expandable_result *out);

/* ---------------------------------------------------------------- plots (replay_plot.c) */

typedef struct {
    const char *series;  /* the trace's name: one colour per series */
    const char *label;   /* "cap=2G thr=none" */
    double x, y;         /* peak reserved bytes, driver calls */
} replay_point;

/* Writes a self-contained SVG: x = peak reserved, y = driver calls; 0 or -1 (errno set). */
int replay_plot_svg(const char *path, const char *title, const replay_point *pts, size_t n);

#endif
