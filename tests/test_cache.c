/* Unit tests of the cache core, driven through a fake backend whose "GPU" completes fences
 * only when the test says so. */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "cs_cache.h"

#define MiB (1024ull * 1024)

/* ---------------------------------------------------------------- fake backend
 *
 * One stream of work. gpu_busy() issues work; a fence at a free then takes a new epoch,
 * which completes only when the test says so (gpu_idle, or a wait). The cache calls fence,
 * reached and order_after without its lock (per-thread fast paths), so they are atomic. */

static struct {
    uint64_t next_addr, used, budget;
    bool dirty;                  /* work issued since the last fence */
    uint64_t epoch, completed;   /* newest epoch; every epoch up to completed is done */
    int allocs, frees, fences, reaches, waits, orders;
    int fail_alloc_raw;  /* non-zero: the next alloc fails with this raw code */
    bool stuck;          /* fences never complete by themselves (an unrecordable event) */
    bool fail_order;     /* stream-ordered reuse cannot be arranged */
    int busy;            /* streams with pending fences the backend reports (0: one) */
    bool capturing;      /* a stream capture runs */
} be;

static int fb_alloc(void *dev, uint64_t size, uint64_t *addr, int *raw)
{
    (void)dev;
    __atomic_add_fetch(&be.allocs, 1, __ATOMIC_RELAXED);  /* runs without the cache's lock */
    if (be.fail_alloc_raw) {
        *raw = be.fail_alloc_raw;
        be.fail_alloc_raw = 0;
        return CS_BE_ERROR;
    }
    uint64_t at = __atomic_fetch_add(&be.used, size, __ATOMIC_RELAXED);
    if (at + size > be.budget) {
        __atomic_sub_fetch(&be.used, size, __ATOMIC_RELAXED);
        *raw = 2;
        return CS_BE_OOM;
    }
    *addr = __atomic_fetch_add(&be.next_addr, (size + MiB - 1) / MiB * MiB + MiB,
                               __ATOMIC_RELAXED);
    return CS_BE_OK;
}

static int fb_free(void *dev, uint64_t addr, int *raw)
{
    (void)dev;
    (void)addr;
    (void)raw;
    __atomic_add_fetch(&be.frees, 1, __ATOMIC_RELAXED);  /* releases run unlocked */
    return CS_BE_OK;
}

static uint64_t fb_fence(void *dev)
{
    (void)dev;
    if (__atomic_exchange_n(&be.dirty, false, __ATOMIC_ACQ_REL)) {
        __atomic_add_fetch(&be.fences, 1, __ATOMIC_RELAXED);
        return __atomic_add_fetch(&be.epoch, 1, __ATOMIC_ACQ_REL);
    }
    return __atomic_load_n(&be.epoch, __ATOMIC_ACQUIRE);
}

static int fb_reached(void *dev, uint64_t epoch)
{
    (void)dev;
    __atomic_add_fetch(&be.reaches, 1, __ATOMIC_RELAXED);
    return epoch <= __atomic_load_n(&be.completed, __ATOMIC_ACQUIRE) && (!be.stuck || epoch == 0);
}

/* Every epoch up to this one has completed. */
static void complete_to(uint64_t epoch)
{
    uint64_t done = __atomic_load_n(&be.completed, __ATOMIC_ACQUIRE);
    while (epoch > done &&
           !__atomic_compare_exchange_n(&be.completed, &done, epoch, true, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
    }
}

/* Set by a test: the context is destroyed (its heap forgotten) while a thread waits. */
static cs_cache *forget_in_wait;

static int fb_wait(void *dev, uint64_t epoch)
{
    (void)dev;
    __atomic_add_fetch(&be.waits, 1, __ATOMIC_RELAXED);
    if (forget_in_wait) {
        cs_cache_forget_heap(forget_in_wait, (void *)0x1);
        forget_in_wait = NULL;
    }
    complete_to(epoch);
    return 0;
}

static int fb_order_after(void *dev, uint64_t epoch)
{
    (void)dev;
    (void)epoch;
    __atomic_add_fetch(&be.orders, 1, __ATOMIC_RELAXED);
    return be.fail_order ? -1 : 0;
}

static bool fb_capturing(void) { return be.capturing; }

static int fb_busy_streams(void *dev)
{
    (void)dev;
    int n = __atomic_load_n(&be.busy, __ATOMIC_RELAXED);
    return n > 0 ? n : 1;
}

static const cs_backend_ops ops = {fb_alloc, fb_free, fb_fence, fb_reached, fb_wait,
                                   fb_order_after, fb_busy_streams, NULL};

/* Work is issued (the GPU is busy from now) / everything issued so far completes. */
static void gpu_busy(void) { __atomic_store_n(&be.dirty, true, __ATOMIC_RELEASE); }
static void gpu_idle(void) { complete_to(fb_fence(NULL)); }

/* ---------------------------------------------------------------- fixtures */

static uint64_t cap_limit = CS_UNLIMITED, threshold_limit = CS_UNLIMITED;
static uint64_t cap_for(void *a, uint64_t t) { (void)a; (void)t; return cap_limit; }
static uint64_t thr_for(void *a, uint64_t t) { (void)a; (void)t; return threshold_limit; }
static int released_count;
static void on_release(void *a, int d, uint64_t addr, uint64_t s, cs_release_reason w)
{
    (void)a; (void)d; (void)addr; (void)s; (void)w;
    released_count++;
}

typedef struct {
    cs_cache *cache;
    cs_heap *heap;
} fx;

static int setup_mode(void **state, uint64_t cap, uint64_t threshold, uint64_t budget,
                      cs_reuse_mode reuse)
{
    memset(&be, 0, sizeof be);
    be.next_addr = 0x100000000ull;
    be.budget = budget;
    cap_limit = cap;
    threshold_limit = threshold;
    released_count = 0;
    cs_cache_config cfg = {.cap_for = cap_for, .threshold_for = thr_for, .on_release = on_release,
                           .reuse = reuse, .capturing = fb_capturing};
    fx *f = calloc(1, sizeof *f);
    f->cache = cs_cache_create(&cfg);
    f->heap = cs_cache_add_heap(f->cache, (void *)0x1, 0, 80 * 1024 * MiB, &ops, NULL, 0);
    *state = f;
    return 0;
}

/* Most tests look at when a block becomes ready: reuse only once complete. */
static int setup_with(void **state, uint64_t cap, uint64_t threshold, uint64_t budget)
{
    return setup_mode(state, cap, threshold, budget, CS_REUSE_COMPLETED);
}

static int setup(void **state) { return setup_with(state, CS_UNLIMITED, CS_UNLIMITED, 1ull << 40); }
static int setup_ordered(void **state)
{
    return setup_mode(state, CS_UNLIMITED, CS_UNLIMITED, 1ull << 40, CS_REUSE_ORDERED);
}
static int setup_ordered_cap(void **state)
{
    return setup_mode(state, 10 * MiB, CS_UNLIMITED, 1ull << 40, CS_REUSE_ORDERED);
}

/* A cap shared with other processes (cs_group.h), as the cache sees it: grp_others bytes held
 * by the other members, grp_mine charged by this cache. */
static uint64_t grp_mine, grp_others;
static bool grp_charge(void *a, int d, uint64_t bytes, uint64_t cap, uint64_t *short_by)
{
    (void)a;
    (void)d;
    if (cap != CS_UNLIMITED && grp_others + grp_mine + bytes > cap) {
        *short_by = grp_others + grp_mine + bytes - cap;
        return false;
    }
    grp_mine += bytes;
    return true;
}
static void grp_uncharge(void *a, int d, uint64_t bytes)
{
    (void)a;
    (void)d;
    assert_true(bytes <= grp_mine);
    grp_mine -= bytes;
}
static uint64_t grp_others_of(void *a, int d)
{
    (void)a;
    (void)d;
    return grp_others;
}

static int setup_group(void **state)
{
    setup_mode(state, 10 * MiB, CS_UNLIMITED, 1ull << 40, CS_REUSE_COMPLETED);
    fx *f = *state;
    cs_cache_forget_heap(f->cache, (void *)0x1);
    cs_cache_destroy(f->cache);
    grp_mine = 0;
    grp_others = 4 * MiB;
    cs_cache_config cfg = {.cap_for = cap_for, .threshold_for = thr_for, .on_release = on_release,
                           .reuse = CS_REUSE_COMPLETED, .capturing = fb_capturing,
                           .group_charge = grp_charge, .group_uncharge = grp_uncharge,
                           .group_others = grp_others_of};
    f->cache = cs_cache_create(&cfg);
    f->heap = cs_cache_add_heap(f->cache, (void *)0x1, 0, 80 * 1024 * MiB, &ops, NULL, 0);
    return 0;
}

/* A release threshold (here one no test reaches) turns the thread caches off: every block
 * is in the locked core's lists. */
static int setup_no_tc(void **state) { return setup_with(state, CS_UNLIMITED, 1ull << 50, 1ull << 40); }

static int teardown(void **state)
{
    fx *f = *state;
    cs_cache_forget_heap(f->cache, (void *)0x1);
    cs_cache_forget_heap(f->cache, (void *)0x2);
    cs_cache_destroy(f->cache);
    free(f);
    return 0;
}

static uint64_t must_alloc(fx *f, uint64_t size)
{
    uint64_t a = 0;
    int raw = 0;
    assert_int_equal(cs_cache_alloc(f->cache, f->heap, size, &a, &raw, NULL), CS_OK);
    assert_true(a != 0);
    return a;
}

static cacheshim_stats stats(fx *f)
{
    cacheshim_stats s;
    assert_true(cs_cache_stats(f->cache, 0, &s));
    return s;
}

/* ---------------------------------------------------------------- tests */

static void test_size_classes(void **state)
{
    (void)state;
    uint64_t b;
    assert_int_equal(cs_size_class(1, &b), 0);
    assert_int_equal(b, 512);
    assert_int_equal(cs_size_class(512, &b), 0);
    assert_int_equal(cs_size_class(513, &b), 1);
    assert_int_equal(b, 1024);
    assert_int_equal(cs_size_class(8192, &b), 15);
    assert_int_equal(b, 8192);
    assert_int_equal(cs_size_class(8193, &b), 16);
    assert_int_equal(b, 8704);
    assert_int_equal(cs_size_class(16384, &b), 31);
    assert_int_equal(b, 16384);
    assert_int_equal(cs_size_class(1 * MiB, &b), cs_size_class(1 * MiB - 1, &b));
    assert_int_equal(b, 1 * MiB);
    cs_size_class(1 * MiB + 1, &b);
    assert_int_equal(b, 1 * MiB + 64 * 1024);
    /* Rounding never exceeds 1/16 above 8 KiB, and classes are monotonic. */
    int prev = -1;
    for (uint64_t s = 1; s < (1ull << 40); s = s * 9 / 8 + 1) {
        int c = cs_size_class(s, &b);
        assert_true(c >= prev);
        assert_true(b >= s);
        if (s > 8192)
            assert_true(b - s <= s / 15);
        prev = c;
    }
    assert_int_equal(cs_size_class(1ull << 60, &b), -1);
}

/* The reuse rule. A small request (up to half the granularity) takes a block of its own class
 * or of a larger class within an eighth of its size (511 bytes below 4 KiB), never a large
 * block; a large request takes only a block of exactly its granules, even where a class
 * holds several sizes. The same from the thread's own cache (setup) and from the locked core
 * (setup_no_tc): whichever list holds the idle blocks. */
static void test_reuse_small_within_an_eighth(void **state)
{
    fx *f = *state;
    uint64_t k64 = must_alloc(f, 64 * 1024), k72 = must_alloc(f, 72 * 1024),
             k76 = must_alloc(f, 76 * 1024);
    cs_cache_free(f->cache, k76);
    cs_cache_free(f->cache, k72);
    cs_cache_free(f->cache, k64);
    /* Its own class first, then 72 KiB (64 + 8), never 76 KiB. */
    assert_int_equal(must_alloc(f, 64 * 1024), k64);
    assert_int_equal(must_alloc(f, 64 * 1024), k72);
    uint64_t fresh = must_alloc(f, 64 * 1024);
    assert_true(fresh != k76);
    uint64_t req;
    assert_int_equal(cs_cache_lookup(f->cache, k76, &req), CS_BLOCK_IDLE);
    assert_int_equal(cs_cache_lookup(f->cache, k72, &req), CS_BLOCK_IN_USE);
    assert_int_equal(req, 64 * 1024);
    /* Exactly at the edge: 8 KiB (class 8192) takes 9216 (8192 + 1024), not 9728. */
    uint64_t b9216 = must_alloc(f, 9216), b9728 = must_alloc(f, 9728);
    cs_cache_free(f->cache, b9728);
    cs_cache_free(f->cache, b9216);
    assert_int_equal(must_alloc(f, 8192), b9216);
    assert_true(must_alloc(f, 8192) != b9728);
    /* Below 4 KiB the slack is 511 bytes: 600 B takes a 1 KiB block, never a 2 KiB or even a
     * 1.5 KiB one (1000 B would cost 536 bytes more). */
    uint64_t k2 = must_alloc(f, 2048), k15 = must_alloc(f, 1536), k1 = must_alloc(f, 1024);
    cs_cache_free(f->cache, k2);
    cs_cache_free(f->cache, k15);
    cs_cache_free(f->cache, k1);
    assert_int_equal(must_alloc(f, 600), k1);
    uint64_t x = must_alloc(f, 1000);
    assert_true(x != k15 && x != k2);
    /* The largest small request never takes a large block: 1 MiB (half a granule) is a
     * class of its own; a 2 MiB block is a granule. */
    uint64_t g1 = must_alloc(f, 2 * MiB);
    cs_cache_free(f->cache, g1);
    assert_true(must_alloc(f, 1 * MiB) != g1);
    cacheshim_stats s = stats(f);
    assert_int_equal(s.hits, 4);
    assert_int_equal(s.misses, s.requests - 4);
}

static void test_reuse_large_exact_granules(void **state)
{
    fx *f = *state;
    /* Above 64 MiB a class spans 4 MiB: 66 and 68 MiB blocks share one. */
    uint64_t b1, b2;
    assert_int_equal(cs_size_class(66 * MiB, &b1), cs_size_class(68 * MiB, &b2));
    uint64_t a68 = must_alloc(f, 68 * MiB), a66 = must_alloc(f, 66 * MiB);
    cs_cache_free(f->cache, a68);
    cs_cache_free(f->cache, a66);  /* the class: 68 MiB (oldest), then 66 MiB */
    /* 65 MiB is 66 MiB of granules: the 66 MiB block behind the 68 MiB one. */
    assert_int_equal(must_alloc(f, 65 * MiB), a66);
    /* 66 MiB again: the 68 MiB block is of the class but not of the size. */
    uint64_t n66 = must_alloc(f, 66 * MiB);
    assert_true(n66 != a68);
    /* 67 MiB rounds to 68 MiB: that block, its request remembered. */
    assert_int_equal(must_alloc(f, 67 * MiB), a68);
    uint64_t req;
    assert_int_equal(cs_cache_lookup(f->cache, a68, &req), CS_BLOCK_IN_USE);
    assert_int_equal(req, 67 * MiB);
    /* Granules, not twice the size: a 4 MiB block serves 3 MiB and 2 MiB + 1 (both two
     * granules), never 2 MiB (one) nor 5 MiB (three). */
    uint64_t a4 = must_alloc(f, 4 * MiB);
    cs_cache_free(f->cache, a4);
    assert_true(must_alloc(f, 2 * MiB) != a4);
    assert_int_equal(must_alloc(f, 3 * MiB), a4);
    cs_cache_free(f->cache, a4);
    assert_int_equal(must_alloc(f, 2 * MiB + 1), a4);
    cs_cache_free(f->cache, a4);
    assert_true(must_alloc(f, 5 * MiB) != a4);  /* 6 MiB of granules */
    cacheshim_stats s = stats(f);
    assert_int_equal(s.hits, 4);
    assert_int_equal(s.driver_allocs, 6);
    assert_int_equal(s.bytes_in_use, (66 + 66 + 68 + 2 + 6) * MiB);
    assert_int_equal(s.bytes_requested, (65 + 66 + 67 + 2 + 5) * MiB);
}

static void test_hit_and_miss(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 1000000);
    assert_int_equal(cs_cache_free(f->cache, a), CS_OK);
    uint64_t b = must_alloc(f, 1000000 - 100); /* same class */
    assert_int_equal(a, b);
    cacheshim_stats s = stats(f);
    assert_int_equal(s.requests, 2);
    assert_int_equal(s.hits, 1);
    assert_int_equal(s.misses, 1);
    assert_int_equal(s.driver_allocs, 1);
    assert_int_equal(s.bytes_requested, 1000000 - 100);
    uint64_t c = must_alloc(f, 4 * MiB); /* other class: miss */
    assert_true(c != a);
    assert_int_equal(stats(f).misses, 2);
}

