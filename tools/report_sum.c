/* The numbers of the report, from the events in time order: calls by name and by caller,
 * allocation sizes, bytes in use through each library over time, failed allocations. No
 * formatting here (report_table.c) and no I/O. */
#include "report.h"

#include <stdlib.h>
#include <string.h>

/* a * b / c without overflow: trace clocks can be large and slices many. */
static uint64_t mul_div(uint64_t a, uint64_t b, uint64_t c)
{
    return (uint64_t)((unsigned __int128)a * b / c);
}

uint64_t rp_slice_start(const rp_summary *s, size_t i, size_t n)
{
    return s->t_first + mul_div(s->t_last - s->t_first, i, n);
}

/* The slice of n that time x falls in: slice i holds [start(i), start(i + 1)); the last
 * also holds t_last. */
static size_t slice_of(const rp_summary *s, uint64_t x, size_t n)
{
    uint64_t span = s->t_last - s->t_first;
    if (span == 0)
        return 0;
    size_t i = (size_t)mul_div(x - s->t_first, n, span);
    while (i > 0 && rp_slice_start(s, i, n) > x) /* start(i) rounds down: step back to it */
        i--;
    while (i + 1 < n && rp_slice_start(s, i + 1, n) <= x)
        i++;
    return i < n ? i : n - 1;
}

/* ---- calls by name --------------------------------------------------------------------------- */

typedef struct {
    uint32_t group;
    uint64_t dur;
} timing;

static int by_group_then_dur(const void *a, const void *b)
{
    const timing *x = a, *y = b;
    if (x->group != y->group)
        return x->group < y->group ? -1 : 1;
    return x->dur < y->dur ? -1 : x->dur > y->dur;
}

static const rp_trace *sort_trace; /* for the comparator of the calls table */
static bool sort_timed;

static int by_weight(const void *a, const void *b)
{
    const rp_call_stat *x = a, *y = b;
    uint64_t wx = sort_timed ? x->total_ns : x->calls, wy = sort_timed ? y->total_ns : y->calls;
    if (wx != wy)
        return wx > wy ? -1 : 1;
    int c = strcmp(rp_str(sort_trace, x->name), rp_str(sort_trace, y->name));
    return c ? c : x->lib - y->lib;
}

/* Nearest rank: the smallest duration with at least p % of the calls at or below it. */
static uint64_t percentile(const timing *sorted, uint64_t n, unsigned p)
{
    uint64_t rank = (n * p + 99) / 100;
    return sorted[rank ? rank - 1 : 0].dur;
}

static int calls_by_name(const rp_trace *t, rp_summary *s)
{
    uint32_t *group = malloc(t->nstr * RP_NLIB * sizeof *group);
    timing *tm = malloc(t->nev * sizeof *tm);
    s->calls = calloc(t->nstr * RP_NLIB, sizeof *s->calls);
    if (!group || !tm || !s->calls) {
        free(group);
        free(tm);
        return -1;
    }
    for (size_t i = 0; i < t->nstr * RP_NLIB; i++)
        group[i] = UINT32_MAX;
    for (size_t i = 0; i < t->nev; i++) {
        const rp_event *e = &t->ev[i];
        uint32_t *g = &group[(size_t)e->name * RP_NLIB + e->lib];
        if (*g == UINT32_MAX) {
            *g = (uint32_t)s->ncalls++;
            s->calls[*g] = (rp_call_stat){.name = e->name, .lib = e->lib};
        }
        rp_call_stat *c = &s->calls[*g];
        c->calls++;
        c->failed += e->result != 0;
        c->total_ns += e->dur;
        if (e->dur > c->max_ns)
            c->max_ns = e->dur;
        tm[i] = (timing){*g, e->dur};
    }
    qsort(tm, t->nev, sizeof *tm, by_group_then_dur);
    for (size_t i = 0; i < t->nev;) {
        rp_call_stat *c = &s->calls[tm[i].group];
        c->p50_ns = percentile(tm + i, c->calls, 50);
        c->p99_ns = percentile(tm + i, c->calls, 99);
        i += c->calls;
    }
    sort_trace = t;
    sort_timed = t->timed;
    qsort(s->calls, s->ncalls, sizeof *s->calls, by_weight);
    free(group);
    free(tm);
    return 0;
}

/* ---- calls by caller ------------------------------------------------------------------------- */

