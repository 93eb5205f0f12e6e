/* cacheshim-replay: the command line and the reports. See docs/replay.md. */
#include "replay.h"
#include "tool_args.h"
#include "trace_finish.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cacheshim.h"
#include "cs_options.h"

#define MAX_SETTINGS 64

static void usage(FILE *f)
{
    fputs("usage: " REPLAY_NAME " [OPTIONS] TRACE...\n"
          "Replays allocation traces (a SIZE PTR NS / f PTR NS / e SIZE ERR NS) or JSON Lines of\n"
          "libcacheaudit.so (cacheshim trace), plain or gzipped, through the cacheshim cache on\n"
          "a simulated device and reports what the cache did.\n"
          "\n"
          "  --cap SIZE             hard cap on bytes held (default none)\n"
          "  --threshold SIZE       release threshold for idle cached bytes (default none)\n"
          "  --device-size SIZE     simulated device memory (default 80G); percentages above\n"
          "                         are of this size\n"
          "  --gpu-lag-us N         a fence recorded at trace time t completes at t+N us (default 0)\n"
          "  --reuse MODE           ordered (default) or completed, as CACHESHIM_REUSE\n"
          "  --backend MODE         pooled (default) or classic, as CACHESHIM_BACKEND\n"
          "  --granularity SIZE     the device's allocation granularity (default 2M)\n"
          "  --headroom PCT         as CACHESHIM_HEADROOM (default 10)\n"
          "  --alloc-us X           cost of one cuMemAlloc (default 45)\n"
          "  --free-us X            cost of one cuMemFree (default 31)\n"
          "  --fence-record-us X    cost of one fence record, cuEventRecord (default 0.36)\n"
          "  --fence-query-us X     cost of one fence query, cuEventQuery (default 0.30)\n"
          "  --create-us X          pooled: cost of one cuMemCreate (default 12)\n"
          "  --release-us X         pooled: cost of one cuMemRelease (default 20)\n"
          "  --map-us X             pooled: cost of mapping one chunk, cuMemMap and its\n"
          "                         cuMemSetAccess (default 33)\n"
          "  --unmap-us X           pooled: cost of one cuMemUnmap (default 20)\n"
          "  --sweep caps=LIST      replay once per cap in LIST (comma-separated SIZEs)\n"
          "  --sweep thresholds=LIST  ... and per threshold (the two lists are crossed)\n"
          "  --caps LIST, --thresholds LIST   the same as the two --sweep forms\n"
          "  --plot FILE.svg        draw the runs: x = peak reserved, y = driver calls\n"
          "  --vs-expandable        also replay each trace through a model of PyTorch's\n"
          "                         caching allocator with expandable_segments:True and\n"
          "                         report its peak mapped memory beside the cache's\n"
          "  --json                 machine-readable output on stdout\n"
          "  --help, --version\n"
          "SIZE: bytes, 512K, 8G, 1.5GiB, 75% (of --device-size), none.\n"
          "Exit status: 0 ok, 1 internal failure, 2 bad usage, unreadable file or malformed line.\n",
          f);
}

static int bad_value(const char *opt, const char *v)
{
    fprintf(stderr, REPLAY_NAME ": %s: bad value '%s' (try --help)\n", opt, v);
    return 2;
}

static bool parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0) || isinf(v))
        return false;
    *out = v;
    return true;
}

/* A size spec, kept as typed for labels; UINT64_MAX once resolved means unlimited. */
typedef struct {
    char text[32];
    cs_size_spec spec;
} setting;

static int parse_setting(const char *opt, const char *text, setting *out)
{
    if (strlen(text) >= sizeof out->text || cs_parse_size(text, true, &out->spec) != 0)
        return bad_value(opt, text);
    snprintf(out->text, sizeof out->text, "%s", text);
    return 0;
}

