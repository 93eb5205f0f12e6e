/* Fake CUDA driver: streams, events, stream waits and stream capture.
 *
 * The ordering model. Work on a stream is a sequence of units, numbered from 1: a kernel
 * launch, an asynchronous copy or memset, a host function, a graph launch, a test's
 * fake_stream_launch, and the synchronous copies and memsets, which are units on the legacy
 * stream (the per-thread stream for their _ptds forms) that complete before the call
 * returns. Each unit carries a vector clock of the units it is ordered after (see
 * fake_timeline.c): its stream's previous unit and all that one was after;
 *  - on the legacy stream, everything enqueued so far on every blocking stream of its
 *    context (created without CU_STREAM_NON_BLOCKING, per-thread streams included);
 *    non-blocking streams are left out, which is exactly the hazard a caching allocator
 *    must fence on its own;
 *  - on a blocking stream, everything enqueued so far on the legacy stream of its context;
 *  - after cuStreamWaitEvent(S, E), on S, everything E's last record captured.
 * cuEventRecord takes the clock an operation submitted there and then would have (legacy
 * rules included); the event is complete once every unit in it is. Waiting for a stream
 * (cuStreamQuery, cuStreamSynchronize) means everything enqueued on it, for the legacy
 * stream also everything enqueued on the blocking streams of its context.
 *
 * Work completes only when a test retires it, a synchronizing call waits for it (cuMemFree
 * and cuCtxSynchronize for the whole context), or its ticks run out (fake_set_work_ticks);
 * completing a unit completes everything it is ordered after first. Submitting a unit
 * checks it for races against the pending work (fake_timeline.c).
 *
 * Capture. An operation on a capturing stream becomes a graph node: no unit, no effect. A
 * stream that waits on an event recorded in a capture joins that capture sequence; ending
 * the capture on the stream that began it ends it for all of them. */
#include "fake_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CAPTURES 64

/* Streams in an ongoing capture sequence (active or invalidated), process-wide. */
static fake_stream *g_captures[MAX_CAPTURES];
static int g_ncaptures;
static uint64_t g_last_seq; /* capture sequences are numbered from 1 */
/* cuStreamEndCapture hands this out; nothing in the fake consumes graphs. */
static char g_dummy_graph;

void fake_stream_init(fake_stream *s, fake_ctx *ctx, unsigned flags, bool legacy)
{
    memset(s, 0, sizeof *s);
    s->kind = KIND_STREAM;
    s->ctx = ctx;
    s->flags = flags;
    s->legacy = legacy;
    s->cap_status = CU_STREAM_CAPTURE_STATUS_NONE;
}

bool fake_blocking(const fake_stream *s)
{
    return !s->legacy && !(s->flags & CU_STREAM_NON_BLOCKING);
}

static void link_stream(fake_stream *s)
{
    fake_ctx *c = s->ctx;
    s->prev = NULL;
    s->next = c->streams;
    if (c->streams)
        c->streams->prev = s;
    c->streams = s;
    s->linked = true;
}

static void unlink_stream(fake_stream *s)
{
    if (!s->linked)
        return;
    if (s->prev)
        s->prev->next = s->next;
    else
        s->ctx->streams = s->next;
    if (s->next)
        s->next->prev = s->prev;
    s->prev = s->next = NULL;
    s->linked = false;
}

/* A destroyed stream stays on its context's list only while it still has work, so that the
 * legacy stream and context-wide waits still see that work; then it drops off. Its memory
 * stays (registered) so the old handle and clocks that name it keep working. */
void fake_stream_prune(fake_stream *s)
{
    if (s->destroyed && fake_pending(s) == 0)
        unlink_stream(s);
}

static fake_stream *stream_new(fake_ctx *ctx, unsigned flags)
{
    fake_stream *s = malloc(sizeof *s);
    if (!s)
        return NULL;
    fake_stream_init(s, ctx, flags, false);
    if (!fake_reg_add(s)) {
        free(s);
        return NULL;
    }
    link_stream(s);
    return s;
}

