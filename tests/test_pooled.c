/* Unit tests of the cache core over a pooled heap: blocks backed by the physical pool
 * (shim/cs_pool.c) on the simulated device of vmm_sim.h, fences from a fake backend whose
 * GPU completes work only when the test says so. What the cache says it holds (in use plus
 * cached, the pool's spare included) is checked against what the device holds; every unmap
 * is checked against the work still running on the memory. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "cs_cache.h"
#include "vmm_sim.h"

#define KiB (1024ull)
#define MiB (1024ull * 1024)

/* ---------------------------------------------------------------- fake backend
 *
 * One stream. work_on(addr) issues work on addr: the next fence takes a new epoch, which
 * completes only when the test says so (gpu_idle), a wait, or a sync of the device. The
 * epochs' completion lives in the simulated device, so that its unmaps can be checked. */

static vmm_sim sim;

static struct {
    bool dirty;
    uint64_t epoch;
    int fences, waits, orders;
    int busy;  /* streams with work under way, as the backend would count them (0: one) */
    uint64_t ordered;  /* the newest epoch every stream was made to wait for */
    bool capturing, fail_order;
    uint64_t next_addr;  /* the classic heap's allocations */
    int allocs, frees;
} be;

/* Work and fences under one lock, so that the epoch work is recorded with is exactly the one
 * whose fence covers it. */
static pthread_mutex_t be_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t fb_fence(void *dev)
{
    (void)dev;
    pthread_mutex_lock(&be_lock);
    if (be.dirty) {
        be.dirty = false;
        be.fences++;
        sim_issue(&sim, ++be.epoch);
    }
    uint64_t e = be.epoch;
    pthread_mutex_unlock(&be_lock);
    return e;
}

static int fb_reached(void *dev, uint64_t epoch)
{
    (void)dev;
    return epoch <= sim_completed(&sim);
}

static int fb_wait(void *dev, uint64_t epoch)
{
    (void)dev;
    __atomic_add_fetch(&be.waits, 1, __ATOMIC_RELAXED);
    sim_complete(&sim, epoch);
    return 0;
}

static int fb_order_after(void *dev, uint64_t epoch)
{
    (void)dev;
    __atomic_add_fetch(&be.orders, 1, __ATOMIC_RELAXED);
    if (__atomic_load_n(&be.fail_order, __ATOMIC_RELAXED))
        return -1;
    uint64_t o = __atomic_load_n(&be.ordered, __ATOMIC_RELAXED);
    while (o < epoch && !__atomic_compare_exchange_n(&be.ordered, &o, epoch, false,
                                                     __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
        ;
    return 0;
}

static int fb_busy_streams(void *dev)
{
    (void)dev;
    int n = __atomic_load_n(&be.busy, __ATOMIC_RELAXED);
    return n ? n : 1;
}

static bool fb_capturing(void) { return __atomic_load_n(&be.capturing, __ATOMIC_RELAXED); }

/* The classic backend, for the heaps without a pool. */
static int fb_alloc(void *dev, uint64_t size, uint64_t *addr, int *raw)
{
    (void)dev;
    (void)raw;
    __atomic_add_fetch(&be.allocs, 1, __ATOMIC_RELAXED);
    *addr = __atomic_fetch_add(&be.next_addr, (size + MiB - 1) / MiB * MiB + MiB, __ATOMIC_RELAXED);
    return CS_BE_OK;
}

static int fb_free(void *dev, uint64_t addr, int *raw)
{
    (void)dev;
    (void)addr;
    (void)raw;
    __atomic_add_fetch(&be.frees, 1, __ATOMIC_RELAXED);
    return CS_BE_OK;
}

static const cs_backend_ops pooled_ops = {fb_alloc, fb_free, fb_fence, fb_reached, fb_wait,
                                          fb_order_after, fb_busy_streams, &sim_vmm_ops};
static const cs_backend_ops classic_ops = {fb_alloc, fb_free, fb_fence, fb_reached, fb_wait,
                                           fb_order_after, NULL, NULL};

/* Work is issued on addr (its next fence covers it) / everything issued so far completes. */
static void work_on(uint64_t addr)
{
    pthread_mutex_lock(&be_lock);
    be.dirty = true;
    sim_work(&sim, addr, be.epoch + 1);
    pthread_mutex_unlock(&be_lock);
}

static void gpu_idle(void) { sim_complete(&sim, fb_fence(NULL)); }

/* A block just handed out: any work still under way on its memory is work every stream was
 * made to wait for (an ordered reuse), never more. The count of work records that break this. */
static int unordered_reuse(uint64_t addr, uint64_t size)
{
    return sim_pending_beyond(&sim, addr, size, __atomic_load_n(&be.ordered, __ATOMIC_ACQUIRE));
}

/* ---------------------------------------------------------------- fixtures */

static uint64_t cap_limit, threshold_limit;
static uint64_t cap_for(void *a, uint64_t t) { (void)a; (void)t; return cap_limit; }
static uint64_t thr_for(void *a, uint64_t t) { (void)a; (void)t; return threshold_limit; }
static int released_count, moved_count, spare_released_count;
static void on_release(void *a, int d, uint64_t addr, uint64_t s, cs_release_reason why)
{
    (void)a; (void)d; (void)s;
    released_count++;
    moved_count += why == CS_RELEASE_MOVE;
    spare_released_count += addr == 0;
}

typedef struct {
    cs_cache *cache;
    cs_heap *heap;
} fx;

/* A cap shared with other processes (cs_group.h): the other members hold group_others bytes,
 * this cache is charged group_mine. */
static uint64_t group_mine, group_others;
static bool group_charge(void *a, int d, uint64_t bytes, uint64_t cap, uint64_t *short_by)
{
    (void)a; (void)d;
    uint64_t total = group_others + group_mine + bytes;
    *short_by = cap != CS_UNLIMITED && total > cap ? total - cap : 0;
    group_mine += *short_by ? 0 : bytes;
    return *short_by == 0;
}
static void group_uncharge(void *a, int d, uint64_t bytes) { (void)a; (void)d; group_mine -= bytes; }
static uint64_t others_of(void *a, int d) { (void)a; (void)d; return group_others; }

typedef struct {
    uint64_t cap, threshold, device;
    uint64_t group_others;  /* with a group whose other members hold this (0: no group) */
    unsigned headroom_permille;
    cs_reuse_mode reuse;
} config;

static int setup_config(void **state, config k)
{
    memset(&be, 0, sizeof be);
    be.next_addr = 0x100000000ull;
    sim_init(&sim, k.device ? k.device : 1ull << 40);
    cap_limit = k.cap ? k.cap : CS_UNLIMITED;
    threshold_limit = k.threshold ? k.threshold : CS_UNLIMITED;
    released_count = moved_count = spare_released_count = 0;
    cs_cache_config cfg = {.cap_for = cap_for, .threshold_for = thr_for, .on_release = on_release,
                           .reuse = k.reuse, .capturing = fb_capturing,
                           .pool_headroom_permille = k.headroom_permille};
    group_mine = 0;
    group_others = k.group_others;
    if (k.group_others) {
        cfg.group_charge = group_charge;
        cfg.group_uncharge = group_uncharge;
        cfg.group_others = others_of;
    }
    fx *f = calloc(1, sizeof *f);
    f->cache = cs_cache_create(&cfg);
    f->heap = cs_cache_add_heap(f->cache, (void *)0x1, 0, 80 * 1024 * MiB, &pooled_ops, &sim, 0);
    assert_non_null(f->heap);
    assert_true(cs_cache_heap_pooled(f->heap));
    assert_ptr_equal(cs_cache_heap_dev(f->heap), &sim);
    *state = f;
    return 0;
}

static int setup(void **state) { return setup_config(state, (config){.reuse = CS_REUSE_COMPLETED}); }
static int setup_ordered(void **state) { return setup_config(state, (config){0}); }
/* Two busy streams, within a headroom of 100 % / beyond a headroom of 0. */
static int setup_ordered_busy2(void **state)
{
    int r = setup_config(state, (config){.headroom_permille = 1000});
    be.busy = 2;
    return r;
}
static int setup_ordered_busy2_tight(void **state)
{
    int r = setup_config(state, (config){0});
    be.busy = 2;
    return r;
}
/* A release threshold no test reaches: no thread caches, every block in the core's lists. */
static int setup_no_tc(void **state)
{
    return setup_config(state, (config){.threshold = 1ull << 50, .reuse = CS_REUSE_COMPLETED});
}

static int teardown(void **state)
{
    fx *f = *state;
    cs_cache_forget_heap(f->cache, (void *)0x1);
    cs_cache_forget_heap(f->cache, (void *)0x2);
    cs_cache_destroy(f->cache);
    sim_destroy(&sim);
    free(f);
    return 0;
}

static uint64_t must_alloc_on(fx *f, cs_heap *h, uint64_t size)
{
    uint64_t a = 0;
    int raw = 0;
    cs_result r = cs_cache_alloc(f->cache, h, size, &a, &raw, NULL);
    if (r != CS_OK)
        fail_msg("alloc of %llu: result %d, raw %d", (unsigned long long)size, r, raw);
    assert_true(a != 0);
    return a;
}

static uint64_t must_alloc(fx *f, uint64_t size) { return must_alloc_on(f, f->heap, size); }

static void must_free(fx *f, uint64_t a) { assert_int_equal(cs_cache_free(f->cache, a), CS_OK); }

/* A block of `size` freed while work on it is under way: idle and busy. */
static uint64_t busy_freed(fx *f, uint64_t size)
{
    uint64_t a = must_alloc(f, size);
    work_on(a);
    must_free(f, a);
    return a;
}

/* A block of `size` carved out of the start of busy block a (ordered mode, one busy stream):
 * a's memory joins the free space, and the rest of it stays free and busy. */
static uint64_t carve_busy(fx *f, uint64_t a, uint64_t size)
{
    uint64_t b = must_alloc(f, size);
    assert_int_equal(b, a);
    return b;
}

static cacheshim_stats stats(fx *f)
{
    cacheshim_stats s;
    assert_true(cs_cache_stats(f->cache, 0, &s));
    return s;
}

/* What the cache says it holds is what the device holds: blocks in use, idle blocks, and the
 * pool's memory outside blocks (free chunks, free slots). */
static void assert_exact(fx *f)
{
    cacheshim_stats s = stats(f);
    if (s.bytes_in_use + s.bytes_cached != sim.used)
        fail_msg("in use %llu + cached %llu != the device's %llu",
                 (unsigned long long)s.bytes_in_use, (unsigned long long)s.bytes_cached,
                 (unsigned long long)sim.used);
    assert_int_equal(sim.misuse, 0);
    assert_int_equal(sim.unsafe_unmaps, 0);
}

/* A block was built with no driver call that takes memory (creates as before it), nothing was
 * unmapped, nobody waited on the host, and what the cache holds is what the device holds. */
static void assert_no_driver_work(fx *f, int creates)
{
    assert_int_equal(sim.calls[SIM_CREATE], creates);
    assert_int_equal(sim.calls[SIM_UNMAP], 0);
    assert_int_equal(be.waits, 0);
    assert_exact(f);
}

/* addr is in no block the program holds: unknown to the cache, or (a pooled heap's memory in
 * no block: a free slot, a page no slab has) idle, with nothing requested. */
static void assert_not_held(fx *f, uint64_t addr);

static cs_block_state find(fx *f, uint64_t addr, cs_block_info *info)
{
    memset(info, 0xa5, sizeof *info);
    return cs_cache_find(f->cache, addr, info);
}

/* addr lies in the pool's free memory: no block, idle or in use, holds it. */
static void assert_in_free_span(fx *f, uint64_t addr)
{
    cs_block_info info;
    assert_int_equal(find(f, addr, &info), CS_BLOCK_IDLE);
    assert_int_equal(info.base, addr);
    assert_int_equal(info.size, 0);
}

static void assert_not_held(fx *f, uint64_t addr)
{
    cs_block_info info;
    cs_block_state st = find(f, addr, &info);
    if (st == CS_BLOCK_IN_USE || (st == CS_BLOCK_IDLE && info.requested != 0))
        fail_msg("0x%llx: state %d, requested %llu", (unsigned long long)addr, st,
                 (unsigned long long)info.requested);
}

/* ---------------------------------------------------------------- hits */

/* A block reused as it is costs no driver call at all: large or small, on the thread cache's
 * path or the core's, ready or ordered after its work. */
static void test_hit_never_maps(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 5 * MiB), s = must_alloc(f, 4 * KiB);
    work_on(a);
    must_free(f, a);
    must_free(f, s);
    gpu_idle();
    int calls[SIM_OPS];
    memcpy(calls, sim.calls, sizeof calls);
    for (int i = 0; i < 100; i++) {
        assert_int_equal(must_alloc(f, 5 * MiB), a);
        assert_int_equal(must_alloc(f, 4000), s);
        work_on(a);
        must_free(f, a);
        must_free(f, s);
        gpu_idle();
    }
    assert_memory_equal(calls, sim.calls, sizeof calls);
    cacheshim_stats st = stats(f);
    assert_int_equal(st.hits, 200);
    assert_int_equal(st.moves, 0);
    assert_int_equal(st.driver_allocs, 2);
    assert_exact(f);
}

static void test_ordered_hit_never_maps(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 5 * MiB);
    work_on(a);
    must_free(f, a);  /* busy: handed out again after order_after, never mapped anew */
    int maps = sim.calls[SIM_MAP], creates = sim.calls[SIM_CREATE];
    for (int i = 0; i < 100; i++) {
        assert_int_equal(must_alloc(f, 5 * MiB), a);
        work_on(a);
        must_free(f, a);
    }
    assert_int_equal(sim.calls[SIM_MAP], maps);
    assert_int_equal(sim.calls[SIM_CREATE], creates);
    assert_int_equal(sim.calls[SIM_UNMAP], 0);
    assert_int_equal(be.orders, 100);
    assert_int_equal(stats(f).ordered_hits, 100);
}