static int parse_list(const char *opt, const char *list, setting *out, int *n)
{
    char buf[1024];
    if (strlen(list) >= sizeof buf || !*list)
        return bad_value(opt, list);
    strcpy(buf, list);
    *n = 0;
    char *save = NULL;
    for (char *s = strtok_r(buf, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
        if (*n == MAX_SETTINGS)
            return bad_value(opt, list);
        if (parse_setting(opt, s, &out[(*n)++]))
            return 2;
    }
    return *n ? 0 : bad_value(opt, list);
}

typedef struct {
    replay_config cfg;
    setting device, caps[MAX_SETTINGS], thresholds[MAX_SETTINGS];
    int ncaps, nthresholds;
    bool sweep, json;
    bool vs_expandable;  /* --vs-expandable */
    const char *plot;
    char **files;  /* the traces, in order: options and files may be mixed */
    int nfiles;
} args;

static int parse_args(int argc, char **argv, args *a)
{
    *a = (args){.cfg = {.costs = {45, 31, 0.36, 0.30, 12, 20, 33, 20},
                        .granularity = 2ull << 20,
                        .headroom_pct = 10},  /* CACHESHIM_HEADROOM's default */
                .ncaps = 1,
                .nthresholds = 1};
    parse_setting("--device-size", "80G", &a->device);
    parse_setting("--cap", "none", &a->caps[0]);
    parse_setting("--threshold", "none", &a->thresholds[0]);
    double lag_us = 0;
    a->files = calloc((size_t)argc, sizeof *a->files);
    if (!a->files)
        return 1;
    for (int i = 1; i < argc; i++) {
        const char *v, *arg = argv[i];
        bool missing = false;
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(arg, "--version")) {
            printf(REPLAY_NAME " %s\n", CACHESHIM_VERSION);
            exit(0);
        } else if (!strcmp(arg, "--json")) {
            a->json = true;
        } else if (!strcmp(arg, "--vs-expandable")) {
            a->vs_expandable = true;
        } else if (!strcmp(arg, "--")) {
            while (++i < argc)
                a->files[a->nfiles++] = argv[i];
        } else if ((v = cs_tool_opt_value(argc, argv, &i, "--cap", &missing))) {
            if (parse_setting("--cap", v, &a->caps[0]))
                return 2;
        } else if ((v = cs_tool_opt_value(argc, argv, &i, "--threshold", &missing))) {
            if (parse_setting("--threshold", v, &a->thresholds[0]))
                return 2;
        } else if ((v = cs_tool_opt_value(argc, argv, &i, "--device-size", &missing))) {
            if (cs_parse_size(v, false, &a->device.spec) || a->device.spec.kind != CS_SIZE_BYTES ||
                !a->device.spec.bytes)
                return bad_value("--device-size", v);
            snprintf(a->device.text, sizeof a->device.text, "%.31s", v);
        } else if ((v = cs_tool_opt_value(argc, argv, &i, "--gpu-lag-us", &missing))) {
            if (!parse_double(v, &lag_us) || lag_us > 1e12)
                return bad_value("--gpu-lag-us", v);
        } else if ((v = cs_tool_opt_value(argc, argv, &i, "--reuse", &missing))) {
            if (strcmp(v, "ordered") != 0 && strcmp(v, "completed") != 0)
                return bad_value("--reuse", v);
            a->cfg.reuse_completed = strcmp(v, "completed") == 0;
        } else if ((v = cs_tool_opt_value(argc, argv, &i, "--backend", &missing))) {
            if (strcmp(v, "pooled") != 0 && strcmp(v, "classic") != 0)
                return bad_value("--backend", v);
            a->cfg.classic = strcmp(v, "classic") == 0;
        } else if ((v = cs_tool_opt_value(argc, argv, &i, "--granularity", &missing))) {
            cs_size_spec g;
            if (cs_parse_size(v, false, &g) || g.kind != CS_SIZE_BYTES || g.bytes < 4096 ||
                (g.bytes & (g.bytes - 1)))
                return bad_value("--granularity", v);
            a->cfg.granularity = g.bytes;
        } else if ((v = cs_tool_opt_value(argc, argv, &i, "--headroom", &missing))) {
            double pct;
            if (!parse_double(v, &pct) || pct > 1000 || pct != (double)(unsigned)pct)
                return bad_value("--headroom", v);
            a->cfg.headroom_pct = (unsigned)pct;
        } else if ((v = cs_tool_opt_value(argc, argv, &i, "--create-us", &missing))) {
            if (!parse_double(v, &a->cfg.costs.create_us))
                return bad_value("--create-us", v);
        } else if ((v = cs_tool_opt_value(argc, argv, &i, "--release-us", &missing))) {
            if (!parse_double(v, &a->cfg.costs.release_us))
                return bad_value("--release-us", v);
        } else if ((v = cs_tool_opt_value(argc, argv, &i, "--map-us", &missing))) {
            if (!parse_double(v, &a->cfg.costs.map_us))
                return bad_value("--map-us", v);
        } else if ((v = cs_tool_opt_value(argc, argv, &i, "--unmap-us", &missing))) {
            if (!parse_double(v, &a->cfg.costs.unmap_us))
                return bad_value("--unmap-us", v);
        } else if ((v = cs_tool_opt_value(argc, argv, &i, "--alloc-us", &missing))) {
            if (!parse_double(v, &a->cfg.costs.alloc_us))
                return bad_value("--alloc-us", v);
        } else if ((v = cs_tool_opt_value(argc, argv, &i, "--free-us", &missing))) {
            if (!parse_double(v, &a->cfg.costs.free_us))
                return bad_value("--free-us", v);
        } else if ((v = cs_tool_opt_value(argc, argv, &i, "--fence-record-us", &missing))) {
            if (!parse_double(v, &a->cfg.costs.fence_record_us))
                return bad_value("--fence-record-us", v);
        } else if ((v = cs_tool_opt_value(argc, argv, &i, "--fence-query-us", &missing))) {
            if (!parse_double(v, &a->cfg.costs.fence_query_us))
                return bad_value("--fence-query-us", v);
        } else if ((v = cs_tool_opt_value(argc, argv, &i, "--caps", &missing))) {
            if (parse_list("--caps", v, a->caps, &a->ncaps))
                return 2;
            a->sweep = true;
        } else if ((v = cs_tool_opt_value(argc, argv, &i, "--thresholds", &missing))) {
            if (parse_list("--thresholds", v, a->thresholds, &a->nthresholds))
                return 2;
            a->sweep = true;
        } else if ((v = cs_tool_opt_value(argc, argv, &i, "--sweep", &missing))) {
            int r = !strncmp(v, "caps=", 5)
                        ? parse_list("--sweep caps", v + 5, a->caps, &a->ncaps)
                    : !strncmp(v, "thresholds=", 11)
                        ? parse_list("--sweep thresholds", v + 11, a->thresholds, &a->nthresholds)
                        : bad_value("--sweep", v);
            if (r)
                return 2;
            a->sweep = true;
        } else if ((v = cs_tool_opt_value(argc, argv, &i, "--plot", &missing))) {
            a->plot = v;
        } else if (missing) {
            fprintf(stderr, REPLAY_NAME ": %s needs a value (try --help)\n", arg);
            return 2;
        } else if (arg[0] == '-' && arg[1]) {
            fprintf(stderr, REPLAY_NAME ": unknown option %s (try --help)\n", arg);
            return 2;
        } else {
            a->files[a->nfiles++] = argv[i];
        }
    }
    if (!a->nfiles) {
        usage(stderr);
        return 2;
    }
    a->cfg.device_size = a->device.spec.bytes;
    a->cfg.gpu_lag_ns = (uint64_t)llround(lag_us * 1000);
    return 0;
}