static void test_block_not_reused_while_gpu_busy(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 2 * MiB);
    gpu_busy();  /* a kernel still uses a */
    assert_int_equal(cs_cache_free(f->cache, a), CS_OK);
    uint64_t b = must_alloc(f, 2 * MiB);
    assert_true(b != a);          /* the fence has not completed: a new block */
    assert_int_equal(be.fences, 1);
    gpu_idle();
    assert_int_equal(cs_cache_free(f->cache, b), CS_OK);
    uint64_t c = must_alloc(f, 2 * MiB);
    assert_int_equal(c, a);       /* oldest first, now complete */
    cacheshim_stats s = stats(f);
    assert_int_equal(s.hits, 1);
    assert_int_equal(s.fences, 1);  /* b's free had no new work to fence */
}

static void test_fence_covers_work_before_free_only(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 1 * MiB);
    uint64_t b = must_alloc(f, 1 * MiB);
    uint64_t c = must_alloc(f, 1 * MiB);
    /* No work since the last fence: a is ready at once, without a new fence. */
    assert_int_equal(cs_cache_free(f->cache, a), CS_OK);
    assert_int_equal(must_alloc(f, 1 * MiB), a);
    assert_int_equal(be.fences, 0);
    gpu_busy();
    assert_int_equal(cs_cache_free(f->cache, b), CS_OK);  /* fence 1 covers b */
    gpu_idle();
    gpu_busy();  /* new work, possibly on c */
    assert_int_equal(cs_cache_free(f->cache, c), CS_OK);  /* fence 2, still pending */
    assert_int_equal(must_alloc(f, 1 * MiB), b);
    uint64_t d = must_alloc(f, 1 * MiB);
    assert_true(d != c);
    assert_int_equal(stats(f).fences, 2);
}

static void test_no_release_during_capture(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 1 * MiB);
    cs_cache_free(f->cache, a);
    be.capturing = true;  /* a driver free now could break the capture */
    assert_int_equal(cs_cache_trim(f->cache), 0);
    assert_int_equal(be.frees, 0);
    assert_int_equal(must_alloc(f, 1 * MiB), a);  /* reuse itself is fine */
    cs_cache_free(f->cache, a);
    be.capturing = false;
    assert_int_equal(cs_cache_trim(f->cache), 1 * MiB);
    assert_int_equal(be.frees, 1);
}

static void test_unreachable_fence_is_a_miss(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 1 * MiB);
    gpu_busy();
    assert_int_equal(cs_cache_free(f->cache, a), CS_OK);
    be.stuck = true;
    gpu_idle();
    assert_true(must_alloc(f, 1 * MiB) != a);
}

/* ---------------------------------------------------------------- stream-ordered reuse */

static void test_ordered_reuse_while_busy(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 2 * MiB);
    gpu_busy();
    cs_cache_free(f->cache, a);
    /* The GPU still works on a: handed out at once, the streams made to wait first. */
    assert_int_equal(must_alloc(f, 2 * MiB), a);
    assert_int_equal(be.orders, 1);
    assert_int_equal(be.waits, 0);
    cacheshim_stats s = stats(f);
    assert_int_equal(s.hits, 1);
    assert_int_equal(s.ordered_hits, 1);
    /* With one stream busy, the oldest block is ordered after its work without asking the
     * GPU whether it finished: no stream would wait for it anyway. */
    uint64_t b = must_alloc(f, 2 * MiB);
    cs_cache_free(f->cache, b);
    gpu_idle();
    gpu_busy();
    cs_cache_free(f->cache, a);  /* pending */
    int reaches = be.reaches;
    assert_int_equal(must_alloc(f, 2 * MiB), b);
    assert_int_equal(be.orders, 2);
    assert_int_equal(be.reaches, reaches);
    assert_int_equal(stats(f).ordered_hits, 2);
    /* With several, a ready block is preferred (asked about) and needs no ordering. */
    be.busy = 2;
    cs_cache_free(f->cache, b);
    gpu_idle();
    gpu_busy();
    uint64_t c = must_alloc(f, 2 * MiB);  /* a, the oldest, ready */
    cs_cache_free(f->cache, c);  /* pending again */
    assert_int_equal(must_alloc(f, 2 * MiB), b);
    assert_true(be.reaches > reaches);
    assert_int_equal(be.orders, 2);
    assert_int_equal(stats(f).ordered_hits, 2);
}

