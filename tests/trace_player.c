/* trace_player: replay recorded allocation traces through the CUDA driver.
 *
 *     trace_player [--repeat N] [--device D] [--calls] [--work TICKS [--sync N]] FILE...
 *
 * FILE is a trace in the format of shared/traces/README.md, plain or gzipped (gzipped files
 * are recognised by their magic bytes and read through `gzip -dc`):
 *
 *     a SIZE PTR NS     allocation of SIZE bytes returned PTR (hex, optional 0x)
 *     f PTR NS          free of PTR
 *     e SIZE ERR NS     allocation of SIZE bytes failed with CUresult ERR
 *
 * Blank lines and lines starting with '#' are ignored.
 *
 * The driver is reached the way many programs reach it: dlopen("libcuda.so.1") and dlsym of
 * each entry point. Under LD_PRELOAD=libcacheshim.so the shim's dlsym hands out its wrappers,
 * so the replay measures the shim.
 *
 * Every file is parsed completely, and every PTR resolved to a slot, before the driver is
 * touched: a malformed file fails fast (exit 2) and parsing stays out of wall_ms.
 *
 * Replay of one file: `a` allocates SIZE and maps PTR to the pointer returned; `f` frees the
 * pointer mapped to PTR, or, when PTR has no live allocation in the trace (0 included), is
 * counted in skipped_frees and not sent to the driver; `e` tries to allocate SIZE, counts
 * failed_allocs when it fails now too, and frees it when it succeeded. Allocations still
 * live at the end of the trace are freed after it (outside wall_ms, not counted in frees),
 * so the device is left clean. With --repeat N the trace is replayed N times in a row and
 * the counts and wall_ms are totals over the N replays; peak_live is the peak of one replay.
 *
 * One summary line per file on stdout:
 *
 *     replay FILE events=N allocs=N frees=N skipped_frees=N failed_allocs=N peak_live=BYTES
 *            wall_ms=X.XXX[ hits=N misses=N hit_rate=0.XXXX peak_reserved=BYTES
 *            reserved_over_live=X.XXX driver_allocs=N]
 *
 * (one line; the bracketed part only when cacheshim_get_stats is found with
 * dlsym(RTLD_DEFAULT, ...), i.e. when the shim is preloaded).
 *
 * With --calls (the fake driver of tests/fake only: it counts its calls), a second line per
 * file gives the driver calls made inside wall_ms, by entry point, those called at least once:
 *
 *     calls FILE requests=N cuEventQuery=N cuMemMap=N ...
 *
 * (requests: the allocations and frees sent to the driver, failed ones included).
 *
 * With --work TICKS (the fake driver only), each free follows a kernel on the legacy stream
 * that touches the whole block (fake_touch_kernel), as the program's use of it, and the
 * fake's work completes TICKS driver calls after it could start (fake_set_work_ticks): the
 * "GPU" runs a little behind, so fences are recorded and asked about as on a real one. The
 * calls line (with --calls) then ends with the fake's race check and unmap faults over the
 * replay, both 0 when the cache reused and unmapped memory only after its work:
 *
 *     calls FILE requests=N ... races=N unmap_faults=N
 *
 * With --sync N as well, every Nth free is followed by cuCtxSynchronize, as a training loop
 * waits for its step's result: the "GPU" may then fall up to N kernels behind (with TICKS
 * above the driver calls a free takes) and no further.
 *
 * Exit status: 0 success; 1 a driver call failed unexpectedly (or the driver could not be
 * loaded); 2 usage error, unreadable file, or malformed line.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../shim/cacheshim.h"
#include "replay.h"

/* ------------------------------------------------------------------------------------------ */
/* Events                                                                                      */

enum { EV_ALLOC = 'a', EV_FREE = 'f', EV_FAILED = 'e' };

typedef struct {
    char kind;        /* EV_ALLOC, EV_FREE, EV_FAILED */
    long line;        /* line number in the file, for messages */
    uint64_t size;    /* EV_ALLOC, EV_FAILED */
    int64_t slot;     /* EV_ALLOC: its own slot; EV_FREE: slot it frees, -1 = skipped */
    uint64_t ptr;     /* the trace's PTR (EV_ALLOC, EV_FREE), for messages */
} event;