/* ---------------------------------------------------------------- reports */

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static void json_string(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            printf("\\u%04x", (unsigned char)*s);
        else
            putchar(*s);
    }
    putchar('"');
}

static void json_limit(const char *key, uint64_t v)
{
    if (v == UINT64_MAX)
        printf("\"%s\": null", key);
    else
        printf("\"%s\": %" PRIu64, key, v);
}

/* Where the events came from, for the reports: one line, or nothing for allocation traces. */
static void print_source(const replay_source *src)
{
    if (src->jsonl)
        printf("  source              JSON Lines: cuMemAlloc/cuMemFree calls at the %s (%" PRIu64
               " other allocation calls skipped)\n", src->level, src->skipped);
}

/* One run as JSON; with es (--vs-expandable), the model's two fields too. */
static void print_json_run(const char *path, const replay_source *src, const setting *cap,
                           const setting *thr, const replay_config *cfg, const replay_result *r,
                           const replay_expandable_result *es, bool first)
{
    printf("%s\n    {\"trace\": ", first ? "" : ",");
    json_string(path);
    printf(", \"source\": \"%s%s\", \"skipped_calls\": %" PRIu64, src->jsonl ? "jsonl-" : "alloc",
           src->level, src->skipped);
    printf(", \"cap_spec\": ");
    json_string(cap->text);
    printf(", \"threshold_spec\": ");
    json_string(thr->text);
    printf(", ");
    json_limit("cap", cfg->cap);
    printf(", ");
    json_limit("threshold", cfg->threshold);
    printf(",\n     \"events\": %" PRIu64 ", \"allocs\": %" PRIu64 ", \"frees\": %" PRIu64
           ", \"skipped_frees\": %" PRIu64 ", \"failed_allocs\": %" PRIu64
           ", \"replay_failures\": %" PRIu64 ", \"dropped_frees\": %" PRIu64 ",\n",
           r->events, r->allocs, r->frees, r->skipped_frees, r->failed_allocs,
           r->replay_failures, r->dropped_frees);
    printf("     \"hits\": %" PRIu64 ", \"misses\": %" PRIu64 ", \"hit_rate\": %.6f"
           ", \"driver_allocs\": %" PRIu64 ", \"driver_frees\": %" PRIu64 ",\n",
           r->hits, r->misses, r->hit_rate, r->driver_allocs, r->driver_frees);
    printf("     \"peak_live\": %" PRIu64 ", \"peak_reserved\": %" PRIu64
           ", \"reserved_over_live\": %.6f, \"releases\": %" PRIu64 ", \"oom_recoveries\": %" PRIu64
           ", \"oom_failures\": %" PRIu64 ", \"cap_refusals\": %" PRIu64 ",\n",
           r->peak_live, r->peak_reserved, r->reserved_over_live, r->releases, r->oom_recoveries,
           r->oom_failures, r->cap_refusals);
    printf("     \"backend\": \"%s\", \"granularity\": %" PRIu64 ", \"moves\": %" PRIu64
           ", \"chunk_creates\": %" PRIu64 ", \"chunk_releases\": %" PRIu64
           ", \"chunk_maps\": %" PRIu64 ", \"chunk_unmaps\": %" PRIu64 ",\n",
           cfg->classic ? "classic" : "pooled", cfg->granularity, r->moves, r->creates,
           r->chunk_releases, r->maps, r->unmaps);
    printf("     \"fences\": %" PRIu64 ", \"fence_queries\": %" PRIu64 ", \"fence_waits\": %" PRIu64
           ", \"baseline_us\": %.3f, \"cached_us\": %.3f, \"saved_us\": %.3f",
           r->fences, r->fence_queries, r->fence_waits, r->baseline_us, r->cached_us, r->saved_us);
    if (es)
        printf(",\n     \"expandable_peak_mapped\": %" PRIu64 ", \"expandable_over_live\": %.6f",
               es->peak_mapped, es->over_live);
    putchar('}');
}

