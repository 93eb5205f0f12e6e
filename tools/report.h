/* cacheshim-report: summary tables and an HTML page from a recorded trace (docs/report.md).
 *
 * One layer a file, each using only the ones above it:
 *   trace_input.c   a trace file (plain or gzipped, zlib) or a buffer, line by line
 *   report_json.c   one JSON Lines record of libcacheaudit.so into an event (jansson)
 *   report_read.c   a whole trace into events (JSON Lines or the allocation format)
 *   report_sum.c    the numbers: calls, callers, sizes, bytes in use over time, failures,
 *                   each allocation's lifetime and the call sites holding memory at the peak
 *   report_scope.c  the program's scopes (cacheshim.h): what was allocated in each
 *   report_sym.c    call sites' addresses into functions, files and lines (libdw)
 *   report_table.c  the numbers as tables of text cells, shared by both outputs
 *   report_text.c   the tables aligned on stdout
 *   report_html.c   the tables, the plot (report_svg.c) and the memory timeline
 *                   (report_timeline.c) as one self-contained HTML page
 *   report_main.c   the command line */
#ifndef REPORT_H
#define REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The tool named in messages: cacheshim-replay compiles the readers with its own name. */
#ifndef REPORT_NAME
#define REPORT_NAME "cacheshim-report"
#endif

/* ---------------------------------------------------------------- events (report_read.c) */

/* Where a call went. RP_LIB_TRACE: the allocation-trace format, which does not say. */
enum { RP_LIB_DRIVER, RP_LIB_SHIM, RP_LIB_RUNTIME, RP_LIB_TRACE, RP_NLIB };
/* Who made it. RP_FROM_NONE: not recorded (allocation traces). */
enum { RP_FROM_APP, RP_FROM_SHIM, RP_FROM_CUDART, RP_FROM_NONE, RP_NFROM };
/* What it does to device bytes: the calls and rules of the tracer's counter (audit/ca_mem.c). */
enum { RP_ROLE_NONE, RP_ROLE_ALLOC, RP_ROLE_FREE };
/* A call of the shim's scopes (cacheshim_scope_begin, cacheshim_scope_end). */
enum { RP_SCOPE_NONE, RP_SCOPE_BEGIN, RP_SCOPE_END };

#define RP_NO_STRING UINT32_MAX

typedef struct {
    uint64_t t;       /* start, ns on the trace's clock */
    uint64_t dur;     /* ns; 0 where the format has no durations */
    uint64_t ptr;     /* allocation: the address or handle handed out; free: the one given back */
    uint64_t size;    /* allocation (failed ones too): bytes asked */
    uint64_t line;    /* line number in the file, for messages and the failure table */
    int64_t result;   /* CUresult / cudaError_t; 0 success */
    int64_t pid, tid;
    uint32_t name;    /* string index */
    uint32_t result_name; /* string index or RP_NO_STRING */
    uint32_t stack;   /* call site ("PID 0xPC 0xPC..." interned) or RP_NO_STRING */
    uint32_t scope_name; /* RP_SCOPE_BEGIN: the scope's name (string index) */
    uint8_t lib, from, role, scope;
    uint8_t handle;   /* ptr is a cuMemCreate handle, not an address */
} rp_event;

/* When a call changes bytes in use: an allocation at the end of its call (when the program
 * has the pointer), a free at its start (another thread may be handed the same address
 * before the free returns). Other calls: at their end. */
static inline uint64_t rp_when(const rp_event *e)
{
    return e->role == RP_ROLE_FREE ? e->t : e->t + e->dur;
}

enum { RP_FORMAT_JSONL, RP_FORMAT_ALLOC };

/* Most frames of one call site. */
#define RP_STACK_MAX 64

/* Where a library of a traced process was loaded (the tracer's "object" records). */
typedef struct {
    int64_t pid;
    uint64_t base;      /* load bias */
    uint32_t path, build_id; /* strings; build_id "" when unknown */
} rp_object;

typedef struct {
    const char *path;
    int format;
    bool timed;            /* calls have durations (JSON Lines) */
    rp_event *ev;          /* sorted by rp_when, then line */
    size_t nev, evcap;
    uint64_t other_lines;  /* JSON Lines: lines not starting with '{' (a program's own output) */
    rp_object *obj;        /* call sites' objects, in file order */
    size_t nobj, objcap;
    /* Interned strings: names and result names. */
    char **str;
    size_t nstr, strcap;
    uint32_t *hash;        /* open addressing, index + 1, 0 empty */
    size_t hashcap;
} rp_trace;

