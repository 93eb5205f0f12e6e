/* Fake CUDA driver: the timeline. Units of work on streams, what each is ordered after (a
 * vector clock), and their completion. The ordering model itself, which calls add what
 * order, is described at the top of fake_stream.c.
 *
 * Completion. A stream's units complete in order, so a stream only counts how many have
 * completed. Completing a unit first completes everything it is ordered after, because a
 * GPU cannot finish work before the work it waits for. Units complete when a test retires
 * them or when a synchronizing call waits for them. */
#include "fake_internal.h"

#include <stdlib.h>

struct fake_unit {
    uint64_t seq;            /* its number on its stream, from 1 */
    const char *name;        /* the entry point (or control call) that submitted it */
    struct fake_clock after; /* what it is ordered after; its stream predecessor included */
    fake_unit *next;
};

static fake_stream *g_busy; /* streams with pending units, any context; under the lock */

uint64_t fake_pending(const fake_stream *s) { return s->submitted - s->completed; }

/* ---- clocks ------------------------------------------------------------------------------ */

static bool entry_done(const struct fake_clock_entry *e) { return e->stream->completed >= e->seq; }

/* Drop the entries whose units have all completed. */
static void clock_prune(struct fake_clock *c)
{
    size_t k = 0;
    for (size_t i = 0; i < c->n; i++)
        if (!entry_done(&c->v[i]))
            c->v[k++] = c->v[i];
    c->n = k;
}

/* Order c after units 1..seq of s too. */
static CUresult clock_raise(struct fake_clock *c, fake_stream *s, uint64_t seq)
{
    if (s->completed >= seq)
        return CUDA_SUCCESS;
    for (size_t i = 0; i < c->n; i++) {
        if (c->v[i].stream == s) {
            if (c->v[i].seq < seq)
                c->v[i].seq = seq;
            return CUDA_SUCCESS;
        }
    }
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 4;
        struct fake_clock_entry *v = realloc(c->v, cap * sizeof *v);
        if (!v)
            return CUDA_ERROR_OUT_OF_MEMORY;
        c->v = v;
        c->cap = cap;
    }
    c->v[c->n++] = (struct fake_clock_entry){s, seq};
    return CUDA_SUCCESS;
}

CUresult fake_clock_join(struct fake_clock *dst, const struct fake_clock *src)
{
    clock_prune(dst);
    for (size_t i = 0; i < src->n; i++) {
        CUresult rc = clock_raise(dst, src->v[i].stream, src->v[i].seq);
        if (rc != CUDA_SUCCESS)
            return rc;
    }
    return CUDA_SUCCESS;
}

bool fake_clock_done(const struct fake_clock *c)
{
    for (size_t i = 0; i < c->n; i++)
        if (!entry_done(&c->v[i]))
            return false;
    return true;
}

void fake_clock_clear(struct fake_clock *c) { c->n = 0; }

void fake_clock_free(struct fake_clock *c)
{
    free(c->v);
    *c = (struct fake_clock){0};
}

/* ---- the list of busy streams ------------------------------------------------------------- */

static void busy_add(fake_stream *s)
{
    s->busy_prev = NULL;
    s->busy_next = g_busy;
    if (g_busy)
        g_busy->busy_prev = s;
    g_busy = s;
    s->busy = true;
}

static void busy_remove(fake_stream *s)
{
    if (s->busy_prev)
        s->busy_prev->busy_next = s->busy_next;
    else
        g_busy = s->busy_next;
    if (s->busy_next)
        s->busy_next->busy_prev = s->busy_prev;
    s->busy_prev = s->busy_next = NULL;
    s->busy = false;
}

/* ---- completion ---------------------------------------------------------------------------- */

/* The oldest pending unit of s completes now. */
static void unit_done(fake_stream *s)
{
    fake_unit *u = s->units;
    s->units = u->next;
    if (!s->units)
        s->units_tail = NULL;
    s->completed = u->seq;
    fake_clock_free(&u->after);
    free(u);
    if (!s->units) {
        busy_remove(s);
        fake_stream_prune(s);
    }
}

