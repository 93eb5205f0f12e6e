/* Fake CUDA driver: the timeline. Units of work on streams, what each is ordered after (a
 * vector clock), their completion, and the race check. The ordering model itself, which
 * calls add what order, is described at the top of fake_stream.c.
 *
 * Completion. A stream's units complete in order, so a stream only counts how many have
 * completed. Completing a unit first completes everything it is ordered after, because a
 * GPU cannot finish work before the work it waits for. Units complete when a test retires
 * them, when a synchronizing call waits for them, or, for units submitted after
 * fake_set_work_ticks(t) with t > 0, by themselves t ticks after they could start. A tick is
 * one entry point call; the timeline is brought up to the current tick lazily, each time
 * the driver lock is taken (fake_lock), so no thread runs the "GPU".
 *
 * Exact times. A unit could start once it is the oldest pending unit of its stream and
 * everything in its clock has completed; every completion is followed by wake(), which
 * notes that tick as the start of each unit that just became able to start, so a unit's
 * completion tick (start + ticks) is exact however rarely the timeline is evaluated.
 *
 * Races. When a unit is submitted, each pending unit that touches bytes it touches and is
 * not in its clock is a race: counted (fake_races) and reported on stderr. Bytes are the
 * memory behind an address (struct fake_touch): for memory mapped with cuMemMap, the
 * physical allocation and offset, so work through a new mapping of memory that work
 * through an old one still uses is caught like work on the same address. A synchronous
 * copy or memset is a unit that completes before the call returns, followed by the host's
 * own access to the device bytes: every unit still pending that touches them is a race. For
 * such a call the two checks would find the same units, so only the host access is checked
 * and each race counts once. Touching is not split into reads and writes: two unordered
 * units that only read the same bytes count too; a test that means to share bytes between
 * streams orders them. */
#include "fake_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NEVER UINT64_MAX

struct fake_callback {
    CUhostFn fn;
    void *data;
    struct fake_callback *next;
};

struct fake_unit {
    uint64_t seq;            /* its number on its stream, from 1 */
    const char *name;        /* the entry point (or control call) that submitted it */
    struct fake_clock after; /* what it is ordered after; its stream predecessor included */
    struct fake_touch *touch; /* the device bytes it touches, none empty */
    int ntouch;
    uint64_t ticks; /* completes this long after it could start; 0: only when told */
    uint64_t start; /* the tick it could start at, NEVER until then */
    struct fake_callback *cb; /* cuLaunchHostFunc's function, queued when it completes */
    fake_unit *next;
};

atomic_long fake_race_count;
atomic_long fake_unmap_fault_count;

static _Atomic uint64_t g_ticks; /* entry point calls so far */
/* Under the lock: */
static uint64_t g_now;        /* the tick the timeline has been brought up to */
static uint64_t g_work_ticks; /* fake_set_work_ticks */
static long g_timed;          /* pending units with ticks > 0 */
static bool g_ignore_waits;   /* fake_set_ignore_stream_waits */
static fake_stream *g_busy;   /* streams with pending units, any context */
/* Host functions of completed units, in completion order, not yet run. */
static struct fake_callback *g_callbacks, **g_callbacks_tail = &g_callbacks;

void fake_tick(void) { atomic_fetch_add_explicit(&g_ticks, 1, memory_order_relaxed); }

bool fake_ignore_waits(void) { return g_ignore_waits; }

uint64_t fake_pending(const fake_stream *s) { return s->submitted - s->completed; }

/* ---- clocks ------------------------------------------------------------------------------ */

static bool entry_done(const struct fake_clock_entry *e) { return e->stream->completed >= e->seq; }

static uint64_t clock_get(const struct fake_clock *c, const fake_stream *s)
{
    for (size_t i = 0; i < c->n; i++)
        if (c->v[i].stream == s)
            return c->v[i].seq;
    return 0;
}

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

