/* The times of records: ticks of the time-stamp counter or CLOCK_MONOTONIC, and ticks made
 * ns (see ca_clock.h). The state changes only in ca_clock_note, one thread at a time (a
 * trylock), and is kept in two slots: the writer fills the one not current, then makes it
 * current (g_gen's parity). A reader copies the current one and takes the copy when g_gen
 * did not change meanwhile: never waiting on a writer, so that a signal handler that formats
 * on the writer's own thread, interrupting it, and the child of a fork made while another
 * thread wrote, find a whole state at once. Every word of a slot is written with release
 * and read with acquire (no fences, which ThreadSanitizer cannot follow): a reader that
 * sees any word of a slot's next filling also sees the g_gen made before it, and reads
 * g_gen again after every word. */
#include "ca_clock.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "cs_options.h"

#define MS 1000000u
#define SLOW_NS 1000000000u /* the rate is taken over at least this long, once it can be */

int ca_clock_ticks;

static ca_clock_state g_state[2];                         /* the current one: g_gen's parity */
static unsigned g_gen;                                    /* atomic */
/* atomic: CLOCK_MONOTONIC before which no pair is due (the newest's and 1 ms; 0 while there
 * is none but the first): ca_clock_note's test, one clock read, before the lock and a pair
 * (three of each), for the program's threads that note at each record (no ring). */
static uint64_t g_due_ns;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* the one changing it */

#define STATE_WORDS (sizeof(ca_clock_state) / sizeof(uint64_t))

static void load_state(const ca_clock_state *from, ca_clock_state *to)
{
    const uint64_t *f = (const uint64_t *)from;
    uint64_t *t = (uint64_t *)to;
    for (size_t i = 0; i < STATE_WORDS; i++)
        t[i] = __atomic_load_n(&f[i], __ATOMIC_ACQUIRE);
}

static void store_state(ca_clock_state *to, const ca_clock_state *from)
{
    const uint64_t *f = (const uint64_t *)from;
    uint64_t *t = (uint64_t *)to;
    for (size_t i = 0; i < STATE_WORDS; i++)
        __atomic_store_n(&t[i], f[i], __ATOMIC_RELEASE);
}

/* s made the current state: written into the slot not current, then that slot made current.
 * The slot's stores are releases after the previous g_gen (a reader of the slot that sees
 * one of them sees that g_gen changed). One writer at a time. */
static void publish(const ca_clock_state *s)
{
    unsigned gen = __atomic_load_n(&g_gen, __ATOMIC_RELAXED);
    store_state(&g_state[(gen + 1) & 1], s);
    __atomic_store_n(&g_gen, gen + 1, __ATOMIC_RELEASE);
    __atomic_store_n(&g_due_ns, s->n ? s->recent[s->n - 1].ns + MS : 0, __ATOMIC_RELAXED);
}

/* ---- which clock --------------------------------------------------------------------------- */

/* An invariant time-stamp counter: one rate in every power state, the same on every CPU. */
static int invariant_tsc(void)
{
#if defined(__x86_64__)
    unsigned a, b, c, d;
    return __get_cpuid(0x80000007u, &a, &b, &c, &d) && (d & (1u << 8));
#else
    return 0;
#endif
}

