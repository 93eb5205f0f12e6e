/* CPU benchmark of the cache core alone (no driver): cache-hit allocate+free pairs per
 * second with a backend whose fences cost nothing, on 1 thread and on N threads, for a few
 * size mixes. Run with `meson test --benchmark -C build --verbose`. Prints medians of 15
 * runs; asserts nothing about time. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cs_cache.h"

enum { RUNS = 15, PAIRS = 200000 };

static uint64_t next_addr = 1ull << 32;
static int be_alloc(void *d, uint64_t size, uint64_t *addr, int *raw)
{
    (void)d; (void)raw;
    *addr = __atomic_fetch_add(&next_addr, size + 4096, __ATOMIC_RELAXED);
    return CS_BE_OK;
}
static int be_free(void *d, uint64_t a, int *raw) { (void)d; (void)a; (void)raw; return CS_BE_OK; }
static int be_record(void *d, void **f) { (void)d; *f = (void *)1; return 0; }
static int be_query(void *d, void *f) { (void)d; (void)f; return 1; }
static int be_wait(void *d, void *f) { (void)d; (void)f; return 0; }
static void be_destroy(void *d, void *f) { (void)d; (void)f; }
static const cs_backend_ops ops = {be_alloc, be_free, be_record, be_query, be_wait, be_destroy};

typedef struct {
    cs_cache *cache;
    cs_heap *heap;
    const uint64_t *sizes;
    int nsizes;
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
    for (int i = 0; i < PAIRS; i++) {
        uint64_t a;
        int raw;
        cs_cache_alloc(j->cache, j->heap, j->sizes[i % j->nsizes], &a, &raw, NULL);
        cs_cache_free(j->cache, a);
    }
    return NULL;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void run(const char *mix, const uint64_t *sizes, int nsizes, int threads)
{
    double rate[RUNS];
    for (int r = 0; r < RUNS; r++) {
        cs_cache_config cfg = {0};
        cs_cache *c = cs_cache_create(&cfg);
        cs_heap *h = cs_cache_add_heap(c, (void *)1, 0, 1ull << 36, &ops, NULL);
        job j = {c, h, sizes, nsizes};
        pthread_t t[64];
        loop(&j);  /* warm: every class has its blocks */
        double t0 = now();
        for (int i = 0; i < threads; i++)
            pthread_create(&t[i], NULL, loop, &j);
        for (int i = 0; i < threads; i++)
            pthread_join(t[i], NULL);
        rate[r] = (double)PAIRS * threads / (now() - t0);
        cs_cache_forget_heap(c, (void *)1);
        cs_cache_destroy(c);
    }
    qsort(rate, RUNS, sizeof rate[0], cmp);
    printf("bench cache-hit mix=%-8s threads=%-2d median_pairs_per_s=%.3gM ns_per_pair=%.1f "
           "min=%.3gM max=%.3gM runs=%d\n",
           mix, threads, rate[RUNS / 2] / 1e6, 1e9 / rate[RUNS / 2], rate[0] / 1e6,
           rate[RUNS - 1] / 1e6, RUNS);
}

int main(void)
{
    static const uint64_t one[] = {1 << 20};
    static const uint64_t small[] = {256, 1024, 4096, 8192, 32768, 65536};
    static const uint64_t mixed[] = {512, 70000, 1 << 20, 3 << 20, 64 << 20, 200 << 20};
    run("1MiB", one, 1, 1);
    run("small", small, 6, 1);
    run("mixed", mixed, 6, 1);
    run("1MiB", one, 1, 4);
    run("mixed", mixed, 6, 4);
    return 0;
}