static void test_ordered_refused_is_a_miss(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 2 * MiB);
    gpu_busy();
    cs_cache_free(f->cache, a);
    be.fail_order = true;
    assert_true(must_alloc(f, 2 * MiB) != a);
    assert_int_equal(stats(f).ordered_hits, 0);
}

/* The pipelined loop: allocate, issue work, free, never waiting for the GPU. Ordered reuse
 * holds one block however far behind the GPU is; completed reuse takes a new one each time
 * (bounded only by a cap, where it waits). */
static void test_pipeline_memory_does_not_follow_lag(void **state)
{
    fx *f = *state;
    for (int i = 0; i < 1000; i++) {
        uint64_t a = must_alloc(f, 16 * MiB);
        gpu_busy();
        cs_cache_free(f->cache, a);
    }
    cacheshim_stats s = stats(f);
    assert_int_equal(s.driver_allocs, 1);
    assert_int_equal(s.peak_reserved, 16 * MiB);
    assert_int_equal(s.ordered_hits, 999);
    assert_int_equal(be.waits, 0);
}

/* Work spread over four busy streams: a class keeps a pending block per busy stream before
 * the oldest is reused, so each stream mostly gets back its own; never more. */
static void test_ordered_depth_follows_busy_streams(void **state)
{
    fx *f = *state;
    be.busy = 4;
    for (int i = 0; i < 1000; i++) {
        uint64_t a = must_alloc(f, 16 * MiB);
        gpu_busy();
        cs_cache_free(f->cache, a);
    }
    cacheshim_stats s = stats(f);
    assert_int_equal(s.driver_allocs, 4);
    assert_int_equal(s.ordered_hits, 996);
    be.busy = 100;  /* many busy streams: a class keeps at most 8 (a thread's cache 4) */
    for (int i = 0; i < 1000; i++) {
        uint64_t a = must_alloc(f, 16 * MiB);
        gpu_busy();
        cs_cache_free(f->cache, a);
    }
    assert_true(stats(f).driver_allocs <= 8);
}

static void test_pipeline_completed_mode_grows(void **state)
{
    fx *f = *state;
    for (int i = 0; i < 100; i++) {
        uint64_t a = must_alloc(f, 16 * MiB);
        gpu_busy();
        cs_cache_free(f->cache, a);
    }
    assert_int_equal(stats(f).driver_allocs, 100);
    assert_int_equal(be.orders, 0);
}

static void test_foreign_double_and_null_free(void **state)
{
    fx *f = *state;
    assert_int_equal(cs_cache_free(f->cache, 0), CS_FOREIGN);
    assert_int_equal(cs_cache_free(f->cache, 0xdead000), CS_FOREIGN);
    uint64_t a = must_alloc(f, 4096);
    assert_int_equal(cs_cache_free(f->cache, a + 512), CS_FOREIGN); /* interior */
    assert_int_equal(cs_cache_free(f->cache, a), CS_OK);
    assert_int_equal(cs_cache_free(f->cache, a), CS_NOT_IN_USE);
    cacheshim_stats all;
    cs_cache_stats(f->cache, -1, &all);
    assert_int_equal(all.foreign_frees, 3);
    assert_int_equal(all.frees, 1);
}

static void test_lookup(void **state)
{
    fx *f = *state;
    uint64_t req = 0;
    uint64_t a = must_alloc(f, 1000);
    assert_int_equal(cs_cache_lookup(f->cache, a, &req), CS_BLOCK_IN_USE);
    assert_int_equal(req, 1000);
    assert_int_equal(cs_cache_lookup(f->cache, a + 1, &req), CS_BLOCK_UNKNOWN);
    cs_cache_free(f->cache, a);
    assert_int_equal(cs_cache_lookup(f->cache, a, &req), CS_BLOCK_IDLE);
}

static int setup_cap(void **state) { return setup_with(state, 10 * MiB, CS_UNLIMITED, 1ull << 40); }

static void test_cap_never_exceeded(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 4 * MiB);
    uint64_t b = must_alloc(f, 4 * MiB);
    uint64_t x;
    int raw;
    cs_alloc_failure fail;
    assert_int_equal(cs_cache_alloc(f->cache, f->heap, 4 * MiB, &x, &raw, &fail), CS_OOM);
    assert_true(fail.by_cap);
    assert_int_equal(fail.requested, 4 * MiB);
    assert_int_equal(fail.in_use, 8 * MiB);
    assert_int_equal(fail.cap, 10 * MiB);
    assert_int_equal(stats(f).cap_refusals, 1);
    /* Freed blocks are cached: a different class must make room by releasing them. */
    cs_cache_free(f->cache, a);
    cs_cache_free(f->cache, b);
    uint64_t c = must_alloc(f, 6 * MiB);
    cacheshim_stats s = stats(f);
    assert_true(s.bytes_in_use + s.bytes_cached <= 10 * MiB);
    assert_true(s.peak_reserved <= 10 * MiB);
    assert_true(s.releases >= 1);
    (void)c;
}

static void test_cap_waits_for_busy_block(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 4 * MiB);
    must_alloc(f, 4 * MiB);
    gpu_busy();
    cs_cache_free(f->cache, a);
    int allocs = be.allocs, frees = be.frees;
    /* 8 MiB held, cap 10: a new 4 MiB block would need a to go. Waiting for a is better. */
    assert_int_equal(must_alloc(f, 4 * MiB), a);
    assert_int_equal(be.allocs, allocs);
    assert_int_equal(be.frees, frees);
    assert_int_equal(be.waits, 1);
    cacheshim_stats s = stats(f);
    assert_int_equal(s.fence_waits, 1);
    assert_int_equal(s.cap_refusals, 0);
}

/* The group is charged what the cache holds, no more and no less, after every call; the
 * group's cap refuses what the other members' bytes leave no room for, and idle memory goes
 * back to make room as for the process's own cap. */
static void test_group_charged_what_is_held(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 4 * MiB);
    assert_int_equal(grp_mine, 4 * MiB);
    uint64_t x;
    int raw;
    cs_alloc_failure fail;
    /* 4 of ours, 4 of theirs: 4 more would pass our cap of 10, not the group's. */
    assert_int_equal(cs_cache_alloc(f->cache, f->heap, 4 * MiB, &x, &raw, &fail), CS_OOM);
    assert_true(fail.by_cap);
    assert_int_equal(fail.device, 0);
    assert_int_equal(stats(f).cap_refusals, 1);
    assert_int_equal(grp_mine, 4 * MiB);
    uint64_t vf, vt;
    cs_cache_mem_view(f->cache, 0, 80 * 1024 * MiB, 80 * 1024 * MiB, &vf, &vt);
    assert_int_equal(vt, 10 * MiB);
    assert_int_equal(vf, 2 * MiB);  /* 10 - 4 (theirs) - 4 (ours) */
    /* Idle, a's memory makes room for a block of another size. */
    cs_cache_free(f->cache, a);
    assert_int_equal(grp_mine, 4 * MiB);  /* cached: still held */
    uint64_t b = must_alloc(f, 6 * MiB);
    assert_int_equal(grp_mine, 6 * MiB);
    assert_true(stats(f).releases >= 1);
    /* The other members let go: the whole cap is ours again. */
    grp_others = 0;
    uint64_t c = must_alloc(f, 4 * MiB);
    assert_int_equal(grp_mine, 10 * MiB);
    cs_cache_free(f->cache, b);
    cs_cache_free(f->cache, c);
    cs_cache_trim(f->cache);
    cacheshim_stats s = stats(f);
    assert_int_equal(grp_mine, s.bytes_in_use + s.bytes_cached);
    assert_int_equal(grp_mine, 0);
    /* A failed driver allocation gives its reservation back to the group. */
    be.budget = be.used;
    assert_int_equal(cs_cache_alloc(f->cache, f->heap, 4 * MiB, &x, &raw, &fail), CS_OOM);
    assert_false(fail.by_cap);
    assert_int_equal(grp_mine, 0);
    be.budget = 1ull << 40;
    /* A context gone takes its memory with it. */
    must_alloc(f, 4 * MiB);
    cs_cache_forget_heap(f->cache, (void *)0x1);
    assert_int_equal(grp_mine, 0);
}

/* Memory outside the cache (cs_cache_charge, cs_outside.c) given back is given back to the
 * group too, at once: the other members must not wait for this process's next allocation to
 * have the room. */
static void test_group_uncharge_gives_back(void **state)
{
    fx *f = *state;
    assert_int_equal(cs_cache_charge(f->cache, f->heap, 4 * MiB, NULL), CS_OK);
    assert_int_equal(grp_mine, 4 * MiB);
    cs_cache_uncharge(f->cache, f->heap, 4 * MiB);
    assert_int_equal(stats(f).bytes_outside, 0);
    assert_int_equal(grp_mine, 0);
}

/* A size near 2^64 must not wrap the sum of what is held and what is asked for past the cap:
 * refused by the cap, nothing counted, the group's charge untouched. */
static void test_charge_near_2_64_refused(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 4 * MiB);
    cs_alloc_failure fail;
    assert_int_equal(cs_cache_charge(f->cache, f->heap, UINT64_MAX - 2 * MiB, &fail), CS_OOM);
    assert_true(fail.by_cap);
    cacheshim_stats s = stats(f);
    assert_int_equal(s.bytes_outside, 0);
    assert_int_equal(s.cap_refusals, 1);
    assert_int_equal(grp_mine, 4 * MiB);
    uint64_t vf, vt;
    cs_cache_mem_view(f->cache, 0, 80 * 1024 * MiB, 80 * 1024 * MiB, &vf, &vt);
    assert_int_equal(vf, 2 * MiB);  /* 10 - 4 (theirs) - 4 (ours) */
    cs_cache_free(f->cache, a);
}

static void test_charge_near_2_64_refused_alone(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 4 * MiB);
    assert_int_equal(cs_cache_charge(f->cache, f->heap, UINT64_MAX - 2 * MiB, NULL), CS_OOM);
    assert_int_equal(stats(f).bytes_outside, 0);
    assert_int_equal(cs_cache_charge(f->cache, f->heap, UINT64_MAX, NULL), CS_OOM);
    assert_int_equal(cs_cache_charge(f->cache, f->heap, 6 * MiB, NULL), CS_OK);
    cs_cache_uncharge(f->cache, f->heap, 6 * MiB);
    cs_cache_free(f->cache, a);
}

/* Another thread destroys the context while this one waits for a busy block at the cap,
 * without the cache's lock: the block and the heap it waits on must stay valid, nothing is
 * counted twice, and the allocation says the context is gone. */