static int calls_by_caller(const rp_trace *t, rp_summary *s)
{
    rp_caller_stat m[RP_NFROM][RP_NLIB] = {{{0}}};
    for (size_t i = 0; i < t->nev; i++) {
        const rp_event *e = &t->ev[i];
        rp_caller_stat *c = &m[e->from][e->lib];
        c->calls++;
        c->failed += e->result != 0;
        c->total_ns += e->dur;
        if (e->result == 0 && e->role == RP_ROLE_ALLOC) {
            c->allocs++;
            c->alloc_bytes += e->size;
        }
        c->frees += e->result == 0 && e->role == RP_ROLE_FREE;
    }
    s->callers = calloc(RP_NFROM * RP_NLIB, sizeof *s->callers);
    if (!s->callers)
        return -1;
    for (int f = 0; f < RP_NFROM; f++)
        for (int l = 0; l < RP_NLIB; l++)
            if (m[f][l].calls) {
                s->callers[s->ncallers] = m[f][l];
                s->callers[s->ncallers].from = (uint8_t)f;
                s->callers[s->ncallers].lib = (uint8_t)l;
                s->ncallers++;
            }
    return 0;
}

/* ---- bytes in use ---------------------------------------------------------------------------- */

/* Live allocations: a chained hash of (pid, lib, handle?, address) → size, nodes from one
 * pool (at most one node per allocation event). */
typedef struct {
    uint64_t ptr, size;
    int64_t pid;
    uint32_t band; /* its band (the program's library), UINT32_MAX none */
    uint32_t next; /* node index + 1, 0 ends the chain */
    uint8_t lib, handle;
} node;

typedef struct {
    uint32_t *bucket;
    size_t nbucket;
    node *pool;
    uint32_t nused, free_list;
} live_map;

static uint32_t *slot(live_map *m, const rp_event *e)
{
    uint64_t h = (e->ptr >> 8 ^ e->ptr ^ (uint64_t)e->pid * 0x9e3779b97f4a7c15u) +
                 e->lib * 31u + e->handle;
    uint32_t *p = &m->bucket[(h * 0x9e3779b97f4a7c15u >> 20) & (m->nbucket - 1)];
    while (*p) {
        node *n = &m->pool[*p - 1];
        if (n->ptr == e->ptr && n->pid == e->pid && n->lib == e->lib && n->handle == e->handle)
            break;
        p = &n->next;
    }
    return p;
}

static void bucket_add(rp_series *r, uint64_t size)
{
    int b = 0;
    while (b < 64 && (size >> b) > 1)
        b++;
    b = size ? b + 1 : 0; /* bucket 0: size 0; bucket k + 1: [2^k, 2^(k+1)) */
    r->hist_count[b]++;
    r->hist_bytes[b] += size;
}

/* The value v, held from the last change until time x, covers the slices from *at (where
 * that change fell) to the slice of x, the latter only if x is past its start: from x on
 * the new value holds. */
static void hold(const rp_summary *s, uint64_t *max, size_t n, size_t *at, uint64_t v, uint64_t x)
{
    size_t i = slice_of(s, x, n);
    for (size_t k = *at; k < i; k++)
        if (max[k] < v)
            max[k] = v;
    if (x > rp_slice_start(s, i, n) && max[i] < v)
        max[i] = v;
    *at = i;
}

/* A library's bytes in use now, and the slice and plot column of its last change. */
typedef struct {
    uint64_t cur;
    size_t slice, col;
} cursor;

static void advance(const rp_summary *s, rp_series *r, cursor *c, uint64_t x)
{
    hold(s, r->slice_max, s->nslices, &c->slice, c->cur, x);
    hold(s, r->col_max, s->ncols, &c->col, c->cur, x);
}

/* The value after a change, in the slice and column of the change. */
static void mark(rp_series *r, const cursor *c)
{
    if (r->slice_max[c->slice] < c->cur)
        r->slice_max[c->slice] = c->cur;
    if (r->col_max[c->col] < c->cur)
        r->col_max[c->col] = c->cur;
}

/* The band of an allocation of the program's library; UINT32_MAX for other libraries. */
static uint32_t new_band(rp_summary *s, const rp_event *e, uint64_t when)
{
    if (e->lib != s->prog_lib)
        return UINT32_MAX;
    s->has_stacks |= e->stack != RP_NO_STRING;
    s->bands[s->nbands] = (rp_band){when, UINT64_MAX, e->size, e->stack};
    return (uint32_t)s->nbands++;
}