static const char *mib(uint64_t b, char *buf)
{
    sprintf(buf, "%.1f MiB", (double)b / (1 << 20));
    return buf;
}

/* The model's line: its peak mapped, over the trace's peak live, and the cache's peak reserved
 * over it (with r; a sweep's header has no run to compare). */
static void print_expandable(const replay_expandable_result *es, const replay_result *r)
{
    char b[48];
    printf("  expandable model    %" PRIu64 " B (%s) mapped at peak: %.3f of peak live",
           es->peak_mapped, mib(es->peak_mapped, b), es->over_live);
    if (r)
        printf(", peak reserved %.3f of it",
               es->peak_mapped ? (double)r->peak_reserved / (double)es->peak_mapped : 0);
    putchar('\n');
}

static void print_text_run(const char *path, const replay_source *src, const setting *cap,
                           const setting *thr, const args *a, const replay_result *r,
                           const replay_expandable_result *es)
{
    char b1[48], b2[48];
    printf("%s: cap %s, threshold %s, device %s, gpu lag %.3f us, reuse %s, backend %s\n",
           path, cap->text, thr->text, a->device.text, (double)a->cfg.gpu_lag_ns / 1000,
           a->cfg.reuse_completed ? "completed" : "ordered", a->cfg.classic ? "classic" : "pooled");
    print_source(src);
    printf("  events              %" PRIu64 "\n", r->events);
    printf("  allocations         %" PRIu64 "\n", r->allocs);
    printf("  frees               %" PRIu64 "\n", r->frees);
    printf("  skipped frees       %" PRIu64 "  (pointers never allocated in the trace)\n",
           r->skipped_frees);
    printf("  failed in trace     %" PRIu64 "  (e lines: counted, not replayed)\n",
           r->failed_allocs);
    printf("  failed in replay    %" PRIu64 "  (their %" PRIu64 " frees dropped)\n",
           r->replay_failures, r->dropped_frees);
    printf("  hits / misses       %" PRIu64 " / %" PRIu64 "  (hit rate %.2f %%)\n", r->hits,
           r->misses, 100 * r->hit_rate);
    printf("  driver allocs       %" PRIu64 "  (allocations that took new memory: %.2f %% served "
           "without)\n",
           r->driver_allocs,
           r->allocs ? 100.0 * (double)(r->allocs - r->driver_allocs) / (double)r->allocs : 0);
    printf("  driver frees        %" PRIu64 "\n", r->driver_frees);
    if (!a->cfg.classic)
        printf("  pooled              %" PRIu64 " moves, %" PRIu64 " chunks created, %" PRIu64
               " released, %" PRIu64 " mapped, %" PRIu64 " unmapped\n",
               r->moves, r->creates, r->chunk_releases, r->maps, r->unmaps);
    printf("  peak live           %" PRIu64 " B (%s)\n", r->peak_live, mib(r->peak_live, b1));
    printf("  peak reserved       %" PRIu64 " B (%s)\n", r->peak_reserved,
           mib(r->peak_reserved, b2));
    printf("  reserved / live     %.3f\n", r->reserved_over_live);
    if (es)
        print_expandable(es, r);
    printf("  releases            %" PRIu64 "\n", r->releases);
    printf("  OOM recoveries      %" PRIu64 "\n", r->oom_recoveries);
    printf("  OOM failures        %" PRIu64 "\n", r->oom_failures);
    printf("  cap refusals        %" PRIu64 "\n", r->cap_refusals);
    printf("  fences              %" PRIu64 " recorded, %" PRIu64 " queries, %" PRIu64
           " waits\n",
           r->fences, r->fence_queries, r->fence_waits);
    printf("  driver time         %.1f ms without cache, %.1f ms with: %.1f ms saved\n",
           r->baseline_us / 1000, r->cached_us / 1000, r->saved_us / 1000);
}