/* ---------------------------------------------------------------- moves */

/* headroom.trace's sequence: 4 MiB, 2 MiB, 4 MiB, each freed first. Each large block's
 * memory joins the pool's free space at its free (its work is done), and the next block is
 * carved out of its free span, whatever the headroom: no move, no driver call. Memory held
 * stays at the peak, 4 MiB, and no chunk is made after the first. */
static void headroom_run(fx *f)
{
    must_free(f, must_alloc(f, 4 * MiB));
    must_free(f, must_alloc(f, 2 * MiB));
    must_free(f, must_alloc(f, 4 * MiB));
}

/* Before any new memory, idle small blocks whose work is done give their slots back to their
 * slabs, whatever the headroom (a slab whose slots are all free gives up its pages, and an
 * empty small range joins the free space); the headroom then decides whether the block takes
 * new memory or free chunks move. Here a 1 MiB block, its small range alone, is idle when a
 * 4 MiB block misses: it goes back (a move) and its range, at the arena's top, is a free
 * granule. The block needs two granules where large blocks go (zones, cs_pool.c): 2 MiB
 * held, 4 MiB needed, a peak of 1 MiB: 6 MiB held is within the headroom from 500 % on, the
 * free granule then staying mapped; below, its chunk moves into the block (one unmap). */
static void test_small_idle_back_before_new_memory(void **state)
{
    (void)state;
    static const struct {
        unsigned permille;
        int creates, unmaps;
        uint64_t peak;
    } cases[] = {
        {0, 2, 1, 4 * MiB}, {4990, 2, 1, 4 * MiB}, {5000, 3, 0, 6 * MiB}, {10000, 3, 0, 6 * MiB},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fx *f;
        setup_config((void **)&f, (config){.headroom_permille = cases[i].permille,
                                           .reuse = CS_REUSE_COMPLETED});
        uint64_t s = must_alloc(f, 1 * MiB);
        must_free(f, s);
        uint64_t a = must_alloc(f, 4 * MiB);
        cacheshim_stats st = stats(f);
        if (st.moves != 1 || sim.calls[SIM_CREATE] != cases[i].creates ||
            sim.calls[SIM_UNMAP] != cases[i].unmaps)
            fail_msg("headroom %u permille: %llu moves, %d creates, %d unmaps", cases[i].permille,
                     (unsigned long long)st.moves, sim.calls[SIM_CREATE], sim.calls[SIM_UNMAP]);
        assert_true(a != s);
        cs_block_info info;
        assert_int_equal(find(f, s, &info), CS_BLOCK_IDLE);  /* the arena's, in no block */
        assert_int_equal(info.size, 0);
        assert_int_equal(sim.calls[SIM_RELEASE], 0);
        assert_int_equal(st.peak_reserved, cases[i].peak);
        assert_int_equal(moved_count, 0);  /* moves give nothing back: no release hook */
        assert_exact(f);
        teardown((void **)&f);
        /* A large ready idle block goes back whatever the headroom. */
        setup_config((void **)&f, (config){.headroom_permille = cases[i].permille,
                                           .reuse = CS_REUSE_COMPLETED});
        headroom_run(f);
        st = stats(f);
        assert_int_equal(st.moves, 0);   /* joined at their frees */
        assert_int_equal(st.hits, 2);    /* carved out of the freed blocks' spans */
        assert_int_equal(st.misses, 1);
        assert_int_equal(sim.calls[SIM_CREATE], 2);
        assert_int_equal(sim.calls[SIM_MAP], 2);
        assert_int_equal(sim.calls[SIM_UNMAP], 0);
        assert_int_equal(sim.calls[SIM_RELEASE], 0);
        assert_int_equal(st.peak_reserved, 4 * MiB);
        assert_int_equal(st.releases, 0);
        assert_exact(f);
        teardown((void **)&f);
    }
}

/* A freed large block's span joins the free space at its free: the new block is carved out
 * of it, no chunk created or mapped, the very chunks it had; the rest of the span stays
 * free, spare counted as cached and held, and serves the next block of its size without the
 * driver too. */
static void test_move_builds_from_moved_chunks(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 6 * MiB);  /* 3 chunks of a granule */
    uint64_t first = sim_handle_at(&sim, a);
    assert_int_equal(sim_mapped_at(&sim, a), 2 * MiB);
    must_free(f, a);
    assert_int_equal(stats(f).bytes_cached, 6 * MiB);  /* a's span, free */
    assert_in_free_span(f, a);
    int calls[SIM_OPS];
    memcpy(calls, sim.calls, sizeof calls);
    uint64_t b = must_alloc(f, 4 * MiB);  /* carved out of a's free span */
    assert_int_equal(b, a);
    assert_int_equal(sim_handle_at(&sim, b), first);
    cacheshim_stats s = stats(f);
    assert_int_equal(s.moves, 0);
    assert_int_equal(s.hits, 1);  /* b: carved, no driver call */
    assert_int_equal(s.misses, 1);
    assert_int_equal(s.driver_allocs, 1);
    assert_int_equal(s.driver_frees, 0);
    assert_int_equal(s.bytes_in_use, 4 * MiB);
    assert_int_equal(s.bytes_cached, 2 * MiB);  /* the free granule, spare */
    assert_int_equal(s.peak_reserved, 6 * MiB);
    cs_block_info info;
    assert_int_equal(find(f, a, &info), CS_BLOCK_IN_USE);
    assert_int_equal(info.size, 4 * MiB);
    assert_not_held(f, a + 4 * MiB);  /* the free span */
    assert_exact(f);
    uint64_t c = must_alloc(f, 2 * MiB);
    assert_int_equal(c, a + 4 * MiB);
    assert_int_equal(stats(f).bytes_cached, 0);
    assert_memory_equal(calls, sim.calls, sizeof calls);  /* no driver call since a's free */
    assert_exact(f);
}