/* Reads a whole trace, detecting its format from the content. 0 on success; otherwise a
 * message on stderr and 2 (unreadable, malformed, unsupported format, no events) or 1 (out
 * of host memory). */
int rp_trace_load(rp_trace *t, const char *path);
/* The same from len bytes at data (the fuzzers); path names it in messages. */
int rp_trace_load_mem(rp_trace *t, const char *path, const void *data, size_t len);
bool rp_object_add(rp_trace *t, const rp_object *o);
void rp_trace_free(rp_trace *t);
const char *rp_str(const rp_trace *t, uint32_t i);
/* The index of s (copied), RP_NO_STRING when out of memory. */
uint32_t rp_intern(rp_trace *t, const char *s, size_t n);

const char *rp_lib_name(int lib);
const char *rp_from_name(int from);

/* ---------------------------------------------------------------- JSON Lines (report_json.c) */

/* Parses one line of len bytes into e, interning strings in t. 0 for a call; 1 for an
 * object record (added to t); -1 when malformed, with a reason in *why and the 1-based
 * column in *col (0 when the JSON is valid but a field is wrong); -2 out of host memory. */
int rp_json_record(const char *line, size_t len, rp_trace *t, rp_event *e, const char **why,
                   size_t *col);

/* ---------------------------------------------------------------- the numbers (report_sum.c) */

typedef struct {
    uint32_t name;
    uint8_t lib;
    uint64_t calls, failed;
    uint64_t total_ns, max_ns, p50_ns, p99_ns;
} rp_call_stat;

typedef struct {
    uint8_t from, lib;
    uint64_t calls, failed, total_ns;
    uint64_t allocs, alloc_bytes, frees;
} rp_caller_stat;

#define RP_NBUCKETS 65 /* 0, then [2^k, 2^(k+1)) for k = 0..63 */

/* Bytes in use through one library: what its successful allocations handed out and its
 * frees have not given back. */
typedef struct {
    bool present;               /* the library allocated, freed or failed to allocate */
    uint64_t peak, peak_t;      /* highest value, and when it was first reached (end of call) */
    uint64_t end, live_end;     /* bytes and allocations still live at the end */
    uint64_t allocs, frees, failed;
    uint64_t unknown_frees;     /* frees of pointers with no live allocation in the trace */
    uint64_t reused;            /* allocations of a pointer still live (its free not seen) */
    uint64_t hist_count[RP_NBUCKETS], hist_bytes[RP_NBUCKETS];
    uint64_t *slice_max;        /* per timeline slice: highest bytes in use */
    uint64_t *col_max;          /* the same per plot column */
} rp_series;

/* One successful allocation of the program's library, from the end of its call to the start
 * of its free (UINT64_MAX: not freed in the trace). */
typedef struct {
    uint64_t start, end, size;
    uint32_t stack;     /* call site or RP_NO_STRING */
} rp_band;

/* A call site's share of the program's bytes at its peak. */
typedef struct {
    uint32_t stack;     /* RP_NO_STRING: allocations recorded without a call site */
    uint64_t bytes, count;
    char *where;        /* symbolized frames (report_sym.c), or NULL */
} rp_site;

#define RP_MAX_SITES 20 /* rows of the sites table */

typedef struct {
    size_t ev;          /* index into the trace's events */
    uint64_t in_use;    /* bytes in use through the same library when it failed */
} rp_failure;

/* One entry into a scope: from the end of its begin call to the start of its end call
 * (UINT64_MAX: still open when the trace ends), and the program's allocations on its
 * thread meanwhile (inner scopes' too). held: bytes of those not freed at its end. */
typedef struct {
    uint32_t name;
    int64_t pid, tid;
    uint64_t start, end;
    uint32_t parent, depth;   /* the entry it is nested in (UINT32_MAX none), how deep */
    uint64_t allocs, bytes, peak, held;
} rp_scope_entry;

/* A scope's entries added up per name, as the shim's exit report: peak the highest of
 * them, held_at_end the last entry's (at the trace's end when it is still open). */
typedef struct {
    uint32_t name;
    uint64_t entered, open;   /* entries, and those with no end in the trace */
    uint64_t allocs, bytes, peak, held_at_end;
    bool last_open;
} rp_scope_stat;