static void test_context_destroyed_during_wait(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 4 * MiB);
    must_alloc(f, 4 * MiB);
    gpu_busy();
    cs_cache_free(f->cache, a);
    forget_in_wait = f->cache;
    uint64_t x;
    int raw = 0;
    assert_int_equal(cs_cache_alloc(f->cache, f->heap, 4 * MiB, &x, &raw, NULL), CS_GONE);
    cacheshim_stats s = stats(f);
    assert_int_equal(s.bytes_in_use, 0);
    assert_int_equal(s.bytes_cached, 0);
    f->heap = cs_cache_add_heap(f->cache, (void *)0x1, 0, 80 * 1024 * MiB, &ops, NULL, 0);
    must_alloc(f, 4 * MiB);  /* a new context of the same key works */
}

static void test_cap_random_never_exceeded(void **state)
{
    fx *f = *state;
    uint64_t live[16] = {0};
    srand(7);
    for (int i = 0; i < 5000; i++) {
        int k = rand() % 16;
        if (live[k]) {
            assert_int_equal(cs_cache_free(f->cache, live[k]), CS_OK);
            live[k] = 0;
        } else {
            uint64_t a;
            int raw;
            uint64_t size = (uint64_t)(rand() % 3000 + 1) * 1024;
            if (cs_cache_alloc(f->cache, f->heap, size, &a, &raw, NULL) == CS_OK)
                live[k] = a;
        }
        if (i % 7 == 0)
            gpu_busy();
        if (i % 13 == 0)
            gpu_idle();
        cacheshim_stats s = stats(f);
        assert_true(s.bytes_in_use + s.bytes_cached <= 10 * MiB);
    }
    assert_true(stats(f).peak_reserved <= 10 * MiB);
}

static void test_mem_view(void **state)
{
    fx *f = *state;
    uint64_t free_b, total_b;
    uint64_t a = must_alloc(f, 4 * MiB);
    cs_cache_free(f->cache, a);  /* 4 MiB cached */
    must_alloc(f, 1 * MiB);      /* 1 MiB in use (a 4 MiB block is too big to serve it) */
    /* cap 10 MiB: total = cap, free = cap - in use (cached counts as free) */
    cs_cache_mem_view(f->cache, 0, 1000 * MiB, 80000 * MiB, &free_b, &total_b);
    assert_int_equal(total_b, 10 * MiB);
    assert_int_equal(free_b, 9 * MiB);
    /* The device itself is nearly full: driver free + cached is the bound. */
    cs_cache_mem_view(f->cache, 0, 1 * MiB, 80000 * MiB, &free_b, &total_b);
    assert_int_equal(free_b, 5 * MiB);
}

static void test_mem_view_uncapped(void **state)
{
    fx *f = *state;
    uint64_t free_b, total_b;
    uint64_t a = must_alloc(f, 4 * MiB);
    cs_cache_free(f->cache, a);
    cs_cache_mem_view(f->cache, 0, 100 * MiB, 80000 * MiB, &free_b, &total_b);
    assert_int_equal(total_b, 80000 * MiB);
    assert_int_equal(free_b, 104 * MiB);
    /* A device the cache never saw: the driver's numbers. */
    cs_cache_mem_view(f->cache, 3, 100 * MiB, 200 * MiB, &free_b, &total_b);
    assert_int_equal(free_b, 100 * MiB);
    assert_int_equal(total_b, 200 * MiB);
}

static int setup_threshold(void **state) { return setup_with(state, CS_UNLIMITED, 2 * MiB, 1ull << 40); }

static void test_threshold_honoured(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 1 * MiB), b = must_alloc(f, 1 * MiB), c = must_alloc(f, 1 * MiB);
    cs_cache_free(f->cache, a);
    cs_cache_free(f->cache, b);
    assert_int_equal(stats(f).bytes_cached, 2 * MiB);
    assert_int_equal(be.frees, 0);
    cs_cache_free(f->cache, c);
    assert_int_equal(stats(f).bytes_cached, 2 * MiB);
    assert_int_equal(be.frees, 1);
    assert_int_equal(released_count, 1);
    /* Oldest went back: a is gone, b and c remain. */
    uint64_t req;
    assert_int_equal(cs_cache_lookup(f->cache, a, &req), CS_BLOCK_UNKNOWN);
    assert_int_equal(cs_cache_lookup(f->cache, b, &req), CS_BLOCK_IDLE);
}

static int setup_small_device(void **state) { return setup_with(state, CS_UNLIMITED, CS_UNLIMITED, 8 * MiB); }

static void test_driver_error_passes_through(void **state)
{
    fx *f = *state;
    be.fail_alloc_raw = 999;
    uint64_t a;
    int raw = 0;
    assert_int_equal(cs_cache_alloc(f->cache, f->heap, 1 * MiB, &a, &raw, NULL), CS_ERROR);
    assert_int_equal(raw, 999);
    assert_int_equal(stats(f).bytes_in_use, 0);
}

static void test_forget_heap(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 1 * MiB), b = must_alloc(f, 1 * MiB);
    gpu_busy();
    cs_cache_free(f->cache, a);
    must_alloc(f, 1 * MiB); /* a new block: a's fence is pending */
    int frees = be.frees;
    cs_cache_forget_heap(f->cache, (void *)0x1);
    assert_int_equal(be.frees, frees);  /* no driver frees for a dead context */
    assert_int_equal(cs_cache_free(f->cache, b), CS_FOREIGN);
    cacheshim_stats s = stats(f);
    assert_int_equal(s.bytes_in_use, 0);
    assert_int_equal(s.bytes_cached, 0);
    assert_null(cs_cache_heap(f->cache, (void *)0x1));
}

/* A thread that looked the heap up before its context went allocates from it after: the
 * forgotten heap's idle blocks are gone (freed), so it must find none of them, and hears
 * that the context is gone. */
static void test_alloc_on_forgotten_heap(void **state)
{
    fx *f = *state;
    uint64_t a[4];
    for (int i = 0; i < 4; i++)
        a[i] = must_alloc(f, 1 * MiB);
    for (int i = 0; i < 4; i++)
        assert_int_equal(cs_cache_free(f->cache, a[i]), CS_OK);
    cs_cache_forget_heap(f->cache, (void *)0x1);
    uint64_t x = 0;
    int raw = 0;
    assert_int_equal(cs_cache_alloc(f->cache, f->heap, 1 * MiB, &x, &raw, NULL), CS_GONE);
    assert_int_equal(cs_cache_alloc(f->cache, f->heap, 3 * MiB, &x, &raw, NULL), CS_GONE);
    cacheshim_stats s = stats(f);
    assert_int_equal(s.bytes_in_use, 0);
    assert_int_equal(s.bytes_cached, 0);
}

static void test_trim(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 1 * MiB), b = must_alloc(f, 2 * MiB);
    cs_cache_free(f->cache, a);  /* no work before it: ready */
    gpu_busy();
    cs_cache_free(f->cache, b);  /* its fence is pending: trim leaves it */
    assert_int_equal(cs_cache_trim(f->cache), 1 * MiB);
    gpu_idle();
    assert_int_equal(cs_cache_trim(f->cache), 2 * MiB);
    assert_int_equal(stats(f).bytes_cached, 0);
}

static void test_reset_after_fork(void **state)
{
    fx *f = *state;
    must_alloc(f, 1 * MiB);
    cs_cache_lock(f->cache);  /* as the prepare hook does */
    cs_cache_reset_after_fork(f->cache);
    assert_null(cs_cache_heap(f->cache, (void *)0x1));
    cacheshim_stats s;
    assert_false(cs_cache_stats(f->cache, 0, &s));
    f->heap = cs_cache_add_heap(f->cache, (void *)0x1, 0, 80 * 1024 * MiB, &ops, NULL, 0);
    must_alloc(f, 1 * MiB);
}

/* ---------------------------------------------------------------- OOM sequence, exactly */

static uint64_t oom_used;
static int oom_alloc(void *dev, uint64_t size, uint64_t *addr, int *raw)
{
    (void)dev;
    be.allocs++;
    if (oom_used + size > be.budget) {
        *raw = 2;
        return CS_BE_OOM;
    }
    oom_used += size;
    *addr = be.next_addr;
    be.next_addr += 64 * MiB;
    return CS_BE_OK;
}
static uint64_t oom_sizes[1 << 12];
static int oom_free(void *dev, uint64_t addr, int *raw)
{
    (void)dev;
    (void)raw;
    be.frees++;
    oom_used -= oom_sizes[(addr - 0x100000000ull) / (64 * MiB)];
    return CS_BE_OK;
}
static const cs_backend_ops oom_ops = {oom_alloc, oom_free, fb_fence, fb_reached, fb_wait,
                                       fb_order_after, fb_busy_streams, NULL};

/* The OOM tests' heap: a granularity of 1 MiB, so that 3, 4 and 7 MiB are blocks of their
 * own size and the device's 8 MiB fill up the way each test says. */
#define OOM_GRAN (1 * MiB)

static cs_heap *oom_heap(fx *f)
{
    cs_cache_forget_heap(f->cache, (void *)0x1);
    return cs_cache_add_heap(f->cache, (void *)0x2, 0, 8 * MiB, &oom_ops, NULL, OOM_GRAN);
}

/* The bytes the cache asks the backend for (cs_block_bytes): a size class up to half the
 * granularity, whole granules above. */
static uint64_t block_bytes(uint64_t size, uint64_t gran)
{
    uint64_t b;
    if (size <= gran / 2)
        cs_size_class(size, &b);
    else
        b = (size + gran - 1) / gran * gran;
    return b;
}

static uint64_t oom_must(fx *f, uint64_t size)
{
    uint64_t a = must_alloc(f, size);
    oom_sizes[(a - 0x100000000ull) / (64 * MiB)] = block_bytes(size, OOM_GRAN);
    return a;
}

static void test_oom_sequence(void **state)
{
    fx *f = *state;
    oom_used = 0;
    f->heap = oom_heap(f);
    uint64_t a = oom_must(f, 3 * MiB), b = oom_must(f, 3 * MiB);
    cs_cache_free(f->cache, a);            /* ready once a fence is recorded and done */
    assert_int_equal(oom_must(f, 3 * MiB), a);
    cs_cache_free(f->cache, a);
    /* Step 1: a is ready (covered by a completed fence); 4 MiB needs it gone. */
    uint64_t c = oom_must(f, 4 * MiB);
    cacheshim_stats s = stats(f);
    assert_int_equal(s.oom_recoveries, 1);
    assert_int_equal(be.waits, 0);
    /* Step 2: b and c freed while the GPU is busy, neither fits 7 MiB: nothing is ready, so
     * everything goes back (the driver's free waits for the device itself). */
    gpu_busy();
    cs_cache_free(f->cache, b);
    cs_cache_free(f->cache, c);
    uint64_t d = oom_must(f, 7 * MiB);
    s = stats(f);
    assert_int_equal(s.oom_recoveries, 2);
    assert_int_equal(be.waits, 0);
    assert_int_equal(s.releases, 3);
    /* Step 3: nothing cached, the device is full: the failure remains, with numbers. */
    uint64_t x;
    int raw;
    cs_alloc_failure fail;
    assert_int_equal(cs_cache_alloc(f->cache, f->heap, 2 * MiB, &x, &raw, &fail), CS_OOM);
    assert_false(fail.by_cap);
    assert_int_equal(fail.requested, 2 * MiB);
    assert_int_equal(fail.in_use, 7 * MiB);
    assert_int_equal(fail.cached, 0);
    assert_int_equal(stats(f).oom_failures, 1);
    (void)d;
}