/* Large blocks whose work is done join the pool's free space at their frees, beside each
 * other: a block of their joined size is carved out of them. Small ones stay whole idle
 * blocks (a slot's memory comes free only with its slab), and so does a busy one unless
 * reuse is ordered with one busy stream (then it joins too, test_busy_block_carved_ordered). */
static void test_move_order(void **state)
{
    fx *f = *state;
    uint64_t s = must_alloc(f, 512 * KiB), a = must_alloc(f, 2 * MiB), b = must_alloc(f, 2 * MiB),
             c = must_alloc(f, 2 * MiB), e = must_alloc(f, 2 * MiB);
    must_free(f, s);  /* oldest, but small */
    must_free(f, a);
    must_free(f, b);
    must_free(f, c);
    work_on(e);
    must_free(f, e);  /* busy */
    /* a, b and c joined make a free span of 6 MiB: no new memory, the headroom (0) does not
     * come into it. */
    assert_in_free_span(f, b);
    int creates = sim.calls[SIM_CREATE];
    uint64_t d = must_alloc(f, 6 * MiB);
    assert_int_equal(d, a);
    cs_block_info info;
    assert_int_equal(find(f, s, &info), CS_BLOCK_IDLE);
    assert_int_equal(info.base, s);
    assert_int_equal(info.size, 512 * KiB);
    assert_int_equal(find(f, e, &info), CS_BLOCK_IDLE);
    assert_int_equal(info.base, e);
    assert_int_equal(find(f, c, &info), CS_BLOCK_IN_USE);
    assert_int_equal(info.base, d);
    assert_int_equal(stats(f).moves, 0);
    assert_no_driver_work(f, creates);  /* none for d */
}

/* A block whose work is not done does not move when reuse waits for completion, nor, ordered,
 * while several streams are busy and new memory stays within the headroom: new memory
 * instead. */
static void test_busy_block_does_not_move(void **state)
{
    fx *f = *state;
    uint64_t a = busy_freed(f, 4 * MiB);
    uint64_t b = must_alloc(f, 2 * MiB);
    cs_block_info info;
    assert_int_equal(find(f, a, &info), CS_BLOCK_IDLE);
    assert_int_equal(info.base, a);
    assert_int_equal(stats(f).moves, 0);
    assert_int_equal(sim.calls[SIM_UNMAP], 0);
    assert_int_equal(be.waits, 0);
    /* Once done, the next miss moves it, and is carved out of it. */
    gpu_idle();
    int creates = sim.calls[SIM_CREATE];
    assert_int_equal(must_alloc(f, 2 * MiB), a);
    assert_int_equal(stats(f).moves, 1);
    assert_int_equal(sim.calls[SIM_CREATE], creates);
    assert_exact(f);
    (void)b;
}

/* Ordered, with one busy stream: a busy block's memory joins the free space at its free (with
 * several, at a miss once new memory would pass the headroom), and a block of another size is
 * carved out of it, its streams made to wait for the work on it: no driver call, no host
 * wait. What is left of it stays free but busy: a later miss may build on it (ordered again)
 * but never unmaps it while the device's work is under way. */
static void test_busy_block_carved_ordered(void **state)
{
    fx *f = *state;
    uint64_t a = busy_freed(f, 4 * MiB);
    int creates = sim.calls[SIM_CREATE], orders = be.orders;
    assert_in_free_span(f, a);
    uint64_t b = must_alloc(f, 2 * MiB);
    assert_int_equal(b, a);
    assert_int_equal(unordered_reuse(b, 2 * MiB), 0);
    cacheshim_stats st = stats(f);
    assert_int_equal(st.moves, 0);
    assert_int_equal(st.ordered_hits, 1);
    assert_int_equal(st.misses, 1);  /* a's own allocation */
    assert_true(be.orders > orders);
    assert_int_equal(sim.calls[SIM_CREATE], creates);
    assert_int_equal(be.waits, 0);
    /* 8 MiB fit nowhere: the busy rest of a and new memory after it, ordered again (a miss:
     * new memory was mapped, so no ordered hit either). */
    orders = be.orders;
    uint64_t c = must_alloc(f, 8 * MiB);
    assert_int_equal(c, a + 2 * MiB);
    assert_int_equal(unordered_reuse(c, 8 * MiB), 0);
    assert_int_equal(stats(f).ordered_hits, 1);
    assert_true(be.orders > orders);
    assert_int_equal(sim.calls[SIM_UNMAP], 0);
    assert_int_equal(be.waits, 0);
    assert_exact(f);
    /* Once the work is done, memory freed is free memory like any: no order needed. */
    gpu_idle();
    must_free(f, c);
    assert_int_equal(must_alloc(f, 10 * MiB), c);
    assert_int_equal(stats(f).ordered_hits, 1);
    assert_exact(f);
}

/* Memory that joined the free space busy, while one stream was busy, is not carved for a
 * block once several streams are busy and new memory stays within the headroom (100 % here):
 * new memory, as for a busy block kept whole, so that the streams are not made to wait for
 * each other's work. */
static void test_busy_free_memory_waits_for_busy_streams(void **state)
{
    fx *f = *state;
    be.busy = 1;
    uint64_t a = busy_freed(f, 4 * MiB);
    assert_in_free_span(f, a);
    be.busy = 2;
    int orders = be.orders;
    uint64_t b = must_alloc(f, 4 * MiB);
    assert_true(b != a);
    assert_int_equal(be.orders, orders);
    assert_int_equal(stats(f).ordered_hits, 0);
    must_free(f, b);
    assert_exact(f);
}

/* Block a (one stream busy) is freed while work on it is under way, then asked for again at
 * `size` once two streams are busy: carved out of its memory, ordered after that work, with
 * no wait for the device and `creates` calls to cuMemCreate. */
static uint64_t busy_carved_again(fx *f, uint64_t a, uint64_t size, int creates)
{
    work_on(a);
    must_free(f, a);
    assert_in_free_span(f, a);
    be.busy = 2;
    int syncs = sim.calls[SIM_SYNC], before = sim.calls[SIM_CREATE];
    uint64_t b = must_alloc(f, size);
    assert_int_equal(b, a);
    assert_int_equal(unordered_reuse(b, size), 0);
    assert_int_equal(sim.calls[SIM_SYNC], syncs);
    assert_int_equal(sim.calls[SIM_CREATE], before + creates);
    return b;
}

/* ... but at the cap new memory is no choice: busy free memory is carved for the block, ordered
 * after its work, where giving it back first would wait for the whole device. Here the free
 * memory shares a granule with a block in use, so it could not even go back: the cap would
 * refuse the request. The same with a cap shared by a group (8 MiB, 3 of it the others'). */
static int setup_ordered_busy2_cap5(void **state)
{
    int r = setup_config(state, (config){.cap = 5 * MiB, .headroom_permille = 1000});
    be.busy = 2;
    return r;
}
static int setup_ordered_busy2_group_cap(void **state)
{
    int r = setup_config(state, (config){.cap = 8 * MiB, .group_others = 3 * MiB,
                                         .headroom_permille = 1000});
    be.busy = 2;
    return r;
}

static void test_busy_free_memory_taken_at_cap(void **state)
{
    fx *f = *state;
    be.busy = 1;
    uint64_t a = must_alloc(f, 2560 * KiB), z = must_alloc(f, 1536 * KiB);
    assert_int_equal(z, a + 2560 * KiB);  /* the rest of a's second granule */
    uint64_t b = busy_carved_again(f, a, 2560 * KiB, 0);
    assert_int_equal(stats(f).ordered_hits, 1);
    assert_int_equal(stats(f).cap_refusals, 0);
    must_free(f, b);
    must_free(f, z);
    assert_exact(f);
}

/* ... and out of memory on the device, where new memory was tried first, before anything
 * goes back: here the free memory shares both its granules with blocks in use, so nothing could
 * go back, and the request would fail although that memory serves it. */
static void test_busy_free_memory_taken_out_of_memory(void **state)
{
    fx *f = *state;
    sim.capacity = 6 * MiB;
    be.busy = 1;
    uint64_t y = must_alloc(f, 1536 * KiB), a = must_alloc(f, 1536 * KiB),
             z = must_alloc(f, 2560 * KiB);
    assert_int_equal(a, y + 1536 * KiB);  /* in y's granule and the next, z's first */
    assert_int_equal(z, a + 1536 * KiB);
    assert_int_equal(sim.used, 6 * MiB);
    uint64_t b = busy_carved_again(f, a, 1536 * KiB, 1);  /* the create that failed */
    cacheshim_stats st = stats(f);
    assert_int_equal(st.ordered_hits, 0);  /* a miss: the driver was asked first */
    assert_int_equal(st.oom_recoveries, 1);
    assert_int_equal(st.oom_failures, 0);
    must_free(f, b);
    must_free(f, y);
    must_free(f, z);
    assert_exact(f);
}

/* Several busy streams: up to two blocks per busy stream (three blocks of the size asked for,
 * here) may be new memory beyond the headroom (0 here), as whole blocks are kept one per busy
 * stream before they are reused ordered; past that, the busy blocks' memory is carved,
 * ordered: memory does not grow with the GPU's lag. */
static void test_busy_memory_beyond_busy_streams(void **state)
{
    fx *f = *state;
    uint64_t a = busy_freed(f, 4 * MiB);  /* the peak in use: each block goes before the next */
    static const uint64_t sizes[] = {1536 * KiB, 1280 * KiB};
    for (int i = 0; i < 2; i++) {  /* held + size within 4 MiB + 3 * size: new memory */
        uint64_t b = must_alloc(f, sizes[i]);
        assert_true(b != a);
        work_on(b);
        must_free(f, b);
    }
    assert_int_equal(stats(f).ordered_hits, 0);
    int creates = sim.calls[SIM_CREATE];
    /* Held: 4 MiB and two new granules. 8 + 1.75 passes 4 + 3 * 1.75 MiB: carved out of the
     * free span a and the others make, joined. */
    uint64_t e = must_alloc(f, 1792 * KiB);
    assert_int_equal(e, a);
    assert_int_equal(unordered_reuse(e, 1792 * KiB), 0);
    assert_int_equal(stats(f).ordered_hits, 1);
    assert_no_driver_work(f, creates);
}

