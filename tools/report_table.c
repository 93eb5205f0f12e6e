/* The summary as tables of text cells. Both outputs print these same cells (report_text.c
 * aligned on stdout, report_html.c as HTML tables), so the numbers cannot differ between
 * them. Units: times in s to the µs, durations in ms or µs to the ns, bytes exact where the
 * column says "bytes" and in binary units (KiB, MiB...) elsewhere. */
#include "report.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cs_options.h"

#define MAX_FAILURES_LISTED 20

void rp_fmt_seconds(uint64_t ns, char *buf, size_t len)
{
    snprintf(buf, len, "%" PRIu64 ".%06" PRIu64, ns / 1000000000u, ns % 1000000000u / 1000u);
}

void rp_fmt_bytes(uint64_t bytes, char *buf, size_t len) { cs_bytes_format(bytes, buf, len); }

const char *rp_series_meaning(int lib)
{
    switch (lib) {
    case RP_LIB_DRIVER: return "held from the driver (device memory)";
    case RP_LIB_SHIM: return "asked of the cache by the program";
    case RP_LIB_RUNTIME: return "asked of cudart by the program";
    default: return "allocated (a lines not yet freed)";
    }
}

/* ---- building tables ------------------------------------------------------------------------- */

typedef struct {
    rp_tables *ts;
    bool failed;
} builder;

static char *vformat(const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s)
        vsnprintf(s, (size_t)n + 1, fmt, ap);
    return s;
}

__attribute__((format(printf, 2, 3))) static char *format(builder *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = vformat(fmt, ap);
    va_end(ap);
    if (!s)
        b->failed = true;
    return s;
}

/* A new table; head is a NULL-terminated list, a leading '>' marks a right-aligned column. */
static rp_table *table(builder *b, const char *id, const char *title, const char *const *head)
{
    rp_table *t = realloc(b->ts->t, (b->ts->n + 1) * sizeof *t);
    if (!t) {
        b->failed = true;
        return NULL;
    }
    b->ts->t = t;
    t = &b->ts->t[b->ts->n++];
    *t = (rp_table){.id = id, .title = title};
    for (; head[t->ncols] && t->ncols < RP_MAXCOLS; t->ncols++) {
        const char *h = head[t->ncols];
        if (h[0] == '>') {
            t->right |= 1u << t->ncols;
            h++;
        }
        snprintf(t->head[t->ncols], sizeof t->head[0], "%s", h);
    }
    return t;
}

/* Appends one row of t->ncols cells, taking the strings (all freed on failure). */
static void row(builder *b, rp_table *t, char **cells)
{
    bool ok = !b->failed;
    for (int c = 0; c < t->ncols; c++)
        ok &= cells[c] != NULL;
    if (ok && t->nrows == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        char **cell = realloc(t->cell, cap * (size_t)t->ncols * sizeof *cell);
        if (cell) {
            t->cell = cell;
            t->cap = cap;
        } else {
            ok = false;
        }
    }
    if (!ok) {
        for (int c = 0; c < t->ncols; c++)
            free(cells[c]);
        b->failed = true;
        return;
    }
    memcpy(&t->cell[t->nrows++ * (size_t)t->ncols], cells, (size_t)t->ncols * sizeof *cells);
}

static char *bytes_cell(builder *b, uint64_t v)
{
    char buf[32];
    rp_fmt_bytes(v, buf, sizeof buf);
    return format(b, "%s", buf);
}

static char *seconds_cell(builder *b, uint64_t ns)
{
    char buf[32];
    rp_fmt_seconds(ns, buf, sizeof buf);
    return format(b, "%s", buf);
}

/* ns as ms or µs with three decimals. */
static char *ms_cell(builder *b, uint64_t ns)
{
    return format(b, "%" PRIu64 ".%03" PRIu64, ns / 1000000u, ns / 1000u % 1000u);
}

static char *us_cell(builder *b, uint64_t ns)
{
    return format(b, "%" PRIu64 ".%03" PRIu64, ns / 1000u, ns % 1000u);
}