/* The kernel keeps CLOCK_MONOTONIC with the counter (it found it synchronized and stable). */
static int kernel_uses_tsc(void)
{
    char buf[16] = {0};
    int fd = open("/sys/devices/system/clocksource/clocksource0/current_clocksource",
                  O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    return n >= 3 && strncmp(buf, "tsc", 3) == 0 && (n == 3 || buf[3] == '\n');
}

/* Ticks and ns read together: the ticks between two clock reads, the ns their middle; the
 * closest of three tries (an interrupt between the reads makes one wide). */
static ca_clock_pair read_pair(void)
{
    ca_clock_pair best = {0, 0};
    uint64_t width = UINT64_MAX;
    for (int i = 0; i < 3; i++) {
        uint64_t a = ca_now_ns();
        uint64_t t = ca_clock_read();
        uint64_t b = ca_now_ns();
        if (b - a < width) {
            width = b - a;
            best.ticks = t;
            best.ns = a + (b - a) / 2;
        }
    }
    return best;
}

void ca_clock_init(int want, const char **why)
{
    *why = NULL;
    int use = 0;
    if (want == CS_TRACE_CLOCK_TSC) {
        use = invariant_tsc();
        if (!use)
            *why = "cacheshim: CACHESHIM_TRACE_CLOCK=tsc: this CPU has no invariant time-stamp "
                   "counter; using monotonic";
    } else if (want == CS_TRACE_CLOCK_AUTO) {
        use = invariant_tsc() && kernel_uses_tsc();
    }
    ca_clock_state s = {0};
    __atomic_store_n(&ca_clock_ticks, use, __ATOMIC_RELAXED);
    s.ticks = (uint64_t)use;
    if (use)
        s.first = read_pair();
    s.slow = s.slow_next = s.first;
    publish(&s);
}

/* ---- pairs --------------------------------------------------------------------------------- */

/* Another thread notes a pair: where it waits out the first millisecond, the first records
 * of this one wait for its pair too (their times would otherwise all be the first pair's).
 * At most 5 ms: the one noting may be this very thread, interrupted by a signal handler
 * that traces. */
static void wait_for_a_rate(void)
{
    for (int i = 0; i < 100; i++) {
        unsigned gen = __atomic_load_n(&g_gen, __ATOMIC_ACQUIRE);
        if (__atomic_load_n(&g_state[gen & 1].n, __ATOMIC_RELAXED) > 0)
            return;
        struct timespec pause = {0, 50000};
        nanosleep(&pause, NULL);
    }
}

void ca_clock_note(int wait)
{
    if (!__atomic_load_n(&ca_clock_ticks, __ATOMIC_RELAXED) ||
        ca_now_ns() < __atomic_load_n(&g_due_ns, __ATOMIC_RELAXED))
        return;
    if (pthread_mutex_trylock(&g_lock) != 0) {
        if (wait)
            wait_for_a_rate();
        return;
    }
    ca_clock_state s;
    load_state(&g_state[__atomic_load_n(&g_gen, __ATOMIC_RELAXED) & 1], &s);
    ca_clock_pair newest = s.n ? s.recent[s.n - 1] : s.first;
    ca_clock_pair p = read_pair();
    if (p.ns - newest.ns < MS && wait && s.n == 0) {
        struct timespec rest = {0, (long)(MS - (p.ns - newest.ns))};
        while (nanosleep(&rest, &rest) != 0 && errno == EINTR) {
        } /* a signal's handler ran: the rest of the wait */
        p = read_pair();
    }
    if (p.ns - newest.ns >= MS && p.ticks > newest.ticks) {
        if (s.n == CA_CLOCK_RECENT) {
            memmove(s.recent, s.recent + 1, (CA_CLOCK_RECENT - 1) * sizeof s.recent[0]);
            s.n--;
        }
        s.recent[s.n++] = p;
        /* The rate's start: slow, one to two seconds old once the process is that old. */
        if (p.ns - s.slow_next.ns >= SLOW_NS) {
            s.slow = s.slow_next;
            s.slow_next = p;
        }
        publish(&s);
    }
    pthread_mutex_unlock(&g_lock);
}

void ca_clock_snapshot(ca_clock_state *s)
{
    for (;;) {
        unsigned gen = __atomic_load_n(&g_gen, __ATOMIC_ACQUIRE);
        load_state(&g_state[gen & 1], s);
        if (__atomic_load_n(&g_gen, __ATOMIC_RELAXED) == gen)
            return;
    }
}

void ca_clock_current(int wait, ca_clock_state *s)
{
    ca_clock_note(wait);
    ca_clock_snapshot(s);
}

void ca_clock_fork_child(void)
{
    pthread_mutex_init(&g_lock, NULL);
}

/* ---- ticks made ns ------------------------------------------------------------------------ */

/* The ns at ticks t on the line through a with the slope of (from, to): from.ticks <
 * to.ticks, from.ns <= to.ns. Saturates instead of overflowing (a damaged file's values). */
static uint64_t on_line(ca_clock_pair a, ca_clock_pair from, ca_clock_pair to, uint64_t t)
{
    unsigned __int128 span_t = to.ticks - from.ticks, span_ns = to.ns - from.ns;
    unsigned __int128 d = t >= a.ticks ? t - a.ticks : a.ticks - t;
    unsigned __int128 dn = d * span_ns / span_t; /* < 2^64 * 2^64 / 1: fits */
    if (t >= a.ticks)
        return dn > UINT64_MAX - a.ns ? UINT64_MAX : a.ns + (uint64_t)dn;
    return dn > a.ns ? 0 : a.ns - (uint64_t)dn;
}

static int before(ca_clock_pair a, ca_clock_pair b)
{
    return a.ticks < b.ticks && a.ns <= b.ns;
}

/* t before oldest, the oldest of the recent pairs (a long call's start, a record the
 * formatter met late): on the line between the older pairs kept around it (first, slow,
 * slow_next: the rate over where t lies, not the last second's, carried back up to the
 * age of the process); before them all (a damaged file's), back from the oldest at the
 * rate of (from, newest). */
static uint64_t before_recent(const ca_clock_state *s, ca_clock_pair oldest, ca_clock_pair from,
                              ca_clock_pair newest, uint64_t t)
{
    const ca_clock_pair older[3] = {s->first, s->slow, s->slow_next};
    ca_clock_pair hi = oldest;
    for (int i = 2; i >= 0; i--) {
        if (!before(older[i], hi))
            continue;
        if (older[i].ticks <= t)
            return on_line(older[i], older[i], hi, t);
        hi = older[i];
    }
    return on_line(hi, from, newest, t);
}

uint64_t ca_clock_ns(const ca_clock_state *s, uint64_t t)
{
    if (!s->ticks)
        return t;
    unsigned n = s->n <= CA_CLOCK_RECENT ? (unsigned)s->n : 0;
    ca_clock_pair newest = n ? s->recent[n - 1] : s->first;
    /* The rate: since slow, or since the first pair while no pair is as old as slow wants. */
    ca_clock_pair from = before(s->slow, newest) ? s->slow : s->first;
    if (!before(from, newest))
        return newest.ns; /* no rate (a single pair, or a damaged file's) */
    if (t >= newest.ticks)
        return on_line(newest, from, newest, t);
    if (n == 0 || t < s->recent[0].ticks)
        return before_recent(s, n ? s->recent[0] : newest, from, newest, t);
    unsigned i = n - 1;
    while (i > 0 && s->recent[i].ticks > t)
        i--;
    /* recent[i] <= t < recent[i + 1]: the line through both. */
    if (!before(s->recent[i], s->recent[i + 1]))
        return on_line(s->recent[i], from, newest, t);
    return on_line(s->recent[i], s->recent[i], s->recent[i + 1], t);
}