/* The oldest pending unit of s completes now. Its host function is queued for fake_unlock. */
static void unit_done(fake_stream *s)
{
    fake_unit *u = s->units;
    s->units = u->next;
    if (!s->units)
        s->units_tail = NULL;
    s->completed = u->seq;
    if (u->ticks)
        g_timed--;
    if (u->cb) {
        u->cb->next = NULL;
        *g_callbacks_tail = u->cb;
        g_callbacks_tail = &u->cb->next;
    }
    fake_clock_free(&u->after);
    free(u->touch);
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

/* Note the current tick as the start of every timed unit that just became able to start. */
static void wake(void)
{
    if (g_timed == 0)
        return;
    for (fake_stream *s = g_busy; s; s = s->busy_next) {
        fake_unit *u = s->units;
        if (u->ticks && u->start == NEVER && fake_clock_done(&u->after))
            u->start = g_now;
    }
}

static void clock_complete(const struct fake_clock *c)
{
    for (size_t i = 0; i < c->n; i++)
        complete_through(c->v[i].stream, c->v[i].seq);
}

void fake_clock_complete(const struct fake_clock *c)
{
    clock_complete(c);
    wake();
}

void fake_retire(fake_stream *s, int64_t n)
{
    uint64_t upto = s->submitted;
    if (n >= 0 && (uint64_t)n < fake_pending(s))
        upto = s->completed + (uint64_t)n;
    complete_through(s, upto);
    wake();
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
    wake();
}

void fake_complete_all(void)
{
    while (g_busy)
        complete_through(g_busy, g_busy->submitted);
}

/* The tick a timed unit completes at by itself: NEVER if it cannot start yet (or ever). */
static uint64_t unit_end(const fake_unit *u)
{
    if (!u->ticks || u->start == NEVER || u->start > NEVER - u->ticks)
        return NEVER;
    return u->start + u->ticks;
}

/* The stream whose oldest unit completes first by itself; NULL if none will. */
static fake_stream *next_timed(void)
{
    fake_stream *best = NULL;
    uint64_t best_end = NEVER;
    for (fake_stream *s = g_busy; s; s = s->busy_next) {
        if (unit_end(s->units) < best_end) {
            best = s;
            best_end = unit_end(s->units);
        }
    }
    return best;
}

/* Completes the timed units in the order of their ticks, each at its own tick, so that
 * what they let start starts at the right tick. */
void fake_timeline_advance(void)
{
    uint64_t now = atomic_load_explicit(&g_ticks, memory_order_relaxed);
    while (g_timed > 0) {
        fake_stream *s = next_timed();
        if (!s || unit_end(s->units) > now)
            break;
        g_now = unit_end(s->units);
        unit_done(s);
        wake();
    }
    if (now > g_now)
        g_now = now;
}

/* ---- host functions ------------------------------------------------------------------------ */

/* Held while host functions run: they run one at a time, in the order their units completed,
 * as on the real driver's callback thread, whichever threads find them. */
static pthread_mutex_t g_callback_mutex = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local bool t_running_callbacks;

bool fake_callbacks_waiting(void) { return g_callbacks != NULL; }

static struct fake_callback *callback_pop(void)
{
    struct fake_callback *cb = g_callbacks;
    if (cb && !(g_callbacks = cb->next))
        g_callbacks_tail = &g_callbacks;
    return cb;
}

/* A host function that calls the driver comes back here through fake_unlock: the outer
 * loop runs whatever that call completed. */
void fake_run_callbacks(void)
{
    if (t_running_callbacks)
        return;
    t_running_callbacks = true;
    pthread_mutex_lock(&g_callback_mutex);
    for (;;) {
        fake_lock();
        struct fake_callback *cb = callback_pop();
        fake_unlock();
        if (!cb)
            break;
        cb->fn(cb->data);
        free(cb);
    }
    pthread_mutex_unlock(&g_callback_mutex);
    t_running_callbacks = false;
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
    clock_complete(&s->clock);
    for (const fake_stream *b; s->legacy && (b = blocking_busy(s));)
        clock_complete(&b->clock);
    wake();
}

/* ---- the race check ------------------------------------------------------------------------ */

/* Two touches of the same memory: same space, overlapping offsets. */
static bool same_bytes(const struct fake_touch *a, const struct fake_touch *b)
{
    return a->space == b->space && a->at < b->at + b->n && b->at < a->at + a->n;
}

static const struct fake_touch *overlap(const struct fake_touch *r, int nr, const fake_unit *u)
{
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < u->ntouch; j++)
            if (same_bytes(&r[i], &u->touch[j]))
                return &r[i];
    return NULL;
}

static void report(const char *name, const fake_stream *ws, const struct fake_touch *hit,
                   const fake_stream *us, const fake_unit *u)
{
    atomic_fetch_add(&fake_race_count, 1);
    char where[64] = "on the host", memory[96] = "";
    if (ws)
        snprintf(where, sizeof where, "on stream %p", (const void *)ws);
    if (hit->space)
        snprintf(memory, sizeof memory, " (allocation 0x%llx at offset 0x%llx)",
                 (unsigned long long)hit->space, (unsigned long long)hit->at);
    fprintf(stderr,
            "fake cuda: race: %s %s touches [0x%llx,0x%llx)%s while %s on stream %p, not "
            "ordered before it, still uses it\n",
            name, where, (unsigned long long)hit->va, (unsigned long long)(hit->va + hit->n),
            memory, u->name, (const void *)us);
}