typedef struct {
    const rp_trace *trace;
    uint64_t t_first, t_last;   /* first start, last end */
    uint64_t npids, ntids;
    rp_call_stat *calls;        /* by total time (or count), largest first */
    size_t ncalls;
    rp_caller_stat *callers;    /* by caller, then library */
    size_t ncallers;
    rp_series series[RP_NLIB];
    rp_failure *failures;       /* every failed allocation, in time order */
    size_t nfailures;
    size_t nslices, ncols;      /* as asked, or fewer: no slice under 1 ns */
    int prog_lib;               /* the program's own allocations: shim, runtime, trace or driver */
    int reserved_lib;           /* what the process held of the driver beside them, or -1 */
    rp_band *bands;             /* every allocation of prog_lib, in time order */
    size_t nbands;
    bool has_stacks;            /* some allocation has a call site */
    rp_site *sites;             /* at prog_lib's peak, most bytes first */
    size_t nsites;
    rp_scope_entry *scope_entries; /* in order of entry */
    size_t nscope_entries;
    rp_scope_stat *scopes;      /* per name, in order of first entry */
    size_t nscopes;
} rp_summary;

/* Computes everything from t with nslices timeline slices and ncols plot columns (both
 * >= 1; fewer when the trace spans fewer nanoseconds). 0, or -1 when out of host memory. */
int rp_summarize(const rp_trace *t, size_t nslices, size_t ncols, rp_summary *s);
void rp_summary_free(rp_summary *s);
/* The scopes of s from t (report_scope.c; after the bands). 0, or -1 when out of memory. */
int rp_scopes(const rp_trace *t, rp_summary *s);
/* Start time of slice i of n over the trace's span ([t_first, t_last]). */
uint64_t rp_slice_start(const rp_summary *s, size_t i, size_t n);

/* ---------------------------------------------------------------- call sites (report_sym.c) */

/* The frames of site (an interned "PID 0xPC ...") as "function (file:line) < ..." from the
 * trace's objects and their files' debug information; frames that cannot be resolved as
 * "object+0xOFFSET" or the address. A malloc'ed string, or NULL when out of memory. */
char *rp_sym_site(const rp_trace *t, uint32_t site);
/* Symbolizes the summary's first RP_MAX_SITES sites. 0, or -1 when out of memory. */
int rp_sym_sites(rp_summary *s);

/* ---------------------------------------------------------------- tables (report_table.c) */

#define RP_MAXCOLS 16

typedef struct {
    const char *id;          /* stable name, for the HTML page and tests */
    const char *title;
    char *note;              /* a sentence or two under the title, or NULL */
    int ncols;
    char head[RP_MAXCOLS][32];
    unsigned right;          /* bit c: column c is numeric, aligned right */
    char **cell;             /* nrows * ncols strings */
    size_t nrows, cap;
} rp_table;

typedef struct {
    rp_table *t;
    size_t n;
} rp_tables;

/* Every table of the report, in order. 0, or -1 when out of host memory. */
int rp_tables_build(const rp_summary *s, rp_tables *out);
void rp_tables_free(rp_tables *ts);

/* ---------------------------------------------------------------- output */

/* Text tables; 0 or -1 on a write error. */
int rp_text_write(FILE *f, const rp_tables *ts);
/* The HTML page; 0 or -1 on a write error. */
int rp_html_write(FILE *f, const rp_summary *s, const rp_tables *ts);
/* Columns of the plot: the summary's ncols for the HTML page, one a pixel. */
#define RP_PLOT_COLUMNS 840
/* text escaped for HTML (report_html.c); bytes that are not UTF-8 and control characters
 * as U+FFFD. */
void rp_put_escaped(FILE *f, const char *text);
/* The inline SVG plot of bytes in use over time. */
void rp_svg_write(FILE *f, const rp_summary *s);
/* Allocations drawn one band each at most (the largest by bytes x lifetime); the rest as one
 * area. */
#define RP_MAX_BANDS 2000
/* The memory timeline (report_timeline.c): each allocation a band over time, stacked, with
 * the driver's reserved bytes beside. 0, or -1 when out of memory. */
int rp_timeline_write(FILE *f, const rp_summary *s);
/* Shared with report_timeline.c: the axes' units and steps. */
typedef struct {
    double div;
    const char *name;
} rp_unit;
rp_unit rp_bytes_unit(uint64_t max);
rp_unit rp_time_unit(uint64_t span);
double rp_nice_step(double max);

/* Shared formatting (report_table.c): "123.456789" s from ns, bytes as "1.50 MiB". */
void rp_fmt_seconds(uint64_t ns, char *buf, size_t len);
void rp_fmt_bytes(uint64_t bytes, char *buf, size_t len);
/* What a library's bytes in use mean, for notes and the legend. */
const char *rp_series_meaning(int lib);

#endif
