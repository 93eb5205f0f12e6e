/* CPU benchmark of the cache core alone (no driver): cache-hit allocate+free pairs per
 * second with a backend whose fences cost nothing, on 1 thread and on N threads, for a few
 * size mixes. Prints medians; asserts nothing about time.
 *
 *     bench_cache                  every mix on 1 thread and on N threads (N = the online
 *                                  CPUs, at least 2), 15 runs x 200000 pairs a thread
 *                                  (what `meson test --benchmark` runs)
 *     bench_cache MIX THREADS PAIRS RUNS
 *                                  one case; scripts/bench-cpu runs these, and runs them
 *                                  under callgrind with two PAIRS to count instructions */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cs_cache.h"

enum { RUNS = 15, PAIRS = 200000, MAX_THREADS = 64, MAX_RUNS = 1000 };
/* Pairs run before the clock starts, whatever PAIRS is, so that every class of the mix has
 * a cached block and two pair counts differ only in the timed pairs. */
enum { WARM_PAIRS = 1200 };

static uint64_t next_addr = 1ull << 32;
static int be_alloc(void *d, uint64_t size, uint64_t *addr, int *raw)
{
    (void)d; (void)raw;
    *addr = __atomic_fetch_add(&next_addr, size + 4096, __ATOMIC_RELAXED);
    return CS_BE_OK;
}
static int be_free(void *d, uint64_t a, int *raw) { (void)d; (void)a; (void)raw; return CS_BE_OK; }
static uint64_t be_fence(void *d) { (void)d; return 0; }
static int be_reached(void *d, uint64_t e) { (void)d; (void)e; return 1; }
static int be_wait(void *d, uint64_t e) { (void)d; (void)e; return 0; }
static int be_order(void *d, uint64_t e) { (void)d; (void)e; return 0; }
static const cs_backend_ops ops = {be_alloc, be_free, be_fence, be_reached, be_wait, be_order, NULL, NULL};

typedef struct {
    const char *name;
    const uint64_t *sizes;
    int nsizes;
} mix;

static const uint64_t one_mib[] = {1 << 20};
static const uint64_t small[] = {256, 1024, 4096, 8192, 32768, 65536};
static const uint64_t mixed[] = {512, 70000, 1 << 20, 3 << 20, 64 << 20, 200 << 20};
static const mix mixes[] = {
    {"1MiB", one_mib, 1},
    {"small", small, 6},
    {"mixed", mixed, 6},
};

typedef struct {
    cs_cache *cache;
    cs_heap *heap;
    const mix *m;
    long pairs;
    pthread_barrier_t *start;  /* all threads and the clock start together */
} job;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *loop(void *arg)
{
    job *j = arg;
    if (j->start)
        pthread_barrier_wait(j->start);
    for (long i = 0; i < j->pairs; i++) {
        uint64_t a;
        int raw;
        cs_cache_alloc(j->cache, j->heap, j->m->sizes[i % j->m->nsizes], &a, &raw, NULL);
        cs_cache_free(j->cache, a);
    }
    return NULL;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int run(const mix *m, int threads, long pairs, int runs)
{
    double rate[MAX_RUNS];
    for (int r = 0; r < runs; r++) {
        cs_cache_config cfg = {0};
        cs_cache *c = cs_cache_create(&cfg);
        cs_heap *h = c ? cs_cache_add_heap(c, (void *)1, 0, 1ull << 36, &ops, NULL, 0) : NULL;
        if (!h) {
            fprintf(stderr, "bench_cache: out of host memory\n");
            return 1;
        }
        job warm = {c, h, m, WARM_PAIRS, NULL};
        loop(&warm);
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
        job j = {c, h, m, pairs, &start};
        pthread_t t[MAX_THREADS];
        for (int i = 0; i < threads; i++) {
            if (pthread_create(&t[i], NULL, loop, &j) != 0) {
                fprintf(stderr, "bench_cache: cannot start thread %d\n", i + 1);
                return 1;
            }
        }
        /* The clock starts before the threads are let go: were it read after, a thread
         * could run its pairs while this one waits to be scheduled, and be timed short. */
        double t0 = now();
        pthread_barrier_wait(&start);
        for (int i = 0; i < threads; i++)
            pthread_join(t[i], NULL);
        rate[r] = (double)pairs * threads / (now() - t0);
        pthread_barrier_destroy(&start);
        cs_cache_forget_heap(c, (void *)1);
        cs_cache_destroy(c);
    }
    qsort(rate, (size_t)runs, sizeof rate[0], cmp);
    printf("bench cache-hit mix=%-5s threads=%-2d pairs=%ld runs=%d median_pairs_per_s=%.3gM "
           "ns_per_pair=%.1f min=%.3gM max=%.3gM\n",
           m->name, threads, pairs, runs, rate[runs / 2] / 1e6, 1e9 / rate[runs / 2],
           rate[0] / 1e6, rate[runs - 1] / 1e6);
    return 0;
}

/* A decimal number in [min, max], or -1. */
static long number(const char *s, long min, long max)
{
    char *end;
    long v = strtol(s, &end, 10);
    return (*s && !*end && v >= min && v <= max) ? v : -1;
}

int main(int argc, char **argv)
{
    if (argc == 1) {
        /* Each thread allocates its own blocks: 1 vs N shows how the cache scales. */
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        int n = cpus < 2 ? 2 : cpus > MAX_THREADS ? MAX_THREADS : (int)cpus;
        int bad = 0;
        for (size_t i = 0; i < sizeof mixes / sizeof mixes[0]; i++) {
            bad |= run(&mixes[i], 1, PAIRS, RUNS);
            bad |= run(&mixes[i], n, PAIRS, RUNS);
        }
        return bad;
    }
    const mix *m = NULL;
    for (size_t i = 0; argc == 5 && i < sizeof mixes / sizeof mixes[0]; i++)
        if (strcmp(argv[1], mixes[i].name) == 0)
            m = &mixes[i];
    long threads = argc == 5 ? number(argv[2], 1, MAX_THREADS) : -1;
    long pairs = argc == 5 ? number(argv[3], 1, 1000000000) : -1;
    long runs = argc == 5 ? number(argv[4], 1, MAX_RUNS) : -1;
    if (!m || threads < 0 || pairs < 0 || runs < 0) {
        fprintf(stderr, "usage: bench_cache [MIX THREADS PAIRS RUNS]\n"
                        "  MIX: 1MiB, small or mixed; THREADS 1-%d; PAIRS 1-1000000000; "
                        "RUNS 1-%d\n",
                MAX_THREADS, MAX_RUNS);
        return 2;
    }
    return run(m, (int)threads, pairs, (int)runs);
}