/* Nothing can be ordered after the busy memory (a fence lost): the block is not carved out of
 * it, and nobody waits on the host: new memory instead. The busy memory stays, free. */
static void test_busy_memory_unordered_when_order_fails(void **state)
{
    fx *f = *state;
    uint64_t a = busy_freed(f, 4 * MiB);
    be.fail_order = true;
    uint64_t b = must_alloc(f, 2 * MiB);
    assert_true(b != a);
    assert_int_equal(stats(f).ordered_hits, 0);
    assert_int_equal(be.waits, 0);
    assert_int_equal(sim.calls[SIM_UNMAP], 0);
    assert_exact(f);
    be.fail_order = false;
    gpu_idle();
    assert_int_equal(must_alloc(f, 4 * MiB), a);  /* all of a's memory, free and done */
    assert_exact(f);
}

/* Trimming gives busy free memory back only after the device finished its work. */
static void test_trim_waits_for_busy_free_memory(void **state)
{
    fx *f = *state;
    uint64_t a = busy_freed(f, 4 * MiB), b = carve_busy(f, a, 2 * MiB);
    must_free(f, b);
    int syncs = sim.calls[SIM_SYNC];
    assert_true(cs_cache_trim(f->cache) >= 2 * MiB);  /* b's, idle and busy, stays */
    assert_true(sim.calls[SIM_SYNC] > syncs);
    assert_int_equal(sim.unsafe_unmaps, 0);
    assert_exact(f);
}

/* The host out of memory on demand: the cache's bookkeeping of a block (on cache lines of its
 * own, aligned_alloc) fails while fail_lines is set. */
static int fail_lines;
void *aligned_alloc(size_t align, size_t size)
{
    void *p = NULL;
    if (__atomic_load_n(&fail_lines, __ATOMIC_RELAXED))
        return NULL;
    return posix_memalign(&p, align, size) == 0 ? p : NULL;
}

/* No host memory for the bookkeeping of a block built, ordered, on memory the GPU still works
 * on: the memory goes back, and is unmapped only once that work has completed. */
static void test_no_host_memory_for_ordered_block(void **state)
{
    fx *f = *state;
    uint64_t a = busy_freed(f, 4 * MiB);
    uint64_t b = 0;
    int raw = 0;
    fail_lines = 1;
    cs_result r = cs_cache_alloc(f->cache, f->heap, 8 * MiB, &b, &raw, NULL);
    fail_lines = 0;
    assert_int_equal(r, CS_OOM);
    assert_int_equal(sim.unsafe_unmaps, 0);
    assert_int_equal(stats(f).ordered_hits, 0);  /* a miss: new memory was mapped too */
    assert_exact(f);
    assert_int_equal(must_alloc(f, 8 * MiB), a);
    assert_exact(f);
}

/* No host memory for the bookkeeping of a block carved, ordered, out of busy free memory (the
 * path taken before any miss): the memory is back in the pool as it was, busy, and the request
 * fails as out of memory; once the host has memory, the same carve serves it. */
static void test_no_host_memory_for_carved_block(void **state)
{
    fx *f = *state;
    uint64_t a = busy_freed(f, 4 * MiB);
    assert_in_free_span(f, a);
    uint64_t b = 0;
    int raw = 0;
    fail_lines = 1;  /* the miss's path after it fails the same way: new memory, given back */
    cs_result r = cs_cache_alloc(f->cache, f->heap, 4 * MiB, &b, &raw, NULL);
    fail_lines = 0;
    assert_int_equal(r, CS_OOM);
    assert_in_free_span(f, a);
    assert_int_equal(sim.unsafe_unmaps, 0);
    assert_int_equal(stats(f).bytes_in_use, 0);
    assert_exact(f);
    assert_int_equal(must_alloc(f, 4 * MiB), a);
    assert_exact(f);
}

/* While a capture runs, a trim gives back only free memory whose work is done: waiting for
 * the device (a context synchronize) would break the capture. */
static void test_trim_never_waits_while_capturing(void **state)
{
    fx *f = *state;
    uint64_t a = busy_freed(f, 4 * MiB), b = carve_busy(f, a, 2 * MiB);
    int syncs = sim.calls[SIM_SYNC];
    be.capturing = true;
    assert_int_equal(cs_cache_trim(f->cache), 0);
    assert_int_equal(sim.calls[SIM_SYNC], syncs);
    be.capturing = false;
    assert_int_equal(cs_cache_trim(f->cache), 2 * MiB);  /* the busy rest, after a wait */
    assert_true(sim.calls[SIM_SYNC] > syncs);
    must_free(f, b);
    assert_exact(f);
}

/* While a stream capture runs nothing moves (an unmap could break it) and a freed block does
 * not join the free space: new memory. */
static void test_capture_blocks_moves(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 6 * MiB);
    be.capturing = true;
    must_free(f, a);
    must_alloc(f, 2 * MiB);
    assert_int_equal(stats(f).moves, 0);
    assert_int_equal(sim.calls[SIM_UNMAP], 0);
    cs_block_info info;
    assert_int_equal(find(f, a, &info), CS_BLOCK_IDLE);
    be.capturing = false;
    must_alloc(f, 2 * MiB);
    assert_int_equal(stats(f).moves, 1);
    assert_exact(f);
}

/* While a capture runs, idle small blocks keep their slots too (giving them back is no driver
 * call, but what follows it may be); after it, a miss gives them back. */
static void test_capture_keeps_small_idle_blocks(void **state)
{
    fx *f = *state;
    uint64_t s = must_alloc(f, 1 * MiB);
    must_free(f, s);
    be.capturing = true;
    must_alloc(f, 4 * MiB);  /* new memory */
    assert_int_equal(stats(f).moves, 0);
    cs_block_info info;
    assert_int_equal(find(f, s, &info), CS_BLOCK_IDLE);
    assert_true(info.size > 0);  /* still a block, idle */
    be.capturing = false;
    must_alloc(f, 8 * MiB);
    assert_int_equal(stats(f).moves, 1);
    assert_int_equal(find(f, s, &info), CS_BLOCK_IDLE);
    assert_int_equal(info.size, 0);  /* the arena's, in no block */
    assert_exact(f);
}

/* At the cap, a large block that only a free span outside its zone takes (in the arena's
 * upper half, left by a block larger than a quarter of the arena) is carved there: no trim,
 * no new arena, no new memory, and while a capture runs no refusal. The cap is below the
 * headroom's bound here, so only the cap says new memory may not be taken. */
static void cap_zone(bool capture)
{
    fx *f;
    const uint64_t GiB = 1024 * MiB;
    setup_config((void **)&f, (config){.cap = 125 * GiB, .headroom_permille = 1000,
                                       .reuse = CS_REUSE_COMPLETED});
    must_alloc(f, 40 * GiB);
    must_alloc(f, 40 * GiB);
    uint64_t c = must_alloc(f, 41 * GiB); /* over a quarter of the 160 GiB arena: anywhere */
    must_free(f, c);                      /* its span joins the free space, upper half */
    int creates = sim.calls[SIM_CREATE], releases = sim.calls[SIM_RELEASE];
    int reserves = sim.calls[SIM_RESERVE];
    be.capturing = capture;
    uint64_t x = 0;
    int raw = 0;
    assert_int_equal(cs_cache_alloc(f->cache, f->heap, 10 * GiB, &x, &raw, NULL), CS_OK);
    be.capturing = false;
    assert_int_equal(x, c);
    assert_int_equal(sim.calls[SIM_CREATE], creates);
    assert_int_equal(sim.calls[SIM_RELEASE], releases);
    assert_int_equal(sim.calls[SIM_RESERVE], reserves);
    assert_int_equal(stats(f).cap_refusals, 0);
    teardown((void **)&f);
}

static void test_cap_takes_free_span_outside_zone(void **state)
{
    (void)state;
    cap_zone(false);
    cap_zone(true);
}

/* ---------------------------------------------------------------- limits */

/* The cap bounds what the device holds, the pool's spare included: at the cap the spare goes
 * first (no block loses its memory for it), then idle blocks, a busy one waited for before
 * its memory is unmapped. */
static int setup_cap7(void **state)
{
    return setup_config(state, (config){.cap = 7 * MiB, .reuse = CS_REUSE_COMPLETED});
}

static void test_cap_counts_spare(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 6 * MiB);  /* 3 chunks of a granule */
    must_free(f, a);
    uint64_t b = must_alloc(f, 2 * MiB);  /* carved out of a's span, 4 MiB of it spare */
    cacheshim_stats s = stats(f);
    assert_int_equal(s.moves, 0);
    assert_int_equal(s.bytes_cached, 4 * MiB);
    assert_exact(f);
    work_on(b);
    must_free(f, b);  /* busy */
    /* 6 MiB: the free 4 MiB + 2 new would make 8 MiB with b: over the cap. The spare goes
     * back first, as little at a time as the cap asks (a chunk of a granule, then the
     * other: the window lost the first); b cannot move (busy) and is given back once its
     * work is done; c then takes the arena's start anew. */
    size_t mark = sim.nlog;
    uint64_t c = must_alloc(f, 6 * MiB);
    s = stats(f);
    assert_int_equal(c, a);
    assert_int_equal(s.cap_refusals, 0);
    assert_int_equal(s.releases, 3);
    assert_int_equal(s.driver_frees, 3);
    assert_int_equal(s.driver_allocs, 2);
    assert_int_equal(s.bytes_in_use, 6 * MiB);
    assert_int_equal(s.bytes_cached, 0);
    assert_true(s.peak_reserved <= 7 * MiB);
    assert_true(sim.peak_used <= 7 * MiB);
    assert_int_equal(be.waits, 1);
    assert_int_equal(s.fence_waits, 1);  /* the host waited for b's fence */
    /* The spare chunks' unmaps and releases, b's, then c's chunks; the arena stays. */
    assert_string_equal(sim_log_from(&sim, mark), "URURURCMCMCMA");
    assert_exact(f);
}

