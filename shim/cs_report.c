/* The statistics table printed at exit with CACHESHIM_STATS=1: rows are counters, columns
 * are devices, every column right-aligned to its widest cell. */
#include "cs_report.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---------------------------------------------------------------- the rows */

typedef enum {
    ROW_COUNT,        /* a counter of cacheshim_stats */
    ROW_BYTES,        /* a byte count of cacheshim_stats, human size */
    ROW_HIT_RATE,     /* hits / requests, rounded down: 100.0% only when every request hit */
    ROW_CALLS_SAVED,  /* driver calls the program asked for that the shim did not make */
    ROW_TIME_SAVED,   /* those calls at the costs of CS_REPORT_ALLOC_NS / CS_REPORT_FREE_NS */
    ROW_CAP,          /* cap_bytes, or "none" */
} row_kind;

typedef struct {
    const char *label;
    row_kind kind;
    size_t field;  /* ROW_COUNT, ROW_BYTES, ROW_CAP: the offset in cacheshim_stats */
} row;

#define FIELD(name) offsetof(cacheshim_stats, name)

static const row summary_rows[] = {
    {"requests", ROW_COUNT, FIELD(requests)},
    {"hit rate", ROW_HIT_RATE, 0},
    {"peak in use", ROW_BYTES, FIELD(peak_in_use)},
    {"peak reserved", ROW_BYTES, FIELD(peak_reserved)},
    {"cached now", ROW_BYTES, FIELD(bytes_cached)},
    {"driver calls saved", ROW_CALLS_SAVED, 0},
    {"est. time saved", ROW_TIME_SAVED, 0},
    {"OOM recoveries", ROW_COUNT, FIELD(oom_recoveries)},
    {"cap refusals", ROW_COUNT, FIELD(cap_refusals)},
};

static const row detail_rows[] = {
    {"hits", ROW_COUNT, FIELD(hits)},
    {"ordered hits", ROW_COUNT, FIELD(ordered_hits)},
    {"misses", ROW_COUNT, FIELD(misses)},
    {"frees", ROW_COUNT, FIELD(frees)},
    {"in use now", ROW_BYTES, FIELD(bytes_in_use)},
    {"peak requested", ROW_BYTES, FIELD(peak_requested)},
    {"driver allocations", ROW_COUNT, FIELD(driver_allocs)},
    {"driver frees", ROW_COUNT, FIELD(driver_frees)},
    {"releases", ROW_COUNT, FIELD(releases)},
    {"fences", ROW_COUNT, FIELD(fences)},
    {"fence waits", ROW_COUNT, FIELD(fence_waits)},
    {"OOM failures", ROW_COUNT, FIELD(oom_failures)},
    {"other paths now", ROW_BYTES, FIELD(bytes_outside)},
    {"cap", ROW_CAP, FIELD(cap_bytes)},
};

#define NSUMMARY (sizeof summary_rows / sizeof summary_rows[0])
#define NDETAILS (sizeof detail_rows / sizeof detail_rows[0])

/* ---------------------------------------------------------------- cells */

/* Integers only, here and in cs_bytes_format: the program's LC_NUMERIC cannot turn '.'
 * into ','. */
void cs_duration_format(int64_t ns, char *buf, size_t len)
{
    static const char *const units[] = {"us", "ms", "s"};
    static const uint64_t scale[] = {1000, 1000000, 1000000000};  /* ns per unit */
    if (ns == 0) {
        snprintf(buf, len, "0 us");
        return;
    }
    const char *sign = ns < 0 ? "-" : "";
    uint64_t v = ns < 0 ? 0 - (uint64_t)ns : (uint64_t)ns;
    size_t u = 0;
    while (u < 2 && v >= scale[u + 1])
        u++;
    for (;;) {
        uint64_t s = scale[u];
        uint64_t r2 = (v + s / 200) / (s / 100);  /* hundredths of the unit, rounded */
        uint64_t r1 = (v + s / 20) / (s / 10);
        uint64_t r0 = (v + s / 2) / s;
        if (r2 < 1000) {
            snprintf(buf, len, "%s%" PRIu64 ".%02" PRIu64 " %s", sign, r2 / 100, r2 % 100,
                     units[u]);
            return;
        }
        if (r1 < 1000) {
            snprintf(buf, len, "%s%" PRIu64 ".%" PRIu64 " %s", sign, r1 / 10, r1 % 10, units[u]);
            return;
        }
        if (r0 < 1000 || u == 2) {
            snprintf(buf, len, "%s%" PRIu64 " %s", sign, r0, units[u]);
            return;
        }
        u++;  /* 999.6 us rounds to 1000: 1.00 ms */
    }
}

static uint64_t field_of(const cacheshim_stats *s, size_t offset)
{
    uint64_t v;
    memcpy(&v, (const char *)s + offset, sizeof v);
    return v;
}

/* Net of the calls the shim added (releases, out-of-memory retries, the pooled backend's
 * several calls for one block), never below zero: a program whose blocks were each allocated
 * once and released saved nothing, it did not lose calls it would have made anyway. A request
 * the cap refused reached no driver and counts too. */
static int64_t allocs_saved(const cacheshim_stats *s)
{
    return s->requests > s->driver_allocs ? (int64_t)(s->requests - s->driver_allocs) : 0;
}

static int64_t frees_saved(const cacheshim_stats *s)
{
    return s->frees > s->driver_frees ? (int64_t)(s->frees - s->driver_frees) : 0;
}

/* timed: the time row's costs apply (device memory); for pinned host memory they do not, and
 * the cell says "-" rather than a number nobody measured. */
