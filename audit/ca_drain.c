/* The formatter: raw records from the ring (ca_ring.c) into the trace's text (ca_format.c;
 * the lines of the objects of call sites come as text, put by the calling thread) appended
 * to the file (ca_out.c), in the order the calls returned.
 *
 * A thread of its own ("cacheshim-fmt") takes what the ring holds every millisecond while
 * records come (every 20 ms when none came for a while, or at once when a writer finds the
 * ring a quarter full), batch by batch, under g_lock: one consumer at a time. A writer that
 * finds the ring full formats records itself under the same lock. A record's room in the
 * ring is given back only once its text is in the file, and the header says how far that
 * is (ca_ring_consumed): a process killed at any moment leaves every record either as text
 * or in the ring, where the tools find it (ca_recover.c). */
#include "ca_drain.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ca_out.h"
#include "ca_ring.h"
#include "ca_sys.h"
#include "cs_options.h"

/* Text appended to the file at a time. */
#define BATCH_TEXT ((size_t)64 << 10)

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* the consumer's */
static const ca_fmt_ctx *g_ctx;
static ca_fmt_ids g_ids;
static char g_text[BATCH_TEXT + 2 * CA_REC_TEXT_MAX + 256];
static int g_stopped;          /* under g_lock: the process ends, nothing more is formatted */
static int g_ending;           /* atomic: the end wants g_lock: its holder lets go of it */
static uint64_t g_dropped;     /* atomic: calls with no room (ca_drain_full) */
static uint64_t g_dropped_noted; /* under g_lock: those the trace's notes count */
static int g_said;             /* atomic: the line on stderr was written */
static int g_stuck;            /* atomic: the ring stayed full: no more waiting for room */

/* What a note of dropped calls says, in the words of a write error's note (ca_format_note). */
#define DROPPED_WHY "dropped: the ring of unformatted calls stayed full"

/* Waking the thread. */
static pthread_mutex_t g_wake_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_wake_cond;
static int g_kicked; /* atomic */

static void flush(size_t *n, size_t *records)
{
    if (*n)
        ca_out_append(g_text, *n, *records);
    *n = *records = 0;
}

/* Under g_lock: the records the ring holds, formatted and appended; how many. final: the
 * writers are done, so a record never sealed is passed over at once. */
static size_t drain_locked(int final)
{
    ca_rec r;
    long tid;
    const char *text;
    unsigned skipped = 0;
    size_t count = 0, n = 0, batch = 0;
    /* The times of this batch's records made ns with a pair read now (the records were
     * sealed before it, but for those put while the batch goes, a little past it). */
    ca_clock_state clock;
    ca_clock_current(0, &clock);
    /* A record not sealed yet stops the formatting until its thread seals it (a thread
     * paused in the middle of its put, by a signal handler or a debugger, holds it up; its
     * room must not be given back while it may still write there). Only at the end, once
     * the writers are done, is one that stays unsealed passed over. */
    int skip = final;
    while (!g_stopped && (final || !__atomic_load_n(&g_ending, __ATOMIC_RELAXED)) &&
           ca_ring_take(&r, &tid, &text, skip, &skipped)) {
        if (r.fn == CA_RAW_TEXT) { /* the objects of a call site, put by its thread */
            memcpy(g_text + n, text, (size_t)r.bytes);
            n += (size_t)r.bytes;
        } else {
            ca_rec_times_ns(&r, &clock);
            n += ca_format_entry(g_ctx, &r, tid, &g_ids, g_text + n);
            batch++;
        }
        count++;
        if (n >= BATCH_TEXT)
            flush(&n, &batch);
    }
    /* Calls dropped since the last note: a note of their count, after what was formatted
     * (in the ring before them), so that every call is in the trace or counted there. */
    uint64_t dropped = __atomic_load_n(&g_dropped, __ATOMIC_RELAXED);
    if (dropped > g_dropped_noted && !g_stopped) {
        uint64_t k = dropped - g_dropped_noted;
        size_t at, w = ca_format_note(g_ctx->format, &k, DROPPED_WHY, g_text + n,
                                      sizeof g_text - n, &at);
        if (w) {
            n += w;
            g_dropped_noted = dropped;
        }
    }
    flush(&n, &batch);
    /* Not once the file is finished (the end gave up waiting for this lock): the text may
     * not be in it, so the records stay in the ring for ca_recover. */
    size_t end = ca_out_end();
    if ((count || skipped) && end != SIZE_MAX) {
        const char *error;
        uint64_t lost = ca_out_lost(&error);
        ca_ring_clock(&clock);
        ca_ring_consumed(end, lost, error);
    }
    return count;
}