static void test_oom_step0_waits_for_fitting_block(void **state)
{
    fx *f = *state;
    oom_used = 0;
    f->heap = oom_heap(f);
    uint64_t a = oom_must(f, 3 * MiB);
    oom_must(f, 4 * MiB);
    gpu_busy();
    cs_cache_free(f->cache, a);
    int frees = be.frees;
    /* 1 MiB left on the device: the driver refuses 3 MiB; a is busy but fits: wait, reuse. */
    assert_int_equal(oom_must(f, 3 * MiB), a);
    assert_int_equal(be.frees, frees);  /* nothing given back */
    cacheshim_stats s = stats(f);
    assert_int_equal(s.oom_recoveries, 1);
    assert_int_equal(s.fence_waits, 1);
    assert_int_equal(s.releases, 0);
}

/* ---------------------------------------------------------------- threads */

static void *hammer(void *arg)
{
    fx *f = arg;
    for (int i = 0; i < 20000; i++) {
        uint64_t a;
        int raw;
        uint64_t size = (uint64_t)(i % 7 + 1) * 4096;
        if (cs_cache_alloc(f->cache, f->heap, size, &a, &raw, NULL) == CS_OK)
            assert_int_equal(cs_cache_free(f->cache, a), CS_OK);
    }
    return NULL;
}

/* cs_cache_find on a block a thread owns, while that thread hands it out and frees it again
 * (its serial changes under the thread's own lock): a consistent answer every time, and no
 * race for ThreadSanitizer to see (the concurrency suite runs this under it). */
static uint64_t g_found_addr;
static int g_found_stop;

static void *hand_out_and_free(void *arg)
{
    fx *f = arg;
    while (!__atomic_load_n(&g_found_stop, __ATOMIC_RELAXED)) {
        uint64_t a;
        int raw;
        if (cs_cache_alloc(f->cache, f->heap, 4096, &a, &raw, NULL) == CS_OK) {
            __atomic_store_n(&g_found_addr, a, __ATOMIC_RELAXED);
            cs_cache_free(f->cache, a);
        }
    }
    return NULL;
}

static void test_find_while_the_owner_hands_out(void **state)
{
    fx *f = *state;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, hand_out_and_free, f), 0);
    long found = 0;
    /* Until a few thousand lookups found the block (or two seconds passed, however the
     * threads are scheduled). */
    time_t start = time(NULL);
    while (found < 5000 && time(NULL) - start < 2) {
        uint64_t a = __atomic_load_n(&g_found_addr, __ATOMIC_RELAXED);
        cs_block_info info;
        if (a && cs_cache_find(f->cache, a, &info) != CS_BLOCK_UNKNOWN) {
            assert_int_equal(info.base, a);
            assert_true(info.serial > 0);
            found++;
        }
    }
    __atomic_store_n(&g_found_stop, 1, __ATOMIC_RELAXED);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_true(found > 0);
}

/* Buffer ids (cs_block.serial) are unique in the process however threads hand blocks out:
 * each thread cache takes them a batch at a time, and the core one at a time. Four threads
 * each hand out a block 3,000 times (about three batches), through their own caches (the
 * same size again) and through the core (a thread cache full of its class sends the fifth
 * block of a class to the core); every id is recorded and no two may be equal. */
enum { SERIAL_THREADS = 4, SERIAL_ROUNDS = 600, SERIAL_PER_ROUND = 5 };
static uint64_t g_serials[SERIAL_THREADS][SERIAL_ROUNDS * SERIAL_PER_ROUND];

typedef struct {
    fx *f;
    int index;
} serial_arg;

static void *hand_out_recording_ids(void *arg)
{
    serial_arg *sa = arg;
    uint64_t *ids = g_serials[sa->index], a[SERIAL_PER_ROUND];
    int n = 0;
    for (int r = 0; r < SERIAL_ROUNDS; r++) {
        for (int i = 0; i < SERIAL_PER_ROUND; i++) {
            int raw;
            cs_block_info info;
            assert_int_equal(cs_cache_alloc(sa->f->cache, sa->f->heap, 4096, &a[i], &raw, NULL),
                             CS_OK);
            assert_int_equal(cs_cache_find(sa->f->cache, a[i], &info), CS_BLOCK_IN_USE);
            ids[n++] = info.serial;
        }
        for (int i = 0; i < SERIAL_PER_ROUND; i++)
            assert_int_equal(cs_cache_free(sa->f->cache, a[i]), CS_OK);
    }
    return NULL;
}

static int compare_ids(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

static void test_serials_unique_across_threads(void **state)
{
    fx *f = *state;
    pthread_t t[SERIAL_THREADS];
    serial_arg args[SERIAL_THREADS];
    for (int i = 0; i < SERIAL_THREADS; i++) {
        args[i] = (serial_arg){f, i};
        assert_int_equal(pthread_create(&t[i], NULL, hand_out_recording_ids, &args[i]), 0);
    }
    for (int i = 0; i < SERIAL_THREADS; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    cacheshim_stats s = stats(f);
    assert_true(s.hits > 0);                         /* the thread caches' path was taken */
    assert_true(s.requests - s.hits >= SERIAL_THREADS); /* and the core's */
    size_t n = SERIAL_THREADS * SERIAL_ROUNDS * SERIAL_PER_ROUND;
    uint64_t *all = &g_serials[0][0];
    qsort(all, n, sizeof *all, compare_ids);
    assert_true(all[0] > 0);
    for (size_t i = 1; i < n; i++)
        if (all[i] == all[i - 1])
            fail_msg("buffer id %llu handed out twice", (unsigned long long)all[i]);
}

static void test_threads(void **state)
{
    fx *f = *state;
    pthread_t t[8];
    for (int i = 0; i < 8; i++)
        pthread_create(&t[i], NULL, hammer, f);
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
    cacheshim_stats s = stats(f);
    assert_int_equal(s.requests, 8 * 20000);
    assert_int_equal(s.frees, 8 * 20000);
    assert_int_equal(s.hits + s.misses, s.requests);
    assert_int_equal(s.bytes_in_use, 0);
    assert_true(s.misses <= 8 * 7 * 2);  /* at most a few blocks per class and thread */
}

static int setup_no_idle(void **state) { return setup_with(state, CS_UNLIMITED, 0, 1ull << 40); }

static void test_threads_threshold_zero(void **state)
{
    fx *f = *state;
    pthread_t t[8];
    for (int i = 0; i < 8; i++)
        pthread_create(&t[i], NULL, hammer, f);
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
    cacheshim_stats s = stats(f);
    assert_int_equal(s.frees, 8 * 20000);
    assert_int_equal(s.bytes_cached, 0);
    assert_int_equal(s.releases, s.driver_allocs);  /* every block went back */
    assert_int_equal(be.frees, (int)s.releases);
}

/* ---------------------------------------------------------------- per-thread caches
 *
 * An agent is a thread that stays alive between jobs, so its per-thread cache does too, and
 * runs one job at a time when asked. Jobs record results; the main thread asserts (cmocka's
 * asserts belong to the thread that runs the test). */

typedef void (*job_fn)(fx *f, void *arg);

typedef struct {
    pthread_t thread;
    pthread_mutex_t m;
    pthread_cond_t cv;
    fx *f;
    job_fn fn;
    void *arg;
    bool pending, quit;
} agent;

static void *agent_main(void *p)
{
    agent *a = p;
    pthread_mutex_lock(&a->m);
    for (;;) {
        while (!a->pending && !a->quit)
            pthread_cond_wait(&a->cv, &a->m);
        if (!a->pending)
            break;
        pthread_mutex_unlock(&a->m);
        a->fn(a->f, a->arg);
        pthread_mutex_lock(&a->m);
        a->pending = false;
        pthread_cond_broadcast(&a->cv);
    }
    pthread_mutex_unlock(&a->m);
    return NULL;
}

static void agent_start(agent *a, fx *f)
{
    memset(a, 0, sizeof *a);
    pthread_mutex_init(&a->m, NULL);
    pthread_cond_init(&a->cv, NULL);
    a->f = f;
    assert_int_equal(pthread_create(&a->thread, NULL, agent_main, a), 0);
}

static void agent_post(agent *a, job_fn fn, void *arg)
{
    pthread_mutex_lock(&a->m);
    a->fn = fn;
    a->arg = arg;
    a->pending = true;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->m);
}

/* Has the posted job finished within `seconds`? */
static bool agent_wait(agent *a, int seconds)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += seconds;
    pthread_mutex_lock(&a->m);
    while (a->pending && pthread_cond_timedwait(&a->cv, &a->m, &until) == 0) {
    }
    bool done = !a->pending;
    pthread_mutex_unlock(&a->m);
    return done;
}

static void agent_run(agent *a, job_fn fn, void *arg)
{
    agent_post(a, fn, arg);
    assert_true(agent_wait(a, 120));
}

static void agent_stop(agent *a)
{
    pthread_mutex_lock(&a->m);
    a->quit = true;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->m);
    pthread_join(a->thread, NULL);
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->m);
}

/* Blocks a job allocates or frees, and what the cache answered. */
typedef struct {
    uint64_t size;
    int n;
    uint64_t addr[8];
    cs_result r[8];
    uint64_t first;  /* job_pairs: the first block it got */
} blocks;

static void job_alloc(fx *f, void *arg)
{
    blocks *b = arg;
    for (int i = 0; i < b->n; i++) {
        int raw;
        b->r[i] = cs_cache_alloc(f->cache, f->heap, b->size, &b->addr[i], &raw, NULL);
    }
}

static void job_free(fx *f, void *arg)
{
    blocks *b = arg;
    for (int i = 0; i < b->n; i++)
        b->r[i] = cs_cache_free(f->cache, b->addr[i]);
}

static void assert_all_ok(const blocks *b)
{
    for (int i = 0; i < b->n; i++)
        assert_int_equal(b->r[i], CS_OK);
}