typedef struct {
    const char *path;
    event *ev;
    size_t nev, cap;
    size_t nslots;    /* number of EV_ALLOC events: slot ids are 0..nslots-1 */
} trace;

/* ------------------------------------------------------------------------------------------ */
/* PTR -> slot: open addressing, linear probing, backward-shift deletion (no tombstones).    */

typedef struct {
    uint64_t *keys;
    int64_t *vals;
    unsigned char *used;
    size_t mask;      /* capacity - 1, capacity a power of two */
    size_t count;
} ptrmap;

static void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz);
    if (!p) {
        fprintf(stderr, "trace_player: out of memory\n");
        exit(2);
    }
    return p;
}

static size_t hash64(uint64_t k)
{
    /* splitmix64 finaliser: device pointers share high bits and low zero bits. */
    k ^= k >> 30;
    k *= 0xbf58476d1ce4e5b9ULL;
    k ^= k >> 27;
    k *= 0x94d049bb133111ebULL;
    k ^= k >> 31;
    return (size_t)k;
}

static void map_init(ptrmap *m, size_t cap)
{
    m->keys = xcalloc(cap, sizeof *m->keys);
    m->vals = xcalloc(cap, sizeof *m->vals);
    m->used = xcalloc(cap, 1);
    m->mask = cap - 1;
    m->count = 0;
}

static void map_free(ptrmap *m)
{
    free(m->keys);
    free(m->vals);
    free(m->used);
}

static void map_put(ptrmap *m, uint64_t key, int64_t val);

static void map_grow(ptrmap *m)
{
    ptrmap old = *m;
    map_init(m, (old.mask + 1) * 2);
    for (size_t i = 0; i <= old.mask; i++)
        if (old.used[i])
            map_put(m, old.keys[i], old.vals[i]);
    map_free(&old);
}

/* Insert or replace. */
static void map_put(ptrmap *m, uint64_t key, int64_t val)
{
    if ((m->count + 1) * 2 > m->mask + 1)
        map_grow(m);
    size_t i = hash64(key) & m->mask;
    while (m->used[i]) {
        if (m->keys[i] == key) {
            m->vals[i] = val;
            return;
        }
        i = (i + 1) & m->mask;
    }
    m->used[i] = 1;
    m->keys[i] = key;
    m->vals[i] = val;
    m->count++;
}

/* Remove key; returns its value, or -1 when absent. */
static int64_t map_take(ptrmap *m, uint64_t key)
{
    size_t i = hash64(key) & m->mask;
    while (m->used[i] && m->keys[i] != key)
        i = (i + 1) & m->mask;
    if (!m->used[i])
        return -1;
    int64_t val = m->vals[i];
    /* Backward-shift: move later members of the probe run into the hole when their home
     * position does not lie cyclically in (hole, j]. */
    size_t hole = i, j = i;
    for (;;) {
        j = (j + 1) & m->mask;
        if (!m->used[j])
            break;
        size_t home = hash64(m->keys[j]) & m->mask;
        bool stays = (hole <= j) ? (hole < home && home <= j) : (hole < home || home <= j);
        if (stays)
            continue;
        m->keys[hole] = m->keys[j];
        m->vals[hole] = m->vals[j];
        hole = j;
    }
    m->used[hole] = 0;
    m->count--;
    return val;
}

/* ------------------------------------------------------------------------------------------ */
/* Parsing                                                                                     */

static void malformed(const char *path, long line, const char *text)
{
    fprintf(stderr, "trace_player: %s:%ld: malformed line: %.200s\n", path, line, text);
    exit(2);
}

static void push_event(trace *t, event e)
{
    if (t->nev == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 4096;
        t->ev = realloc(t->ev, t->cap * sizeof *t->ev);
        if (!t->ev) {
            fprintf(stderr, "trace_player: out of memory\n");
            exit(2);
        }
    }
    t->ev[t->nev++] = e;
}

/* The format is read with cacheshim-replay's reader and line parser (tools/trace_input.c,
 * tools/replay_trace.c);
 * what is the player's own is the PTR -> slot resolution. */