/* This thread's CU_STREAM_PER_THREAD stream in ctx, created on first use. */
static fake_stream *per_thread_stream(fake_ctx *ctx)
{
    struct fake_thread *t = fake_self();
    int slot = -1;
    for (int i = 0; i < t->nptds; i++) {
        if (t->ptds[i].ctx == ctx)
            return t->ptds[i].stream;
        if (slot < 0 && t->ptds[i].ctx->destroyed)
            slot = i;
    }
    if (slot < 0 && t->nptds == FAKE_MAX_PTDS)
        return NULL;
    fake_stream *s = stream_new(ctx, 0);
    if (!s)
        return NULL;
    s->per_thread = true;
    if (slot < 0)
        slot = t->nptds++;
    t->ptds[slot].ctx = ctx;
    t->ptds[slot].stream = s;
    fake_watch_thread_exit();
    return s;
}

CUresult fake_resolve_stream(CUstream h, bool ptsz, bool allow_destroyed, fake_stream **out)
{
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        fake_ctx *c;
        CUresult rc = fake_current_ctx(&c);
        if (rc != CUDA_SUCCESS)
            return rc;
        if (h == CU_STREAM_LEGACY || (h == NULL && !ptsz)) {
            *out = &c->legacy;
            return CUDA_SUCCESS;
        }
        *out = per_thread_stream(c);
        return *out ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    }
    fake_stream *s = fake_reg_find(h, KIND_STREAM);
    if (!s || (!allow_destroyed && (s->destroyed || s->ctx->destroyed)))
        return CUDA_ERROR_INVALID_HANDLE;
    *out = s;
    return CUDA_SUCCESS;
}

/* ---- capture rules ----------------------------------------------------------------------- */

static bool capturing(const fake_stream *s)
{
    return s->cap_status != CU_STREAM_CAPTURE_STATUS_NONE;
}

static void capture_add(fake_stream *s) { g_captures[g_ncaptures++] = s; }

static void capture_remove(fake_stream *s)
{
    for (int i = 0; i < g_ncaptures; i++) {
        if (g_captures[i] == s) {
            g_captures[i] = g_captures[--g_ncaptures];
            break;
        }
    }
    s->cap_status = CU_STREAM_CAPTURE_STATUS_NONE;
    s->cap_graph = NULL;
    s->cap_seq = 0;
    s->cap_origin = false;
}

/* A stream of the ongoing capture sequence seq (its origin if there is one), or NULL. */
static fake_stream *sequence_member(uint64_t seq)
{
    fake_stream *any = NULL;
    for (int i = 0; i < g_ncaptures; i++) {
        if (g_captures[i]->cap_seq != seq)
            continue;
        if (g_captures[i]->cap_origin)
            return g_captures[i];
        any = g_captures[i];
    }
    return any;
}

/* The stream leaves its capture; if it began it, every stream that joined leaves too. */
static void capture_leave(fake_stream *s)
{
    if (!s->cap_origin) {
        capture_remove(s);
        return;
    }
    uint64_t seq = s->cap_seq;
    for (fake_stream *m; (m = sequence_member(seq));)
        capture_remove(m);
}

static void invalidate_sequence(uint64_t seq)
{
    for (int i = 0; i < g_ncaptures; i++)
        if (g_captures[i]->cap_seq == seq)
            g_captures[i]->cap_status = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
}

/* cuThreadExchangeStreamCaptureMode's rule for "potentially unsafe" calls: a GLOBAL-mode
 * thread may not make them while any GLOBAL capture runs anywhere in the process, and a
 * non-RELAXED thread may not make them during its own non-RELAXED capture. */
static bool unsafe_conflict(const fake_stream *s, const struct fake_thread *t)
{
    if (t->mode == CU_STREAM_CAPTURE_MODE_RELAXED)
        return false;
    if (s->cap_mode == CU_STREAM_CAPTURE_MODE_GLOBAL && t->mode == CU_STREAM_CAPTURE_MODE_GLOBAL)
        return true;
    return s->cap_owner == t->id && s->cap_mode != CU_STREAM_CAPTURE_MODE_RELAXED;
}

/* Use of the legacy stream while a blocking stream of its context captures would make the
 * legacy stream depend on the capture. */