/* 1000 pairs of b->size that must each get one of b's n blocks; r[0] is the first failure,
 * if any. */
static void job_pairs(fx *f, void *arg)
{
    blocks *b = arg;
    b->r[0] = CS_OK;
    for (int i = 0; i < 1000; i++) {
        uint64_t a = 0;
        int raw;
        cs_result r = cs_cache_alloc(f->cache, f->heap, b->size, &a, &raw, NULL);
        bool known = false;
        for (int k = 0; k < b->n; k++)
            known |= a == b->addr[k];
        if (i == 0)
            b->first = a;
        if (r == CS_OK && !known)
            r = CS_ERROR;
        if (r == CS_OK)
            r = cs_cache_free(f->cache, a);
        if (r != CS_OK && b->r[0] == CS_OK)
            b->r[0] = r;
    }
}

/* Runs fn in the agent while this thread holds the cache's lock: true if it finished without
 * it (the lock is released either way, and the job waited for). */
static bool runs_without_the_lock(fx *f, agent *a, job_fn fn, void *arg)
{
    cs_cache_lock(f->cache);
    agent_post(a, fn, arg);
    bool done = agent_wait(a, 10);
    cs_cache_unlock(f->cache);
    if (!done)
        assert_true(agent_wait(a, 120));
    return done;
}

static void test_tc_fast_path_takes_no_lock(void **state)
{
    fx *f = *state;
    agent a;
    agent_start(&a, f);
    blocks w = {.size = 1 * MiB, .n = 1};
    agent_run(&a, job_alloc, &w);  /* a miss: the locked path */
    agent_run(&a, job_free, &w);   /* into the agent's own cache */
    assert_all_ok(&w);
    assert_true(runs_without_the_lock(f, &a, job_pairs, &w));
    assert_int_equal(w.r[0], CS_OK);
    cacheshim_stats s = stats(f);
    assert_int_equal(s.requests, 1001);
    assert_int_equal(s.hits, 1000);
    assert_int_equal(s.misses, 1);
    assert_int_equal(s.frees, 1001);
    assert_int_equal(s.driver_allocs, 1);
    assert_int_equal(s.bytes_in_use, 0);
    assert_int_equal(s.bytes_cached, 1 * MiB);
    assert_int_equal(s.peak_in_use, 1 * MiB);
    agent_stop(&a);
}

/* Completed mode: a block in the thread's cache whose fence is pending is not reused; once
 * reached() says so, it is, on the fast path; the known-safe epoch then spares the query. */
static void test_tc_readiness_completed(void **state)
{
    fx *f = *state;
    agent a;
    agent_start(&a, f);
    blocks w = {.size = 2 * MiB, .n = 1};
    agent_run(&a, job_alloc, &w);
    gpu_busy();
    agent_run(&a, job_free, &w);  /* fence 1, pending */
    uint64_t req;
    assert_int_equal(cs_cache_lookup(f->cache, w.addr[0], &req), CS_BLOCK_IDLE);
    blocks other = {.size = 2 * MiB, .n = 1};
    agent_run(&a, job_alloc, &other);
    assert_all_ok(&other);
    assert_true(other.addr[0] != w.addr[0]);  /* a new block: the cached one is busy */
    assert_int_equal(stats(f).hits, 0);
    assert_int_equal(be.orders, 0);
    agent_run(&a, job_free, &other);
    gpu_idle();
    int reaches = be.reaches;
    blocks again = {.size = 2 * MiB, .n = 2, .addr = {w.addr[0], other.addr[0]}};
    assert_true(runs_without_the_lock(f, &a, job_pairs, &again));
    assert_int_equal(again.r[0], CS_OK);
    assert_int_equal(again.first, w.addr[0]);  /* the oldest, ready now */
    /* Its fence was asked about once; every later free had no new work (same epoch). */
    assert_int_equal(be.reaches, reaches + 1);
    assert_int_equal(stats(f).hits, 1000);
    agent_stop(&a);
}

/* Ordered mode: the busy block is handed out at once, after order_after, without the lock. */
static void test_tc_readiness_ordered(void **state)
{
    fx *f = *state;
    agent a;
    agent_start(&a, f);
    blocks w = {.size = 2 * MiB, .n = 1};
    agent_run(&a, job_alloc, &w);
    gpu_busy();
    agent_run(&a, job_free, &w);
    blocks again = {.size = 2 * MiB, .n = 1, .addr = {w.addr[0]}};
    assert_true(runs_without_the_lock(f, &a, job_pairs, &again));
    assert_int_equal(again.r[0], CS_OK);
    /* The GPU never finishes epoch 1: every reuse is ordered after it, none waits. */
    assert_int_equal(be.orders, 1000);
    assert_int_equal(be.waits, 0);
    cacheshim_stats s = stats(f);
    assert_int_equal(s.ordered_hits, 1000);
    assert_int_equal(s.hits, 1000);
    assert_int_equal(s.driver_allocs, 1);
    /* Refused ordering: a miss, as in the core. */
    gpu_busy();
    blocks one = {.size = 2 * MiB, .n = 1, .addr = {w.addr[0]}};
    agent_run(&a, job_alloc, &one);
    agent_run(&a, job_free, &one);  /* a busy again (new work) */
    be.fail_order = true;
    agent_run(&a, job_alloc, &one);
    assert_all_ok(&one);
    assert_true(one.addr[0] != w.addr[0]);
    assert_int_equal(stats(f).ordered_hits, 1001);
    agent_stop(&a);
}

static void test_tc_cross_thread_free(void **state)
{
    fx *f = *state;
    agent a;
    agent_start(&a, f);
    blocks w = {.size = 2 * MiB, .n = 2};
    agent_run(&a, job_alloc, &w);  /* held by the agent's cache */
    assert_all_ok(&w);
    /* This thread frees the agent's first block: the locked path, through the agent's lock. */
    assert_int_equal(cs_cache_free(f->cache, w.addr[0]), CS_OK);
    uint64_t req = 0;
    assert_int_equal(cs_cache_lookup(f->cache, w.addr[0], &req), CS_BLOCK_IDLE);
    assert_int_equal(cs_cache_lookup(f->cache, w.addr[1], &req), CS_BLOCK_IN_USE);
    assert_int_equal(req, 2 * MiB);
    /* The agent frees its second block itself: its fast path. */
    blocks second = {.n = 1, .addr = {w.addr[1]}};
    agent_run(&a, job_free, &second);
    assert_all_ok(&second);
    cacheshim_stats s = stats(f);
    assert_int_equal(s.frees, 2);
    assert_int_equal(s.bytes_in_use, 0);
    assert_int_equal(s.bytes_cached, 4 * MiB);
    /* This thread's allocations: the block it freed (in the core's lists), then the agent's
     * idle one, taken from the agent's cache before the driver is asked. */
    assert_int_equal(must_alloc(f, 2 * MiB), w.addr[0]);
    assert_int_equal(must_alloc(f, 2 * MiB), w.addr[1]);
    s = stats(f);
    assert_int_equal(s.driver_allocs, 2);
    assert_int_equal(s.hits, 2);
    assert_int_equal(s.bytes_in_use, 4 * MiB);
    assert_int_equal(s.bytes_cached, 0);
    /* And back: the agent frees both, now this thread's. */
    agent_run(&a, job_free, &w);
    assert_all_ok(&w);
    s = stats(f);
    assert_int_equal(s.frees, 4);
    assert_int_equal(s.bytes_in_use, 0);
    assert_int_equal(s.bytes_requested, 0);
    assert_int_equal(s.bytes_cached, 4 * MiB);
    agent_stop(&a);
}

static void test_tc_double_free_both_paths(void **state)
{
    fx *f = *state;
    agent a;
    agent_start(&a, f);
    /* Fast path: the block is idle in this thread's cache. */
    uint64_t x = must_alloc(f, 4096);
    assert_int_equal(cs_cache_free(f->cache, x), CS_OK);
    assert_int_equal(cs_cache_free(f->cache, x), CS_NOT_IN_USE);
    assert_int_equal(cs_cache_free(f->cache, x + 512), CS_FOREIGN);  /* interior */
    /* Another thread's double free of it: the locked path, through this thread's lock. */
    blocks w = {.n = 1, .addr = {x}};
    agent_run(&a, job_free, &w);
    assert_int_equal(w.r[0], CS_NOT_IN_USE);
    /* The agent takes it (a ready block of this thread's cache), this thread frees it, then
     * the agent frees it again: no longer in the agent's map, the core says not in use. */
    blocks got = {.size = 4096, .n = 1};
    agent_run(&a, job_alloc, &got);
    assert_all_ok(&got);
    assert_int_equal(got.addr[0], x);
    assert_int_equal(cs_cache_free(f->cache, x), CS_OK);
    agent_run(&a, job_free, &got);
    assert_int_equal(got.r[0], CS_NOT_IN_USE);
    assert_int_equal(cs_cache_free(f->cache, x), CS_NOT_IN_USE);
    cacheshim_stats all;
    cs_cache_stats(f->cache, -1, &all);
    assert_int_equal(all.frees, 2);
    assert_int_equal(all.foreign_frees, 1);
    assert_int_equal(all.bytes_in_use, 0);
    assert_int_equal(all.bytes_cached, 4096);
    agent_stop(&a);
}

static void test_tc_trim_reclaims(void **state)
{
    fx *f = *state;
    agent a;
    agent_start(&a, f);
    blocks one = {.size = 1 * MiB, .n = 1}, two = {.size = 2 * MiB, .n = 1};
    agent_run(&a, job_alloc, &one);
    agent_run(&a, job_alloc, &two);
    agent_run(&a, job_free, &one);  /* no work before it: ready */
    gpu_busy();
    agent_run(&a, job_free, &two);  /* its fence is pending: trim leaves it */
    assert_int_equal(stats(f).bytes_cached, 3 * MiB);
    assert_int_equal(cs_cache_trim(f->cache), 1 * MiB);  /* from the agent's cache */
    uint64_t req;
    assert_int_equal(cs_cache_lookup(f->cache, one.addr[0], &req), CS_BLOCK_UNKNOWN);
    assert_int_equal(cs_cache_lookup(f->cache, two.addr[0], &req), CS_BLOCK_IDLE);
    assert_int_equal(be.frees, 1);
    gpu_idle();
    assert_int_equal(cs_cache_trim(f->cache), 2 * MiB);
    cacheshim_stats s = stats(f);
    assert_int_equal(s.bytes_cached, 0);
    assert_int_equal(s.releases, 2);
    /* The agent's cache is empty: a new block. */
    agent_run(&a, job_alloc, &two);
    assert_all_ok(&two);
    assert_int_equal(stats(f).driver_allocs, 3);
    agent_stop(&a);
}