/* A band ends at its free, never before its start: a free of the address that begins
 * before the allocation's call ended (another thread's, or a made-up trace) ends it there. */
static void end_band(rp_summary *s, uint32_t band, uint64_t when)
{
    if (band != UINT32_MAX)
        s->bands[band].end = when > s->bands[band].start ? when : s->bands[band].start;
}

/* Whose allocations are the program's: what it asked of the cache, else of cudart, else the
 * allocation trace, else the driver; the driver beside them is what the process reserved. */
static void choose_libs(const rp_trace *t, rp_summary *s)
{
    bool present[RP_NLIB] = {false};
    for (size_t i = 0; i < t->nev; i++)
        present[t->ev[i].lib] |= t->ev[i].role != RP_ROLE_NONE;
    s->prog_lib = present[RP_LIB_SHIM] ? RP_LIB_SHIM : present[RP_LIB_RUNTIME] ? RP_LIB_RUNTIME
                : present[RP_LIB_TRACE] ? RP_LIB_TRACE : RP_LIB_DRIVER;
    s->reserved_lib = s->prog_lib != RP_LIB_DRIVER && present[RP_LIB_DRIVER] ? RP_LIB_DRIVER : -1;
}

static int by_stack(const void *a, const void *b)
{
    const rp_site *x = a, *y = b;
    return x->stack < y->stack ? -1 : x->stack > y->stack;
}

static int by_bytes(const void *a, const void *b)
{
    const rp_site *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return by_stack(a, b);
}

/* The call sites of what was live at the program's peak, most bytes first. */
static int sites_at_peak(rp_summary *s)
{
    const rp_series *r = &s->series[s->prog_lib];
    if (!s->has_stacks || !r->peak)
        return 0;
    s->sites = malloc(s->nbands * sizeof *s->sites);
    if (!s->sites)
        return -1;
    size_t n = 0;
    for (size_t i = 0; i < s->nbands; i++) {
        const rp_band *b = &s->bands[i];
        if (b->start <= r->peak_t && b->end > r->peak_t)
            s->sites[n++] = (rp_site){b->stack, b->size, 1, NULL};
    }
    qsort(s->sites, n, sizeof *s->sites, by_stack);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (k && s->sites[k - 1].stack == s->sites[i].stack) {
            s->sites[k - 1].bytes += s->sites[i].bytes;
            s->sites[k - 1].count++;
        } else {
            s->sites[k++] = s->sites[i];
        }
    }
    qsort(s->sites, k, sizeof *s->sites, by_bytes);
    s->nsites = k;
    return 0;
}

static int bytes_in_use(const rp_trace *t, rp_summary *s)
{
    live_map m = {0};
    size_t nalloc = 0;
    for (size_t i = 0; i < t->nev; i++)
        nalloc += t->ev[i].role == RP_ROLE_ALLOC;
    for (m.nbucket = 64; m.nbucket < nalloc * 2; m.nbucket *= 2)
        ;
    m.bucket = calloc(m.nbucket, sizeof *m.bucket);
    m.pool = malloc((nalloc ? nalloc : 1) * sizeof *m.pool);
    s->failures = malloc((nalloc ? nalloc : 1) * sizeof *s->failures);
    bool ok = m.bucket && m.pool && s->failures;
    for (int l = 0; l < RP_NLIB && ok; l++) {
        s->series[l].slice_max = calloc(s->nslices, sizeof(uint64_t));
        s->series[l].col_max = calloc(s->ncols, sizeof(uint64_t));
        ok = s->series[l].slice_max && s->series[l].col_max;
    }
    if (!ok) {
        free(m.bucket);
        free(m.pool);
        return -1;
    }
    s->bands = malloc((nalloc ? nalloc : 1) * sizeof *s->bands);
    if (!s->bands) {
        free(m.bucket);
        free(m.pool);
        return -1;
    }
    cursor cur[RP_NLIB] = {{0}};
    for (size_t i = 0; i < t->nev; i++) {
        const rp_event *e = &t->ev[i];
        if (e->role == RP_ROLE_NONE)
            continue;
        rp_series *r = &s->series[e->lib];
        cursor *c = &cur[e->lib];
        uint64_t when = rp_when(e);
        r->present = true;
        if (e->result != 0) {
            r->failed += e->role == RP_ROLE_ALLOC;
            if (e->role == RP_ROLE_ALLOC)
                s->failures[s->nfailures++] = (rp_failure){i, c->cur};
            continue;
        }
        advance(s, r, c, when);
        uint32_t *p = slot(&m, e);
        if (e->role == RP_ROLE_ALLOC) {
            r->allocs++;
            bucket_add(r, e->size);
            if (*p) { /* still live: its free was not traced; this allocation replaces it */
                node *n = &m.pool[*p - 1];
                r->reused++;
                c->cur -= n->size;
                n->size = e->size;
                end_band(s, n->band, when);
                n->band = new_band(s, e, when);
            } else {
                uint32_t k = m.free_list ? m.free_list : ++m.nused;
                node *n = &m.pool[k - 1];
                m.free_list = m.free_list ? n->next : 0;
                *n = (node){e->ptr, e->size, e->pid, new_band(s, e, when), 0, e->lib, e->handle};
                *p = k;
                r->live_end++;
            }
            c->cur += e->size;
            if (c->cur > r->peak) {
                r->peak = c->cur;
                r->peak_t = when;
            }
        } else if (*p) {
            uint32_t k = *p;
            node *n = &m.pool[k - 1];
            r->frees++;
            c->cur -= n->size;
            end_band(s, n->band, when);
            r->live_end--;
            *p = n->next;
            n->next = m.free_list;
            m.free_list = k;
        } else {
            r->unknown_frees++;
        }
        mark(r, c);
    }
    for (int l = 0; l < RP_NLIB; l++) {
        advance(s, &s->series[l], &cur[l], s->t_last);
        mark(&s->series[l], &cur[l]);
        s->series[l].end = cur[l].cur;
    }
    free(m.bucket);
    free(m.pool);
    return 0;
}