static bool legacy_conflict(const fake_stream *s, const fake_stream *target)
{
    return target && target->legacy && s->ctx == target->ctx && fake_blocking(s);
}

enum {
    RULE_UNSAFE = 1, /* the call is "potentially unsafe": thread capture modes apply */
    RULE_LEGACY = 2, /* target is used as the legacy stream */
    RULE_TARGET = 4, /* target itself must not be capturing (query, synchronize) */
    RULE_CTX = 8,    /* no stream of ctx may be capturing (context-wide wait) */
};

/* Apply the capture rules for one call: each conflicting capture is invalidated, as the real
 * driver does, and the call counts as one violation. */
static CUresult guard(unsigned rules, const fake_stream *target, const fake_ctx *ctx,
                      CUresult unsafe_err)
{
    if (g_ncaptures == 0)
        return CUDA_SUCCESS;
    const struct fake_thread *t = fake_self();
    CUresult rc = CUDA_SUCCESS;
    for (int i = 0; i < g_ncaptures; i++) {
        fake_stream *s = g_captures[i];
        CUresult e = CUDA_SUCCESS;
        if ((rules & RULE_UNSAFE) && unsafe_conflict(s, t))
            e = unsafe_err;
        else if ((rules & RULE_LEGACY) && legacy_conflict(s, target))
            e = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        else if ((rules & RULE_TARGET) && s == target)
            e = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        else if ((rules & RULE_CTX) && s->ctx == ctx)
            e = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        if (e == CUDA_SUCCESS)
            continue;
        invalidate_sequence(s->cap_seq);
        if (rc == CUDA_SUCCESS)
            rc = e;
    }
    if (rc != CUDA_SUCCESS) {
        atomic_fetch_add(&fake_violations, 1);
        /* Say which call, so a shim test that sees the counter move knows where to look. */
        fprintf(stderr, "fake cuda: %s during stream capture: error %d, capture invalidated\n",
                fake_entry_name(t->entry), (int)rc);
    }
    return rc;
}

