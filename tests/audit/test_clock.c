/* The tracer's clock (audit/ca_clock.c): ticks made ns along the pairs of a state, and the
 * clock itself against CLOCK_MONOTONIC on this machine. */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "ca_clock.h"
#include "cs_options.h"

/* Ticks at 3 a ns from T0 ticks at N0 ns: pairs at 0, 1, 2 and 3 ms. */
#define T0 4000000000ull
#define N0 2000000000ull
static ca_clock_state linear_state(void)
{
    ca_clock_state s = {0};
    s.ticks = 1;
    s.first = (ca_clock_pair){T0, N0};
    s.slow = s.slow_next = s.first;
    for (unsigned i = 0; i < 4; i++)
        s.recent[i] = (ca_clock_pair){T0 + 3000000ull * i, N0 + 1000000ull * i};
    s.n = 4;
    return s;
}

static void test_monotonic_is_kept(void **state)
{
    (void)state;
    ca_clock_state s = {0};
    assert_int_equal(ca_clock_ns(&s, 123456789), 123456789);
}

static void test_between_pairs(void **state)
{
    (void)state;
    ca_clock_state s = linear_state();
    assert_int_equal(ca_clock_ns(&s, T0), N0);
    assert_int_equal(ca_clock_ns(&s, T0 + 3000000), N0 + 1000000);
    assert_int_equal(ca_clock_ns(&s, T0 + 4500000), N0 + 1500000);
    /* A pair off the line: the times between its neighbours follow it, exact at it. */
    s.recent[2].ns += 300;
    assert_int_equal(ca_clock_ns(&s, T0 + 6000000), N0 + 2000300);
    assert_int_equal(ca_clock_ns(&s, T0 + 4500000), N0 + 1500150);
}

static void test_past_and_before_the_pairs(void **state)
{
    (void)state;
    ca_clock_state s = linear_state();
    s.first = (ca_clock_pair){T0 - 3000000000ull, N0 - 1000000000ull}; /* a second before */
    s.slow = s.first;
    s.recent[3].ns += 30; /* the newest 30 ns off: past it, the rate of the last second */
    uint64_t newest_t = T0 + 9000000, newest_ns = N0 + 3000030;
    assert_int_equal(ca_clock_ns(&s, newest_t + 3000000), newest_ns + 1000000);
    /* Before the recent pairs: back from the oldest at the same rate. */
    assert_int_equal(ca_clock_ns(&s, T0 - 300), N0 - 100);
    /* Never below 0: the oldest pair 100 ns after 0, 3 ticks a ns before it. */
    s.recent[0].ns = 100;
    assert_int_equal(ca_clock_ns(&s, T0 - 3000), 0);
}

/* A record that began long before the recent pairs (a call that blocked for seconds): on the
 * line of the older pairs around its start (within the ns lost to rounding), not at the last
 * second's rate carried back (here 33 ppm off: 10 us). */
static void assert_near(uint64_t ns, uint64_t want)
{
    if (ns + 1 < want || ns > want + 1)
        fail_msg("%llu ns, not %llu", (unsigned long long)ns, (unsigned long long)want);
}

static void test_long_before_the_recent_pairs(void **state)
{
    (void)state;
    ca_clock_state s = linear_state();
    s.first = (ca_clock_pair){T0 - 3900000000ull, N0 - 1300000000ull - 10000};
    s.slow = (ca_clock_pair){T0 - 3000000000ull, N0 - 1000000000ull};
    s.slow_next = (ca_clock_pair){T0 - 1500000000ull, N0 - 500000000ull};
    assert_near(ca_clock_ns(&s, s.first.ticks), s.first.ns);
    assert_near(ca_clock_ns(&s, s.first.ticks + 3000), s.first.ns + 1000);
    assert_near(ca_clock_ns(&s, s.slow.ticks - 3), s.slow.ns - 1);
    assert_near(ca_clock_ns(&s, s.slow.ticks + 3), s.slow.ns + 1);
    assert_near(ca_clock_ns(&s, T0 - 3), N0 - 1);
    /* Before every pair (a damaged file's records): back from the oldest at the rate. */
    assert_near(ca_clock_ns(&s, s.first.ticks - 3000), s.first.ns - 1000);
}

static void test_increases(void **state)
{
    (void)state;
    ca_clock_state s = linear_state();
    s.recent[1].ns -= 400; /* uneven segments */
    s.recent[3].ns += 700;
    uint64_t last = 0;
    for (uint64_t t = T0 - 5000000; t < T0 + 20000000; t += 997) {
        uint64_t ns = ca_clock_ns(&s, t);
        assert_true(ns >= last);
        last = ns;
    }
}

/* What a damaged pending file can hold: no division by zero, no overflow (UBSan), an answer. */
static void test_damaged(void **state)
{
    (void)state;
    ca_clock_state s = linear_state();
    s.n = 1000;
    (void)ca_clock_ns(&s, T0);
    s = linear_state();
    s.recent[2] = s.recent[1]; /* two pairs at one tick */
    (void)ca_clock_ns(&s, T0 + 3000000);
    (void)ca_clock_ns(&s, UINT64_MAX);
    s.recent[3] = (ca_clock_pair){UINT64_MAX, UINT64_MAX};
    (void)ca_clock_ns(&s, UINT64_MAX - 1);
    (void)ca_clock_ns(&s, 0);
    memset(&s, 0xff, sizeof s);
    (void)ca_clock_ns(&s, 42);
    ca_clock_state one = {.ticks = 1, .first = {5, 7}};
    one.slow = one.slow_next = one.first;
    assert_int_equal(ca_clock_ns(&one, 100), 7); /* a single pair: no rate */
}

