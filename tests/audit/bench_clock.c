/* What the tracer's clocks and atomics cost on this machine: clock_gettime(CLOCK_MONOTONIC),
 * rdtsc, rdtscp, a sequentially consistent store and a compare-and-swap, each in a loop of
 * 10 million, three times (ns each). meson test --benchmark audit-clock-cost. */
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

static uint64_t now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

#define N 10000000
#define TIME(name, body) \
    do { \
        uint64_t a_ = now(); \
        for (int i = 0; i < N; i++) { \
            body; \
        } \
        printf("%-14s %6.2f ns\n", name, (double)(now() - a_) / N); \
    } while (0)

int main(void)
{
    volatile uint64_t sink = 0;
    int x = 0;
    uint64_t c = 0;
    for (int k = 0; k < 3; k++) {
        TIME("clock_gettime", sink += now());
#if defined(__x86_64__)
        unsigned aux;
        TIME("rdtsc", sink += __rdtsc());
        TIME("rdtscp", sink += __rdtscp(&aux));
#endif
        TIME("seq_cst store", __atomic_store_n(&x, i, __ATOMIC_SEQ_CST));
        TIME("cas", {
            uint64_t p = c;
            __atomic_compare_exchange_n(&c, &p, p + 8, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
        });
    }
    return (int)(sink & 0);
}