/* ---- processes and threads ------------------------------------------------------------------- */

typedef struct {
    int64_t pid, tid;
} thread_id;

static int by_thread(const void *a, const void *b)
{
    const thread_id *x = a, *y = b;
    if (x->pid != y->pid)
        return x->pid < y->pid ? -1 : 1;
    return x->tid < y->tid ? -1 : x->tid > y->tid;
}

static int count_threads(const rp_trace *t, rp_summary *s)
{
    thread_id *ids = malloc(t->nev * sizeof *ids);
    if (!ids)
        return -1;
    for (size_t i = 0; i < t->nev; i++)
        ids[i] = (thread_id){t->ev[i].pid, t->ev[i].tid};
    qsort(ids, t->nev, sizeof *ids, by_thread);
    for (size_t i = 0; i < t->nev; i++) {
        if (i == 0 || ids[i].pid != ids[i - 1].pid)
            s->npids++;
        if (i == 0 || by_thread(&ids[i], &ids[i - 1]))
            s->ntids++;
    }
    free(ids);
    return 0;
}

int rp_summarize(const rp_trace *t, size_t nslices, size_t ncols, rp_summary *s)
{
    *s = (rp_summary){.trace = t, .nslices = nslices, .ncols = ncols};
    s->t_first = UINT64_MAX;
    for (size_t i = 0; i < t->nev; i++) {
        if (t->ev[i].t < s->t_first)
            s->t_first = t->ev[i].t;
        if (t->ev[i].t + t->ev[i].dur > s->t_last)
            s->t_last = t->ev[i].t + t->ev[i].dur;
    }
    if (t->nev == 0)
        s->t_first = 0;
    /* No slice shorter than a nanosecond: fewer slices for a trace that spans fewer. */
    uint64_t span = s->t_last - s->t_first;
    if (span < s->nslices)
        s->nslices = span ? (size_t)span : 1;
    if (span < s->ncols)
        s->ncols = span ? (size_t)span : 1;
    choose_libs(t, s);
    if (calls_by_name(t, s) || calls_by_caller(t, s) || bytes_in_use(t, s) ||
        count_threads(t, s) || sites_at_peak(s) || rp_scopes(t, s)) {
        rp_summary_free(s);
        return -1;
    }
    return 0;
}

void rp_summary_free(rp_summary *s)
{
    free(s->calls);
    free(s->callers);
    free(s->failures);
    free(s->bands);
    for (size_t i = 0; i < s->nsites; i++)
        free(s->sites[i].where);
    free(s->sites);
    free(s->scope_entries);
    free(s->scopes);
    for (int l = 0; l < RP_NLIB; l++) {
        free(s->series[l].slice_max);
        free(s->series[l].col_max);
    }
    *s = (rp_summary){0};
}
