/* Unit tests of the exit statistics table (shim/cs_report.c): the real cache, driven through a
 * backend on host counters whose fences complete at once, then the table's exact lines. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cs_report.h"

#define MiB (1024ull * 1024)

/* ---------------------------------------------------------------- backend: one per device */

typedef struct {
    uint64_t budget, used, next_addr;
    struct { uint64_t addr, size; } live[64];
} device;

static int be_alloc(void *d, uint64_t size, uint64_t *addr, int *raw)
{
    device *dev = d;
    if (dev->used + size > dev->budget) {
        *raw = 2;
        return CS_BE_OOM;
    }
    for (int i = 0; i < 64; i++) {
        if (dev->live[i].size == 0) {
            dev->live[i].addr = *addr = dev->next_addr;
            dev->live[i].size = size;
            dev->next_addr += size + MiB;
            dev->used += size;
            return CS_BE_OK;
        }
    }
    *raw = 2;
    return CS_BE_OOM;
}

static int be_free(void *d, uint64_t addr, int *raw)
{
    device *dev = d;
    (void)raw;
    for (int i = 0; i < 64; i++) {
        if (dev->live[i].size && dev->live[i].addr == addr) {
            dev->used -= dev->live[i].size;
            dev->live[i].size = 0;
            return CS_BE_OK;
        }
    }
    return CS_BE_ERROR;
}

/* Every free follows work: each records a fence, a new epoch. */
static uint64_t epochs;
static uint64_t be_fence(void *d) { (void)d; return ++epochs; }
static int be_reached(void *d, uint64_t e) { (void)d; (void)e; return 1; }
static int be_wait(void *d, uint64_t e) { (void)d; (void)e; return 0; }
static int be_order(void *d, uint64_t e) { (void)d; (void)e; return 0; }
static const cs_backend_ops ops = {be_alloc, be_free, be_fence, be_reached, be_wait, be_order, NULL, NULL};

static device devs[8];
static uint64_t cap_bytes;

static uint64_t cap_for(void *arg, uint64_t total)
{
    (void)arg;
    (void)total;
    return cap_bytes;
}

/* A cache with `cap` on every device (CS_UNLIMITED: none) and fresh devices. */
static cs_cache *new_cache(uint64_t cap)
{
    cap_bytes = cap;
    memset(devs, 0, sizeof devs);
    for (int i = 0; i < 8; i++) {
        devs[i].budget = 1ull << 40;
        devs[i].next_addr = (uint64_t)(i + 1) << 44;
    }
    cs_cache_config cfg = {.cap_for = cap_for};
    cs_cache *c = cs_cache_create(&cfg);
    assert_non_null(c);
    return c;
}

static cs_heap *heap(cs_cache *c, int device)
{
    cs_heap *h = cs_cache_add_heap(c, &devs[device], device, 80ull << 30, &ops, &devs[device], 0);
    assert_non_null(h);
    return h;
}

static uint64_t alloc(cs_cache *c, cs_heap *h, uint64_t size)
{
    uint64_t a = 0;
    int raw = 0;
    assert_int_equal(cs_cache_alloc(c, h, size, &a, &raw, NULL), CS_OK);
    return a;
}

/* ---------------------------------------------------------------- collecting the lines */

static struct {
    char text[64][256];
    int n;
} out;

static void collect(const char *line, void *arg)
{
    (void)arg;
    assert_true(out.n < 64);
    assert_true(strlen(line) < sizeof out.text[0]);
    strcpy(out.text[out.n++], line);
}

static void report(cs_cache *c, bool details)
{
    out.n = 0;
    cs_report_stats(c, details, collect, NULL);
}

static void expect_lines(const char *const *want, int n)
{
    for (int i = 0; i < n && i < out.n; i++)
        assert_string_equal(out.text[i], want[i]);
    assert_int_equal(out.n, n);
}

#define EXPECT(...)                                                        \
    do {                                                                   \
        static const char *const want_[] = {__VA_ARGS__};                  \
        expect_lines(want_, (int)(sizeof want_ / sizeof want_[0]));        \
    } while (0)

/* ---------------------------------------------------------------- tests */