/* A miss goes round again when the spare it counted on went meanwhile (CS_BE_SHORT): here the
 * cap trims it. If, on the second round, a busy block of the size has become idle, the
 * request waits for it: one request, one hit, no miss. (The block is freed from inside the
 * driver call that releases the spare, while the cache's lock is not held.) */
static struct {
    fx *f;
    uint64_t block;
    bool armed;
} free_in_release;

static void free_during_release(vmm_sim *s, int op, void *arg)
{
    (void)s;
    (void)arg;
    if (op == SIM_RELEASE && free_in_release.armed) {
        free_in_release.armed = false;
        work_on(free_in_release.block);
        must_free(free_in_release.f, free_in_release.block);
    }
}

static int setup_cap13(void **state)
{
    return setup_config(state, (config){.cap = 13 * MiB, .reuse = CS_REUSE_COMPLETED});
}

static void test_wait_on_retry_is_one_hit(void **state)
{
    fx *f = *state;
    uint64_t d = must_alloc(f, 6 * MiB), a = must_alloc(f, 6 * MiB);
    must_free(f, a);
    uint64_t b = must_alloc(f, 2 * MiB);  /* b carved out of a's span: 4 MiB of it spare */
    work_on(b);
    must_free(f, b);  /* busy: 6 in use + 2 idle + 4 spare = 12 */
    cacheshim_stats before = stats(f);
    free_in_release.f = f;
    free_in_release.block = d;
    free_in_release.armed = true;
    sim.hook = free_during_release;
    /* 6 MiB: 4 from the spare + 2 new = 14 > 13. The spare is trimmed (d freed meanwhile),
     * the pool now needs 6: short; the second round waits for d and hands it out. */
    uint64_t x = must_alloc(f, 6 * MiB);
    sim.hook = NULL;
    assert_false(free_in_release.armed);
    assert_int_equal(x, d);
    cacheshim_stats s = stats(f);
    assert_int_equal(s.requests - before.requests, 1);
    assert_int_equal(s.hits - before.hits, 1);
    assert_int_equal(s.misses - before.misses, 0);
    assert_int_equal(s.fence_waits - before.fence_waits, 1);
    assert_int_equal(s.requests, s.hits + s.misses);
    assert_exact(f);
}

/* Out of memory on the device: the spare of every heap of the device goes back (here
 * another context's), and the block is asked for again at the same size. */
static void test_oom_trims_spare_and_retries(void **state)
{
    fx *f = *state;
    cs_heap *h2 = cs_cache_add_heap(f->cache, (void *)0x2, 0, 8 * MiB, &pooled_ops, &sim, 0);
    assert_non_null(h2);
    sim.capacity = 8 * MiB;
    uint64_t a = must_alloc(f, 6 * MiB);
    must_free(f, a);
    must_alloc(f, 2 * MiB);  /* carved out of a's span: 4 MiB of it spare, in the first heap */
    assert_int_equal(sim.used, 6 * MiB);
    /* 6 + 4 > 8: the second granule is out of memory; the first heap's spare goes and the
     * block is made anew. */
    uint64_t c = must_alloc_on(f, h2, 4 * MiB);
    cacheshim_stats s = stats(f);
    assert_int_equal(s.oom_recoveries, 1);
    assert_int_equal(s.oom_failures, 0);
    assert_int_equal(s.bytes_cached, 0);
    assert_int_equal(s.bytes_in_use, 6 * MiB);
    assert_int_equal(sim.calls[SIM_CREATE], 7);  /* a's 3, c's first and failed second, c's 2 */
    assert_int_equal(sim.calls[SIM_RELEASE], 3);  /* c's first, rolled back; the spare 2 */
    assert_exact(f);
    cs_block_info info;
    assert_int_equal(find(f, c + 1, &info), CS_BLOCK_IN_USE);
    assert_int_equal(info.size, 4 * MiB);
}

/* Out of memory, the first step gives back only free memory the GPU is done with: here
 * another context's, 2 MiB ready beside 4 MiB whose work still runs. That serves the block
 * with no wait for the device; the busy memory stays. */
static void test_oom_first_step_does_not_wait(void **state)
{
    fx *f = *state;
    cs_heap *h2 = cs_cache_add_heap(f->cache, (void *)0x2, 0, 8 * MiB, &pooled_ops, &sim, 0);
    assert_non_null(h2);
    sim.capacity = 8 * MiB;
    uint64_t a = must_alloc(f, 4 * MiB);
    must_alloc(f, 2 * MiB);  /* kept: a's span and c's apart */
    uint64_t c = must_alloc(f, 2 * MiB);
    must_free(f, c);  /* ready */
    work_on(a);
    must_free(f, a);  /* busy (one busy stream: its span joins the free memory, fenced) */
    assert_int_equal(sim.used, 8 * MiB);
    int syncs = sim.calls[SIM_SYNC], waits = be.waits;
    must_alloc_on(f, h2, 2 * MiB);
    cacheshim_stats s = stats(f);
    assert_int_equal(s.oom_recoveries, 1);
    assert_int_equal(s.oom_failures, 0);
    assert_int_equal(sim.calls[SIM_SYNC], syncs);
    assert_int_equal(be.waits, waits);
    assert_int_equal(sim.used, 8 * MiB);  /* c's 2 MiB went, a's 4 stayed */
    assert_int_equal(sim.unsafe_unmaps, 0);
    assert_exact(f);
}

/* The second step of OOM recovery gives back busy blocks too: each waited for before its
 * range is unmapped. */
static void test_oom_waits_before_unmapping(void **state)
{
    fx *f = *state;
    sim.capacity = 6 * MiB;
    uint64_t a = must_alloc(f, 4 * MiB);
    work_on(a);
    must_free(f, a);  /* busy */
    must_alloc(f, 2 * MiB);  /* a cannot move: 2 MiB new, the device is full */
    uint64_t c = must_alloc(f, 2 * MiB);  /* out of memory; a is waited for, then goes */
    cacheshim_stats s = stats(f);
    assert_int_equal(s.oom_recoveries, 1);
    assert_int_equal(s.releases, 1);
    assert_int_equal(be.waits, 1);
    assert_int_equal(s.fence_waits, 1);
    assert_int_equal(sim.unsafe_unmaps, 0);
    assert_exact(f);
    (void)c;
}

/* A small block that needs a new small range (a whole granule) recovers from out of memory
 * like a large one: the reservation covers the granule, not just the slot (it once stayed
 * short for ever and failed with an error where the raw driver would have served it). */
static void test_oom_small_block_after_large(void **state)
{
    fx *f = *state;
    sim.capacity = 4 * MiB;
    uint64_t a = must_alloc(f, 4 * MiB);
    work_on(a);
    must_free(f, a);  /* busy: it cannot move, the device is full */
    uint64_t s4 = must_alloc(f, 4 * KiB);
    cacheshim_stats s = stats(f);
    assert_int_equal(s.oom_recoveries, 1);
    assert_int_equal(s.oom_failures, 0);
    assert_int_equal(sim.unsafe_unmaps, 0);
    assert_int_equal(sim.used, 2 * MiB);
    must_free(f, s4);
    assert_exact(f);
}

/* The release threshold counts the spare and trims it before any idle block. */
static int setup_threshold6(void **state)
{
    return setup_config(state, (config){.threshold = 6 * MiB, .reuse = CS_REUSE_COMPLETED});
}

static void test_threshold_trims_spare_first(void **state)
{
    fx *f = *state;
    uint64_t x = must_alloc(f, 2 * MiB), a = must_alloc(f, 6 * MiB);
    must_free(f, a);  /* its span joins the free space: 6 MiB spare, at the threshold */
    uint64_t b = must_alloc(f, 2 * MiB);  /* b carved out of a's span: 4 MiB spare */
    assert_int_equal(b, a);
    must_free(f, b);  /* 6 MiB spare: at the threshold */
    int releases = sim.calls[SIM_RELEASE];
    must_free(f, x);  /* 8 MiB spare: a spare chunk goes back */
    assert_int_equal(sim.calls[SIM_RELEASE], releases + 1);
    assert_int_equal(sim.calls[SIM_UNMAP], 1);  /* that chunk's */
    assert_int_equal(spare_released_count, 1);  /* the release hook is told, address 0 */
    cs_block_info info;
    assert_int_equal(find(f, x, &info), CS_BLOCK_IDLE);
    assert_int_equal(find(f, b, &info), CS_BLOCK_IDLE);
    cacheshim_stats s = stats(f);
    assert_int_equal(s.bytes_cached, 6 * MiB);  /* at the threshold again */
    assert_int_equal(s.releases, 1);
    assert_exact(f);
}

/* While a stream capture runs nothing goes back to the driver, the pool's free memory whose
 * work is done included (usage.md: a free could break the capture); the next free after it
 * gives back what is over the threshold. */
static void test_threshold_gives_nothing_back_while_capturing(void **state)
{
    fx *f = *state;
    uint64_t x = must_alloc(f, 2 * MiB), y = must_alloc(f, 2 * MiB), a = must_alloc(f, 6 * MiB);
    must_free(f, a);  /* 6 MiB spare: at the threshold */
    int unmaps = sim.calls[SIM_UNMAP], releases = sim.calls[SIM_RELEASE];
    be.capturing = true;
    must_free(f, x);  /* 8 MiB spare: over, but a capture runs */
    assert_int_equal(sim.calls[SIM_UNMAP], unmaps);
    assert_int_equal(sim.calls[SIM_RELEASE], releases);
    assert_int_equal(stats(f).bytes_cached, 8 * MiB);
    be.capturing = false;
    must_free(f, y);  /* 10 MiB spare: 4 MiB go back */
    assert_true(sim.calls[SIM_RELEASE] > releases);
    assert_int_equal(stats(f).bytes_cached, 6 * MiB);
    assert_exact(f);
}

