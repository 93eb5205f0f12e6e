/* Where the GPU's work is: streams, fences and stream-ordered reuse (see cs_streams.h).
 *
 * A stream is *dirty* once work was put on it after its last fence; a dirty stream is on its
 * context's dirty list (pushed by the thread that made it dirty, lock-free). A fence takes the
 * whole list and records one event on each stream in it, and nothing on the others, so idle
 * streams cost nothing however many exist. The events of one fence form a *slot* numbered by
 * an epoch; slots complete in order. A block freed at epoch e is safe to reuse once every slot
 * up to e has completed: every work item issued before the free is either covered by an event
 * of those slots or was on a stream that was clean at the free, whose earlier work an earlier
 * slot covers.
 *
 * Open slot (ordered reuse): a fence of one stream alone (a loop on one stream frees after
 * each launch) is not recorded at once. Its slot stays open, the newest, and the next fences
 * of that stream alone join it, until someone must know whether its work finished or wait for
 * it (a poll, a wait, another stream's catch-up, a capture or destroy of a stream) or another
 * fence comes: then one event is recorded for it all (seal). An event recorded later covers
 * more work, never less, so a fence is only ever late. The loop then records an event every
 * POLL_EVERY frees, where it recorded one at each.
 *
 * Ordered reuse: the cache may hand out a block whose epoch has not completed after
 * cs_streams_order_after raised the context's order epoch to it. Before its next work, every
 * stream then waits (cuStreamWaitEvent), for every other stream, on that stream's newest event
 * in the slots up to the order epoch (catch_up); with several contexts, on the other
 * contexts' fences too (peer access). A stream never waits on its own events: the common
 * single-stream loop costs no wait at all. If the GPU cannot be made to wait, the host does.
 *
 * Per-thread default streams can only be named (CU_STREAM_PER_THREAD) by their own thread;
 * another thread fences them through the legacy stream, which waits for every blocking
 * stream. Nothing is recorded into, or waited from, a capturing stream: while captures run
 * (a process-wide count of streams flagged capturing), each stream is asked for its capture
 * state before an event is recorded on it, and a fence that cannot be recorded yet keeps an
 * entry without event, recorded once the capture is over. A slot that can never be recorded
 * (a failed record, a destroyed stream's entry) is broken: it completes after one device
 * synchronize, made at the next work call outside any lock and any capture. */
#include "cs_streams.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cs_driver.h"
#include "cs_libc.h"
#include "cs_shim.h"
#include "cs_work.h"

/* Pending fences kept apart; past that a new fence joins the newest slot, and a stream made to
 * wait for that slot waits for more than it needs. 4096 slots (160 KiB a context) keep the
 * waits precise until the host runs 4096 frees ahead of the GPU. */
#define MAX_SLOTS 4096
/* Events kept for reuse once their slot completed (an event made costs a driver call); up to
 * twice the GPU's lag in fences are pending between polls (POLL_EVERY at least apart). */
#define EVENT_POOL 1024
#define POLL_EVERY 16
#define STREAM_BUCKETS 256

typedef struct {
    cs_stream *st;  /* the stream the event was recorded on */
    CUevent ev;     /* NULL: still to be recorded (a capture forbade it) */
} fence_event;

typedef struct {
    uint64_t epoch;
    int n, cap;
    int done;       /* ev[0..done) seen complete */
    bool broken;    /* a record failed: complete only once the context has synchronized */
    bool open;      /* the newest slot, its one entry's event not recorded yet (leave_open) */
    fence_event *ev;
} slot;

struct cs_stream {
    CUstream handle;         /* what record and wait take: the stream, or LEGACY/PER_THREAD */
    cs_ctx_streams *cs;
    int dirty;               /* atomic: on cs->dirty_head */
    uint64_t waited;         /* atomic: the order epoch its work already waits for */
    int capturing;           /* atomic: a capture began on it and has not ended */
    bool legacy, per_thread, zombie, orphan;
    pthread_t owner;         /* the thread of a per-thread stream */
    CUevent last_event;      /* newest event recorded on it, not yet seen complete */
    int unrecorded;          /* slot entries still waiting for an event on it */
    uint64_t gen_seen;       /* atomic: order_gen when it last waited for other contexts */
    cs_stream *dirty_next;
    cs_stream *hash_next;
    cs_stream *ctx_prev, *ctx_next;
    cs_stream *thread_next;  /* a thread's per-thread streams */
    CUevent pick;            /* catch_up's choice for it (the context's lock) */
    cs_stream *pick_next;
};

struct cs_ctx_streams {
    CUcontext ctx;
    bool dead;
    pthread_mutex_t lock;
    cs_stream legacy;
    cs_stream *streams;      /* every other record of the context: created, per-thread, zombie */
    cs_stream *dirty_head;   /* atomic */
    uint64_t epoch;          /* atomic: newest epoch; taken before a fence takes the list */
    uint64_t done;           /* atomic: every epoch up to this one completed */
    uint64_t order;          /* atomic: streams wait for all fences up to this before new work */
    slot ring[MAX_SLOTS];
    unsigned first;
    int count;
    CUevent pool[EVENT_POOL];
    int npool;
    int waiters;             /* threads in cs_streams_wait's cuEventSynchronize, unlocked */
    CUevent *held;           /* events past the pool given back while waiters > 0 */
    int nheld, held_cap;
    bool said_record, said_wait;
    bool sync_wanted;        /* atomic: a broken slot waits for one device synchronize */
    int busy;                /* atomic: streams whose last_event is set, or open_st */
    int unrecorded;          /* pending slot entries without event, all streams */
    int broken;              /* pending slots marked broken */
    uint64_t poll_epoch;     /* a fence of this epoch or later polls */
    cs_stream *open_st;      /* atomic: the stream of the open slot, or NULL */
    cs_ctx_streams *next;
};

/* Contexts and the handle -> stream map. Lock order: a context's lock, then this one. */
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static cs_ctx_streams *contexts;
static cs_ctx_streams *dead_contexts; /* forgotten, kept: late callers may hold a pointer */
static cs_stream *buckets[STREAM_BUCKETS];
static cs_stream *spare;            /* records are recycled, never freed (stale pointers stay safe) */
static uint64_t generation;         /* atomic: bumped whenever a record leaves the map */
static int capturing_streams;       /* atomic */
static uint64_t work_calls;         /* atomic: calls through cs_work_begin */
static int live_contexts;           /* atomic: contexts on the list */
static uint64_t order_gen;          /* atomic: bumped whenever a context's order is raised */
/* The contexts locked across fork, as a snapshot: a context forgotten meanwhile moves lists. */
#define FORK_LOCKED 256
static cs_ctx_streams *locked[FORK_LOCKED];
static int nlocked;

static _Thread_local struct {
    CUstream handle;
    cs_stream *st;
    CUcontext ctx;
    cs_stream *legacy, *per_thread;
    uint64_t generation;
} tl;
static _Thread_local cs_stream *tl_own;  /* this thread's per-thread streams */
static pthread_key_t exit_key;
static bool exit_key_ok;  /* the program had a key left for it */
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;

