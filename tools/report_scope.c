/* The program's scopes (cacheshim_scope_begin / _end, recorded by the tracer): each entry's
 * allocations, bytes, peak and what it still held at its end, from the allocations of the
 * program's library made on its thread while it was open, as the shim counts them
 * (shim/cs_scope.c): an allocation counts in every scope open on its thread, its free (by any
 * thread) takes it out of them. Runs after the bytes in use (report_sum.c), whose bands are
 * the program's allocations in event order, each with the time of its free. */
#include "report.h"

#include <stdlib.h>

/* A thread and its innermost open scope entry. */
typedef struct {
    int64_t pid, tid;
    uint32_t top; /* entry index, UINT32_MAX none */
} thread_top;

/* One allocation's size entering (+) or leaving (-) an entry's count. */
typedef struct {
    uint32_t entry;
    uint64_t when, size;
    bool add;
} delta;

static int by_entry_then_time(const void *a, const void *b)
{
    const delta *x = a, *y = b;
    if (x->entry != y->entry)
        return x->entry < y->entry ? -1 : 1;
    if (x->when != y->when)
        return x->when < y->when ? -1 : 1;
    return (int)x->add - (int)y->add; /* a free before an allocation at the same time */
}

static thread_top *thread_of(thread_top **th, size_t *n, size_t *cap, const rp_event *e)
{
    for (size_t i = 0; i < *n; i++)
        if ((*th)[i].pid == e->pid && (*th)[i].tid == e->tid)
            return &(*th)[i];
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 16;
        thread_top *p = realloc(*th, c * sizeof *p);
        if (!p)
            return NULL;
        *th = p;
        *cap = c;
    }
    (*th)[*n] = (thread_top){e->pid, e->tid, UINT32_MAX};
    return &(*th)[(*n)++];
}

/* Entries from begins and ends, and for each band the innermost entry open on its thread. */
static int entries(const rp_trace *t, rp_summary *s, uint32_t *band_top)
{
    thread_top *th = NULL;
    size_t nth = 0, thcap = 0, cap = 0, band = 0;
    for (size_t i = 0; i < t->nev; i++) {
        const rp_event *e = &t->ev[i];
        bool alloc = e->role == RP_ROLE_ALLOC && e->result == 0 && e->lib == s->prog_lib;
        if (!alloc && (e->scope == RP_SCOPE_NONE || e->result != 0))
            continue;
        thread_top *me = thread_of(&th, &nth, &thcap, e);
        if (!me)
            goto oom;
        if (alloc) {
            band_top[band++] = me->top;
        } else if (e->scope == RP_SCOPE_END) {
            if (me->top != UINT32_MAX) { /* else its begin was not traced */
                s->scope_entries[me->top].end = e->t;
                me->top = s->scope_entries[me->top].parent;
            }
        } else {
            if (s->nscope_entries == cap) {
                cap = cap ? cap * 2 : 16;
                rp_scope_entry *p = realloc(s->scope_entries, cap * sizeof *p);
                if (!p)
                    goto oom;
                s->scope_entries = p;
            }
            uint32_t depth = me->top == UINT32_MAX ? 0 : s->scope_entries[me->top].depth + 1;
            s->scope_entries[s->nscope_entries] = (rp_scope_entry){
                .name = e->scope_name, .pid = e->pid, .tid = e->tid, .start = e->t + e->dur,
                .end = UINT64_MAX, .parent = me->top, .depth = depth};
            me->top = (uint32_t)s->nscope_entries++;
        }
    }
    free(th);
    return 0;
oom:
    free(th);
    return -1;
}

/* Each entry's numbers from the bands counted in it, in time order. */
static int count(rp_summary *s, const uint32_t *band_top)
{
    size_t n = 0;
    for (size_t k = 0; k < s->nbands; k++)
        for (uint32_t x = band_top[k]; x != UINT32_MAX; x = s->scope_entries[x].parent)
            n += 2;
    delta *d = malloc((n ? n : 1) * sizeof *d);
    if (!d)
        return -1;
    n = 0;
    for (size_t k = 0; k < s->nbands; k++) {
        const rp_band *b = &s->bands[k];
        for (uint32_t x = band_top[k]; x != UINT32_MAX; x = s->scope_entries[x].parent) {
            d[n++] = (delta){x, b->start, b->size, true};
            d[n++] = (delta){x, b->end, b->size, false};
        }
    }
    qsort(d, n, sizeof *d, by_entry_then_time);
    for (size_t i = 0; i < n; i++) {
        rp_scope_entry *x = &s->scope_entries[d[i].entry];
        if (d[i].add) {
            x->allocs++;
            x->bytes += d[i].size;
            x->held += d[i].size;
            x->peak = x->held > x->peak ? x->held : x->peak;
        } else if (d[i].when <= x->end && d[i].when != UINT64_MAX) {
            x->held -= d[i].size; /* freed while the entry was open (or before the trace's end) */
        }
    }
    free(d);
    return 0;
}

/* Per name, in the order of first entry. */
static int by_name(rp_summary *s)
{
    s->scopes = calloc(s->nscope_entries ? s->nscope_entries : 1, sizeof *s->scopes);
    if (!s->scopes)
        return -1;
    for (size_t i = 0; i < s->nscope_entries; i++) {
        const rp_scope_entry *x = &s->scope_entries[i];
        size_t k = 0;
        while (k < s->nscopes && s->scopes[k].name != x->name)
            k++;
        rp_scope_stat *st = &s->scopes[k];
        if (k == s->nscopes) {
            s->nscopes++;
            st->name = x->name;
        }
        st->entered++;
        st->open += x->end == UINT64_MAX;
        st->allocs += x->allocs;
        st->bytes += x->bytes;
        st->peak = x->peak > st->peak ? x->peak : st->peak;
        st->held_at_end = x->held; /* the last entry's, as the shim's exit report */
        st->last_open = x->end == UINT64_MAX;
    }
    return 0;
}

int rp_scopes(const rp_trace *t, rp_summary *s)
{
    uint32_t *band_top = malloc((s->nbands ? s->nbands : 1) * sizeof *band_top);
    int rc = band_top && !entries(t, s, band_top) && !count(s, band_top) && !by_name(s) ? 0 : -1;
    free(band_top);
    return rc;
}