static uint64_t now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The live clock over 60 ms with pairs noted as a formatter notes them: each time read, made
 * ns with the state at the end, lies between the CLOCK_MONOTONIC reads around it. */
static void check_live(int want)
{
    const char *why;
    ca_clock_init(want, &why);
    assert_null(why);
    enum { N = 60 };
    uint64_t t[N], lo[N], hi[N];
    for (int i = 0; i < N; i++) {
        lo[i] = now();
        t[i] = ca_clock_read();
        hi[i] = now();
        ca_clock_note(i == 0);
        usleep(1000);
    }
    ca_clock_state s;
    ca_clock_snapshot(&s);
    assert_int_equal(s.ticks, (uint64_t)ca_clock_ticks);
    for (int i = 0; i < N; i++) {
        uint64_t ns = ca_clock_ns(&s, t[i]);
        if (ns + 1000 < lo[i] || ns > hi[i] + 1000)
            fail_msg("read %d: %llu ns, between %llu and %llu", i, (unsigned long long)ns,
                     (unsigned long long)lo[i], (unsigned long long)hi[i]);
    }
}

static void test_live_auto(void **state)
{
    (void)state;
    check_live(CS_TRACE_CLOCK_AUTO);
}

static void test_live_monotonic(void **state)
{
    (void)state;
    check_live(CS_TRACE_CLOCK_MONOTONIC);
    assert_int_equal(ca_clock_ticks, 0);
}

/* tsc asked for: taken where the CPU has an invariant counter, else one line says why. */
static void test_live_tsc(void **state)
{
    (void)state;
    const char *why;
    ca_clock_init(CS_TRACE_CLOCK_TSC, &why);
#if defined(__x86_64__)
    if (ca_clock_ticks) {
        assert_null(why);
        check_live(CS_TRACE_CLOCK_TSC);
        return;
    }
#endif
    assert_non_null(why);
    assert_non_null(strstr(why, "CACHESHIM_TRACE_CLOCK=tsc"));
}

/* The clock started anew with ticks (the test skipped where auto takes monotonic: nothing to
 * make ns), and a thread running fn(arg). */
static pthread_t start_with(void *(*fn)(void *), void *arg)
{
    const char *why;
    ca_clock_init(CS_TRACE_CLOCK_AUTO, &why);
    if (!ca_clock_ticks)
        skip();
    pthread_t other;
    assert_int_equal(pthread_create(&other, NULL, fn, arg), 0);
    return other;
}

static void *note_first(void *arg)
{
    (void)arg;
    ca_clock_note(1);
    return NULL;
}

/* Two threads at their first records (no ring: each thread makes its own record's times
 * ns, ca_trace.c write_here): one waits out the first millisecond in ca_clock_note(1),
 * holding the state; the other, which finds it held, still makes its times ns with a rate,
 * not all at the first pair's time. */
static void test_first_records_of_two_threads(void **state)
{
    (void)state;
    pthread_t other = start_with(note_first, NULL);
    usleep(300); /* the other thread (most likely) in its wait now */
    uint64_t lo = now(), t = ca_clock_read(), hi = now();
    ca_clock_note(1);
    ca_clock_state s;
    ca_clock_snapshot(&s);
    uint64_t ns = ca_clock_ns(&s, t);
    pthread_join(other, NULL);
    if (ns + 1000 < lo || ns > hi + 1000)
        fail_msg("%llu ns, between %llu and %llu (the first pair at %llu)",
                 (unsigned long long)ns, (unsigned long long)lo, (unsigned long long)hi,
                 (unsigned long long)s.first.ns);
}

static void on_signal(int sig)
{
    (void)sig;
}

static void *signal_soon(void *arg)
{
    usleep(300);
    pthread_kill(*(pthread_t *)arg, SIGUSR1);
    return NULL;
}

/* A signal in the middle of the first millisecond's wait (a profiler's timer, SIGCHLD):
 * the wait goes on, and the first records have their rate. */
static void test_first_wait_interrupted(void **state)
{
    (void)state;
    struct sigaction sa = {0}, old;
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, &old);
    pthread_t self = pthread_self(), other = start_with(signal_soon, &self);
    ca_clock_note(1);
    pthread_join(other, NULL);
    sigaction(SIGUSR1, &old, NULL);
    ca_clock_state s;
    ca_clock_snapshot(&s);
    assert_int_equal(s.n, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_monotonic_is_kept),
        cmocka_unit_test(test_between_pairs),
        cmocka_unit_test(test_past_and_before_the_pairs),
        cmocka_unit_test(test_long_before_the_recent_pairs),
        cmocka_unit_test(test_increases),
        cmocka_unit_test(test_damaged),
        cmocka_unit_test(test_live_auto),
        cmocka_unit_test(test_live_monotonic),
        cmocka_unit_test(test_live_tsc),
        cmocka_unit_test(test_first_records_of_two_threads),
        cmocka_unit_test(test_first_wait_interrupted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