/* Every pending unit touching the ranges that `after` does not order before them is a race;
 * ws NULL: the host touches them, ordered after nothing still pending. */
static void race_check(const char *name, const fake_stream *ws, const struct fake_clock *after,
                       const struct fake_touch *r, int nr)
{
    if (nr == 0)
        return;
    for (const fake_stream *x = g_busy; x; x = x->busy_next) {
        uint64_t ordered = after ? clock_get(after, x) : 0;
        for (const fake_unit *u = x->units; u; u = u->next) {
            const struct fake_touch *hit = u->seq > ordered ? overlap(r, nr, u) : NULL;
            if (hit)
                report(name, ws, hit, x, u);
        }
    }
}

/* ---- the unmap check ------------------------------------------------------------------------ */

void fake_unmap_check(uint64_t mapping, CUdeviceptr va, size_t n)
{
    for (const fake_stream *x = g_busy; x; x = x->busy_next) {
        for (const fake_unit *u = x->units; u; u = u->next) {
            for (int j = 0; j < u->ntouch; j++) {
                if (u->touch[j].mapping != mapping)
                    continue;
                atomic_fetch_add(&fake_unmap_fault_count, 1);
                fprintf(stderr,
                        "fake cuda: unmap fault: cuMemUnmap of [0x%llx,0x%llx) while %s on "
                        "stream %p still uses it\n",
                        (unsigned long long)va, (unsigned long long)(va + n), u->name,
                        (const void *)x);
                break;
            }
        }
    }
}

/* ---- submission ---------------------------------------------------------------------------- */

static void unit_free(fake_unit *u)
{
    fake_clock_free(&u->after);
    free(u->touch);
    free(u->cb);
    free(u);
}

static fake_unit *unit_new(const char *name, const struct fake_touches *t, CUhostFn fn,
                           void *data)
{
    fake_unit *u = calloc(1, sizeof *u);
    if (!u)
        return NULL;
    if (fn && !(u->cb = malloc(sizeof *u->cb))) {
        unit_free(u);
        return NULL;
    }
    if (fn)
        *u->cb = (struct fake_callback){fn, data, NULL};
    if (t && t->n) {
        if (!(u->touch = malloc((size_t)t->n * sizeof *u->touch))) {
            unit_free(u);
            return NULL;
        }
        memcpy(u->touch, t->v, (size_t)t->n * sizeof *u->touch);
        u->ntouch = t->n;
    }
    u->name = name;
    u->ticks = g_work_ticks;
    u->start = NEVER;
    return u;
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

CUresult fake_submit(fake_stream *s, const char *name, const struct fake_touches *t,
                     CUhostFn fn, void *data)
{
    fake_unit *u = unit_new(name, t, fn, data);
    if (!u)
        return CUDA_ERROR_OUT_OF_MEMORY;
    /* The stream's clock becomes the unit's plus the unit itself. */
    struct fake_clock next = {0};
    if (fake_stream_snapshot(s, &u->after) != CUDA_SUCCESS ||
        fake_clock_join(&next, &u->after) != CUDA_SUCCESS ||
        clock_raise(&next, s, s->submitted + 1) != CUDA_SUCCESS) {
        fake_clock_free(&next);
        unit_free(u);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    race_check(name, s, &u->after, u->touch, u->ntouch);
    u->seq = ++s->submitted;
    fake_clock_free(&s->clock);
    s->clock = next;
    append(s, u);
    if (u->ticks) {
        g_timed++;
        wake();
    }
    return CUDA_SUCCESS;
}

CUresult fake_submit_sync(fake_stream *s, const char *name, const struct fake_touches *t)
{
    struct fake_clock c = {0};
    CUresult rc = fake_stream_snapshot(s, &c);
    if (rc == CUDA_SUCCESS) {
        clock_complete(&c);
        /* The unit itself: numbered, and complete at once; s has nothing pending now. */
        s->submitted++;
        s->completed++;
        if (t)
            race_check(name, NULL, NULL, t->v, t->n);
        wake();
    }
    fake_clock_free(&c);
    return rc;
}

/* ---- control API ------------------------------------------------------------------------- */

FAKE_API void fake_set_work_ticks(uint64_t ticks)
{
    fake_lock();
    g_work_ticks = ticks;
    fake_unlock();
}

FAKE_API void fake_set_ignore_stream_waits(int on)
{
    fake_lock();
    g_ignore_waits = on != 0;
    fake_unlock();
}

FAKE_API long fake_races(void) { return atomic_load(&fake_race_count); }

FAKE_API long fake_unmap_faults(void) { return atomic_load(&fake_unmap_fault_count); }