/* Ordered, with the release threshold: a free over it gives back what needs no wait first.
 * Free memory the GPU still works on is spare too, but a free never waits for the whole device
 * to give it back while an idle block whose work is done can go instead. */
static int setup_threshold5_ordered(void **state)
{
    return setup_config(state, (config){.threshold = 5 * MiB, .headroom_permille = 1000});
}

static void test_threshold_never_syncs_for_busy_spare(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 4 * MiB), s = must_alloc(f, 1 * MiB);
    must_free(f, s);  /* a slab's slot, idle, its work done */
    work_on(a);
    must_free(f, a);                        /* 5 MiB idle: at the threshold */
    uint64_t b = carve_busy(f, a, 2 * MiB); /* 2 MiB of a's memory spare, busy */
    must_free(f, b);                        /* 3 MiB idle, 2 spare */
    uint64_t t = must_alloc(f, 512 * KiB);  /* on free pages of s's range */
    int syncs = sim.calls[SIM_SYNC], waits = be.waits;
    must_free(f, t);                        /* 3.5 MiB idle, 2 spare: over */
    assert_int_equal(sim.calls[SIM_SYNC], syncs);
    assert_int_equal(be.waits, waits);
    cs_block_info info;
    assert_int_equal(find(f, b, &info), CS_BLOCK_IDLE);
    assert_int_equal(info.base, b);  /* still a block: s went instead, with no wait */
    assert_int_equal(stats(f).releases, 0);  /* its slot stays the pool's, with t's */
    assert_exact(f);
}

/* Ordered, with a release threshold of 0: a large block freed while the GPU still works on
 * it does not join the free space (busy spare could go back only after a wait for the whole
 * device): it stays a block, given back at once after a wait for its own fence. */
static int setup_threshold0_ordered(void **state)
{
    return setup_config(state, (config){.threshold = 1});
}

static void test_threshold_gives_back_busy_block(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 4 * MiB);
    work_on(a);
    int syncs = sim.calls[SIM_SYNC], waits = be.waits;
    must_free(f, a);
    cacheshim_stats st = stats(f);
    assert_int_equal(st.bytes_cached, 0);
    assert_int_equal(st.releases, 1);
    assert_int_equal(be.waits, waits + 1);          /* its own fence */
    assert_int_equal(sim.calls[SIM_SYNC], syncs);  /* not the whole device */
    assert_exact(f);
}

/* Trim gives back idle blocks whose work is done, then the spare; it says what the driver got
 * back. A slot's memory goes back only with its range. */
static void test_trim(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 6 * MiB), s1 = must_alloc(f, 4 * KiB), s2 = must_alloc(f, 4 * KiB);
    must_free(f, a);
    must_free(f, s1);
    assert_int_equal(cs_cache_trim(f->cache), 6 * MiB);  /* s1's slot stays: s2 holds its range */
    cacheshim_stats s = stats(f);
    assert_int_equal(s.bytes_in_use, 4 * KiB);
    assert_int_equal(s.bytes_cached, 2 * MiB - 4 * KiB);  /* the granule's free slots */
    assert_exact(f);
    must_free(f, s2);
    assert_int_equal(cs_cache_trim(f->cache), 2 * MiB);  /* the range with its last slot */
    assert_int_equal(stats(f).bytes_cached, 0);
    assert_int_equal(sim.used, 0);
    assert_exact(f);
}

/* ---------------------------------------------------------------- pointer lookups */

static void test_find_pooled(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 3 * MiB + 5), s = must_alloc(f, 3000);
    cs_block_info info;
    assert_int_equal(find(f, a, &info), CS_BLOCK_IN_USE);
    assert_int_equal(info.base, a);
    assert_int_equal(info.requested, 3 * MiB + 5);
    assert_int_equal(info.size, 3 * MiB + 512);  /* carved to 512 bytes */
    assert_int_equal(info.device, 0);
    assert_true(info.pooled);
    uint64_t serial = info.serial;
    assert_int_equal(find(f, a + 3 * MiB + 4, &info), CS_BLOCK_IN_USE);  /* interior */
    assert_int_equal(info.base, a);
    assert_int_equal(info.serial, serial);
    assert_int_equal(find(f, a + 3 * MiB + 511, &info), CS_BLOCK_IN_USE);  /* past the request */
    assert_int_equal(info.base, a);
    assert_true(s % (2 * MiB) == 0 && s > a + 3 * MiB);  /* small: the arena's top (zones) */
    assert_int_equal(find(f, s + 2999, &info), CS_BLOCK_IN_USE);
    assert_int_equal(info.base, s);
    assert_int_equal(info.size, 3072);
    assert_int_equal(info.requested, 3000);
    assert_not_held(f, s + 3072);  /* a free slot */
    assert_not_held(f, s + 100 * KiB);  /* free pages */
    assert_not_held(f, s - 1);          /* the arena's hole below the range */
    assert_int_equal(find(f, 0x1000, &info), CS_BLOCK_UNKNOWN);
    must_free(f, a);  /* its span joins the free space: no block holds it */
    assert_int_equal(find(f, a + 100, &info), CS_BLOCK_IDLE);
    assert_int_equal(info.base, a + 100);
    assert_int_equal(info.size, 0);
    assert_int_equal(info.requested, 0);
    assert_true(info.pooled);
}

/* A large block freed twice: its memory joined the free space at the first free, so the
 * second finds no block there, only the pool's free memory, and is refused as a double free
 * without a driver call (the driver would be asked about a pointer it never gave). A pointer
 * inside a block in use is no block's start: the caller asks the driver. */
static void test_double_free_in_free_memory(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 3 * MiB), b = must_alloc(f, 3 * MiB);
    must_free(f, a);
    assert_in_free_span(f, a);
    int calls[SIM_OPS];
    memcpy(calls, sim.calls, sizeof calls);
    assert_int_equal(cs_cache_free(f->cache, a), CS_NOT_IN_USE);
    assert_int_equal(cs_cache_free(f->cache, a + 4096), CS_NOT_IN_USE);
    assert_int_equal(cs_cache_free(f->cache, b + 4096), CS_FOREIGN);
    assert_memory_equal(calls, sim.calls, sizeof calls);
    assert_int_equal(stats(f).frees, 1);
    must_free(f, b);
    assert_exact(f);
}

static void test_find_classic(void **state)
{
    fx *f = *state;
    cs_heap *h = cs_cache_add_heap(f->cache, (void *)0x2, 1, 80 * 1024 * MiB, &classic_ops, NULL, 0);
    assert_false(cs_cache_heap_pooled(h));
    uint64_t a = must_alloc_on(f, h, 3 * MiB + 5);
    cs_block_info info;
    assert_int_equal(find(f, a, &info), CS_BLOCK_IN_USE);
    assert_int_equal(info.base, a);
    assert_int_equal(info.requested, 3 * MiB + 5);
    assert_int_equal(info.size, 4 * MiB);
    assert_int_equal(info.device, 1);
    assert_false(info.pooled);
    /* Inside a classic block: the driver knows the allocation, the caller asks it. */
    assert_int_equal(find(f, a + 1, &info), CS_BLOCK_UNKNOWN);
    assert_int_equal(cs_cache_free(f->cache, a), CS_OK);
    assert_int_equal(find(f, a, &info), CS_BLOCK_IDLE);
    assert_int_equal(info.requested, 0);
    assert_int_equal(find(f, 0x12345000, &info), CS_BLOCK_UNKNOWN);
    assert_int_equal(sim.calls[SIM_CREATE], 0);
}

/* Every hand-out of a block gets a number of its own (buffer ids): the thread cache's path,
 * the core's, an ordered hit. New, not larger: a thread cache takes its ids a batch at a
 * time, so an id from its batch can be below one the core gave out meanwhile. */
static bool serial_seen(const uint64_t *seen, int n, uint64_t serial)
{
    for (int i = 0; i < n; i++)
        if (seen[i] == serial)
            return true;
    return false;
}

static void test_serial_at_every_handout(void **state)
{
    fx *f = *state;
    uint64_t seen[6];
    int nseen = 0;
    cs_block_info info;
    uint64_t a = must_alloc(f, 4 * MiB);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(find(f, a, &info), CS_BLOCK_IN_USE);
        assert_true(info.serial > 0 && !serial_seen(seen, nseen, info.serial));
        seen[nseen++] = info.serial;
        if (i == 3)
            work_on(a);  /* the next reuse is ordered (or, completed, a new block) */
        must_free(f, a);
        uint64_t again = must_alloc(f, 4 * MiB);
        if (again != a) {  /* a stayed a whole idle block: either is handed out next */
            gpu_idle();
            must_free(f, again);
            assert_int_equal(find(f, again, &info), CS_BLOCK_IDLE);
            uint64_t next = must_alloc(f, 4 * MiB);
            assert_true(next == a || next == again);
            a = next;
        }
    }
    assert_int_equal(find(f, a, &info), CS_BLOCK_IN_USE);
    assert_true(info.serial > 0 && !serial_seen(seen, nseen, info.serial));
}

/* Peer access granted: every run of mapped spans of a pooled heap gets the access op again
 * (two calls here: a's free memory, its two granules, and the small range at the arena's top);
 * a classic heap has nothing to do. A failure's raw code comes back. */