static void *drain_main(void *arg)
{
    (void)arg;
    unsigned idle = 0;
    for (;;) {
        pthread_mutex_lock(&g_lock);
        size_t n = drain_locked(0);
        int stopped = g_stopped || __atomic_load_n(&g_ending, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&g_lock);
        if (stopped)
            break;
        idle = n ? 0 : idle + 1;
        /* 1 ms while records come, 20 ms once none came for 20 rounds. */
        uint64_t wait = idle < 20 ? 1000000u : 20000000u;
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += (long)wait;
        until.tv_sec += until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        pthread_mutex_lock(&g_wake_lock);
        while (!__atomic_load_n(&g_kicked, __ATOMIC_RELAXED) &&
               pthread_cond_timedwait(&g_wake_cond, &g_wake_lock, &until) == 0) {
        }
        __atomic_store_n(&g_kicked, 0, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&g_wake_lock);
    }
    /* Stopped: the process is ending. The thread waits for it without returning: a thread
     * of the tracer's namespace that exits frees its stack's TLS through ld.so, whose free is
     * the program's malloc, which a sanitizer's runtime serves only on threads it knows. */
    for (;;)
        pause();
    return NULL;
}

void ca_drain_start(const ca_fmt_ctx *c)
{
    g_ctx = c;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g_wake_cond, &ca);
    pthread_condattr_destroy(&ca);
    /* Without it, the writers format when the ring is full (ca_drain_full). */
    ca_sys_thread(drain_main, "cacheshim-fmt");
}

void ca_drain_kick(void)
{
    if (__atomic_exchange_n(&g_kicked, 1, __ATOMIC_RELAXED))
        return;
    pthread_mutex_lock(&g_wake_lock);
    pthread_cond_signal(&g_wake_cond);
    pthread_mutex_unlock(&g_wake_lock);
}

void ca_drain_full(const ca_rec *r, const char *text, size_t n, long tid)
{
    /* Once a wait has failed, the ring counts as stuck: each call tries once and goes on,
     * so that a formatter stopped for good costs the program no more than that. */
    int stuck = __atomic_load_n(&g_stuck, __ATOMIC_RELAXED);
    uint64_t start = ca_now_ns();
    do {
        /* The process is ending: as for any call in progress then, nothing is written. */
        if (__atomic_load_n(&g_ending, __ATOMIC_RELAXED))
            return;
        /* Not a blocking lock: this thread may hold it already (a signal handler that makes
         * driver calls, run while this thread formatted). */
        if (pthread_mutex_trylock(&g_lock) == 0) {
            drain_locked(0);
            pthread_mutex_unlock(&g_lock);
        } else if (!stuck) {
            struct timespec pause = {0, 100000};
            nanosleep(&pause, NULL);
        }
        if ((text ? ca_ring_put_text(text, n, tid) : ca_ring_put(r, tid)) != 0) {
            if (stuck)
                __atomic_store_n(&g_stuck, 0, __ATOMIC_RELAXED);
            return;
        }
    } while (!stuck && ca_now_ns() - start < 200000000u);
    __atomic_store_n(&g_stuck, 1, __ATOMIC_RELAXED);
    if (!text) /* a call; text is the objects of a call site */
        __atomic_fetch_add(&g_dropped, 1, __ATOMIC_RELAXED);
    if (!__atomic_exchange_n(&g_said, 1, __ATOMIC_RELAXED))
        ca_out_say("cacheshim: the trace's ring of unformatted calls stayed full for 200 ms "
                   "(its formatter stopped?); calls are dropped while it is full, and counted "
                   "in the trace");
}

int ca_drain_finish(void)
{
    /* The formatter (or a writer whose ring is full) may be in the middle of a long batch:
     * it stops at its next record, so the lock is had at once unless its holder is stopped
     * for good. */
    __atomic_store_n(&g_ending, 1, __ATOMIC_RELAXED);
    if (!ca_sys_lock_within(&g_lock, 100))
        return 0;
    drain_locked(1);
    g_stopped = 1;
    int empty = ca_ring_used() == 0;
    pthread_mutex_unlock(&g_lock);
    return empty;
}

void ca_drain_fork_prepare(void)
{
    pthread_mutex_lock(&g_lock);
    if (g_ctx)
        drain_locked(0);
}

/* g_wake_lock is not held across fork (a writer that wakes the formatter meanwhile would
 * wait for the fork): the child makes it, and the condition, anew. */
void ca_drain_fork_parent(void)
{
    pthread_mutex_unlock(&g_lock);
}

/* The thread is not in the child; the child starts its own ring and thread when it traces. */
void ca_drain_fork_child(void)
{
    pthread_mutex_init(&g_lock, NULL);
    pthread_mutex_init(&g_wake_lock, NULL);
    g_kicked = 0;
    g_stuck = 0;
    g_dropped = g_dropped_noted = 0; /* the parent's, noted in its trace (fork_prepare) */
    g_said = 0;
    g_ids.len = 0;
}