static void print_sweep_header(const char *path, const replay_source *src, const args *a,
                               const replay_expandable_result *es)
{
    printf("%s: sweep, device %s, gpu lag %.3f us\n", path, a->device.text,
           (double)a->cfg.gpu_lag_ns / 1000);
    print_source(src);
    if (es)
        print_expandable(es, NULL);
    printf("  %-10s %-10s %8s %8s %8s %12s %7s %8s %7s %7s %7s %10s\n", "cap", "threshold",
           "hit%", "d.alloc", "d.free", "reserved_MiB", "res/liv", "releases", "oomrec",
           "oomfail", "capref", "saved_ms");
}

static void print_sweep_row(const setting *cap, const setting *thr, const replay_result *r)
{
    printf("  %-10s %-10s %8.2f %8" PRIu64 " %8" PRIu64 " %12.1f %7.3f %8" PRIu64 " %7" PRIu64
           " %7" PRIu64 " %7" PRIu64 " %10.1f\n",
           cap->text, thr->text, 100 * r->hit_rate, r->driver_allocs, r->driver_frees,
           (double)r->peak_reserved / (1 << 20), r->reserved_over_live, r->releases,
           r->oom_recoveries, r->oom_failures, r->cap_refusals, r->saved_us / 1000);
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv)
{
    args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) {
        free(a.files);
        return rc;
    }
    int ntraces = a.nfiles;
    size_t nruns = (size_t)ntraces * (size_t)(a.ncaps * a.nthresholds);
    replay_point *pts = calloc(nruns, sizeof *pts);
    char(*labels)[80] = calloc(nruns, sizeof *labels);
    replay_trace *traces = calloc((size_t)ntraces, sizeof *traces);
    replay_source *srcs = calloc((size_t)ntraces, sizeof *srcs);
    if (!pts || !labels || !traces || !srcs) {
        fprintf(stderr, REPLAY_NAME ": out of memory\n");
        return 1;
    }
    /* Every trace is read before anything is replayed: a bad file fails with no output. */
    for (int t = 0; t < ntraces && !rc; t++) {
        trace_finish(a.files[t], REPLAY_NAME);
        rc = replay_trace_load_any(&traces[t], a.files[t], &srcs[t]);
    }

    if (!rc && a.json)
        printf("{\"tool\": \"" REPLAY_NAME "\", \"version\": \"%s\", \"device_size\": %" PRIu64
               ", \"gpu_lag_us\": %.3f,\n \"costs_us\": {\"alloc\": %g, \"free\": %g, "
               "\"fence_record\": %g, \"fence_query\": %g},\n \"runs\": [",
               CACHESHIM_VERSION, a.cfg.device_size, (double)a.cfg.gpu_lag_ns / 1000,
               a.cfg.costs.alloc_us, a.cfg.costs.free_us, a.cfg.costs.fence_record_us,
               a.cfg.costs.fence_query_us);
    size_t n = 0;
    for (int t = 0; t < ntraces && !rc; t++) {
        const char *path = a.files[t];
        /* The model depends on the trace alone: once per trace, shown with each of its runs. */
        replay_expandable_result model, *es = a.vs_expandable ? &model : NULL;
        if (es && replay_expandable_run(&traces[t], es)) {
            fprintf(stderr, REPLAY_NAME ": out of memory\n");
            rc = 1;
            break;
        }
        if (a.sweep && !a.json)
            print_sweep_header(path, &srcs[t], &a, es);
        for (int ci = 0; ci < a.ncaps && !rc; ci++)
            for (int ti = 0; ti < a.nthresholds && !rc; ti++) {
                replay_config cfg = a.cfg;
                cfg.cap = cs_size_resolve(&a.caps[ci].spec, cfg.device_size);
                cfg.threshold = cs_size_resolve(&a.thresholds[ti].spec, cfg.device_size);
                replay_result r;
                if (replay_run(&traces[t], &cfg, &r)) {
                    fprintf(stderr, REPLAY_NAME ": out of memory\n");
                    rc = 1;
                    break;
                }
                if (a.json)
                    print_json_run(path, &srcs[t], &a.caps[ci], &a.thresholds[ti], &cfg, &r, es,
                                   n == 0);
                else if (a.sweep)
                    print_sweep_row(&a.caps[ci], &a.thresholds[ti], &r);
                else
                    print_text_run(path, &srcs[t], &a.caps[ci], &a.thresholds[ti], &a, &r, es);
                snprintf(labels[n], sizeof labels[n], "cap=%s thr=%s", a.caps[ci].text,
                         a.thresholds[ti].text);
                pts[n] = (replay_point){base_name(path), labels[n], (double)r.peak_reserved,
                                        (double)(r.driver_allocs + r.driver_frees)};
                n++;
            }
        if (!a.json && t + 1 < ntraces)
            putchar('\n');
    }
    if (!rc && a.json)
        printf("\n ]}\n");
    if (!rc && a.plot &&
        replay_plot_svg(a.plot, REPLAY_NAME ": driver calls against peak reserved memory", pts,
                        n)) {
        fprintf(stderr, REPLAY_NAME ": %s: %s\n", a.plot, strerror(errno));
        rc = 1;
    }
    for (int t = 0; t < ntraces; t++)
        replay_trace_free(&traces[t]);
    free(traces);
    free(srcs);
    free(a.files);
    free(labels);
    free(pts);
    return rc;
}