static void test_regrant(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 3 * MiB), s = must_alloc(f, 4 * KiB);
    must_free(f, a);  /* free: still mapped, granted too */
    assert_true(s > a + 4 * MiB);  /* small: the arena's top (zones) */
    int calls = sim.calls[SIM_ACCESS], from = sim.naccess;
    assert_int_equal(cs_cache_regrant(f->heap), 0);
    assert_int_equal(sim.calls[SIM_ACCESS], calls + 2);
    assert_int_equal(sim.access_va[from % 256], a);
    assert_int_equal(sim.access_size[from % 256], 4 * MiB);
    assert_int_equal(sim.access_va[(from + 1) % 256], s);
    assert_int_equal(sim.access_size[(from + 1) % 256], 2 * MiB);
    sim_fail_in(&sim, SIM_ACCESS, 1, CS_BE_ERROR);
    assert_int_equal(cs_cache_regrant(f->heap), 999);
    cs_heap *h = cs_cache_add_heap(f->cache, (void *)0x2, 0, 80 * 1024 * MiB, &classic_ops, NULL, 0);
    calls = sim.calls[SIM_ACCESS];
    assert_int_equal(cs_cache_regrant(h), 0);
    assert_int_equal(sim.calls[SIM_ACCESS], calls);
}

/* What a capped program sees of the device: the pool's spare is the program's to have, like
 * idle blocks. */
static int setup_cap16(void **state)
{
    return setup_config(state, (config){.cap = 16 * MiB, .reuse = CS_REUSE_COMPLETED});
}

static void test_mem_view_counts_spare(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 6 * MiB);
    must_free(f, a);
    must_alloc(f, 2 * MiB);  /* carved out of a's span: 2 in use, 4 of free span spare */
    uint64_t free_b, total_b;
    cs_cache_mem_view(f->cache, 0, 1 * MiB, 80 * 1024 * MiB, &free_b, &total_b);
    assert_int_equal(total_b, 16 * MiB);
    assert_int_equal(free_b, 5 * MiB);  /* the driver's 1 + the spare 4 */
    cs_cache_mem_view(f->cache, 0, 100 * MiB, 80 * 1024 * MiB, &free_b, &total_b);
    assert_int_equal(free_b, 14 * MiB);  /* the cap less what is in use */
}

/* ---------------------------------------------------------------- contexts */

/* The context goes: the heap's blocks and spare are forgotten, nothing is asked of the driver
 * for them afterwards; a new context works as before. */
/* The context goes while another thread's block is being mapped (here: inside its access
 * grant): the allocation answers that the context is gone, and nothing it built stays on the
 * device. A large block and a new small range. */
static fx *forget_fx;
static void forget_during_access(vmm_sim *s, int op, void *arg)
{
    (void)s;
    (void)arg;
    if (op == SIM_ACCESS && forget_fx) {
        fx *f = forget_fx;
        forget_fx = NULL;
        cs_cache_forget_heap(f->cache, (void *)0x1);
    }
}

static void test_context_gone_while_building(void **state)
{
    fx *f = *state;
    static const uint64_t sizes[] = {6 * MiB, 4 * KiB};
    for (int i = 0; i < 2; i++) {
        if (i)
            f->heap = cs_cache_add_heap(f->cache, (void *)0x1, 0, 80 * 1024 * MiB, &pooled_ops,
                                        &sim, 0);
        forget_fx = f;
        sim.hook = forget_during_access;
        uint64_t a = 0;
        int raw = 0;
        assert_int_equal(cs_cache_alloc(f->cache, f->heap, sizes[i], &a, &raw, NULL), CS_GONE);
        sim.hook = NULL;
        assert_null(forget_fx);
        assert_int_equal(sim_live_handles(&sim), 0);
        assert_int_equal(sim_live_reserves(&sim), 0);
        assert_int_equal(sim_live_maps(&sim), 0);
        assert_int_equal(sim.used, 0);
        assert_int_equal(sim.misuse, 0);
    }
}

/* A thread that looked the heap up before its context went allocates from it after: the
 * forgotten heap's idle small blocks were freed with it, so it finds none of them, and hears
 * that the context is gone; nothing is made on the device. */
static void test_alloc_on_forgotten_heap(void **state)
{
    fx *f = *state;
    uint64_t a[4];
    for (int i = 0; i < 4; i++)
        a[i] = must_alloc(f, 64 * KiB);
    for (int i = 0; i < 4; i++)
        must_free(f, a[i]);
    cs_cache_forget_heap(f->cache, (void *)0x1);
    int creates = sim.calls[SIM_CREATE];
    uint64_t x = 0;
    int raw = 0;
    assert_int_equal(cs_cache_alloc(f->cache, f->heap, 64 * KiB, &x, &raw, NULL), CS_GONE);
    assert_int_equal(cs_cache_alloc(f->cache, f->heap, 6 * MiB, &x, &raw, NULL), CS_GONE);
    assert_int_equal(sim.calls[SIM_CREATE], creates);
    assert_int_equal(sim.misuse, 0);
}

/* The context goes (cs_cache_forget_heap) while another thread allocates a large block from
 * the heap it looked up before. The forget marks the heap dead under the cache's lock and
 * releases its pool after it: in that gap the pool still has free spans, and a block carved
 * from one would be counted on a heap that is gone and unmapped under the program. The gap
 * holds no driver call, so it is made to last: this thread holds the pool's lock (inside an
 * access grant of cs_cache_regrant) while the forget runs, which then waits at the pool's
 * release, the heap already dead; an allocation now must answer that the context is gone
 * without touching the pool (it would wait for this thread's lock, and here give up). */
static struct {
    fx *f;
    pthread_t forget, alloc;
    uint64_t addr;
    int result, done;
} gap;

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, ms % 1000 * 1000000};
    nanosleep(&ts, NULL);
}

static void *forget_thread(void *p)
{
    fx *f = p;
    cs_cache_forget_heap(f->cache, (void *)0x1);
    return NULL;
}

/* Starts the forget, waits until the heap is dead (its pool not released: the test holds
 * the pool's lock), then allocates from it. Takes the cache's lock, which the test, holding
 * the pool's, must not. */