static const cs_driver *drv(void)
{
    return cs_driver_get();
}

/* ---------------------------------------------------------------- small helpers */

static bool captures_running(void)
{
    return __atomic_load_n(&capturing_streams, __ATOMIC_ACQUIRE) > 0;
}

/* Queries run in relaxed capture mode while captures run, as PyTorch's allocator does: a
 * capture that another thread began must not see them as unsafe calls. */
static CUstreamCaptureMode relax(void)
{
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (drv()->cuThreadExchangeStreamCaptureMode)
        drv()->cuThreadExchangeStreamCaptureMode(&mode);
    return mode;
}

static void unrelax(CUstreamCaptureMode mode)
{
    if (drv()->cuThreadExchangeStreamCaptureMode)
        drv()->cuThreadExchangeStreamCaptureMode(&mode);
}

/* May an event be recorded into, or a wait issued from, this stream now? Asks the driver
 * only while captures run. The legacy stream answers an error while a blocking stream of
 * its context captures. */
static bool recordable(const cs_stream *st)
{
    if (__atomic_load_n(&st->capturing, __ATOMIC_ACQUIRE))
        return false;
    if (!captures_running() || !drv()->cuStreamIsCapturing)
        return true;
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    return drv()->cuStreamIsCapturing(st->handle, &status) == CUDA_SUCCESS &&
           status == CU_STREAM_CAPTURE_STATUS_NONE;
}