static char *u64_cell(builder *b, uint64_t v) { return format(b, "%" PRIu64, v); }

/* ---- the tables ------------------------------------------------------------------------------ */

static void trace_table(builder *b, const rp_summary *s)
{
    const rp_trace *tr = s->trace;
    static const char *const head[] = {"", "", NULL};
    rp_table *t = table(b, "trace", "Trace", head);
    if (!t)
        return;
    bool jsonl = tr->format == RP_FORMAT_JSONL;
    char first[32], last[32], span[32];
    rp_fmt_seconds(s->t_first, first, sizeof first);
    rp_fmt_seconds(s->t_last, last, sizeof last);
    rp_fmt_seconds(s->t_last - s->t_first, span, sizeof span);
    row(b, t, (char *[]){format(b, "file"), format(b, "%s", tr->path)});
    row(b, t, (char *[]){format(b, "format"),
                         format(b, "%s", jsonl ? "JSON Lines (libcacheaudit.so)"
                                               : "allocation trace (a, f, e lines)")});
    row(b, t, (char *[]){format(b, "events"),
                         format(b, "%zu %s", tr->nev, jsonl ? "calls" : "lines")});
    if (jsonl) {
        row(b, t, (char *[]){format(b, "processes"), u64_cell(b, s->npids)});
        row(b, t, (char *[]){format(b, "threads"), u64_cell(b, s->ntids)});
    }
    row(b, t, (char *[]){format(b, "time"),
                         format(b, "%s s to %s s (%s s)", first, last, span)});
    if (tr->other_lines)
        row(b, t, (char *[]){format(b, "other lines"),
                             format(b, "%" PRIu64 " line%s not starting with '{' skipped "
                                       "(the program's own output?)", tr->other_lines,
                                    tr->other_lines == 1 ? "" : "s")});
}

static void calls_table(builder *b, const rp_summary *s)
{
    const rp_trace *tr = s->trace;
    static const char *const timed[] = {"call", "lib", ">calls", ">failed", ">total ms",
                                        ">mean us", ">p50 us", ">p99 us", ">max us", NULL};
    static const char *const untimed[] = {"call", "lib", ">calls", ">failed", NULL};
    rp_table *t = table(b, "calls", "Calls by name", tr->timed ? timed : untimed);
    if (!t)
        return;
    t->note = tr->timed
        ? format(b, "Every traced call by function and library (lib: where the call went), "
                    "most total time first. Times are spent inside the call; p50 and p99 are "
                    "nearest-rank percentiles.")
        : format(b, "Allocation traces record no durations: alloc counts a and e lines "
                    "(failed: e), free counts f lines.");
    for (size_t i = 0; i < s->ncalls; i++) {
        const rp_call_stat *c = &s->calls[i];
        char *cells[RP_MAXCOLS] = {format(b, "%s", rp_str(tr, c->name)),
                                   format(b, "%s", rp_lib_name(c->lib)), u64_cell(b, c->calls),
                                   u64_cell(b, c->failed)};
        if (tr->timed) {
            cells[4] = ms_cell(b, c->total_ns);
            cells[5] = us_cell(b, c->total_ns / c->calls);
            cells[6] = us_cell(b, c->p50_ns);
            cells[7] = us_cell(b, c->p99_ns);
            cells[8] = us_cell(b, c->max_ns);
        }
        row(b, t, cells);
    }
}

static void callers_table(builder *b, const rp_summary *s)
{
    static const char *const head[] = {"caller", "lib", ">calls", ">failed", ">total ms",
                                       ">allocations", ">bytes allocated", ">frees", NULL};
    if (s->trace->format != RP_FORMAT_JSONL)
        return;
    rp_table *t = table(b, "callers", "Calls by caller", head);
    if (!t)
        return;
    t->note = format(b, "Who made the calls (caller: app = the program and its libraries, shim "
                        "= the cache, cudart = the shared CUDA runtime) and where they went "
                        "(lib). Allocations and frees: successful ones.");
    for (size_t i = 0; i < s->ncallers; i++) {
        const rp_caller_stat *c = &s->callers[i];
        row(b, t, (char *[]){format(b, "%s", rp_from_name(c->from)),
                             format(b, "%s", rp_lib_name(c->lib)), u64_cell(b, c->calls),
                             u64_cell(b, c->failed), ms_cell(b, c->total_ns),
                             u64_cell(b, c->allocs), bytes_cell(b, c->alloc_bytes),
                             u64_cell(b, c->frees)});
    }
}