static void parse_trace(trace *t)
{
    tr_input in;
    if (tr_open(&in, t->path, "trace_player"))
        exit(2);
    ptrmap live;
    map_init(&live, 1024);

    char *buf;
    size_t len;
    bool cut;
    int more;
    while ((more = tr_next(&in, &buf, &len, &cut)) == 1) {
        long lineno = (long)in.lineno;
        char copy[256];
        snprintf(copy, sizeof copy, "%s", buf);
        replay_event r;
        int got = replay_trace_parse_line(buf, &r);
        if (got < 0)
            malformed(t->path, lineno, copy);
        if (got == 0)
            continue;

        event e = {.kind = r.kind, .line = lineno, .size = r.size, .slot = -1, .ptr = r.ptr};
        if (e.kind == EV_ALLOC) {
            e.slot = (int64_t)t->nslots++;
            /* If PTR is still live here, the earlier block was freed by an unrecorded path;
             * the new mapping replaces it and the old slot stays live until the end-of-trace
             * cleanup (never a double use of one real pointer). */
            map_put(&live, e.ptr, e.slot);
        } else if (e.kind == EV_FREE) {
            e.slot = e.ptr ? map_take(&live, e.ptr) : -1;
        }
        push_event(t, e);
    }
    if (more < 0)
        exit(2);
    tr_close(&in);
    map_free(&live);
}

/* ------------------------------------------------------------------------------------------ */
/* The driver, through dlopen/dlsym                                                            */

typedef CUresult (*fn_cuInit)(unsigned int);
typedef CUresult (*fn_cuDeviceGet)(CUdevice *, int);
typedef CUresult (*fn_cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
typedef CUresult (*fn_cuCtxSetCurrent)(CUcontext);
typedef CUresult (*fn_cuMemAlloc_v2)(CUdeviceptr *, size_t);
typedef CUresult (*fn_cuMemFree_v2)(CUdeviceptr);
typedef CUresult (*fn_cuDevicePrimaryCtxRelease_v2)(CUdevice);
typedef CUresult (*fn_cuGetErrorName)(CUresult, const char **);
typedef CUresult (*fn_cuCtxSynchronize)(void);
typedef const char *(*fn_fake_entry_at)(int);
typedef long (*fn_fake_calls)(const char *);
typedef CUfunction (*fn_fake_touch_kernel)(void);
typedef void (*fn_fake_set_work_ticks)(uint64_t);
typedef long (*fn_fake_count)(void);
typedef CUresult (*fn_cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                                      unsigned, unsigned, unsigned, CUstream, void **, void **);

static struct {
    fn_cuInit init;
    fn_cuDeviceGet device_get;
    fn_cuDevicePrimaryCtxRetain ctx_retain;
    fn_cuCtxSetCurrent ctx_set_current;
    fn_cuMemAlloc_v2 mem_alloc;
    fn_cuMemFree_v2 mem_free;
    fn_cuDevicePrimaryCtxRelease_v2 ctx_release;
    fn_cuGetErrorName get_error_name;
    /* --calls: the fake driver's counters (tests/fake/fake_control.h). */
    fn_fake_entry_at entry_at;
    fn_fake_calls calls;
    /* --work: launches of the fake's kernel, and its race check. */
    fn_cuLaunchKernel launch;
    fn_cuCtxSynchronize sync;
    long sync_every;   /* --sync: a synchronize after every this many frees (0: never) */
    CUfunction touch;
    fn_fake_count races, unmap_faults;
} drv;

static void *must_sym(void *h, const char *name)
{
    void *p = dlsym(h, name);
    if (!p) {
        fprintf(stderr, "trace_player: libcuda.so.1 has no %s: %s\n", name, dlerror());
        exit(1);
    }
    return p;
}

/* Function pointers are assigned through *(void **)& (the POSIX idiom), which keeps ISO C's
 * object-to-function pointer conversion out of the code. */
/* A function of the fake driver, for --calls and --work. */
static void *fake_sym(void *h, const char *name, const char *opt)
{
    void *p = dlsym(h, name);
    if (!p) {
        fprintf(stderr, "trace_player: %s needs the fake driver of tests/fake; this "
                        "libcuda.so.1 has no %s\n", opt, name);
        exit(2);
    }
    return p;
}

static void load_driver(bool calls, long work_ticks)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "trace_player: cannot load libcuda.so.1: %s\n", dlerror());
        exit(1);
    }
    *(void **)&drv.init = must_sym(h, "cuInit");
    *(void **)&drv.device_get = must_sym(h, "cuDeviceGet");
    *(void **)&drv.ctx_retain = must_sym(h, "cuDevicePrimaryCtxRetain");
    *(void **)&drv.ctx_set_current = must_sym(h, "cuCtxSetCurrent");
    *(void **)&drv.mem_alloc = must_sym(h, "cuMemAlloc_v2");
    *(void **)&drv.mem_free = must_sym(h, "cuMemFree_v2");
    *(void **)&drv.ctx_release = must_sym(h, "cuDevicePrimaryCtxRelease_v2");
    *(void **)&drv.get_error_name = must_sym(h, "cuGetErrorName");
    if (calls) {
        *(void **)&drv.entry_at = fake_sym(h, "fake_entry_at", "--calls");
        *(void **)&drv.calls = fake_sym(h, "fake_calls", "--calls");
    }
    if (work_ticks >= 0) {
        fn_fake_touch_kernel touch;
        fn_fake_set_work_ticks set_ticks;
        *(void **)&touch = fake_sym(h, "fake_touch_kernel", "--work");
        *(void **)&set_ticks = fake_sym(h, "fake_set_work_ticks", "--work");
        *(void **)&drv.races = fake_sym(h, "fake_races", "--work");
        *(void **)&drv.unmap_faults = fake_sym(h, "fake_unmap_faults", "--work");
        *(void **)&drv.launch = must_sym(h, "cuLaunchKernel");
        *(void **)&drv.sync = must_sym(h, "cuCtxSynchronize");
        drv.touch = touch();
        set_ticks((uint64_t)work_ticks);
    }
}