static CUevent take_event(cs_ctx_streams *cs)
{
    if (cs->npool > 0)
        return cs->pool[--cs->npool];
    if (cs->nheld > 0)
        return cs->held[--cs->nheld];
    CUevent e = NULL;
    if (drv()->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
        return NULL;
    return e;
}

/* An event whose slot completed goes back to the pool, or past its size is destroyed. Not
 * while a thread waits for an event outside the lock (cs_streams_wait): it may be that one,
 * and a destroyed handle is a use after free (or a wait on an unrelated event that took the
 * handle). Such events are kept on the held list meanwhile, taken again like the pool's (a
 * waiter's event recorded again only makes its wait longer, as a pooled one does), and those
 * past the pool destroyed when the last waiter leaves (release_held). Nothing when the
 * context is dead: its events went with it. */
static void give_event(cs_ctx_streams *cs, CUevent e)
{
    if (!e || cs->dead)
        return;
    if (cs->npool < EVENT_POOL) {
        cs->pool[cs->npool++] = e;
    } else if (cs->waiters > 0) {
        if (cs->nheld == cs->held_cap) {
            int cap = cs->held_cap ? 2 * cs->held_cap : 64;
            CUevent *held = realloc(cs->held, (size_t)cap * sizeof *held);
            if (!held)
                return;  /* out of host memory: the event leaks, never destroyed under a waiter */
            cs->held = held;
            cs->held_cap = cap;
        }
        cs->held[cs->nheld++] = e;
    } else {
        drv()->cuEventDestroy_v2(e);
    }
}

/* The last waiter left: the held events go to the pool, or are destroyed. With the context's
 * lock held and the context current. */
static void release_held(cs_ctx_streams *cs)
{
    while (cs->nheld > 0)
        give_event(cs, cs->held[--cs->nheld]);
}

static slot *slot_at(cs_ctx_streams *cs, int i)
{
    return &cs->ring[(cs->first + (unsigned)i) % MAX_SLOTS];
}

/* ---------------------------------------------------------------- records */

static size_t bucket_of(CUstream h)
{
    return (size_t)(((uintptr_t)h >> 4) * 0x9E3779B97F4A7C15ull >> 56) % STREAM_BUCKETS;
}

/* With reg_lock held. */
static cs_stream *record_new(cs_ctx_streams *cs, CUstream handle)
{
    cs_stream *st = spare;
    if (st)
        spare = st->hash_next;
    else if (!(st = malloc(sizeof *st)))
        return NULL;
    memset(st, 0, sizeof *st);
    st->handle = handle;
    st->cs = cs;
    return st;
}

/* With the context's lock held. */
static void ctx_link(cs_ctx_streams *cs, cs_stream *st)
{
    st->ctx_prev = NULL;
    st->ctx_next = cs->streams;
    if (cs->streams)
        cs->streams->ctx_prev = st;
    cs->streams = st;
}

static void ctx_unlink(cs_ctx_streams *cs, cs_stream *st)
{
    if (st->ctx_prev)
        st->ctx_prev->ctx_next = st->ctx_next;
    else
        cs->streams = st->ctx_next;
    if (st->ctx_next)
        st->ctx_next->ctx_prev = st->ctx_prev;
}

/* With the context's lock and reg_lock held. */
static void record_recycle(cs_stream *st)
{
    st->hash_next = spare;
    spare = st;
}

/* The process-wide count follows the flags exactly: each flag changes it once. */
static void set_capturing(cs_stream *st, int on)
{
    if (__atomic_exchange_n(&st->capturing, on, __ATOMIC_ACQ_REL) != on)
        __atomic_add_fetch(&capturing_streams, on ? 1 : -1, __ATOMIC_ACQ_REL);
}

/* Can a record that left the map go? Not while a slot still names it. */
static bool unreferenced(const cs_stream *st)
{
    return !st->last_event && st->unrecorded == 0 && !__atomic_load_n(&st->dirty, __ATOMIC_ACQUIRE) &&
           __atomic_load_n(&st->cs->open_st, __ATOMIC_RELAXED) != st;
}

/* A record leaves the context (stream destroyed, thread gone and nothing pending). */
static void retire_record(cs_ctx_streams *cs, cs_stream *st)
{
    set_capturing(st, 0);
    ctx_unlink(cs, st);
    pthread_mutex_lock(&reg_lock);
    record_recycle(st);
    pthread_mutex_unlock(&reg_lock);
}

/* ---------------------------------------------------------------- contexts */

static cs_ctx_streams *find_ctx(CUcontext ctx)
{
    for (cs_ctx_streams *cs = contexts; cs; cs = cs->next)
        if (cs->ctx == ctx)
            return cs;
    return NULL;
}

cs_ctx_streams *cs_streams_for(CUcontext ctx)
{
    pthread_mutex_lock(&reg_lock);
    cs_ctx_streams *cs = find_ctx(ctx);
    if (!cs && (cs = calloc(1, sizeof *cs))) {
        cs->ctx = ctx;
        pthread_mutex_init(&cs->lock, NULL);
        cs->legacy.handle = CU_STREAM_LEGACY;
        cs->legacy.cs = cs;
        cs->legacy.legacy = true;
        cs->next = contexts;
        contexts = cs;
        __atomic_add_fetch(&live_contexts, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&reg_lock);
    return cs;
}

int cs_streams_all(cs_ctx_streams **out, int max)
{
    int n = 0;
    pthread_mutex_lock(&reg_lock);
    for (cs_ctx_streams *cs = contexts; cs; cs = cs->next, n++)
        if (n < max)
            out[n] = cs;
    pthread_mutex_unlock(&reg_lock);
    return n;
}

CUcontext cs_streams_context(const cs_ctx_streams *cs)
{
    return cs->ctx;
}

bool cs_streams_dead(cs_ctx_streams *cs)
{
    pthread_mutex_lock(&cs->lock);
    bool dead = cs->dead;
    pthread_mutex_unlock(&cs->lock);
    return dead;
}

void cs_streams_forget(CUcontext ctx)
{
    /* Off the list at once: the driver may give a new context the same handle. */
    pthread_mutex_lock(&reg_lock);
    cs_ctx_streams **pp = &contexts;
    while (*pp && (*pp)->ctx != ctx)
        pp = &(*pp)->next;
    cs_ctx_streams *cs = *pp;
    if (cs) {
        *pp = cs->next;
        cs->next = dead_contexts;
        dead_contexts = cs;
        __atomic_sub_fetch(&live_contexts, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&reg_lock);
    if (!cs)
        return;
    pthread_mutex_lock(&cs->lock);
    /* Kept (dead) so that late calls with its pointer find valid memory; nothing it holds
     * reaches the driver again. */
    cs->dead = true;
    cs->npool = 0;
    cs->nheld = 0;
    cs->unrecorded = cs->broken = 0;
    __atomic_store_n(&cs->busy, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&cs->open_st, NULL, __ATOMIC_RELAXED);
    for (int i = 0; i < cs->count; i++) {
        slot_at(cs, i)->n = 0;
        slot_at(cs, i)->open = false;
    }
    cs->count = 0;
    __atomic_store_n(&cs->dirty_head, NULL, __ATOMIC_RELEASE);
    set_capturing(&cs->legacy, 0);
    pthread_mutex_lock(&reg_lock);
    for (size_t b = 0; b < STREAM_BUCKETS; b++) {
        cs_stream **p = &buckets[b];
        while (*p) {
            if ((*p)->cs == cs)
                *p = (*p)->hash_next;
            else
                p = &(*p)->hash_next;
        }
    }
    while (cs->streams) {
        cs_stream *st = cs->streams;
        set_capturing(st, 0);
        ctx_unlink(cs, st);
        if (!st->per_thread || st->orphan)
            record_recycle(st);  /* a live thread's per-thread record stays on its list */
    }
    __atomic_add_fetch(&generation, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&reg_lock);
    pthread_mutex_unlock(&cs->lock);
}

/* ---------------------------------------------------------------- completion */

/* A stream's newest pending event, and the open slot's stream; busy counts the streams that
 * have either. With the context's lock held. */
static void set_last_event(cs_ctx_streams *cs, cs_stream *st, CUevent ev)
{
    if (!st->last_event != !ev && __atomic_load_n(&cs->open_st, __ATOMIC_RELAXED) != st)
        __atomic_add_fetch(&cs->busy, ev ? 1 : -1, __ATOMIC_RELAXED);
    st->last_event = ev;
}

static void set_open(cs_ctx_streams *cs, cs_stream *st)
{
    cs_stream *old = __atomic_load_n(&cs->open_st, __ATOMIC_RELAXED);
    if (old && !old->last_event)
        __atomic_sub_fetch(&cs->busy, 1, __ATOMIC_RELAXED);
    if (st && !st->last_event)
        __atomic_add_fetch(&cs->busy, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&cs->open_st, st, __ATOMIC_RELAXED);
}


/* The slot can never be recorded in full: it completes after one device synchronize. */
static void mark_broken(cs_ctx_streams *cs, slot *sl)
{
    if (!sl->broken)
        cs->broken++;
    sl->broken = true;
    __atomic_store_n(&cs->sync_wanted, true, __ATOMIC_RELEASE);
}

/* Record an event for entry e of slot sl now if it still lacks one; false if that cannot be
 * done yet. A per-thread stream can only be named by its own thread: any other thread records
 * on the legacy stream, which waits for it. A destroyed stream cannot be recorded on any
 * more: its slot then completes only after one device synchronize (resolve_broken). */
static bool record_late(cs_ctx_streams *cs, slot *sl, fence_event *e)
{
    if (e->ev)
        return true;
    cs_stream *target = e->st;
    if (target->per_thread && (target->orphan || !pthread_equal(target->owner, pthread_self())))
        target = &cs->legacy;
    else if (target->zombie) {
        mark_broken(cs, sl);
        return false;
    }
    if (!recordable(target))
        return false;
    CUevent ev = take_event(cs);
    if (!ev)
        return false;
    if (drv()->cuEventRecord(ev, target->handle) != CUDA_SUCCESS) {
        give_event(cs, ev);
        return false;
    }
    e->st->unrecorded--;
    cs->unrecorded--;
    if (e->st->zombie && unreferenced(e->st))
        retire_record(cs, e->st);
    e->st = target;
    e->ev = ev;
    set_last_event(cs, target, ev);
    return true;
}

/* The head slot is complete: everything up to its epoch is. */
static void pop_slot(cs_ctx_streams *cs)
{
    slot *s = slot_at(cs, 0);
    bool open = s->open;  /* completed by a device synchronize before it was recorded */
    if (open) {
        s->open = false;
        set_open(cs, NULL);
    }
    for (int i = 0; i < s->n; i++) {
        cs_stream *st = s->ev[i].st;
        if (!s->ev[i].ev && !open) {
            st->unrecorded--;  /* completed by a device synchronize */
            cs->unrecorded--;
        }
        else if (st->last_event == s->ev[i].ev)
            set_last_event(cs, st, NULL);
        give_event(cs, s->ev[i].ev);
        if (st->zombie && unreferenced(st))
            retire_record(cs, st);
    }
    __atomic_store_n(&cs->done, s->epoch, __ATOMIC_RELEASE);
    s->n = 0;
    s->done = 0;
    cs->broken -= s->broken;
    s->broken = false;
    cs->first = (cs->first + 1) % MAX_SLOTS;
    cs->count--;
}

/* Are all events of slot i complete? Asks the driver for those not seen complete yet,
 * recording first what was left to record. An event that cannot be asked (an error) is not
 * known complete. */
static bool slot_complete(cs_ctx_streams *cs, int i)
{
    slot *s = slot_at(cs, i);
    for (; s->done < s->n; s->done++) {
        fence_event *e = &s->ev[s->done];
        if (!record_late(cs, s, e) || drv()->cuEventQuery(e->ev) != CUDA_SUCCESS)
            return false;
    }
    return true;
}

/* Is every event not yet complete on one stream (none to record, no slot broken)? A stream
 * with no last_event has only completed ones (it is cleared when the slot of its newest
 * event pops). Then slots complete in the order they were recorded, as that stream's events
 * do. */
static bool pending_on_one_stream(cs_ctx_streams *cs)
{
    return !cs->unrecorded && !cs->broken && __atomic_load_n(&cs->busy, __ATOMIC_RELAXED) <= 1;
}

/* Pop the finished slots of a context whose pending events are on one stream: the oldest
 * first (asked again before the GPU moved on, it is all a question costs), then the newest (a
 * GPU in step has finished them all), else by bisection. A few queries however far the GPU
 * is behind, where asking slot after slot takes one for each. */
static void poll_one_stream(cs_ctx_streams *cs)
{
    if (!slot_complete(cs, 0))
        return;
    int done = 0, not_done = cs->count - 1;  /* slots up to done finished; not_done not */
    if (slot_complete(cs, not_done))
        done = not_done;
    while (not_done - done > 1) {
        int mid = done + (not_done - done) / 2;
        if (slot_complete(cs, mid))
            done = mid;
        else
            not_done = mid;
    }
    for (int i = 0; i <= done; i++)
        pop_slot(cs);
}

/* Pop the finished slots oldest first. */
static void poll_in_order(cs_ctx_streams *cs)
{
    while (cs->count > 0) {
        if (slot_at(cs, 0)->broken) {
            /* Resolved by one device synchronize, without locks, at the next work call. */
            __atomic_store_n(&cs->sync_wanted, true, __ATOMIC_RELEASE);
            return;
        }
        if (!slot_complete(cs, 0))
            return;
        pop_slot(cs);
    }
}

static void seal(cs_ctx_streams *cs);

/* Pop every slot the GPU has finished, the open one recorded first (so that the next poll
 * can find it finished). With the context's lock held; the context is current. Never
 * blocks. */
static void poll(cs_ctx_streams *cs)
{
    bool relaxed = captures_running();
    CUstreamCaptureMode mode = relaxed ? relax() : CU_STREAM_CAPTURE_MODE_GLOBAL;
    seal(cs);
    if (cs->count > 2 && pending_on_one_stream(cs))
        poll_one_stream(cs);  /* the head left, if any, is not finished */
    else
        poll_in_order(cs);
    if (cs->count == 0)  /* nothing pending: every epoch so far is done */
        __atomic_store_n(&cs->done, __atomic_load_n(&cs->epoch, __ATOMIC_RELAXED),
                         __ATOMIC_RELEASE);
    cs->poll_epoch = __atomic_load_n(&cs->epoch, __ATOMIC_RELAXED) +
                     (uint64_t)(cs->count > POLL_EVERY ? cs->count : POLL_EVERY);
    if (relaxed)
        unrelax(mode);
}

/* ---------------------------------------------------------------- fences */

/* The entry of st in slot s: its existing one (a merged fence re-records it), or a new one
 * (fresh = always a new one). */
static fence_event *slot_entry(slot *s, cs_stream *st, bool fresh)
{
    for (int i = 0; i < s->n && !fresh; i++)
        if (s->ev[i].st == st)
            return &s->ev[i];
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 4;
        fence_event *ev = realloc(s->ev, (size_t)cap * sizeof *ev);
        if (!ev)
            return NULL;
        s->ev = ev;
        s->cap = cap;
    }
    s->ev[s->n] = (fence_event){st, NULL};
    return &s->ev[s->n++];
}

/* Record the fence of one dirty stream into slot s. A per-thread stream of another thread
 * (or of one that exited) is fenced on the legacy stream. */
static void fence_stream(cs_ctx_streams *cs, slot *s, cs_stream *st)
{
    cs_stream *target = st;
    if (st->per_thread && (st->orphan || !pthread_equal(st->owner, pthread_self())))
        target = &cs->legacy;
    /* A merged slot re-records the stream's event there (the new record covers the old one,
     * and a stream that waited on the old state keeps what it waited for). */
    fence_event *e = slot_entry(s, target, false);
    CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
    if (e && target->zombie && !target->handle) {
        /* Destroyed while its slot was open and the context could not be entered: NULL would
         * name the legacy stream, whose event does not cover a non-blocking stream's work. */
        r = CUDA_ERROR_INVALID_HANDLE;
    } else if (e && recordable(target)) {
        CUevent ev = e->ev ? e->ev : take_event(cs);
        r = ev ? drv()->cuEventRecord(ev, target->handle) : CUDA_ERROR_OUT_OF_MEMORY;
        if (r == CUDA_SUCCESS) {
            e->ev = ev;
            set_last_event(cs, target, ev);
            return;
        }
        if (!e->ev)
            give_event(cs, ev);
    } else if (e) {
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  /* capturing: recorded once it is over */
    }
    /* Not recorded now. An entry that already has an event keeps it (an order raised on this
     * slot may rely on it); the work since goes into an entry of its own, without event. */
    if (e && e->ev)
        e = slot_entry(s, target, true);
    if (!e) {
        mark_broken(cs, s);  /* out of host memory: complete only after a synchronize */
        return;
    }
    target->unrecorded++;
    cs->unrecorded++;
    if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT || r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED ||
        r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
        return;  /* a capture: recorded later */
    /* The stream cannot be fenced: its work is only known done once the device has
     * synchronized, which the next work call does. A stream other than the legacy one is no
     * longer tracked. */
    mark_broken(cs, s);
    if (!cs->said_record) {
        cs->said_record = true;
        cs_log("cuEventRecord on stream %p of context %p failed (error %d): the stream is no "
               "longer tracked; memory freed after its work is reused once the device has "
               "synchronized, which the next launch does once (said once per context)",
               (void *)target->handle, (void *)cs->ctx, (int)r);
    }
    if (!target->legacy && !target->per_thread) {
        pthread_mutex_lock(&reg_lock);
        cs_stream **p = &buckets[bucket_of(target->handle)];
        while (*p && *p != target)
            p = &(*p)->hash_next;
        if (*p)
            *p = target->hash_next;
        __atomic_add_fetch(&generation, 1, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&reg_lock);
        target->zombie = true;  /* retired once its slots are done */
    }
}

/* The slot after the newest, emptied (counted by the caller once it is filled). */
static slot *next_slot(cs_ctx_streams *cs)
{
    slot *s = slot_at(cs, cs->count);
    s->n = 0;
    s->done = 0;
    s->broken = false;
    return s;
}

/* Record the open slot's event now: whenever someone must know whether its work finished or
 * wait for it, and before any later slot is recorded (a stream's slots then complete in their
 * order). With the context's lock held and the context current. */
static void seal(cs_ctx_streams *cs)
{
    cs_stream *st = __atomic_load_n(&cs->open_st, __ATOMIC_RELAXED);
    if (!st)
        return;
    slot *s = slot_at(cs, cs->count - 1);
    s->open = false;
    s->n = 0;
    set_open(cs, NULL);
    fence_stream(cs, s, st);
}

/* The fence of one stream alone, left open: its event is recorded only when sealed, and
 * until then the next fence of that stream alone joins the slot (takes its epoch) instead of
 * recording another. An event recorded later covers the work fenced and what followed on the
 * stream, so it is only later, never early. A per-thread stream is never left open (another
 * thread could only record it on the legacy stream, which waits for every blocking stream),
 * nor anything while captures run. Nor under completed reuse, which takes a block only once
 * its fence finished: an open fence, joined by the frees after it, would make the block wait
 * for their work too (memory grew from 1.19 to 2.40 times the live bytes in a replay of
 * cupy's trace). False: fence it now. */
static bool leave_open(cs_ctx_streams *cs, cs_stream *st, uint64_t epoch)
{
    if (cs_shim_get()->opts.reuse == CS_REUSE_COMPLETED)
        return false;
    if (st->dirty_next || st->per_thread || st->zombie || captures_running() ||
        __atomic_load_n(&st->capturing, __ATOMIC_ACQUIRE))
        return false;
    if (__atomic_load_n(&cs->open_st, __ATOMIC_RELAXED) == st) {
        __atomic_store_n(&st->dirty, 0, __ATOMIC_RELEASE);
        slot_at(cs, cs->count - 1)->epoch = epoch;
        return true;
    }
    seal(cs);
    if (cs->count == MAX_SLOTS)
        return false;
    slot *s = next_slot(cs);
    if (!slot_entry(s, st, true))
        return false;
    __atomic_store_n(&st->dirty, 0, __ATOMIC_RELEASE);
    s->open = true;
    s->epoch = epoch;
    cs->count++;
    set_open(cs, st);
    return true;
}

/* Record the fence of the streams taken from the dirty list into a new slot of `epoch` (the
 * newest, far behind), the open one sealed first. */
static void fence_list(cs_ctx_streams *cs, cs_stream *list, uint64_t epoch)
{
    seal(cs);
    slot *s;
    if (cs->count == MAX_SLOTS) {
        s = slot_at(cs, cs->count - 1);  /* far behind: join the newest slot */
        s->done = 0;
    } else {
        s = next_slot(cs);
        cs->count++;
    }
    while (list) {
        cs_stream *st = list;
        list = st->dirty_next;
        /* Clean before the record: work issued after this makes it dirty again. */
        __atomic_store_n(&st->dirty, 0, __ATOMIC_RELEASE);
        fence_stream(cs, s, st);
        if (st->orphan && unreferenced(st))
            retire_record(cs, st);  /* its thread is gone and the legacy stream covers it */
    }
    s->epoch = epoch;
}

/* Fence every dirty stream. With the context's lock held and the context current. */
static uint64_t fence_locked(cs_ctx_streams *cs)
{
    if (!__atomic_load_n(&cs->dirty_head, __ATOMIC_ACQUIRE))
        return __atomic_load_n(&cs->epoch, __ATOMIC_RELAXED);
    /* The epoch first, the list second: a free on another thread that finds the list already
     * taken (cs_streams_fence without the lock) then gets this epoch, whose slot covers the
     * work of the streams taken. Only fences take the list, under this lock, so it is not
     * empty below. */
    uint64_t epoch = __atomic_load_n(&cs->epoch, __ATOMIC_RELAXED) + 1;
    __atomic_store_n(&cs->epoch, epoch, __ATOMIC_RELEASE);
    cs_stream *list = __atomic_exchange_n(&cs->dirty_head, NULL, __ATOMIC_ACQ_REL);
    if (!leave_open(cs, list, epoch))
        fence_list(cs, list, epoch);
    /* Hits ask the GPU nothing while one stream is busy (cs_epoch_ready_or_ordered in the
     * cache): finished slots give their events back here then, after as many fences as were
     * pending at the last poll (POLL_EVERY at least), so that a GPU far behind is asked a few
     * times per lag's worth of fences rather than at every one. */
    if (epoch >= cs->poll_epoch)
        poll(cs);
    return epoch;
}

uint64_t cs_streams_fence(cs_ctx_streams *cs)
{
    if (!__atomic_load_n(&cs->dirty_head, __ATOMIC_ACQUIRE))
        return __atomic_load_n(&cs->epoch, __ATOMIC_ACQUIRE);
    bool pushed;
    pthread_mutex_lock(&cs->lock);
    uint64_t epoch = __atomic_load_n(&cs->epoch, __ATOMIC_RELAXED);
    if (!cs->dead && cs_ctx_enter(cs->ctx, &pushed)) {
        epoch = fence_locked(cs);
        cs_ctx_leave(pushed);
    }
    pthread_mutex_unlock(&cs->lock);
    return epoch;
}

int cs_streams_reached(cs_ctx_streams *cs, uint64_t epoch)
{
    if (epoch <= __atomic_load_n(&cs->done, __ATOMIC_ACQUIRE))
        return 1;
    bool pushed;
    pthread_mutex_lock(&cs->lock);
    if (!cs->dead && cs_ctx_enter(cs->ctx, &pushed)) {
        poll(cs);
        cs_ctx_leave(pushed);
    }
    pthread_mutex_unlock(&cs->lock);
    return epoch <= __atomic_load_n(&cs->done, __ATOMIC_ACQUIRE);
}

/* Device-wide synchronize of the context, as cudaFree does, for what events cannot tell (a
 * broken slot, an entry never recorded): not while a capture runs (it would break it). With
 * nothing held and the context current. Then every slot up to `upto` (the newest epoch before
 * the call) is done; later ones may hold work issued meanwhile. */
static bool sync_device(cs_ctx_streams *cs, uint64_t upto)
{
    if (captures_running() || drv()->cuCtxSynchronize() != CUDA_SUCCESS)
        return false;
    pthread_mutex_lock(&cs->lock);
    while (!cs->dead && cs->count > 0 && slot_at(cs, 0)->epoch <= upto)
        pop_slot(cs);
    if (!cs->broken)  /* the broken slots were among those: no second synchronize for them */
        __atomic_store_n(&cs->sync_wanted, false, __ATOMIC_RELEASE);
    cs->poll_epoch = 0;  /* the next fence polls: the spacing was set for the slots gone */
    pthread_mutex_unlock(&cs->lock);
    return true;
}

int cs_streams_wait(cs_ctx_streams *cs, uint64_t epoch)
{
    bool pushed;
    pthread_mutex_lock(&cs->lock);
    if (cs->dead || !cs_ctx_enter(cs->ctx, &pushed)) {
        pthread_mutex_unlock(&cs->lock);
        return -1;
    }
    int result = -1;
    for (;;) {
        poll(cs);
        if (epoch <= __atomic_load_n(&cs->done, __ATOMIC_ACQUIRE) || cs->count == 0) {
            result = 0;
            break;
        }
        slot *s = slot_at(cs, 0);
        CUevent ev = s->done < s->n && !s->broken ? s->ev[s->done].ev : NULL;
        uint64_t upto = __atomic_load_n(&cs->epoch, __ATOMIC_RELAXED);
        if (ev)
            cs->waiters++;  /* ev is not destroyed meanwhile (give_event) */
        pthread_mutex_unlock(&cs->lock);
        /* Without the lock: another thread may see the slot complete meanwhile and give its
         * events back; ev stays a valid event (give_event holds it), recorded again at worst,
         * which only makes this wait longer; poll() decides what completed. */
        bool ok;
        if (ev) {
            bool relaxed = captures_running();
            CUstreamCaptureMode mode = relaxed ? relax() : CU_STREAM_CAPTURE_MODE_GLOBAL;
            ok = drv()->cuEventSynchronize(ev) == CUDA_SUCCESS;
            if (relaxed)
                unrelax(mode);
        } else {
            ok = sync_device(cs, upto);
        }
        pthread_mutex_lock(&cs->lock);
        if (ev && --cs->waiters == 0)
            release_held(cs);  /* nothing when the context died meanwhile */
        if (!ok || cs->dead)
            break;
    }
    pthread_mutex_unlock(&cs->lock);
    cs_ctx_leave(pushed);
    return result;
}

int cs_streams_busy(cs_ctx_streams *cs)
{
    int n = __atomic_load_n(&cs->busy, __ATOMIC_RELAXED);
    return n > 0 ? n : 1;
}

/* Has every slot up to epoch all its events (none broken)? The open slot counts as recorded
 * if open_ok (it is recorded before anyone waits for it). Nothing to look for when no pending
 * slot lacks any: far behind, thousands are pending. With the context's lock held. */
static bool recorded_upto(cs_ctx_streams *cs, uint64_t epoch, bool open_ok)
{
    if (!cs->unrecorded && !cs->broken &&
        (open_ok || !__atomic_load_n(&cs->open_st, __ATOMIC_RELAXED)))
        return true;
    for (int i = 0; i < cs->count; i++) {
        const slot *s = slot_at(cs, i);
        if (s->open)
            return open_ok;
        if (s->broken)
            return false;
        for (int k = s->done; k < s->n; k++)
            if (!s->ev[k].ev)
                return false;
        if (s->epoch >= epoch)
            break;
    }
    return true;
}

int cs_streams_order_after(cs_ctx_streams *cs, uint64_t epoch)
{
    if (epoch <= __atomic_load_n(&cs->done, __ATOMIC_ACQUIRE))
        return 0;
    pthread_mutex_lock(&cs->lock);
    /* Streams wait on the events of every slot up to epoch: all must be there. */
    int result = recorded_upto(cs, epoch, true) ? 0 : -1;
    if (result == 0 && cs->dead)
        result = -1;
    if (result == 0 && __atomic_load_n(&cs->order, __ATOMIC_RELAXED) < epoch) {
        __atomic_store_n(&cs->order, epoch, __ATOMIC_RELEASE);
        __atomic_add_fetch(&order_gen, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&cs->lock);
    return result;
}

/* ---------------------------------------------------------------- work on streams */

/* Make stream st wait, on the GPU, for all work cs fenced up to `target`: for every other
 * stream, its newest recorded event in the slots up to the one that covers target (a stream's
 * events complete in order, so the newest covers the rest). Later fences are not waited for:
 * the blocks handed out before them do not need them. With cs's lock held; st is named by the
 * calling thread, so its handle is valid here (cs may be another context than st's). */
static CUresult wait_fences(cs_ctx_streams *cs, cs_stream *st, uint64_t target)
{
    cs_stream *picked = NULL;
    for (int i = 0; i < cs->count; i++) {
        slot *sl = slot_at(cs, i);
        for (int k = sl->done; k < sl->n; k++) {
            cs_stream *x = sl->ev[k].st;
            if (x == st || !sl->ev[k].ev)
                continue;
            if (!x->pick) {
                x->pick_next = picked;
                picked = x;
            }
            x->pick = sl->ev[k].ev;
        }
        if (sl->epoch >= target)
            break;
    }
    CUresult r = CUDA_SUCCESS;
    for (cs_stream *x = picked; x; x = x->pick_next) {
        if (r == CUDA_SUCCESS)
            r = drv()->cuStreamWaitEvent(st->handle, x->pick, 0);
        x->pick = NULL;
    }
    return r;
}

/* The stream's next work must follow the fences up to its context's order epoch. A capturing
 * stream is left alone (its captured work runs when the graph is launched, and that stream
 * catches up then). If the GPU cannot be made to wait, the host does, before the work is
 * submitted. With nothing held. */
static void catch_up(cs_stream *st)
{
    cs_ctx_streams *cs = st->cs;
    pthread_mutex_lock(&cs->lock);
    uint64_t target = __atomic_load_n(&cs->order, __ATOMIC_ACQUIRE);
    if (cs->dead || __atomic_load_n(&st->waited, __ATOMIC_RELAXED) >= target || !recordable(st)) {
        pthread_mutex_unlock(&cs->lock);
        return;
    }
    /* No other stream has an event pending (a stream's newest is pending while any is) or
     * the open slot, so there is nothing to wait for: the common loop on one stream asks the
     * GPU nothing here. Another stream's open slot is recorded by the poll below. Not when a
     * slot up to target lacks its event: an open slot whose late record failed (in another
     * thread, after this one looked at sync_wanted) is broken and no longer counted busy;
     * the host waits for it below. */
    int busy = __atomic_load_n(&cs->busy, __ATOMIC_RELAXED);
    bool own = st->last_event || __atomic_load_n(&cs->open_st, __ATOMIC_RELAXED) == st;
    if ((busy == 0 || (busy == 1 && own)) && recorded_upto(cs, target, true)) {
        __atomic_store_n(&st->waited, target, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&cs->lock);
        return;
    }
    bool pushed, recorded = true;
    CUresult r = CUDA_ERROR_INVALID_CONTEXT;
    if (cs_ctx_enter(cs->ctx, &pushed)) {
        poll(cs);  /* records the open slot, if any */
        /* A slot recorded only now (the open one) may have failed to: then the host waits. */
        recorded = recorded_upto(cs, target, false);
        r = recorded ? wait_fences(cs, st, target) : CUDA_ERROR_NOT_READY;
        cs_ctx_leave(pushed);
    }
    if (r != CUDA_SUCCESS && recorded && !cs->said_wait) {
        cs->said_wait = true;
        cs_log("cuStreamWaitEvent on stream %p of context %p failed (error %d): waiting on the "
               "host instead, before work on that stream (said once per context)",
               (void *)st->handle, (void *)cs->ctx, (int)r);
    }
    pthread_mutex_unlock(&cs->lock);
    if (r == CUDA_SUCCESS || cs_streams_wait(cs, target) == 0 ||
        (!captures_running() && drv()->cuCtxSynchronize() == CUDA_SUCCESS))
        __atomic_store_n(&st->waited, target, __ATOMIC_RELAXED);
}

/* Memory of another context (peer access) may be reused before its fences completed too:
 * with several contexts, a stream also waits for the other contexts' fences up to their
 * order epochs, whenever one of them was raised since it last looked. Contexts are never
 * freed, so the snapshot stays valid. */
static void catch_up_other_contexts(cs_stream *st, uint64_t gen)
{
    enum { MAX = 64 };
    cs_ctx_streams *list[MAX];
    int n = 0;
    pthread_mutex_lock(&reg_lock);
    for (cs_ctx_streams *cs = contexts; cs && n < MAX; cs = cs->next)
        if (cs != st->cs)
            list[n++] = cs;
    pthread_mutex_unlock(&reg_lock);
    for (int i = 0; i < n; i++) {
        cs_ctx_streams *cs = list[i];
        pthread_mutex_lock(&cs->lock);
        uint64_t target = __atomic_load_n(&cs->order, __ATOMIC_ACQUIRE);
        CUresult r = CUDA_SUCCESS;
        bool pushed;
        /* Asked first, as catch_up does: a hit there no longer asks (cs_cache_int.h). */
        if (!cs->dead && target > __atomic_load_n(&cs->done, __ATOMIC_ACQUIRE) &&
            cs_ctx_enter(cs->ctx, &pushed)) {
            poll(cs);  /* records the open fence, if any */
            cs_ctx_leave(pushed);
        }
        if (!cs->dead && target > __atomic_load_n(&cs->done, __ATOMIC_ACQUIRE))
            r = recorded_upto(cs, target, false) ? wait_fences(cs, st, target)
                                                 : CUDA_ERROR_NOT_READY;
        pthread_mutex_unlock(&cs->lock);
        if (r != CUDA_SUCCESS && cs_streams_wait(cs, target) != 0)
            return;  /* looked at again on the next work */
    }
    __atomic_store_n(&st->gen_seen, gen, __ATOMIC_RELAXED);
}

static void thread_gone(void *arg)
{
    (void)arg;
    /* The driver ends this thread's per-thread streams; their pending work is fenced on the
     * legacy stream from now on, and records without it are dropped. */
    for (cs_stream *st = tl_own, *next; st; st = next) {
        next = st->thread_next;
        cs_ctx_streams *cs = st->cs;
        pthread_mutex_lock(&cs->lock);
        set_capturing(st, 0);
        st->orphan = true;
        st->zombie = true;  /* retired once its last event completed */
        if (cs->dead) {
            pthread_mutex_lock(&reg_lock);
            record_recycle(st);
            pthread_mutex_unlock(&reg_lock);
        } else if (unreferenced(st)) {
            retire_record(cs, st);
        }
        pthread_mutex_unlock(&cs->lock);
    }
    tl_own = NULL;
}

static void make_exit_key(void)
{
    exit_key_ok = cs_libc_key_create(&exit_key, thread_gone) == 0;
}

static cs_stream *per_thread_record(cs_ctx_streams *cs)
{
    for (cs_stream *st = tl_own; st; st = st->thread_next)
        if (st->cs == cs)
            return st;
    pthread_once(&exit_once, make_exit_key);
    pthread_mutex_lock(&cs->lock);
    pthread_mutex_lock(&reg_lock);
    cs_stream *st = cs->dead ? NULL : record_new(cs, CU_STREAM_PER_THREAD);
    pthread_mutex_unlock(&reg_lock);
    if (st) {
        st->per_thread = true;
        st->owner = pthread_self();
        ctx_link(cs, st);
        st->thread_next = tl_own;
        tl_own = st;
        if (exit_key_ok)  /* else no key: never the program's key 0 */
            cs_libc_setspecific(exit_key, st);  /* non-NULL, so thread_gone runs */
    }
    pthread_mutex_unlock(&cs->lock);
    return st;
}

/* The record of an explicit stream handle, made on first sight. */
static cs_stream *explicit_record(CUstream h)
{
    pthread_mutex_lock(&reg_lock);
    cs_stream *st = buckets[bucket_of(h)];
    while (st && st->handle != h)
        st = st->hash_next;
    pthread_mutex_unlock(&reg_lock);
    if (st)
        return st;
    CUcontext ctx = NULL;
    if (!drv()->cuStreamGetCtx || drv()->cuStreamGetCtx(h, &ctx) != CUDA_SUCCESS || !ctx)
        return NULL;
    cs_ctx_streams *cs = cs_streams_for(ctx);
    if (!cs)
        return NULL;
    pthread_mutex_lock(&cs->lock);
    pthread_mutex_lock(&reg_lock);
    st = buckets[bucket_of(h)];
    while (st && st->handle != h)
        st = st->hash_next;
    if (!st && !cs->dead && (st = record_new(cs, h))) {
        st->hash_next = buckets[bucket_of(h)];
        buckets[bucket_of(h)] = st;
        ctx_link(cs, st);
    }
    pthread_mutex_unlock(&reg_lock);
    pthread_mutex_unlock(&cs->lock);
    return st;
}

/* The record of the stream a call names, from this thread's memo when it can. */
static cs_stream *find_stream(CUstream h, int per_thread, bool make)
{
    uint64_t gen = __atomic_load_n(&generation, __ATOMIC_ACQUIRE);
    if (tl.generation != gen) {
        memset(&tl, 0, sizeof tl);
        tl.generation = gen;
    }
    if (h == NULL)
        h = per_thread ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
    if (h != CU_STREAM_LEGACY && h != CU_STREAM_PER_THREAD) {
        if (tl.handle == h && tl.st)
            return tl.st;
        cs_stream *st = make ? explicit_record(h) : NULL;
        if (st) {
            tl.handle = h;
            tl.st = st;
        }
        return st;
    }
    CUcontext ctx = NULL;
    if (drv()->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
        return NULL;
    if (tl.ctx != ctx) {
        cs_ctx_streams *cs = cs_streams_for(ctx);
        if (!cs)
            return NULL;
        tl.ctx = ctx;
        tl.legacy = &cs->legacy;
        tl.per_thread = NULL;
    }
    if (h == CU_STREAM_LEGACY)
        return tl.legacy;
    if (!tl.per_thread)
        tl.per_thread = per_thread_record(tl.legacy->cs);
    return tl.per_thread;
}

/* A slot could not be recorded: wait once for the whole device, as cudaFree would have, so
 * that everything fenced so far is known done. Not while a capture runs. Called with nothing
 * held. */
static void resolve_broken(cs_ctx_streams *cs)
{
    bool pushed;
    if (captures_running())
        return;
    pthread_mutex_lock(&cs->lock);
    uint64_t upto = __atomic_load_n(&cs->epoch, __ATOMIC_RELAXED);
    bool go = __atomic_load_n(&cs->sync_wanted, __ATOMIC_ACQUIRE) && !cs->dead &&
              cs_ctx_enter(cs->ctx, &pushed);
    pthread_mutex_unlock(&cs->lock);
    if (!go)
        return;
    sync_device(cs, upto);  /* clears sync_wanted unless a slot broke meanwhile */
    cs_ctx_leave(pushed);
}

cs_stream *cs_work_begin(CUstream stream, int per_thread)
{
    if (cs_shim_get()->disabled)
        return NULL;  /* CACHESHIM_DISABLE: every call untouched */
    __atomic_add_fetch(&work_calls, 1, __ATOMIC_RELAXED);
    cs_stream *st = find_stream(stream, per_thread, true);
    if (!st)
        return NULL;
    if (__builtin_expect(__atomic_load_n(&st->cs->sync_wanted, __ATOMIC_ACQUIRE), 0))
        resolve_broken(st->cs);
    if (__builtin_expect(__atomic_load_n(&st->cs->order, __ATOMIC_ACQUIRE) >
                             __atomic_load_n(&st->waited, __ATOMIC_RELAXED), 0))
        catch_up(st);
    if (__builtin_expect(__atomic_load_n(&live_contexts, __ATOMIC_RELAXED) > 1, 0)) {
        uint64_t gen = __atomic_load_n(&order_gen, __ATOMIC_ACQUIRE);
        if (gen != __atomic_load_n(&st->gen_seen, __ATOMIC_RELAXED))
            catch_up_other_contexts(st, gen);
    }
    return st;
}

void cs_work_end(cs_stream *st, CUresult result)
{
    (void)result;  /* a failed call may still have queued part of its work */
    if (!st || __atomic_load_n(&st->dirty, __ATOMIC_RELAXED) ||
        __atomic_load_n(&st->capturing, __ATOMIC_ACQUIRE))
        return;
    if (__atomic_exchange_n(&st->dirty, 1, __ATOMIC_ACQ_REL))
        return;
    cs_ctx_streams *cs = st->cs;
    cs_stream *head = __atomic_load_n(&cs->dirty_head, __ATOMIC_RELAXED);
    do
        st->dirty_next = head;
    while (!__atomic_compare_exchange_n(&cs->dirty_head, &head, st, true, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED));
}

/* ---------------------------------------------------------------- stream life */

/* Before st's handle goes (destroy) or stops taking records (capture): fence what it did and
 * record the open slot (st's, or the legacy stream's, which cannot be recorded on while a
 * blocking stream captures). With the context's lock held. */
static void fence_and_seal(cs_ctx_streams *cs, cs_stream *st, bool any_open)
{
    cs_stream *open = __atomic_load_n(&cs->open_st, __ATOMIC_RELAXED);
    bool pushed;
    if (!cs->dead &&
        (__atomic_load_n(&st->dirty, __ATOMIC_ACQUIRE) || open == st || (any_open && open)) &&
        cs_ctx_enter(cs->ctx, &pushed)) {
        fence_locked(cs);
        seal(cs);
        cs_ctx_leave(pushed);
    }
}

void cs_streams_destroying(CUstream h)
{
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
        return;
    cs_stream *st = find_stream(h, 0, false);
    if (!st) {
        pthread_mutex_lock(&reg_lock);
        for (st = buckets[bucket_of(h)]; st && st->handle != h; st = st->hash_next)
            ;
        pthread_mutex_unlock(&reg_lock);
    }
    if (!st)
        return;
    cs_ctx_streams *cs = st->cs;
    pthread_mutex_lock(&cs->lock);
    fence_and_seal(cs, st, false);  /* its last work, while the handle is valid */
    pthread_mutex_lock(&reg_lock);
    cs_stream **p = &buckets[bucket_of(h)];
    while (*p && *p != st)
        p = &(*p)->hash_next;
    if (*p)
        *p = st->hash_next;
    __atomic_add_fetch(&generation, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&reg_lock);
    st->zombie = true;
    st->handle = NULL;
    if (unreferenced(st))
        retire_record(cs, st);
    else
        set_capturing(st, 0);
    pthread_mutex_unlock(&cs->lock);
}

/* ---------------------------------------------------------------- capture */

bool cs_streams_capture_beginning(CUstream stream, int per_thread)
{
    cs_stream *st = find_stream(stream, per_thread, true);
    if (!st)
        return false;
    /* Under the lock, so no fence of another thread is half-way through recording on it:
     * its work so far is fenced and recorded now (an open fence too: the legacy stream cannot
     * be recorded on while a blocking stream captures), and from here on it counts as
     * capturing (no other thread records into it), until the begin's result says otherwise. */
    cs_ctx_streams *cs = st->cs;
    pthread_mutex_lock(&cs->lock);
    fence_and_seal(cs, st, true);
    if (__atomic_load_n(&cs->sync_wanted, __ATOMIC_ACQUIRE)) {
        /* A record failed (the open slot's, late, after a block was reused ordered after
         * it): the device synchronizes now, while it still may, then the fence again. */
        pthread_mutex_unlock(&cs->lock);
        resolve_broken(cs);
        pthread_mutex_lock(&cs->lock);
        fence_and_seal(cs, st, true);
    }
    bool was = __atomic_load_n(&st->capturing, __ATOMIC_ACQUIRE);
    set_capturing(st, 1);
    pthread_mutex_unlock(&cs->lock);
    return was;
}

void cs_streams_capture_begun(CUstream stream, int per_thread, CUresult result, bool was)
{
    cs_stream *st = find_stream(stream, per_thread, true);
    if (!st || result == CUDA_SUCCESS)
        return;
    /* A stream flagged by a begin of its own before: learn from the driver whether that
     * capture goes on. Otherwise this begin's flag goes, whatever the driver says: a stream
     * that captures only as a member of another stream's capture (it waited on an event
     * recorded there: the begin fails for that) is never flagged, and no end would clear the
     * flag when that capture ends; while it runs, the stream is asked (recordable). */
    if (was)
        cs_streams_capture_ended(stream, per_thread);
    else
        set_capturing(st, 0);
}

void cs_streams_capture_ended(CUstream stream, int per_thread)
{
    cs_stream *st = find_stream(stream, per_thread, true);
    if (!st || !__atomic_load_n(&st->capturing, __ATOMIC_ACQUIRE))
        return;
    /* Whatever the end returned, the driver knows whether the capture goes on (it does
     * after CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, for one). */
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (drv()->cuStreamIsCapturing &&
        drv()->cuStreamIsCapturing(stream ? stream
                                          : per_thread ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY,
                                   &status) == CUDA_SUCCESS &&
        status != CU_STREAM_CAPTURE_STATUS_NONE)
        return;
    set_capturing(st, 0);
}

uint64_t cs_streams_work_calls(void)
{
    return __atomic_load_n(&work_calls, __ATOMIC_RELAXED);
}

bool cs_streams_capturing(void)
{
    return captures_running();
}


/* ---------------------------------------------------------------- fork */

void cs_streams_lock_all(void)
{
    /* Contexts' locks before reg_lock, as everywhere. A context past the snapshot, or made in
     * between, is not locked; the child forgets every context anyway. */
    pthread_mutex_lock(&reg_lock);
    nlocked = 0;
    for (cs_ctx_streams *cs = contexts; cs && nlocked < FORK_LOCKED; cs = cs->next)
        locked[nlocked++] = cs;
    pthread_mutex_unlock(&reg_lock);
    for (int i = 0; i < nlocked; i++)
        pthread_mutex_lock(&locked[i]->lock);
    pthread_mutex_lock(&reg_lock);
}

void cs_streams_unlock_all(void)
{
    pthread_mutex_unlock(&reg_lock);
    for (int i = 0; i < nlocked; i++)
        pthread_mutex_unlock(&locked[i]->lock);
}

void cs_streams_reset_after_fork(void)
{
    /* The child's driver state is new: forget the parent's contexts (their memory leaks by
     * design: other threads of the parent may have held pointers into them). */
    for (int i = 0; i < nlocked; i++)
        pthread_mutex_unlock(&locked[i]->lock);
    contexts = NULL;
    live_contexts = 0;
    memset(buckets, 0, sizeof buckets);
    tl_own = NULL;
    capturing_streams = 0;
    __atomic_add_fetch(&generation, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&reg_lock);
}