/* "512 B", "1 KiB", "2 MiB": exact powers of two. */
static void pow2_label(int k, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    snprintf(buf, len, "%" PRIu64 " %s", (uint64_t)1 << (k % 10), units[k / 10]);
}

static void sizes_table(builder *b, const rp_summary *s)
{
    const char *head[2 + 2 * RP_NLIB + 1] = {">size from", ">below"};
    char names[2 * RP_NLIB][32];
    int lib[RP_NLIB], n = 0;
    for (int l = 0; l < RP_NLIB; l++) {
        if (!s->series[l].present)
            continue;
        snprintf(names[2 * n], sizeof names[0], ">%s allocs", rp_lib_name(l));
        snprintf(names[2 * n + 1], sizeof names[0], ">%s bytes", rp_lib_name(l));
        head[2 + 2 * n] = names[2 * n];
        head[3 + 2 * n] = names[2 * n + 1];
        lib[n++] = l;
    }
    head[2 + 2 * n] = NULL;
    rp_table *t = table(b, "sizes", "Allocation sizes", head);
    if (!t)
        return;
    t->note = format(b, "Successful allocations by size, in power-of-two buckets: at least "
                        "\"size from\", less than \"below\"; count and bytes per library.");
    for (int k = 0; k < RP_NBUCKETS; k++) {
        bool any = false;
        for (int i = 0; i < n; i++)
            any |= s->series[lib[i]].hist_count[k] != 0;
        if (!any)
            continue;
        char lo[32], hi[32];
        if (k == 0) {
            snprintf(lo, sizeof lo, "0 B");
            snprintf(hi, sizeof hi, "1 B");
        } else {
            pow2_label(k - 1, lo, sizeof lo);
            if (k < 64)
                pow2_label(k, hi, sizeof hi);
            else
                snprintf(hi, sizeof hi, "16 EiB");
        }
        char *cells[RP_MAXCOLS] = {format(b, "%s", lo), format(b, "%s", hi)};
        for (int i = 0; i < n; i++) {
            cells[2 + 2 * i] = u64_cell(b, s->series[lib[i]].hist_count[k]);
            cells[3 + 2 * i] = bytes_cell(b, s->series[lib[i]].hist_bytes[k]);
        }
        row(b, t, cells);
    }
    if (!t->nrows) {
        free(t->note);
        t->note = format(b, "No successful allocations.");
    }
}

