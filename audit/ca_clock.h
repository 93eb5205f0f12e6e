/* The times of records (layer 3, under the wrappers, ca_trace.c, ca_drain.c and ca_recover.c;
 * see ca_desc.h): read on the program's threads at the start and end of each traced call,
 * made CLOCK_MONOTONIC nanoseconds by whoever formats the record.
 *
 * Where the kernel itself keeps CLOCK_MONOTONIC with the CPU's time-stamp counter (x86-64,
 * clocksource "tsc", an invariant counter), a record holds the counter's ticks: one rdtsc
 * instruction, about half of a clock_gettime, at two reads a call the largest part of what
 * tracing every call costs. The formatter converts ticks with pairs of (ticks,
 * CLOCK_MONOTONIC) read together as it goes (ca_clock_note), about every millisecond while
 * records come: between two pairs along the straight line through them (the recent ones, or
 * for a time before them the first and those one and two seconds old), past them at the rate
 * of the last second or more. Elsewhere, or with CACHESHIM_TRACE_CLOCK=monotonic,
 * a record holds CLOCK_MONOTONIC itself and the conversion changes nothing. */
#ifndef CA_CLOCK_H
#define CA_CLOCK_H

#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC in ns. */
static inline uint64_t ca_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* 1 while records take ticks (set by ca_clock_init, before any record). */
extern int ca_clock_ticks;

/* A record's time: ticks or ns (see above). Inline in each wrapper. */
static inline uint64_t ca_clock_read(void)
{
#if defined(__x86_64__)
    if (__builtin_expect(ca_clock_ticks, 1))
        return __builtin_ia32_rdtsc();
#endif
    return ca_now_ns();
}

typedef struct {
    uint64_t ticks, ns;
} ca_clock_pair;

#define CA_CLOCK_RECENT 16

/* What converting ticks takes: a copy of it goes into the pending file's header, for the
 * tools that format what a killed process left (ca_recover.c). */
typedef struct {
    uint64_t ticks;                        /* 1: records hold ticks; 0: ns, kept as they are */
    uint64_t n;                            /* pairs in recent[] (at most CA_CLOCK_RECENT) */
    ca_clock_pair first;                   /* read by ca_clock_init */
    ca_clock_pair slow;                    /* where the rate is taken from: one to two
                                            * seconds old (first while there is none) */
    ca_clock_pair slow_next;               /* slow's next: a pair up to a second old */
    ca_clock_pair recent[CA_CLOCK_RECENT]; /* the newest, at least 1 ms apart, oldest first */
} ca_clock_state;

/* The clock records take: want is CS_TRACE_CLOCK_* (cs_options.h). *why: a line to print
 * when want is tsc and the counter cannot serve (monotonic is used), else NULL. Reads the
 * first pair. */
void ca_clock_init(int want, const char **why);
/* A pair now, kept when 1 ms or more has passed since the newest (and, while there is none
 * that old, after waiting out the rest of that millisecond: wait, for the first records of
 * a process, so that they never need a rate of less than a millisecond). Never blocks on
 * another thread: when one is noting a pair, returns at once (with wait, while there is
 * none, once that thread's pair is in, or after 5 ms). */
void ca_clock_note(int wait);
/* A copy of the state, consistent, without a lock and without waiting for a writer (any
 * thread, signal handlers too, the writer's own included). */
void ca_clock_snapshot(ca_clock_state *s);
/* A pair now if one is due (ca_clock_note(wait)), then the state (ca_clock_snapshot): what
 * the formatters convert a batch of records with. */
void ca_clock_current(int wait, ca_clock_state *s);
/* A record's time t in CLOCK_MONOTONIC ns, by s. */
uint64_t ca_clock_ns(const ca_clock_state *s, uint64_t t);
/* The child of fork: a lock the parent's formatter held is free again. */
void ca_clock_fork_child(void);

#endif