static void test_tc_cap_reclaims(void **state)
{
    fx *f = *state;
    agent a;
    agent_start(&a, f);
    blocks w = {.size = 4 * MiB, .n = 2};
    agent_run(&a, job_alloc, &w);
    agent_run(&a, job_free, &w);  /* 8 MiB idle in the agent's cache, cap 10 */
    /* 6 MiB fits none of them: one goes back to the driver, from the agent's cache. */
    uint64_t c6 = must_alloc(f, 6 * MiB);
    cacheshim_stats s = stats(f);
    assert_int_equal(s.releases, 1);
    assert_int_equal(s.bytes_in_use, 6 * MiB);
    assert_int_equal(s.bytes_cached, 4 * MiB);
    assert_true(s.peak_reserved <= 10 * MiB);
    assert_int_equal(cs_cache_free(f->cache, c6), CS_OK);
    assert_int_equal(cs_cache_trim(f->cache), 10 * MiB);
    /* At the cap, a busy block idle in another thread's cache is waited for. */
    agent_run(&a, job_alloc, &w);
    assert_all_ok(&w);
    gpu_busy();
    blocks first = {.n = 1, .addr = {w.addr[0]}};
    agent_run(&a, job_free, &first);
    int allocs = be.allocs, frees = be.frees;
    assert_int_equal(must_alloc(f, 4 * MiB), w.addr[0]);
    assert_int_equal(be.allocs, allocs);
    assert_int_equal(be.frees, frees);
    s = stats(f);
    assert_int_equal(s.fence_waits, 1);
    assert_int_equal(s.cap_refusals, 0);
    assert_int_equal(s.bytes_in_use, 8 * MiB);
    /* Full: the agent is refused, with honest numbers. */
    uint64_t x;
    int raw;
    cs_alloc_failure fail;
    assert_int_equal(cs_cache_alloc(f->cache, f->heap, 4 * MiB, &x, &raw, &fail), CS_OOM);
    assert_true(fail.by_cap);
    assert_int_equal(fail.in_use, 8 * MiB);
    assert_int_equal(fail.cached, 0);
    agent_stop(&a);
}

static void test_tc_oom_reclaims(void **state)
{
    fx *f = *state;
    oom_used = 0;
    f->heap = oom_heap(f);
    agent a;
    agent_start(&a, f);
    blocks w = {.size = 3 * MiB, .n = 2};
    agent_run(&a, job_alloc, &w);
    assert_all_ok(&w);
    for (int i = 0; i < 2; i++)
        oom_sizes[(w.addr[i] - 0x100000000ull) / (64 * MiB)] = block_bytes(3 * MiB, OOM_GRAN);
    agent_run(&a, job_free, &w);  /* 6 of 8 MiB idle in the agent's cache */
    /* 4 MiB: the driver is out of memory; the agent's ready blocks go back, then it fits. */
    oom_must(f, 4 * MiB);
    cacheshim_stats s = stats(f);
    assert_int_equal(s.oom_recoveries, 1);
    assert_true(s.releases >= 1);
    assert_int_equal(be.waits, 0);
    assert_int_equal(s.bytes_in_use, 4 * MiB);
    assert_true(s.bytes_cached <= 3 * MiB);
    agent_stop(&a);
}

static void test_tc_forget_heap(void **state)
{
    fx *f = *state;
    agent a;
    agent_start(&a, f);
    blocks w = {.size = 1 * MiB, .n = 3};
    agent_run(&a, job_alloc, &w);
    blocks idle = {.n = 2, .addr = {w.addr[0], w.addr[1]}};
    agent_run(&a, job_free, &idle);  /* two idle in the agent's cache, one in use */
    int frees = be.frees;
    cs_cache_forget_heap(f->cache, (void *)0x1);
    assert_int_equal(be.frees, frees);  /* no driver frees for a dead context */
    cacheshim_stats s = stats(f);
    assert_int_equal(s.bytes_in_use, 0);
    assert_int_equal(s.bytes_cached, 0);
    assert_int_equal(s.frees, 2);  /* counted before: the counters stay */
    uint64_t req;
    for (int i = 0; i < 3; i++)
        assert_int_equal(cs_cache_lookup(f->cache, w.addr[i], &req), CS_BLOCK_UNKNOWN);
    /* The agent's block went with the context: its free is the driver's business. */
    blocks gone = {.n = 1, .addr = {w.addr[2]}};
    agent_run(&a, job_free, &gone);
    assert_int_equal(gone.r[0], CS_FOREIGN);
    /* A new context: the agent works on it as before. */
    f->heap = cs_cache_add_heap(f->cache, (void *)0x1, 0, 80 * 1024 * MiB, &ops, NULL, 0);
    blocks fresh = {.size = 1 * MiB, .n = 1};
    agent_run(&a, job_alloc, &fresh);
    agent_run(&a, job_free, &fresh);
    assert_all_ok(&fresh);
    assert_int_equal(stats(f).bytes_cached, 1 * MiB);
    agent_stop(&a);
}

/* A hit from a thread's own cache while another thread ends the heap's context: the hit reads
 * what it needs of the block under its cache's lock, since cs_cache_forget_heap, once it has
 * taken that lock, frees the block. The thread says it is done, and this thread says it may
 * end, only through relaxed stores (nothing orders one's accesses before the other's), so a
 * read of the block after the lock shows as a race with the free under ThreadSanitizer (the
 * concurrency suite runs this under it); the thread lives on until after the free, or its
 * exit (which takes the cache's lock) would order the read first. */
static int g_hit_state;  /* 0: running, 1: done, 2: failed */
static int g_hit_may_end;
static uint64_t g_hit_addr[2];

static bool spin_until(int *flag, int seconds)
{
    time_t start = time(NULL);
    while (!__atomic_load_n(flag, __ATOMIC_RELAXED)) {
        if (time(NULL) - start > seconds)
            return false;
        sched_yield();
    }
    return true;
}

static void *hit_then_wait(void *arg)
{
    fx *f = arg;
    cs_heap *h = cs_cache_heap(f->cache, (void *)0x2);
    int raw;
    bool ok = h && cs_cache_alloc(f->cache, h, 4096, &g_hit_addr[0], &raw, NULL) == CS_OK &&
              cs_cache_free(f->cache, g_hit_addr[0]) == CS_OK &&
              cs_cache_alloc(f->cache, h, 4096, &g_hit_addr[1], &raw, NULL) == CS_OK;
    __atomic_store_n(&g_hit_state, ok ? 1 : 2, __ATOMIC_RELAXED);
    spin_until(&g_hit_may_end, 10);
    return NULL;
}

static void test_tc_hit_then_context_gone(void **state)
{
    fx *f = *state;
    g_hit_state = g_hit_may_end = 0;
    assert_non_null(cs_cache_add_heap(f->cache, (void *)0x2, 0, 80 * 1024 * MiB, &ops, NULL, 0));
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, hit_then_wait, f), 0);
    bool done = spin_until(&g_hit_state, 10);
    cs_cache_forget_heap(f->cache, (void *)0x2);  /* frees the block the thread holds */
    __atomic_store_n(&g_hit_may_end, 1, __ATOMIC_RELAXED);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_true(done);
    assert_int_equal(g_hit_state, 1);
    assert_int_equal(g_hit_addr[1], g_hit_addr[0]);  /* the hit came from its own cache */
    cacheshim_stats s = stats(f);
    assert_int_equal(s.bytes_in_use, 0);
    assert_int_equal(s.bytes_cached, 0);
}

static void test_tc_reset_after_fork(void **state)
{
    fx *f = *state;
    agent a;
    agent_start(&a, f);
    blocks w = {.size = 1 * MiB, .n = 2};
    agent_run(&a, job_alloc, &w);
    blocks first = {.n = 1, .addr = {w.addr[0]}};
    agent_run(&a, job_free, &first);
    must_alloc(f, 1 * MiB);
    /* As in the child: the prepare hook took the locks; the agent does nothing meanwhile. */
    cs_cache_lock(f->cache);
    cs_cache_reset_after_fork(f->cache);
    cacheshim_stats s;
    assert_false(cs_cache_stats(f->cache, 0, &s));
    f->heap = cs_cache_add_heap(f->cache, (void *)0x1, 0, 80 * 1024 * MiB, &ops, NULL, 0);
    /* The agent's old blocks are unknown; its new ones are cached as usual. */
    blocks old = {.n = 1, .addr = {w.addr[1]}};
    agent_run(&a, job_free, &old);
    assert_int_equal(old.r[0], CS_FOREIGN);
    blocks fresh = {.size = 1 * MiB, .n = 1};
    agent_run(&a, job_alloc, &fresh);
    agent_run(&a, job_free, &fresh);
    assert_all_ok(&fresh);
    must_alloc(f, 2 * MiB);
    s = stats(f);
    assert_int_equal(s.requests, 2);
    assert_int_equal(s.frees, 1);
    assert_int_equal(s.bytes_in_use, 2 * MiB);
    assert_int_equal(s.bytes_cached, 1 * MiB);
    agent_stop(&a);
}

/* A real fork while another thread holds idle blocks in its cache: the child starts empty,
 * can use the cache, and the parent goes on as before. */
static void test_tc_fork(void **state)
{
    fx *f = *state;
    agent a;
    agent_start(&a, f);
    blocks w = {.size = 1 * MiB, .n = 2};
    agent_run(&a, job_alloc, &w);
    agent_run(&a, job_free, &w);
    cs_cache_lock(f->cache);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        cs_cache_reset_after_fork(f->cache);
        cacheshim_stats s;
        bool ok = !cs_cache_stats(f->cache, 0, &s);
        cs_heap *h = cs_cache_add_heap(f->cache, (void *)0x1, 0, 80 * 1024 * MiB, &ops, NULL, 0);
        uint64_t x = 0;
        int raw;
        ok = ok && h && cs_cache_alloc(f->cache, h, 1 * MiB, &x, &raw, NULL) == CS_OK;
        ok = ok && cs_cache_free(f->cache, x) == CS_OK;
        ok = ok && cs_cache_free(f->cache, w.addr[0]) == CS_FOREIGN;
        ok = ok && cs_cache_stats(f->cache, 0, &s) && s.frees == 1 && s.bytes_cached == 1 * MiB;
        _exit(ok ? 0 : 1);
    }
    cs_cache_unlock(f->cache);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    blocks again = {.size = 1 * MiB, .n = 2};
    agent_run(&a, job_alloc, &again);
    assert_all_ok(&again);
    assert_int_equal(again.addr[0], w.addr[0]);  /* the parent's cache is as it was */
    assert_int_equal(stats(f).driver_allocs, 2);
    agent_stop(&a);
}