static void test_one_device_summary_and_details(void **state)
{
    (void)state;
    cs_cache *c = new_cache(CS_UNLIMITED);
    cs_heap *h = heap(c, 0);
    /* 3 misses of different sizes, then 5 hits on the 1 MiB block; one block kept. With one
     * stream busy (no busy_streams here), a hit does not ask whether the work before the free
     * finished: each is ordered after it, an ordered hit. */
    cs_cache_free(c, alloc(c, h, 1 * MiB));
    cs_cache_free(c, alloc(c, h, 2 * MiB));
    cs_cache_free(c, alloc(c, h, 3000));
    for (int i = 0; i < 4; i++)
        cs_cache_free(c, alloc(c, h, 1 * MiB));
    alloc(c, h, 1 * MiB);
    report(c, false);
    /* saved: 8 requests + 7 frees - 3 driver allocations = 12 calls;
     * 5 x 45 us + 7 x 31 us = 442 us. */
    EXPECT("statistics            device 0",
           "  requests                   8",
           "  hit rate               62.5%",
           "  peak in use         2.00 MiB",
           "  peak reserved       3.00 MiB",
           "  cached now          2.00 MiB",
           "  driver calls saved        12",
           "  est. time saved       442 us",
           "  OOM recoveries             0",
           "  cap refusals               0");
    report(c, true);
    EXPECT("statistics            device 0",
           "  requests                   8",
           "  hit rate               62.5%",
           "  peak in use         2.00 MiB",
           "  peak reserved       3.00 MiB",
           "  cached now          2.00 MiB",
           "  driver calls saved        12",
           "  est. time saved       442 us",
           "  OOM recoveries             0",
           "  cap refusals               0",
           "details               device 0",
           "  hits                       5",
           "  ordered hits               5",
           "  misses                     3",
           "  frees                      7",
           "  in use now          1.00 MiB",
           "  peak requested      2.00 MiB",
           "  driver allocations         3",
           "  driver frees               0",
           "  releases                   0",
           "  fences                     7",
           "  fence waits                0",
           "  OOM failures               0",
           "  other paths now          0 B",
           "  cap                     none");
    cs_cache_destroy(c);
}

static void test_two_devices_side_by_side(void **state)
{
    (void)state;
    cs_cache *c = new_cache(8 * MiB);
    cs_heap *h0 = heap(c, 0), *h1 = heap(c, 1);
    for (int i = 0; i < 3; i++)
        cs_cache_free(c, alloc(c, h0, 512));
    /* Device 1: the cap refuses 4 MiB beside 6 MiB in use, then gives the idle 6 MiB back
     * to make room for 7 MiB, a block of 8 MiB (whole 2 MiB granules). */
    uint64_t a = alloc(c, h1, 6 * MiB), b;
    int raw;
    assert_int_equal(cs_cache_alloc(c, h1, 4 * MiB, &b, &raw, NULL), CS_OOM);
    cs_cache_free(c, a);
    cs_cache_free(c, alloc(c, h1, 7 * MiB));
    report(c, true);
    /* Device 1: 3 requests + 2 frees - 2 allocations - 1 free (the release) = 2 calls;
     * 1 x 45 + 1 x 31 = 76 us. The refused request reached no driver: it counts. In use and
     * reserved are block bytes (8 MiB), requested the program's 7 MiB. */
    EXPECT("statistics            device 0  device 1",
           "  requests                   3         3",
           "  hit rate               66.6%      0.0%",
           "  peak in use            512 B  8.00 MiB",
           "  peak reserved          512 B  8.00 MiB",
           "  cached now             512 B  8.00 MiB",
           "  driver calls saved         5         2",
           "  est. time saved       183 us   76.0 us",
           "  OOM recoveries             0         0",
           "  cap refusals               0         1",
           "details               device 0  device 1",
           "  hits                       2         0",
           "  ordered hits               2         0",
           "  misses                     1         3",
           "  frees                      3         2",
           "  in use now               0 B       0 B",
           "  peak requested         512 B  7.00 MiB",
           "  driver allocations         1         2",
           "  driver frees               0         1",
           "  releases                   0         1",
           "  fences                     3         2",
           "  fence waits                0         0",
           "  OOM failures               0         0",
           "  other paths now          0 B       0 B",
           "  cap                 8.00 MiB  8.00 MiB");
    cs_cache_destroy(c);
}