static void format_cell(const row *r, const cacheshim_stats *s, bool timed, char *buf,
                        size_t len)
{
    switch (r->kind) {
    case ROW_COUNT:
        snprintf(buf, len, "%" PRIu64, field_of(s, r->field));
        return;
    case ROW_BYTES:
        cs_bytes_format(field_of(s, r->field), buf, len);
        return;
    case ROW_HIT_RATE:
        if (s->requests == 0) {
            snprintf(buf, len, "-");
        } else {
            uint64_t tenths = s->hits * 1000 / s->requests;
            snprintf(buf, len, "%" PRIu64 ".%" PRIu64 "%%", tenths / 10, tenths % 10);
        }
        return;
    case ROW_CALLS_SAVED:
        snprintf(buf, len, "%" PRId64, allocs_saved(s) + frees_saved(s));
        return;
    case ROW_TIME_SAVED:
        if (!timed) {
            snprintf(buf, len, "-");
            return;
        }
        cs_duration_format(allocs_saved(s) * CS_REPORT_ALLOC_NS +
                               frees_saved(s) * CS_REPORT_FREE_NS,
                           buf, len);
        return;
    case ROW_CAP:
        if (s->cap_bytes == CS_UNLIMITED)
            snprintf(buf, len, "none");
        else
            cs_bytes_format(s->cap_bytes, buf, len);
        return;
    }
}

/* ---------------------------------------------------------------- the table */

/* A line outside the table, formatted. (tests/check_messages_doc.py finds emitf's formats,
 * so docs/troubleshooting.md must show each.) */
__attribute__((format(printf, 3, 4))) static void emitf(cs_report_fn emit, void *arg,
                                                        const char *fmt, ...)
{
    char text[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    emit(text, arg);
}

enum { CELL = 32, MAX_LINES = 2 + NSUMMARY + NDETAILS };

typedef struct {
    const char *label;
    bool heading;  /* the device names, not indented */
    char cells[CS_REPORT_COLUMNS][CELL];
} table_line;

/* A heading line and one line per row, for `cols` columns. Returns the lines added. */
static size_t add_block(table_line *out, const char *title, const row *rows, size_t nrows,
                        const char (*names)[CELL], const cacheshim_stats *st, int cols,
                        bool timed)
{
    out[0].label = title;
    out[0].heading = true;
    for (int c = 0; c < cols; c++)
        snprintf(out[0].cells[c], CELL, "%.*s", CELL - 1, names[c]);  /* a cell: cut to fit */
    for (size_t r = 0; r < nrows; r++) {
        out[1 + r].label = rows[r].label;
        out[1 + r].heading = false;
        for (int c = 0; c < cols; c++)
            format_cell(&rows[r], &st[c], timed, out[1 + r].cells[c], CELL);
    }
    return 1 + nrows;
}

static void emit_group(const char (*names)[CELL], const cacheshim_stats *st, int cols,
                       bool details, bool timed, cs_report_fn emit, void *arg)
{
    table_line lines[MAX_LINES];
    size_t n = add_block(lines, "statistics", summary_rows, NSUMMARY, names, st, cols, timed);
    if (details)
        n += add_block(lines + n, "details", detail_rows, NDETAILS, names, st, cols, timed);

    int label_width = 0, width[CS_REPORT_COLUMNS] = {0};
    for (size_t i = 0; i < n; i++) {
        int w = (int)strlen(lines[i].label) + (lines[i].heading ? 0 : 2);
        if (w > label_width)
            label_width = w;
        for (int c = 0; c < cols; c++)
            if ((int)strlen(lines[i].cells[c]) > width[c])
                width[c] = (int)strlen(lines[i].cells[c]);
    }
    for (size_t i = 0; i < n; i++) {
        char text[CS_REPORT_COLUMNS * (CELL + 4) + 64];
        int o = snprintf(text, sizeof text, "%s%-*s", lines[i].heading ? "" : "  ",
                         label_width - (lines[i].heading ? 0 : 2), lines[i].label);
        for (int c = 0; c < cols && o >= 0 && (size_t)o < sizeof text; c++)
            o += snprintf(text + o, sizeof text - (size_t)o, "  %*s", width[c], lines[i].cells[c]);
        emit(text, arg);
    }
}

void cs_report_stats(cs_cache *cache, bool details, cs_report_fn emit, void *arg)
{
    int devices[CS_MAX_DEVICES];
    int n = cs_cache_devices(cache, devices, CS_MAX_DEVICES);
    if (n == 0)
        emitf(emit, arg, "statistics: no device memory was allocated through the shim");
    for (int first = 0; first < n; first += CS_REPORT_COLUMNS) {
        int cols = n - first < CS_REPORT_COLUMNS ? n - first : CS_REPORT_COLUMNS;
        cacheshim_stats st[CS_REPORT_COLUMNS];
        char names[CS_REPORT_COLUMNS][CELL];
        for (int c = 0; c < cols; c++) {
            cs_cache_stats(cache, devices[first + c], &st[c]);  /* listed, so present */
            snprintf(names[c], CELL, "device %d", devices[first + c]);
        }
        emit_group((const char (*)[CELL])names, st, cols, details, true, emit, arg);
    }
    cacheshim_stats all;
    cs_cache_stats(cache, -1, &all);
    if (all.foreign_frees)
        emitf(emit, arg,
              "foreign frees: %" PRIu64 " (pointers the shim did not hand out, passed to the "
              "driver)",
              all.foreign_frees);
}

void cs_report_host_stats(cs_cache *host, bool details, cs_report_fn emit, void *arg)
{
    cacheshim_stats st;
    if (!cs_cache_stats(host, 0, &st))
        return;  /* no pinned host memory was allocated through the shim */
    static const char names[1][CELL] = {"pinned host"};
    emit_group(names, &st, 1, details, false, emit, arg);
}