static void in_use_table(builder *b, const rp_summary *s)
{
    static const char *const head[] = {"lib", ">peak", ">peak bytes", ">peak at s", ">at end",
                                       ">live at end", ">unknown frees", NULL};
    rp_table *t = table(b, "in_use", "Bytes in use", head);
    if (!t)
        return;
    const rp_series *sr = s->series;
    const char *both = sr[RP_LIB_SHIM].present && sr[RP_LIB_DRIVER].present
        ? " The cache was loaded: shim is the program's own demand, driver what the process "
          "held on the device (in use plus cached)."
        : sr[RP_LIB_RUNTIME].present && sr[RP_LIB_DRIVER].present
        ? " runtime is what the program asked of cudart, driver what the process got from the "
          "driver (cudart's allocations and the program's own)."
        : "";
    uint64_t reused = 0;
    for (int l = 0; l < RP_NLIB; l++)
        reused += sr[l].reused;
    char extra[200] = "";
    if (reused)
        snprintf(extra, sizeof extra, " %" PRIu64 " allocation%s returned a pointer still "
                 "live in the trace (its free was not traced): counted as replacing it.",
                 reused, reused == 1 ? "" : "s");
    char libs[400] = "";
    for (int l = 0, n = 0; l < RP_NLIB; l++)
        if (sr[l].present)
            n += snprintf(libs + n, sizeof libs - (size_t)n, " %s: %s.", rp_lib_name(l),
                          rp_series_meaning(l));
    t->note = format(b, "Bytes handed out by successful allocations and not freed yet, per "
                        "library the calls went to;%s Peak at: the end of the call that first "
                        "reached it. Unknown frees: frees of pointers with no live allocation "
                        "in the trace (0, or allocated before tracing).%s%s",
                     libs, both, extra);
    for (int l = 0; l < RP_NLIB; l++) {
        if (!sr[l].present)
            continue;
        row(b, t, (char *[]){format(b, "%s", rp_lib_name(l)), bytes_cell(b, sr[l].peak),
                             u64_cell(b, sr[l].peak),
                             sr[l].peak ? seconds_cell(b, sr[l].peak_t) : format(b, "-"),
                             bytes_cell(b, sr[l].end), u64_cell(b, sr[l].live_end),
                             u64_cell(b, sr[l].unknown_frees)});
    }
    if (!t->nrows) {
        free(t->note);
        t->note = format(b, "No allocations or frees in the trace.");
    }
}

static void timeline_table(builder *b, const rp_summary *s)
{
    const char *head[3 + RP_NLIB + 1] = {">slice", ">from s", ">to s"};
    char names[RP_NLIB][32];
    int lib[RP_NLIB], n = 0;
    for (int l = 0; l < RP_NLIB; l++) {
        if (!s->series[l].present)
            continue;
        snprintf(names[n], sizeof names[0], ">%s max", rp_lib_name(l));
        head[3 + n] = names[n];
        lib[n++] = l;
    }
    head[3 + n] = NULL;
    if (!n)
        return;
    rp_table *t = table(b, "timeline", "Timeline", head);
    if (!t)
        return;
    t->note = format(b, "The trace's time in %zu equal slices; each cell is the highest bytes "
                        "in use during the slice.", s->nslices);
    for (size_t i = 0; i < s->nslices; i++) {
        char *cells[RP_MAXCOLS] = {u64_cell(b, i + 1), seconds_cell(b, rp_slice_start(s, i, s->nslices)),
                                   seconds_cell(b, rp_slice_start(s, i + 1, s->nslices))};
        for (int k = 0; k < n; k++)
            cells[3 + k] = bytes_cell(b, s->series[lib[k]].slice_max[i]);
        row(b, t, cells);
    }
}

static void failures_table(builder *b, const rp_summary *s)
{
    static const char *const head[] = {">line", ">at s", "call", "lib", "caller", ">size",
                                       "result", ">in use then", NULL};
    const rp_trace *tr = s->trace;
    rp_table *t = table(b, "failures", "Failed allocations", head);
    if (!t)
        return;
    const char *then = "in use then: bytes in use through the same library when it failed.";
    if (s->nfailures == 0)
        t->note = format(b, "None.");
    else if (s->nfailures > MAX_FAILURES_LISTED)
        t->note = format(b, "%zu failed allocations, the first %d listed; %s", s->nfailures,
                         MAX_FAILURES_LISTED, then);
    else
        t->note = format(b, "%zu failed allocation%s; %s", s->nfailures,
                         s->nfailures == 1 ? "" : "s", then);
    for (size_t i = 0; i < s->nfailures && i < MAX_FAILURES_LISTED; i++) {
        const rp_event *e = &tr->ev[s->failures[i].ev];
        row(b, t, (char *[]){u64_cell(b, e->line), seconds_cell(b, e->t + e->dur),
                             format(b, "%s", rp_str(tr, e->name)),
                             format(b, "%s", rp_lib_name(e->lib)),
                             format(b, "%s", rp_from_name(e->from)), bytes_cell(b, e->size),
                             e->result_name != RP_NO_STRING
                                 ? format(b, "%s", rp_str(tr, e->result_name))
                                 : format(b, "%" PRId64, e->result),
                             bytes_cell(b, s->failures[i].in_use)});
    }
}