static void test_more_devices_than_columns(void **state)
{
    (void)state;
    cs_cache *c = new_cache(CS_UNLIMITED);
    static const int ids[] = {0, 1, 2, 3, 7};
    for (int i = 0; i < 5; i++)
        cs_cache_free(c, alloc(c, heap(c, ids[i]), 4096));
    /* A device that had a heap made but was never asked for memory. */
    heap(c, 5);
    /* Device 7: many hits widen its column and make the time saved seconds. */
    cs_heap *h7 = heap(c, 7);
    for (int i = 0; i < 100000; i++)
        cs_cache_free(c, alloc(c, h7, 4096));
    report(c, false);
    EXPECT("statistics            device 0  device 1  device 2  device 3",
           "  requests                   1         1         1         1",
           "  hit rate                0.0%      0.0%      0.0%      0.0%",
           "  peak in use         4.00 KiB  4.00 KiB  4.00 KiB  4.00 KiB",
           "  peak reserved       4.00 KiB  4.00 KiB  4.00 KiB  4.00 KiB",
           "  cached now          4.00 KiB  4.00 KiB  4.00 KiB  4.00 KiB",
           "  driver calls saved         1         1         1         1",
           "  est. time saved      31.0 us   31.0 us   31.0 us   31.0 us",
           "  OOM recoveries             0         0         0         0",
           "  cap refusals               0         0         0         0",
           "statistics            device 5  device 7",
           "  requests                   0    100001",
           "  hit rate                   -     99.9%",
           "  peak in use              0 B  4.00 KiB",
           "  peak reserved            0 B  4.00 KiB",
           "  cached now               0 B  4.00 KiB",
           "  driver calls saved         0    200001",
           "  est. time saved         0 us    7.60 s",
           "  OOM recoveries             0         0",
           "  cap refusals               0         0");
    cs_cache_destroy(c);
}

/* "driver allocations" counts the allocations that took new memory from the driver, not the
 * calls: the one the driver refused for lack of memory, before the cache gave its idle block
 * back and asked again, is not among them. 2 requests and 1 free against 2 driver
 * allocations and 1 driver free: nothing saved, nothing lost. (More calls made than asked
 * for shows 0, never a negative count: tests/test_paths.c, exit table.) */
static void test_oom_retry_counts_one_allocation(void **state)
{
    (void)state;
    cs_cache *c = new_cache(CS_UNLIMITED);
    devs[0].budget = 2 * MiB;
    cs_heap *h = heap(c, 0);
    cs_cache_free(c, alloc(c, h, 1 * MiB));
    alloc(c, h, 2 * MiB);
    report(c, true);
    EXPECT("statistics            device 0",
           "  requests                   2",
           "  hit rate                0.0%",
           "  peak in use         2.00 MiB",
           "  peak reserved       2.00 MiB",
           "  cached now               0 B",
           "  driver calls saved         0",
           "  est. time saved         0 us",
           "  OOM recoveries             1",
           "  cap refusals               0",
           "details               device 0",
           "  hits                       0",
           "  ordered hits               0",
           "  misses                     2",
           "  frees                      1",
           "  in use now          2.00 MiB",
           "  peak requested      2.00 MiB",
           "  driver allocations         2",
           "  driver frees               1",
           "  releases                   1",
           "  fences                     1",
           "  fence waits                0",
           "  OOM failures               0",
           "  other paths now          0 B",
           "  cap                     none");
    cs_cache_destroy(c);
}

static void test_nothing_allocated_and_foreign_frees(void **state)
{
    (void)state;
    cs_cache *c = new_cache(CS_UNLIMITED);
    report(c, true);
    EXPECT("statistics: no device memory was allocated through the shim");
    assert_int_equal(cs_cache_free(c, 0x1000), CS_FOREIGN);
    assert_int_equal(cs_cache_free(c, 0x2000), CS_FOREIGN);
    report(c, false);
    EXPECT("statistics: no device memory was allocated through the shim",
           "foreign frees: 2 (pointers the shim did not hand out, passed to the driver)");
    cs_cache_destroy(c);
}

static void test_duration_format(void **state)
{
    (void)state;
    static const struct {
        int64_t ns;
        const char *text;
    } cases[] = {
        {0, "0 us"},
        {1, "0.00 us"},
        {31000, "31.0 us"},
        {355000, "355 us"},
        {999499, "999 us"},
        {999500, "1.00 ms"},
        {1234567, "1.23 ms"},
        {105300000, "105 ms"},
        {999999999, "1.00 s"},
        {7600000000, "7.60 s"},
        {12345000000000, "12345 s"},
        {-45000, "-45.0 us"},
        {-2500000, "-2.50 ms"},
        {INT64_MIN, "-9223372037 s"},
        {INT64_MAX, "9223372037 s"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[32];
        cs_duration_format(cases[i].ns, buf, sizeof buf);
        assert_string_equal(buf, cases[i].text);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_device_summary_and_details),
        cmocka_unit_test(test_two_devices_side_by_side),
        cmocka_unit_test(test_more_devices_than_columns),
        cmocka_unit_test(test_oom_retry_counts_one_allocation),
        cmocka_unit_test(test_nothing_allocated_and_foreign_frees),
        cmocka_unit_test(test_duration_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