/* A thread that ends hands its idle blocks and its in-use blocks back to the core. */
static void *exit_job(void *arg)
{
    fx *f = ((void **)arg)[0];
    blocks *b = ((void **)arg)[1];
    job_alloc(f, b);
    blocks idle = {.n = b->n - 1};
    memcpy(idle.addr, b->addr, sizeof idle.addr[0] * (size_t)idle.n);
    job_free(f, &idle);
    memcpy(b->r, idle.r, sizeof idle.r[0] * (size_t)idle.n);  /* the last stays in use */
    return NULL;
}

static void test_tc_thread_exit_gives_back(void **state)
{
    fx *f = *state;
    blocks w = {.size = 1 * MiB, .n = 4};
    void *args[2] = {f, &w};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, exit_job, args), 0);
    pthread_join(t, NULL);
    assert_all_ok(&w);
    cacheshim_stats s = stats(f);
    assert_int_equal(s.requests, 4);  /* counted by the thread, folded in at its end */
    assert_int_equal(s.frees, 3);
    assert_int_equal(s.bytes_in_use, 1 * MiB);
    assert_int_equal(s.bytes_requested, 1 * MiB);
    assert_int_equal(s.bytes_cached, 3 * MiB);
    uint64_t req;
    assert_int_equal(cs_cache_lookup(f->cache, w.addr[3], &req), CS_BLOCK_IN_USE);
    /* Its idle blocks serve this thread, oldest first, without the driver. */
    for (int i = 0; i < 3; i++)
        assert_int_equal(must_alloc(f, 1 * MiB), w.addr[i]);
    assert_int_equal(stats(f).driver_allocs, 4);
    /* Its in-use block is anyone's to free now, once. */
    assert_int_equal(cs_cache_free(f->cache, w.addr[3]), CS_OK);
    assert_int_equal(cs_cache_free(f->cache, w.addr[3]), CS_NOT_IN_USE);
    s = stats(f);
    assert_int_equal(s.bytes_in_use, 3 * MiB);
    assert_int_equal(s.bytes_cached, 1 * MiB);
    /* Everything ready goes back: nothing was lost on the way. */
    for (int i = 0; i < 3; i++)
        assert_int_equal(cs_cache_free(f->cache, w.addr[i]), CS_OK);
    assert_int_equal(cs_cache_trim(f->cache), 4 * MiB);
}

/* ---------------------------------------------------------------- stress
 *
 * Threads allocate into shared slots and free whatever they find there, mostly blocks other
 * threads allocated; now and then they issue GPU work, let it complete, trim, and read the
 * statistics (which must never show more than the cap). Every address is freed exactly once:
 * a slot's value is taken with an atomic exchange. */

enum { STRESS_THREADS = 8, STRESS_SLOTS = 64, STRESS_OPS = 20000 };

typedef struct {
    fx *f;
    uint64_t *slots;
    unsigned seed;
    long allocs, frees, bad, over_cap;
} stress_arg;

static void *stress_worker(void *p)
{
    stress_arg *a = p;
    static const uint64_t sizes[] = {512, 4096, 70000, 1 * MiB, 1 * MiB + 1, 3 * MiB};
    for (int i = 0; i < STRESS_OPS; i++) {
        unsigned r = (unsigned)rand_r(&a->seed);
        uint64_t *slot = &a->slots[r % STRESS_SLOTS];
        uint64_t old = __atomic_exchange_n(slot, 0, __ATOMIC_ACQ_REL);
        if (old) {
            a->bad += cs_cache_free(a->f->cache, old) != CS_OK;
            a->frees++;
        } else {
            uint64_t x;
            int raw;
            if (cs_cache_alloc(a->f->cache, a->f->heap, sizes[(r >> 8) % 6], &x, &raw, NULL) ==
                CS_OK) {
                a->allocs++;
                uint64_t prev = __atomic_exchange_n(slot, x, __ATOMIC_ACQ_REL);
                if (prev) {
                    a->bad += cs_cache_free(a->f->cache, prev) != CS_OK;
                    a->frees++;
                }
            }
        }
        switch ((r >> 16) % 64) {
        case 0: gpu_busy(); break;
        case 1: gpu_idle(); break;
        case 2: cs_cache_trim(a->f->cache); break;
        case 3: {
            cacheshim_stats s;
            cs_cache_stats(a->f->cache, 0, &s);
            a->over_cap += cap_limit != CS_UNLIMITED && s.bytes_in_use + s.bytes_cached > cap_limit;
            uint64_t req, any = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
            cs_cache_lookup(a->f->cache, any, &req);  /* whatever it finds, safely */
            break;
        }
        default: break;
        }
    }
    return NULL;
}

static void test_tc_stress(void **state)
{
    fx *f = *state;
    uint64_t slots[STRESS_SLOTS] = {0};
    stress_arg args[STRESS_THREADS];
    pthread_t t[STRESS_THREADS];
    for (int i = 0; i < STRESS_THREADS; i++) {
        args[i] = (stress_arg){.f = f, .slots = slots, .seed = 1234u + (unsigned)i};
        assert_int_equal(pthread_create(&t[i], NULL, stress_worker, &args[i]), 0);
    }
    long allocs = 0, frees = 0;
    for (int i = 0; i < STRESS_THREADS; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(args[i].bad, 0);
        assert_int_equal(args[i].over_cap, 0);
        allocs += args[i].allocs;
        frees += args[i].frees;
    }
    for (int k = 0; k < STRESS_SLOTS; k++) {
        if (slots[k]) {
            assert_int_equal(cs_cache_free(f->cache, slots[k]), CS_OK);
            frees++;
        }
    }
    assert_int_equal(frees, allocs);
    cacheshim_stats s = stats(f);
    assert_int_equal(s.requests, s.hits + s.misses);
    assert_int_equal(s.requests - s.cap_refusals - s.oom_failures, (uint64_t)allocs);
    assert_int_equal(s.frees, (uint64_t)frees);
    assert_int_equal(s.bytes_in_use, 0);
    assert_int_equal(s.bytes_requested, 0);
    assert_int_equal(s.driver_allocs, (uint64_t)be.allocs);
    if (cap_limit != CS_UNLIMITED)
        assert_true(s.peak_reserved <= cap_limit);
    /* Every block is back in the core and goes to the driver: none was lost or counted twice. */
    gpu_idle();
    cs_cache_trim(f->cache);
    s = stats(f);
    assert_int_equal(s.bytes_cached, 0);
    assert_int_equal(s.releases, s.driver_allocs);
    assert_int_equal(be.frees, (int)s.releases);
}

static int setup_stress_cap(void **state) { return setup_with(state, 24 * MiB, CS_UNLIMITED, 1ull << 40); }
static int setup_stress_ordered_cap(void **state)
{
    return setup_mode(state, 24 * MiB, CS_UNLIMITED, 1ull << 40, CS_REUSE_ORDERED);
}


int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_size_classes),
        cmocka_unit_test_setup_teardown(test_hit_and_miss, setup, teardown),
        cmocka_unit_test_setup_teardown(test_group_charged_what_is_held, setup_group, teardown),
        cmocka_unit_test_setup_teardown(test_group_uncharge_gives_back, setup_group, teardown),
        cmocka_unit_test_setup_teardown(test_charge_near_2_64_refused, setup_group, teardown),
        cmocka_unit_test_setup_teardown(test_charge_near_2_64_refused_alone, setup_cap, teardown),
        cmocka_unit_test_setup_teardown(test_reuse_small_within_an_eighth, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reuse_small_within_an_eighth, setup_no_tc, teardown),
        cmocka_unit_test_setup_teardown(test_reuse_large_exact_granules, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reuse_large_exact_granules, setup_no_tc, teardown),
        cmocka_unit_test_setup_teardown(test_block_not_reused_while_gpu_busy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fence_covers_work_before_free_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_release_during_capture, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unreachable_fence_is_a_miss, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ordered_reuse_while_busy, setup_ordered, teardown),
        cmocka_unit_test_setup_teardown(test_ordered_refused_is_a_miss, setup_ordered, teardown),
        cmocka_unit_test_setup_teardown(test_pipeline_memory_does_not_follow_lag, setup_ordered,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_pipeline_completed_mode_grows, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ordered_depth_follows_busy_streams, setup_ordered,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_foreign_double_and_null_free, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lookup, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cap_never_exceeded, setup_cap, teardown),
        cmocka_unit_test_setup_teardown(test_cap_waits_for_busy_block, setup_cap, teardown),
        cmocka_unit_test_setup_teardown(test_context_destroyed_during_wait, setup_cap, teardown),
        cmocka_unit_test_setup_teardown(test_cap_random_never_exceeded, setup_cap, teardown),
        cmocka_unit_test_setup_teardown(test_cap_random_never_exceeded, setup_ordered_cap, teardown),
        cmocka_unit_test_setup_teardown(test_mem_view, setup_cap, teardown),
        cmocka_unit_test_setup_teardown(test_mem_view_uncapped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threshold_honoured, setup_threshold, teardown),
        cmocka_unit_test_setup_teardown(test_driver_error_passes_through, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forget_heap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_alloc_on_forgotten_heap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_alloc_on_forgotten_heap, setup_no_tc, teardown),
        cmocka_unit_test_setup_teardown(test_trim, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reset_after_fork, setup, teardown),
        cmocka_unit_test_setup_teardown(test_oom_sequence, setup_small_device, teardown),
        cmocka_unit_test_setup_teardown(test_oom_step0_waits_for_fitting_block, setup_small_device, teardown),
        cmocka_unit_test_setup_teardown(test_find_while_the_owner_hands_out, setup, teardown),
        cmocka_unit_test_setup_teardown(test_serials_unique_across_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads_threshold_zero, setup_no_idle, teardown),
        cmocka_unit_test_setup_teardown(test_tc_fast_path_takes_no_lock, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tc_readiness_completed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tc_readiness_ordered, setup_ordered, teardown),
        cmocka_unit_test_setup_teardown(test_tc_cross_thread_free, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tc_double_free_both_paths, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tc_trim_reclaims, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tc_cap_reclaims, setup_cap, teardown),
        cmocka_unit_test_setup_teardown(test_tc_oom_reclaims, setup_small_device, teardown),
        cmocka_unit_test_setup_teardown(test_tc_forget_heap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tc_hit_then_context_gone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tc_reset_after_fork, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tc_fork, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tc_thread_exit_gives_back, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tc_stress, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tc_stress, setup_ordered, teardown),
        cmocka_unit_test_setup_teardown(test_tc_stress, setup_stress_cap, teardown),
        cmocka_unit_test_setup_teardown(test_tc_stress, setup_stress_ordered_cap, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