/* Call sites at the peak of the program's bytes (traces recorded with CACHESHIM_TRACE_STACK). */
static void sites_table(builder *b, const rp_summary *s)
{
    if (!s->has_stacks)
        return;
    static const char *const head[] = {">rank", ">bytes", ">share", ">allocations",
                                       "call site", NULL};
    rp_table *t = table(b, "sites", "Allocation sites at the peak", head);
    if (!t)
        return;
    const rp_series *r = &s->series[s->prog_lib];
    char peak[32], at[32];
    rp_fmt_bytes(r->peak, peak, sizeof peak);
    rp_fmt_seconds(r->peak_t, at, sizeof at);
    t->note = format(b, "What held the %s peak of %s (%s s), by call site (innermost frame "
                     "first): %zu site%s%s. Frames symbolized from the recorded objects when "
                     "this report was made.",
                     rp_lib_name(s->prog_lib), peak, at, s->nsites, s->nsites == 1 ? "" : "s",
                     s->nsites > RP_MAX_SITES ? ", the first 20 listed" : "");
    for (size_t i = 0; i < s->nsites && i < RP_MAX_SITES; i++) {
        const rp_site *x = &s->sites[i];
        row(b, t, (char *[]){u64_cell(b, i + 1), bytes_cell(b, x->bytes),
                             format(b, "%.1f %%", 100.0 * (double)x->bytes / (double)r->peak),
                             u64_cell(b, x->count),
                             format(b, "%s", x->where ? x->where : "-")});
    }
}

/* The program's scopes (cacheshim.h), when the trace has any. */
static void scopes_table(builder *b, const rp_summary *s)
{
    if (s->nscopes == 0)
        return;
    static const char *const head[] = {"scope", ">entered", ">still open", ">allocations",
                                       ">bytes", ">peak", ">held at end", NULL};
    rp_table *t = table(b, "scopes", "Scopes", head);
    if (!t)
        return;
    t->note = format(b, "Per scope name (cacheshim_scope_begin): the program's allocations (%s) "
                     "on the scope's thread while it was open, inner scopes' included; peak: "
                     "the most of those bytes held at once in one entry; held at end: what "
                     "the last entry still held at its end, or at the end of the trace when "
                     "it is still open (marked *).",
                     rp_lib_name(s->prog_lib));
    for (size_t i = 0; i < s->nscopes; i++) {
        const rp_scope_stat *x = &s->scopes[i];
        char held[32];
        rp_fmt_bytes(x->held_at_end, held, sizeof held);
        char *name = format(b, "%s", rp_str(s->trace, x->name));
        for (char *p = name; p && *p; p++) /* the program's text: no control characters */
            *p = (unsigned char)*p < 0x20 || *p == 0x7f ? '?' : *p;
        row(b, t, (char *[]){name, u64_cell(b, x->entered),
                             u64_cell(b, x->open), u64_cell(b, x->allocs),
                             bytes_cell(b, x->bytes), bytes_cell(b, x->peak),
                             format(b, "%s%s", held, x->last_open ? " *" : "")});
    }
}

int rp_tables_build(const rp_summary *s, rp_tables *out)
{
    *out = (rp_tables){0};
    builder b = {out, false};
    trace_table(&b, s);
    calls_table(&b, s);
    callers_table(&b, s);
    sizes_table(&b, s);
    in_use_table(&b, s);
    timeline_table(&b, s);
    sites_table(&b, s);
    scopes_table(&b, s);
    failures_table(&b, s);
    if (b.failed) {
        rp_tables_free(out);
        return -1;
    }
    return 0;
}

void rp_tables_free(rp_tables *ts)
{
    for (size_t i = 0; i < ts->n; i++) {
        rp_table *t = &ts->t[i];
        for (size_t k = 0; k < t->nrows * (size_t)t->ncols; k++)
            free(t->cell[k]);
        free(t->cell);
        free(t->note);
    }
    free(ts->t);
    *ts = (rp_tables){0};
}