CUresult fake_capture_guard_unsafe(void)
{
    return guard(RULE_UNSAFE, NULL, NULL, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
}

CUresult fake_capture_guard_ctx_sync(const fake_ctx *ctx)
{
    return guard(RULE_UNSAFE | RULE_CTX, NULL, ctx, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
}

CUresult fake_async_admit(fake_stream *s, bool *captured)
{
    *captured = false;
    if (s->legacy) {
        CUresult rc = guard(RULE_LEGACY, s, NULL, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
        if (rc != CUDA_SUCCESS)
            return rc;
    }
    if (s->cap_status == CU_STREAM_CAPTURE_STATUS_INVALIDATED)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    *captured = capturing(s);
    return CUDA_SUCCESS;
}

/* A synchronous copy waits for its stream like cuStreamSynchronize, so the same rules apply,
 * except that it is not one of the "potentially unsafe" calls. */
CUresult fake_sync_stream(bool ptds, fake_stream **out)
{
    CUresult rc = fake_resolve_stream(NULL, ptds, false, out);
    if (rc == CUDA_SUCCESS)
        rc = guard(RULE_LEGACY | RULE_TARGET, *out, NULL, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    return rc;
}

/* ---- contexts and threads going away ----------------------------------------------------- */

static void event_free(fake_event *e);

void fake_streams_ctx_destroyed(fake_ctx *ctx)
{
    fake_complete_ctx(ctx);
    for (int i = g_ncaptures - 1; i >= 0; i--)
        if (g_captures[i]->ctx == ctx)
            capture_remove(g_captures[i]);
    while (ctx->streams) {
        ctx->streams->destroyed = true;
        unlink_stream(ctx->streams);
    }
    while (ctx->events)
        event_free(ctx->events);
}

void fake_thread_exit_streams(struct fake_thread *t)
{
    for (int i = 0; i < t->nptds; i++) {
        fake_stream *s = t->ptds[i].stream;
        if (s->destroyed)
            continue;
        if (capturing(s))
            capture_leave(s);
        s->destroyed = true;
        fake_stream_prune(s);
    }
    t->nptds = 0;
}

/* ---- streams ----------------------------------------------------------------------------- */

static CUresult stream_create(CUstream *ph, unsigned int flags, int priority)
{
    if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    fake_ctx *c;
    CUresult rc = fake_current_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    fake_stream *s = stream_new(c, flags);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->priority = priority;
    *ph = (CUstream)s;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuStreamCreate(CUstream *phStream, unsigned int flags)
{
    ENTER(cuStreamCreate);
    LOCKED(stream_create(phStream, flags, 0));
}

FAKE_API CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
    ENTER(cuStreamCreateWithPriority);
    LOCKED(stream_create(phStream, flags, priority));
}

/* Returns at once, as the real call does; the stream's work stays pending until retired. */
static CUresult stream_destroy(CUstream h)
{
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
        return CUDA_ERROR_INVALID_HANDLE;
    fake_stream *s;
    CUresult rc = fake_resolve_stream(h, false, false, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (capturing(s))
        capture_leave(s);
    s->destroyed = true;
    fake_stream_prune(s);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuStreamDestroy_v2(CUstream hStream)
{
    ENTER(cuStreamDestroy_v2);
    LOCKED(stream_destroy(hStream));
}

FAKE_API CUresult cuStreamDestroy(CUstream hStream)
{
    ENTER(cuStreamDestroy);
    LOCKED(stream_destroy(hStream));
}

static CUresult stream_wait(CUstream h, bool ptsz, bool block)
{
    fake_stream *s;
    CUresult rc = fake_resolve_stream(h, ptsz, false, &s);
    if (rc == CUDA_SUCCESS)
        rc = guard(RULE_UNSAFE | RULE_LEGACY | RULE_TARGET, s, NULL,
                   CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (block)
        fake_stream_drain(s);
    return fake_stream_idle(s) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

FAKE_API CUresult cuStreamQuery(CUstream hStream)
{
    ENTER(cuStreamQuery);
    LOCKED(stream_wait(hStream, false, false));
}

FAKE_API CUresult cuStreamQuery_ptsz(CUstream hStream)
{
    ENTER(cuStreamQuery_ptsz);
    LOCKED(stream_wait(hStream, true, false));
}

FAKE_API CUresult cuStreamSynchronize(CUstream hStream)
{
    ENTER(cuStreamSynchronize);
    LOCKED(stream_wait(hStream, false, true));
}

FAKE_API CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
    ENTER(cuStreamSynchronize_ptsz);
    LOCKED(stream_wait(hStream, true, true));
}

static CUresult stream_flags(CUstream h, unsigned int *flags, bool ptsz)
{
    if (!flags)
        return CUDA_ERROR_INVALID_VALUE;
    fake_stream *s;
    CUresult rc = fake_resolve_stream(h, ptsz, false, &s);
    if (rc == CUDA_SUCCESS)
        *flags = s->flags;
    return rc;
}

FAKE_API CUresult cuStreamGetFlags(CUstream hStream, unsigned int *flags)
{
    ENTER(cuStreamGetFlags);
    LOCKED(stream_flags(hStream, flags, false));
}

FAKE_API CUresult cuStreamGetFlags_ptsz(CUstream hStream, unsigned int *flags)
{
    ENTER(cuStreamGetFlags_ptsz);
    LOCKED(stream_flags(hStream, flags, true));
}

static CUresult stream_ctx(CUstream h, CUcontext *pctx, bool ptsz)
{
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    fake_stream *s;
    CUresult rc = fake_resolve_stream(h, ptsz, false, &s);
    if (rc == CUDA_SUCCESS)
        *pctx = (CUcontext)s->ctx;
    return rc;
}

FAKE_API CUresult cuStreamGetCtx(CUstream hStream, CUcontext *pctx)
{
    ENTER(cuStreamGetCtx);
    LOCKED(stream_ctx(hStream, pctx, false));
}

FAKE_API CUresult cuStreamGetCtx_ptsz(CUstream hStream, CUcontext *pctx)
{
    ENTER(cuStreamGetCtx_ptsz);
    LOCKED(stream_ctx(hStream, pctx, true));
}

/* ---- events ------------------------------------------------------------------------------ */

static void event_free(fake_event *e)
{
    fake_ctx *c = e->ctx;
    if (e->prev)
        e->prev->next = e->next;
    else
        c->events = e->next;
    if (e->next)
        e->next->prev = e->prev;
    fake_reg_del(e);
    fake_clock_free(&e->clock);
    free(e);
}

static CUresult event_create(CUevent *ph, unsigned int flags)
{
    if (!ph || (flags & ~0xfu))
        return CUDA_ERROR_INVALID_VALUE;
    fake_ctx *c;
    CUresult rc = fake_current_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    fake_event *e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->kind = KIND_EVENT;
    e->ctx = c;
    e->flags = flags;
    if (!fake_reg_add(e)) {
        free(e);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    e->next = c->events;
    if (c->events)
        c->events->prev = e;
    c->events = e;
    *ph = (CUevent)e;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuEventCreate(CUevent *phEvent, unsigned int flags)
{
    ENTER(cuEventCreate);
    LOCKED(event_create(phEvent, flags));
}

static CUresult event_destroy(CUevent h)
{
    fake_event *e = fake_reg_find(h, KIND_EVENT);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    event_free(e);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuEventDestroy_v2(CUevent hEvent)
{
    ENTER(cuEventDestroy_v2);
    LOCKED(event_destroy(hEvent));
}

FAKE_API CUresult cuEventDestroy(CUevent hEvent)
{
    ENTER(cuEventDestroy);
    LOCKED(event_destroy(hEvent));
}

static CUresult event_record(CUevent h, CUstream hs, bool ptsz)
{
    fake_event *e = fake_reg_find(h, KIND_EVENT);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    fake_stream *s;
    CUresult rc = fake_resolve_stream(hs, ptsz, false, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (s->ctx != e->ctx)
        return CUDA_ERROR_INVALID_HANDLE;
    if (capturing(s)) {
        /* Becomes a node of the graph being captured, not a fence on real work; a stream
         * that waits on it joins the capture. */
        fake_clock_clear(&e->clock);
        e->in_graph = true;
        e->cap_seq = s->cap_seq;
        return CUDA_SUCCESS;
    }
    if (s->legacy) {
        rc = guard(RULE_UNSAFE | RULE_LEGACY, s, NULL, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
        if (rc != CUDA_SUCCESS)
            return rc;
    }
    e->in_graph = false;
    return fake_stream_snapshot(s, &e->clock);
}

FAKE_API CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    ENTER(cuEventRecord);
    LOCKED(event_record(hEvent, hStream, false));
}

FAKE_API CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream)
{
    ENTER(cuEventRecord_ptsz);
    LOCKED(event_record(hEvent, hStream, true));
}

static CUresult event_wait(CUevent h, bool block)
{
    fake_event *e = fake_reg_find(h, KIND_EVENT);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult rc = fake_capture_guard_unsafe();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (e->in_graph)
        return CUDA_ERROR_CAPTURED_EVENT;
    if (block)
        fake_clock_complete(&e->clock);
    return fake_clock_done(&e->clock) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

FAKE_API CUresult cuEventQuery(CUevent hEvent)
{
    ENTER(cuEventQuery);
    LOCKED(event_wait(hEvent, false));
}

FAKE_API CUresult cuEventSynchronize(CUevent hEvent)
{
    ENTER(cuEventSynchronize);
    LOCKED(event_wait(hEvent, true));
}

/* ---- stream waits ------------------------------------------------------------------------ */

/* s waits on an event recorded in capture sequence seq: it joins that sequence, as the real
 * driver does for cross-stream capture (the "fork" of a captured graph). A sequence that has
 * ended left no work to wait for. */
static CUresult join_capture(fake_stream *s, uint64_t seq)
{
    const fake_stream *o = sequence_member(seq);
    if (!o || s->cap_seq == seq)
        return CUDA_SUCCESS;
    if (capturing(s))
        return CUDA_ERROR_STREAM_CAPTURE_MERGE;
    if (s->legacy)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (g_ncaptures == MAX_CAPTURES)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->cap_status = o->cap_status;
    s->cap_mode = o->cap_mode;
    s->cap_owner = o->cap_owner;
    s->cap_graph = o->cap_graph;
    s->cap_seq = seq;
    s->cap_origin = false;
    capture_add(s);
    return CUDA_SUCCESS;
}

/* The event may belong to another context: waiting across contexts is allowed. */
static CUresult stream_wait_event(CUstream hs, CUevent he, unsigned flags, bool ptsz)
{
    fake_stream *s;
    CUresult rc = fake_resolve_stream(hs, ptsz, false, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    fake_event *e = fake_reg_find(he, KIND_EVENT);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    if (flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL)
        return CUDA_ERROR_INVALID_VALUE;
    if (s->legacy) {
        rc = guard(RULE_LEGACY, s, NULL, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
        if (rc != CUDA_SUCCESS)
            return rc;
    }
    if (e->in_graph)
        return join_capture(s, e->cap_seq);
    /* A capturing stream waiting on real work: nothing to add to the graph the fake does not
     * keep, and no unit of s will run until the graph is launched. */
    if (capturing(s) || fake_ignore_waits())
        return CUDA_SUCCESS;
    return fake_clock_join(&s->clock, &e->clock);
}

FAKE_API CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    ENTER(cuStreamWaitEvent);
    LOCKED(stream_wait_event(hStream, hEvent, Flags, false));
}

FAKE_API CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    ENTER(cuStreamWaitEvent_ptsz);
    LOCKED(stream_wait_event(hStream, hEvent, Flags, true));
}

/* ---- stream capture ---------------------------------------------------------------------- */

static bool valid_mode(CUstreamCaptureMode m)
{
    return m == CU_STREAM_CAPTURE_MODE_GLOBAL || m == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL ||
           m == CU_STREAM_CAPTURE_MODE_RELAXED;
}

static CUresult begin_capture(CUstream h, CUstreamCaptureMode mode, bool ptsz, CUgraph graph)
{
    if (!valid_mode(mode))
        return CUDA_ERROR_INVALID_VALUE;
    fake_stream *s;
    CUresult rc = fake_resolve_stream(h, ptsz, false, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (s->legacy)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (capturing(s))
        return CUDA_ERROR_ILLEGAL_STATE;
    if (g_ncaptures == MAX_CAPTURES)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->cap_status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    s->cap_mode = mode;
    s->cap_owner = fake_self()->id;
    s->cap_graph = graph;
    s->cap_seq = ++g_last_seq;
    s->cap_origin = true;
    capture_add(s);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    ENTER(cuStreamBeginCapture_v2);
    LOCKED(begin_capture(hStream, mode, false, NULL));
}

FAKE_API CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
    ENTER(cuStreamBeginCapture_v2_ptsz);
    LOCKED(begin_capture(hStream, mode, true, NULL));
}

/* The CUDA 10.0 call had no mode argument; its captures behave as GLOBAL ones. */
FAKE_API CUresult cuStreamBeginCapture(CUstream hStream)
{
    ENTER(cuStreamBeginCapture);
    LOCKED(begin_capture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, false, NULL));
}

FAKE_API CUresult cuStreamBeginCapture_ptsz(CUstream hStream)
{
    ENTER(cuStreamBeginCapture_ptsz);
    LOCKED(begin_capture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, true, NULL));
}

/* Capture into an existing graph: the same rules; the nodes (ignored here) are dependencies. */
static CUresult begin_capture_to_graph(CUstream h, CUgraph graph, CUstreamCaptureMode mode,
                                       bool ptsz)
{
    if (!graph)
        return CUDA_ERROR_INVALID_VALUE;
    return begin_capture(h, mode, ptsz, graph);
}

FAKE_API CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                              const CUgraphNode *dependencies,
                                              const CUgraphEdgeData *dependencyData,
                                              size_t numDependencies, CUstreamCaptureMode mode)
{
    ENTER(cuStreamBeginCaptureToGraph);
    (void)dependencies;
    (void)dependencyData;
    (void)numDependencies;
    LOCKED(begin_capture_to_graph(hStream, hGraph, mode, false));
}

FAKE_API CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                                   const CUgraphNode *dependencies,
                                                   const CUgraphEdgeData *dependencyData,
                                                   size_t numDependencies,
                                                   CUstreamCaptureMode mode)
{
    ENTER(cuStreamBeginCaptureToGraph_ptsz);
    (void)dependencies;
    (void)dependencyData;
    (void)numDependencies;
    LOCKED(begin_capture_to_graph(hStream, hGraph, mode, true));
}

static CUresult end_capture(CUstream h, CUgraph *graph, bool ptsz)
{
    if (!graph)
        return CUDA_ERROR_INVALID_VALUE;
    fake_stream *s;
    CUresult rc = fake_resolve_stream(h, ptsz, false, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!capturing(s))
        return CUDA_ERROR_ILLEGAL_STATE;
    if (!s->cap_origin)
        return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
    if (s->cap_mode != CU_STREAM_CAPTURE_MODE_RELAXED && s->cap_owner != fake_self()->id)
        return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    bool invalidated = s->cap_status == CU_STREAM_CAPTURE_STATUS_INVALIDATED;
    CUgraph into = s->cap_graph;
    capture_leave(s);
    *graph = invalidated ? NULL : into ? into : (CUgraph)(void *)&g_dummy_graph;
    return invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
}

FAKE_API CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    ENTER(cuStreamEndCapture);
    LOCKED(end_capture(hStream, phGraph, false));
}

FAKE_API CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
    ENTER(cuStreamEndCapture_ptsz);
    LOCKED(end_capture(hStream, phGraph, true));
}

static CUresult is_capturing(CUstream h, CUstreamCaptureStatus *status, bool ptsz)
{
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    fake_stream *s;
    CUresult rc = fake_resolve_stream(h, ptsz, false, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    /* Asking about the legacy stream is refused but harmless: no violation, no invalidation. */
    for (int i = 0; i < g_ncaptures; i++)
        if (legacy_conflict(g_captures[i], s))
            return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    *status = (CUstreamCaptureStatus)s->cap_status;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    ENTER(cuStreamIsCapturing);
    LOCKED(is_capturing(hStream, captureStatus, false));
}

FAKE_API CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    ENTER(cuStreamIsCapturing_ptsz);
    LOCKED(is_capturing(hStream, captureStatus, true));
}

FAKE_API CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    ENTER(cuThreadExchangeStreamCaptureMode);
    if (!mode || !valid_mode(*mode))
        return CUDA_ERROR_INVALID_VALUE;
    /* Only this thread reads or writes its own mode, so no lock. */
    struct fake_thread *t = fake_self();
    CUstreamCaptureMode old = t->mode;
    t->mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

/* ---- control API: work on streams ---------------------------------------------------------- */

FAKE_API int fake_stream_launch(CUstream stream)
{
    fake_lock();
    fake_stream *s;
    int rc = fake_resolve_stream(stream, false, false, &s) == CUDA_SUCCESS ? 0 : -1;
    /* A launch into a capturing stream is recorded into the graph, not run. */
    if (rc == 0 && !capturing(s) &&
        fake_submit(s, "fake_stream_launch", NULL, NULL, NULL) != CUDA_SUCCESS)
        rc = -1;
    fake_unlock();
    return rc;
}

FAKE_API void fake_stream_retire(CUstream stream, int n)
{
    fake_lock();
    fake_stream *s;
    if (fake_resolve_stream(stream, false, true, &s) == CUDA_SUCCESS)
        fake_retire(s, n);
    fake_unlock();
}

FAKE_API void fake_retire_all(void)
{
    fake_lock();
    fake_complete_all();
    fake_unlock();
}

FAKE_API int fake_stream_pending(CUstream stream)
{
    fake_lock();
    fake_stream *s;
    int n = -1;
    if (fake_resolve_stream(stream, false, true, &s) == CUDA_SUCCESS)
        n = (int)fake_pending(s);
    fake_unlock();
    return n;
}