/* --calls: each entry point's count, by its number in the fake. */
#define MAX_ENTRIES 1024

static void calls_now(long *n)
{
    for (int i = 0; i < MAX_ENTRIES; i++) {
        const char *name = drv.entry_at(i);
        n[i] = name ? drv.calls(name) : 0;
    }
}

static const char *err_name(CUresult r)
{
    const char *s = NULL;
    if (drv.get_error_name(r, &s) != CUDA_SUCCESS || !s)
        return "(unknown CUresult)";
    return s;
}

static void check_setup(CUresult r, const char *what)
{
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "trace_player: %s failed: %s (%d)\n", what, err_name(r), (int)r);
        exit(1);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Replay                                                                                      */

typedef struct {
    uint64_t events, allocs, frees, skipped_frees, failed_allocs;
    uint64_t peak_live;
    double wall_ms;
    long *calls;      /* --calls: driver calls inside wall_ms by entry point, or NULL */
} replay_counts;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void replay_once(const trace *t, CUdeviceptr *dptr, uint64_t *size, replay_counts *c)
{
    memset(dptr, 0, t->nslots * sizeof *dptr);
    uint64_t live = 0, peak = 0;
    long before[MAX_ENTRIES], after[MAX_ENTRIES];
    if (c->calls)
        calls_now(before);

    double t0 = now_ms();
    for (size_t i = 0; i < t->nev; i++) {
        const event *e = &t->ev[i];
        CUresult r;
        switch (e->kind) {
        case EV_ALLOC:
            r = drv.mem_alloc(&dptr[e->slot], (size_t)e->size);
            if (r != CUDA_SUCCESS) {
                fprintf(stderr, "trace_player: %s:%ld: cuMemAlloc_v2(%" PRIu64 ") failed: %s\n",
                        t->path, e->line, e->size, err_name(r));
                exit(1);
            }
            size[e->slot] = e->size;
            live += e->size;
            if (live > peak)
                peak = live;
            c->allocs++;
            break;
        case EV_FREE:
            if (e->slot < 0) {
                c->skipped_frees++;
                break;
            }
            if (drv.launch) {  /* --work: the block's use, then its free */
                size_t n = (size_t)size[e->slot];
                void *params[] = {&dptr[e->slot], &n};
                r = drv.launch(drv.touch, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
                if (r != CUDA_SUCCESS) {
                    fprintf(stderr, "trace_player: %s:%ld: cuLaunchKernel failed: %s\n",
                            t->path, e->line, err_name(r));
                    exit(1);
                }
            }
            r = drv.mem_free(dptr[e->slot]);
            if (r != CUDA_SUCCESS) {
                fprintf(stderr,
                        "trace_player: %s:%ld: cuMemFree_v2(0x%llx) (trace PTR %" PRIx64
                        ") failed: %s\n",
                        t->path, e->line, (unsigned long long)dptr[e->slot], e->ptr, err_name(r));
                exit(1);
            }
            dptr[e->slot] = 0;
            live -= size[e->slot];
            c->frees++;
            if (drv.sync_every && c->frees % (uint64_t)drv.sync_every == 0 &&
                (r = drv.sync()) != CUDA_SUCCESS) {
                fprintf(stderr, "trace_player: %s:%ld: cuCtxSynchronize failed: %s\n", t->path,
                        e->line, err_name(r));
                exit(1);
            }
            break;
        case EV_FAILED: {
            CUdeviceptr p = 0;
            r = drv.mem_alloc(&p, (size_t)e->size);
            if (r == CUDA_SUCCESS) {
                r = drv.mem_free(p);
                if (r != CUDA_SUCCESS) {
                    fprintf(stderr, "trace_player: %s:%ld: cuMemFree_v2(0x%llx) failed: %s\n",
                            t->path, e->line, (unsigned long long)p, err_name(r));
                    exit(1);
                }
            } else {
                c->failed_allocs++;
            }
            break;
        }
        }
    }
    c->wall_ms += now_ms() - t0;
    if (c->calls) {
        calls_now(after);
        for (int i = 0; i < MAX_ENTRIES; i++)
            c->calls[i] += after[i] - before[i];
    }
    c->events += t->nev;
    if (peak > c->peak_live)
        c->peak_live = peak;

    /* Leave the device clean: free what the trace left live. */
    for (size_t s = 0; s < t->nslots; s++) {
        if (!dptr[s])
            continue;
        CUresult r = drv.mem_free(dptr[s]);
        if (r != CUDA_SUCCESS) {
            fprintf(stderr, "trace_player: %s: end of trace: cuMemFree_v2(0x%llx) failed: %s\n",
                    t->path, (unsigned long long)dptr[s], err_name(r));
            exit(1);
        }
        dptr[s] = 0;
    }
}

/* ------------------------------------------------------------------------------------------ */

static void usage(void)
{
    fprintf(stderr,
            "usage: trace_player [--repeat N] [--device D] [--calls] [--work TICKS [--sync N]] "
            "FILE...\n");
    exit(2);
}

static long parse_count(const char *s, const char *opt, long min)
{
    char *end = NULL;
    errno = 0;
    long v = s && *s >= '0' && *s <= '9' ? strtol(s, &end, 10) : -1;
    if (v < 0 || errno || *end || v > 1000000000 || v < min) {
        fprintf(stderr, "trace_player: %s: bad value '%s'\n", opt, s ? s : "");
        exit(2);
    }
    return v;
}

typedef int (*fn_get_stats)(int, cacheshim_stats *, size_t);

int main(int argc, char **argv)
{
    long repeat = 1, device = 0, work = -1;
    bool calls = false;
    int first = argc;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--repeat") && i + 1 < argc) {
            repeat = parse_count(argv[++i], "--repeat", 1);
        } else if (!strncmp(argv[i], "--repeat=", 9)) {
            repeat = parse_count(argv[i] + 9, "--repeat", 1);
        } else if (!strcmp(argv[i], "--device") && i + 1 < argc) {
            device = parse_count(argv[++i], "--device", 0);
        } else if (!strncmp(argv[i], "--device=", 9)) {
            device = parse_count(argv[i] + 9, "--device", 0);
        } else if (!strcmp(argv[i], "--work") && i + 1 < argc) {
            work = parse_count(argv[++i], "--work", 0);
        } else if (!strcmp(argv[i], "--sync") && i + 1 < argc) {
            drv.sync_every = parse_count(argv[++i], "--sync", 1);
        } else if (!strcmp(argv[i], "--calls")) {
            calls = true;
        } else if (!strcmp(argv[i], "--")) {
            first = i + 1;
            break;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage();
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "trace_player: unknown option %s\n", argv[i]);
            usage();
        } else {
            first = i;
            break;
        }
    }
    int nfiles = argc - first;
    if (nfiles <= 0 || (drv.sync_every && work < 0))
        usage();

    /* Parse everything first: no driver call before every file is known to be good. */
    trace *traces = xcalloc((size_t)nfiles, sizeof *traces);
    size_t max_slots = 0;
    for (int i = 0; i < nfiles; i++) {
        traces[i].path = argv[first + i];
        parse_trace(&traces[i]);
        if (traces[i].nslots > max_slots)
            max_slots = traces[i].nslots;
    }

    load_driver(calls, work);
    CUdevice dev;
    CUcontext ctx;
    check_setup(drv.init(0), "cuInit");
    check_setup(drv.device_get(&dev, (int)device), "cuDeviceGet");
    check_setup(drv.ctx_retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check_setup(drv.ctx_set_current(ctx), "cuCtxSetCurrent");

    /* Present only when libcacheshim.so is loaded (preloaded). */
    fn_get_stats get_stats;
    *(void **)&get_stats = dlsym(RTLD_DEFAULT, "cacheshim_get_stats");

    CUdeviceptr *dptr = xcalloc(max_slots, sizeof *dptr);
    uint64_t *size = xcalloc(max_slots, sizeof *size);

    for (int i = 0; i < nfiles; i++) {
        const trace *t = &traces[i];
        long ncalls[MAX_ENTRIES] = {0};
        replay_counts c = {.calls = calls ? ncalls : NULL};
        cacheshim_stats s0, s1;
        /* The shim may answer -1 until its cache exists (before the first allocation): the
         * counters are all zero then, so a failed first call is a zero baseline. */
        memset(&s0, 0, sizeof s0);
        if (get_stats && get_stats(-1, &s0, sizeof s0) != 0)
            memset(&s0, 0, sizeof s0);

        for (long r = 0; r < repeat; r++)
            replay_once(t, dptr, size, &c);

        bool have_stats = get_stats && get_stats(-1, &s1, sizeof s1) == 0;

        printf("replay %s events=%" PRIu64 " allocs=%" PRIu64 " frees=%" PRIu64
               " skipped_frees=%" PRIu64 " failed_allocs=%" PRIu64 " peak_live=%" PRIu64
               " wall_ms=%.3f",
               t->path, c.events, c.allocs, c.frees, c.skipped_frees, c.failed_allocs,
               c.peak_live, c.wall_ms);
        if (have_stats) {
            uint64_t hits = s1.hits - s0.hits, misses = s1.misses - s0.misses;
            double rate = hits + misses ? (double)hits / (double)(hits + misses) : 0.0;
            /* peak_reserved is the shim's high-water mark since the process started: it cannot
             * be taken as a delta, and with several files it includes the files before (and
             * whatever the cache still held from them). It is reported as is. */
            double over = c.peak_live ? (double)s1.peak_reserved / (double)c.peak_live : 0.0;
            printf(" hits=%" PRIu64 " misses=%" PRIu64 " hit_rate=%.4f peak_reserved=%" PRIu64
                   " reserved_over_live=%.3f driver_allocs=%" PRIu64,
                   hits, misses, rate, s1.peak_reserved, over,
                   s1.driver_allocs - s0.driver_allocs);
        }
        printf("\n");
        if (calls) {
            printf("calls %s requests=%" PRIu64, t->path, c.allocs + c.frees + c.failed_allocs);
            for (int k = 0; k < MAX_ENTRIES; k++)
                if (ncalls[k])
                    printf(" %s=%ld", drv.entry_at(k), ncalls[k]);
            if (drv.launch)
                printf(" races=%ld unmap_faults=%ld", drv.races(), drv.unmap_faults());
            printf("\n");
        }
        fflush(stdout);
    }

    check_setup(drv.ctx_set_current(NULL), "cuCtxSetCurrent(NULL)");
    check_setup(drv.ctx_release(dev), "cuDevicePrimaryCtxRelease_v2");

    free(dptr);
    free(size);
    for (int i = 0; i < nfiles; i++)
        free(traces[i].ev);
    free(traces);
    return 0;
}