/* Complete units 1..seq of s, each after everything it is ordered after. Clocks only name
 * earlier work, so a deeper call never needs a unit of a stream that a shallower call is
 * still completing (those units are complete already): each level that does work is
 * another stream, and the depth is bounded by the number of streams. */
static void complete_through(fake_stream *s, uint64_t seq)
{
    if (seq > s->submitted)
        seq = s->submitted;
    while (s->completed < seq) {
        const fake_unit *u = s->units;
        for (size_t i = 0; i < u->after.n; i++)
            if (u->after.v[i].stream != s)
                complete_through(u->after.v[i].stream, u->after.v[i].seq);
        unit_done(s);
    }
}

void fake_clock_complete(const struct fake_clock *c)
{
    for (size_t i = 0; i < c->n; i++)
        complete_through(c->v[i].stream, c->v[i].seq);
}

void fake_retire(fake_stream *s, int64_t n)
{
    uint64_t upto = s->submitted;
    if (n >= 0 && (uint64_t)n < fake_pending(s))
        upto = s->completed + (uint64_t)n;
    complete_through(s, upto);
}

/* Restarts from the list head after each stream: completing one may complete others too. */
void fake_complete_ctx(fake_ctx *ctx)
{
    for (;;) {
        fake_stream *s = g_busy;
        while (s && s->ctx != ctx)
            s = s->busy_next;
        if (!s)
            break;
        complete_through(s, s->submitted);
    }
}

void fake_complete_all(void)
{
    while (g_busy)
        complete_through(g_busy, g_busy->submitted);
}

/* ---- what streams wait for ------------------------------------------------------------------ */

CUresult fake_stream_snapshot(const fake_stream *s, struct fake_clock *out)
{
    fake_clock_clear(out);
    CUresult rc = fake_clock_join(out, &s->clock);
    if (s->legacy) {
        for (const fake_stream *b = s->ctx->streams; b && rc == CUDA_SUCCESS; b = b->next)
            if (fake_blocking(b))
                rc = fake_clock_join(out, &b->clock);
    } else if (rc == CUDA_SUCCESS && fake_blocking(s)) {
        rc = fake_clock_join(out, &s->ctx->legacy.clock);
    }
    return rc;
}

/* The first blocking stream of the legacy stream's context with work still to complete. */
static const fake_stream *blocking_busy(const fake_stream *legacy)
{
    for (const fake_stream *b = legacy->ctx->streams; b; b = b->next)
        if (fake_blocking(b) && !fake_clock_done(&b->clock))
            return b;
    return NULL;
}

bool fake_stream_idle(const fake_stream *s)
{
    if (!fake_clock_done(&s->clock))
        return false;
    return !s->legacy || !blocking_busy(s);
}

/* Completing may unlink destroyed streams from the context's list: look again each time. */
void fake_stream_drain(const fake_stream *s)
{
    fake_clock_complete(&s->clock);
    for (const fake_stream *b; s->legacy && (b = blocking_busy(s));)
        fake_clock_complete(&b->clock);
}

/* ---- submission ---------------------------------------------------------------------------- */

static void unit_free(fake_unit *u)
{
    fake_clock_free(&u->after);
    free(u);
}

static void append(fake_stream *s, fake_unit *u)
{
    if (s->units_tail)
        s->units_tail->next = u;
    else
        s->units = u;
    s->units_tail = u;
    if (!s->busy)
        busy_add(s);
}

CUresult fake_submit(fake_stream *s, const char *name)
{
    fake_unit *u = calloc(1, sizeof *u);
    if (!u)
        return CUDA_ERROR_OUT_OF_MEMORY;
    u->name = name;
    /* The stream's clock becomes the unit's plus the unit itself. */
    struct fake_clock next = {0};
    if (fake_stream_snapshot(s, &u->after) != CUDA_SUCCESS ||
        fake_clock_join(&next, &u->after) != CUDA_SUCCESS ||
        clock_raise(&next, s, s->submitted + 1) != CUDA_SUCCESS) {
        fake_clock_free(&next);
        unit_free(u);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    u->seq = ++s->submitted;
    fake_clock_free(&s->clock);
    s->clock = next;
    append(s, u);
    return CUDA_SUCCESS;
}