static void *alloc_thread(void *p)
{
    fx *f = p;
    if (pthread_create(&gap.forget, NULL, forget_thread, f) != 0)
        abort();
    while (cs_cache_heap(f->cache, (void *)0x1))
        sleep_ms(1);
    int raw = 0;
    gap.result = cs_cache_alloc(f->cache, f->heap, 6 * MiB, &gap.addr, &raw, NULL);
    __atomic_store_n(&gap.done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void alloc_in_gap(vmm_sim *s, int op, void *arg)
{
    (void)arg;
    if (op != SIM_ACCESS || !gap.f)
        return;
    s->hook = NULL;
    fx *f = gap.f;
    gap.f = NULL;
    assert_int_equal(pthread_create(&gap.alloc, NULL, alloc_thread, f), 0);
    for (int i = 0; i < 2000 && !__atomic_load_n(&gap.done, __ATOMIC_ACQUIRE); i++)
        sleep_ms(1);
}

static void test_alloc_while_context_goes(void **state)
{
    fx *f = *state;
    uint64_t a = must_alloc(f, 6 * MiB);
    must_free(f, a);  /* its span free in the pool, mapped: a block of 6 MiB is carved there */
    gap.f = f;
    gap.done = 0;
    sim.hook = alloc_in_gap;
    assert_int_equal(cs_cache_regrant(f->heap), 0);  /* returns once the allocation did */
    bool in_gap = __atomic_load_n(&gap.done, __ATOMIC_ACQUIRE);
    assert_null(gap.f);  /* the hook ran, and unset itself before the threads started */
    pthread_join(gap.alloc, NULL);
    pthread_join(gap.forget, NULL);
    cacheshim_stats st = stats(f);
    if (!in_gap || gap.result != CS_GONE || st.bytes_in_use || st.bytes_cached)
        fail_msg("allocation on a dead heap before its pool went: %s, result %d (CS_GONE %d), "
                 "in use %llu, cached %llu",
                 in_gap ? "answered" : "went to the pool and waited for it", gap.result,
                 CS_GONE, (unsigned long long)st.bytes_in_use,
                 (unsigned long long)st.bytes_cached);
    assert_int_equal(sim_live_handles(&sim), 0);
    assert_int_equal(sim_live_maps(&sim), 0);
    assert_int_equal(sim.misuse, 0);
}

static void test_forget_heap_with_spare(void **state)
{
    fx *f = *state;
    uint64_t s = must_alloc(f, 4 * KiB);
    must_alloc(f, 8 * KiB);
    uint64_t a = must_alloc(f, 6 * MiB);
    must_free(f, a);
    uint64_t b = must_alloc(f, 2 * MiB);  /* b carved out of a's span: 4 MiB of it spare */
    must_free(f, s);
    cacheshim_stats st = stats(f);
    assert_true(st.bytes_cached > 4 * MiB);  /* spare chunk, free slots, an idle slot */
    int calls[SIM_OPS];
    memcpy(calls, sim.calls, sizeof calls);
    size_t handles = sim_live_handles(&sim);
    cs_cache_forget_heap(f->cache, (void *)0x1);
    /* Nothing is made or waited for on a context that is gone. Its pool's memory went with
     * it, or (virtual memory outlives its context) is given back whole: never in part. */
    static const int none[] = {SIM_CREATE, SIM_RESERVE, SIM_MAP, SIM_ACCESS, SIM_SYNC};
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++)
        assert_int_equal(sim.calls[none[i]], calls[none[i]]);
    size_t live = sim_live_handles(&sim);
    assert_true(live == handles ||
                (live == 0 && sim_live_reserves(&sim) == 0 && sim_live_maps(&sim) == 0));
    assert_int_equal(sim.misuse, 0);
    memcpy(calls, sim.calls, sizeof calls);
    st = stats(f);
    assert_int_equal(st.bytes_in_use, 0);
    assert_int_equal(st.bytes_cached, 0);
    assert_int_equal(cs_cache_free(f->cache, b), CS_FOREIGN);
    cs_block_info info;
    assert_int_equal(find(f, b, &info), CS_BLOCK_UNKNOWN);
    assert_int_equal(cs_cache_trim(f->cache), 0);
    assert_memory_equal(calls, sim.calls, sizeof calls);
    /* A new context on the device (the old memory went with the old context). */
    sim_destroy(&sim);
    sim_init(&sim, 1ull << 40);
    f->heap = cs_cache_add_heap(f->cache, (void *)0x1, 0, 80 * 1024 * MiB, &pooled_ops, &sim, 0);
    uint64_t c = must_alloc(f, 2 * MiB);
    must_free(f, c);
    assert_int_equal(must_alloc(f, 2 * MiB), c);
    assert_exact(f);
}

/* ---------------------------------------------------------------- threads
 *
 * Threads allocate into shared slots and free what they find there (mostly other threads'
 * blocks), issue work on their blocks now and then, let the GPU catch up, trim, and read the
 * statistics. At the end everything goes back: the device holds nothing, nothing was misused,
 * no memory was unmapped while work on it could still run. */

enum { STRESS_THREADS = 8, STRESS_SLOTS = 64, STRESS_OPS = 10000 };

typedef struct {
    fx *f;
    uint64_t *slots;
    unsigned seed;
    long allocs, frees, bad, over_cap, unordered;
} stress_arg;

static void *stress_worker(void *p)
{
    stress_arg *a = p;
    static const uint64_t sizes[] = {512, 4096, 70000, 1 * MiB, 1 * MiB + 1, 3 * MiB, 6 * MiB};
    for (int i = 0; i < STRESS_OPS; i++) {
        unsigned r = (unsigned)rand_r(&a->seed);
        uint64_t *slot = &a->slots[r % STRESS_SLOTS];
        uint64_t old = __atomic_exchange_n(slot, 0, __ATOMIC_ACQ_REL);
        if (old) {
            if ((r >> 20) % 4 == 0)
                work_on(old + 100);
            a->bad += cs_cache_free(a->f->cache, old) != CS_OK;
            a->frees++;
        } else {
            uint64_t x;
            int raw;
            uint64_t size = sizes[(r >> 8) % 7];
            if (cs_cache_alloc(a->f->cache, a->f->heap, size, &x, &raw, NULL) == CS_OK) {
                a->allocs++;
                a->unordered += unordered_reuse(x, size);
                uint64_t prev = __atomic_exchange_n(slot, x, __ATOMIC_ACQ_REL);
                if (prev) {
                    a->bad += cs_cache_free(a->f->cache, prev) != CS_OK;
                    a->frees++;
                }
            }
        }
        switch ((r >> 16) % 64) {
        case 1: gpu_idle(); break;
        case 2: cs_cache_trim(a->f->cache); break;
        case 3: {
            cacheshim_stats s;
            cs_cache_stats(a->f->cache, 0, &s);
            a->over_cap += cap_limit != CS_UNLIMITED && s.bytes_in_use + s.bytes_cached > cap_limit;
            cs_block_info info;
            cs_cache_find(a->f->cache, __atomic_load_n(slot, __ATOMIC_ACQUIRE) + 10, &info);
            break;
        }
        default: break;
        }
    }
    return NULL;
}

static void test_stress(void **state)
{
    fx *f = *state;
    uint64_t slots[STRESS_SLOTS] = {0};
    stress_arg args[STRESS_THREADS];
    pthread_t t[STRESS_THREADS];
    for (int i = 0; i < STRESS_THREADS; i++) {
        args[i] = (stress_arg){.f = f, .slots = slots, .seed = 99u + (unsigned)i};
        assert_int_equal(pthread_create(&t[i], NULL, stress_worker, &args[i]), 0);
    }
    long allocs = 0, frees = 0;
    for (int i = 0; i < STRESS_THREADS; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(args[i].bad, 0);
        assert_int_equal(args[i].over_cap, 0);
        assert_int_equal(args[i].unordered, 0);
        allocs += args[i].allocs;
        frees += args[i].frees;
    }
    for (int k = 0; k < STRESS_SLOTS; k++)
        if (slots[k]) {
            must_free(f, slots[k]);
            frees++;
        }
    assert_int_equal(frees, allocs);
    cacheshim_stats s = stats(f);
    assert_int_equal(s.requests, s.hits + s.misses);
    assert_int_equal(s.requests - s.cap_refusals - s.oom_failures, (uint64_t)allocs);
    assert_int_equal(s.bytes_in_use, 0);
    assert_int_equal(s.bytes_requested, 0);
    assert_exact(f);
    if (cap_limit != CS_UNLIMITED) {
        assert_true(s.peak_reserved <= cap_limit);
        assert_true(sim.peak_used <= cap_limit);
    }
    gpu_idle();
    cs_cache_trim(f->cache);
    s = stats(f);
    assert_int_equal(s.bytes_cached, 0);
    assert_int_equal(sim_live_handles(&sim), 0);
    assert_int_equal(sim_live_reserves(&sim), 1);  /* the heap's arena, until its context goes */
    assert_int_equal(sim_live_maps(&sim), 0);
    assert_int_equal(sim.misuse, 0);
    assert_int_equal(sim.unsafe_unmaps, 0);
    cs_cache_forget_heap(f->cache, (void *)0x1);
    assert_int_equal(sim_live_reserves(&sim), 0);
    assert_int_equal(sim.misuse, 0);
}

static int setup_stress_headroom(void **state)
{
    return setup_config(state, (config){.headroom_permille = 250});
}
static int setup_stress_cap(void **state)
{
    return setup_config(state, (config){.cap = 48 * MiB, .reuse = CS_REUSE_COMPLETED});
}
static int setup_stress_ordered_cap(void **state)
{
    return setup_config(state, (config){.cap = 48 * MiB});
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_hit_never_maps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hit_never_maps, setup_no_tc, teardown),
        cmocka_unit_test_setup_teardown(test_ordered_hit_never_maps, setup_ordered, teardown),
        cmocka_unit_test(test_small_idle_back_before_new_memory),
        cmocka_unit_test_setup_teardown(test_move_builds_from_moved_chunks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_move_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_move_order, setup_no_tc, teardown),
        cmocka_unit_test_setup_teardown(test_busy_block_does_not_move, setup, teardown),
        cmocka_unit_test_setup_teardown(test_busy_block_does_not_move, setup_ordered_busy2,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_busy_block_carved_ordered, setup_ordered, teardown),
        cmocka_unit_test_setup_teardown(test_busy_free_memory_waits_for_busy_streams,
                                        setup_ordered_busy2, teardown),
        cmocka_unit_test_setup_teardown(test_busy_free_memory_taken_at_cap,
                                        setup_ordered_busy2_cap5, teardown),
        cmocka_unit_test_setup_teardown(test_busy_free_memory_taken_at_cap,
                                        setup_ordered_busy2_group_cap, teardown),
        cmocka_unit_test_setup_teardown(test_busy_free_memory_taken_out_of_memory,
                                        setup_ordered_busy2, teardown),
        cmocka_unit_test_setup_teardown(test_busy_memory_beyond_busy_streams,
                                        setup_ordered_busy2_tight, teardown),
        cmocka_unit_test_setup_teardown(test_busy_memory_unordered_when_order_fails,
                                        setup_ordered, teardown),
        cmocka_unit_test_setup_teardown(test_trim_waits_for_busy_free_memory, setup_ordered,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_no_host_memory_for_ordered_block, setup_ordered,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_no_host_memory_for_carved_block, setup_ordered,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_trim_never_waits_while_capturing, setup_ordered,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_capture_blocks_moves, setup, teardown),
        cmocka_unit_test_setup_teardown(test_capture_keeps_small_idle_blocks, setup, teardown),
        cmocka_unit_test(test_cap_takes_free_span_outside_zone),
        cmocka_unit_test_setup_teardown(test_cap_counts_spare, setup_cap7, teardown),
        cmocka_unit_test_setup_teardown(test_wait_on_retry_is_one_hit, setup_cap13, teardown),
        cmocka_unit_test_setup_teardown(test_oom_trims_spare_and_retries, setup, teardown),
        cmocka_unit_test_setup_teardown(test_oom_first_step_does_not_wait, setup_ordered, teardown),
        cmocka_unit_test_setup_teardown(test_oom_waits_before_unmapping, setup, teardown),
        cmocka_unit_test_setup_teardown(test_oom_small_block_after_large, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threshold_trims_spare_first, setup_threshold6, teardown),
        cmocka_unit_test_setup_teardown(test_threshold_gives_nothing_back_while_capturing,
                                        setup_threshold6, teardown),
        cmocka_unit_test_setup_teardown(test_threshold_gives_back_busy_block,
                                        setup_threshold0_ordered, teardown),
        cmocka_unit_test_setup_teardown(test_threshold_never_syncs_for_busy_spare,
                                        setup_threshold5_ordered, teardown),
        cmocka_unit_test_setup_teardown(test_trim, setup, teardown),
        cmocka_unit_test_setup_teardown(test_find_pooled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_double_free_in_free_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(test_find_classic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_serial_at_every_handout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_serial_at_every_handout, setup_no_tc, teardown),
        cmocka_unit_test_setup_teardown(test_serial_at_every_handout, setup_ordered, teardown),
        cmocka_unit_test_setup_teardown(test_regrant, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mem_view_counts_spare, setup_cap16, teardown),
        cmocka_unit_test_setup_teardown(test_forget_heap_with_spare, setup, teardown),
        cmocka_unit_test_setup_teardown(test_alloc_while_context_goes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_alloc_on_forgotten_heap, setup_no_tc, teardown),
        cmocka_unit_test_setup_teardown(test_context_gone_while_building, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stress, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stress, setup_ordered, teardown),
        cmocka_unit_test_setup_teardown(test_stress, setup_stress_headroom, teardown),
        cmocka_unit_test_setup_teardown(test_stress, setup_stress_cap, teardown),
        cmocka_unit_test_setup_teardown(test_stress, setup_stress_ordered_cap, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
