/* Unit tests of the physical pool (shim/cs_pool.c) on a simulated device (vmm_sim.h): how
 * ranges are built from new and spare chunks, trades, the new-memory limit, slabs, frees that
 * keep or release, the sync before unmapping work not known done, address lookups, trimming,
 * access grants, and the rollback of a build that fails at any driver call. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cs_pool.h"
#include "vmm_sim.h"

#define KiB (1024ull)
#define MiB (1024ull * 1024)
#define G (2 * MiB) /* the granularity of every pool here, an H100's */

typedef struct {
    vmm_sim sim;
    cs_pool *p;
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    sim_init(&f->sim, 1ull << 40);
    f->p = cs_pool_create(&sim_vmm_ops, &f->sim, G, 128 * G);
    assert_non_null(f->p);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    cs_pool_destroy(f->p);
    sim_destroy(&f->sim);
    free(f);
    return 0;
}

/* A block of `bytes` with no limit on new memory; what it created and released. */
static uint64_t take(fx *f, uint64_t bytes, uint64_t *created, uint64_t *released)
{
    uint64_t a = 0, c = 0, r = 0;
    int raw = 0;
    assert_int_equal(cs_pool_alloc(f->p, bytes, UINT64_MAX, &a, &c, &r, &raw), CS_BE_OK);
    assert_true(a != 0);
    if (created)
        *created = c;
    if (released)
        *released = r;
    return a;
}

/* Gives a block back: keep it as spare or release it, its work done. Bytes released. */
static uint64_t give(fx *f, uint64_t addr, bool keep)
{
    uint64_t released = 0;
    int raw = 0;
    assert_int_equal(cs_pool_free(f->p, addr, keep, true, &released, &raw), CS_BE_OK);
    return released;
}

static cs_pool_counts counts(fx *f)
{
    cs_pool_counts c;
    cs_pool_counts_get(f->p, &c);
    return c;
}

/* The pool's spare made of these chunk sizes: a block built of them (binary decomposition of
 * their sum, so each must be a distinct power-of-two number of granules), kept on free. */
static void make_spare(fx *f, uint64_t bytes)
{
    give(f, take(f, bytes, NULL, NULL), true);
}

static void assert_found(fx *f, uint64_t addr, uint64_t base, uint64_t size)
{
    uint64_t b = 0, s = 0;
    if (!cs_pool_find(f->p, addr, &b, &s))
        fail_msg("0x%llx: not found", (unsigned long long)addr);
    if (b != base || s != size)
        fail_msg("0x%llx: base 0x%llx size %llu, want 0x%llx size %llu", (unsigned long long)addr,
                 (unsigned long long)b, (unsigned long long)s, (unsigned long long)base,
                 (unsigned long long)size);
}

static void assert_not_found(fx *f, uint64_t addr)
{
    uint64_t b, s;
    if (cs_pool_find(f->p, addr, &b, &s))
        fail_msg("0x%llx: found (base 0x%llx)", (unsigned long long)addr, (unsigned long long)b);
}

/* Inside a small range but in no slot (a slab's tail, a page no slab has): no slot is found
 * there, whether the pool says it knows nothing of addr or that it is its memory in no slot
 * (size 0). */
static void assert_no_slot(fx *f, uint64_t addr)
{
    uint64_t b = 0, s = 0;
    if (cs_pool_find(f->p, addr, &b, &s) && s != 0)
        fail_msg("0x%llx: in a slot (base 0x%llx, size %llu)", (unsigned long long)addr,
                 (unsigned long long)b, (unsigned long long)s);
}

/* Nothing left on the device, nothing misused, no work unmapped before it was done. */
static void assert_clean(fx *f)
{
    assert_int_equal(sim_live_handles(&f->sim), 0);
    assert_int_equal(sim_live_reserves(&f->sim), 0);
    assert_int_equal(sim_live_maps(&f->sim), 0);
    assert_int_equal(f->sim.used, 0);
    assert_int_equal(f->sim.misuse, 0);
    assert_int_equal(f->sim.unsafe_unmaps, 0);
}

/* ---------------------------------------------------------------- creation */

static void test_create(void **state)
{
    (void)state;
    vmm_sim sim;
    sim_init(&sim, 0);
    static const uint64_t bad[] = {0, 512, 1000, 3 * 1024, 3 * MiB};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_null(cs_pool_create(&sim_vmm_ops, &sim, bad[i], 1ull << 30));
    cs_pool *p = cs_pool_create(&sim_vmm_ops, &sim, 1024, 1ull << 30);
    assert_non_null(p);
    cs_pool_destroy(p);
    cs_pool_destroy(NULL);
    assert_int_equal(cs_pool_slab_max(G), 1 * MiB);
    assert_int_equal(cs_pool_slab_max(64 * KiB), 32 * KiB);
    for (int op = 0; op < SIM_OPS; op++)
        assert_int_equal(sim.calls[op], 0);  /* creating and destroying calls no driver */
    sim_destroy(&sim);
}

/* ---------------------------------------------------------------- large blocks */

/* 7 granules from nothing: chunks of 4, 2 and 1 granules, created largest first and mapped
 * end to end in that order, one reservation, one access grant over the whole range. */
static void test_large_new_is_binary(void **state)
{
    fx *f = *state;
    assert_int_equal(cs_pool_need(f->p, 7 * G, true), 7 * G);
    uint64_t created, released;
    uint64_t va = take(f, 7 * G, &created, &released);
    assert_int_equal(created, 7 * G);
    assert_int_equal(released, 0);
    assert_string_equal(sim_log_from(&f->sim, 0), "CCCVMMMA");
    assert_int_equal(sim_mapped_at(&f->sim, va), 4 * G);
    assert_int_equal(sim_mapped_at(&f->sim, va + 4 * G), 2 * G);
    assert_int_equal(sim_mapped_at(&f->sim, va + 6 * G), 1 * G);
    assert_int_equal(f->sim.access_va[0], va);
    assert_int_equal(f->sim.access_size[0], 7 * G);
    assert_found(f, va, va, 7 * G);
    cs_pool_counts c = counts(f);
    assert_int_equal(c.creates, 3);
    assert_int_equal(c.maps, 3);
    assert_int_equal(c.reserves, 1);
    assert_int_equal(c.spare, 0);
    /* A power of two: one chunk. A block of granules rounded up (bytes not a multiple). */
    uint64_t v8 = take(f, 8 * G, &created, NULL);
    assert_int_equal(created, 8 * G);
    assert_int_equal(sim_mapped_at(&f->sim, v8), 8 * G);
    uint64_t v3 = take(f, 2 * G + 1, &created, NULL);
    assert_int_equal(created, 3 * G);
    assert_found(f, v3 + 3 * G - 1, v3, 3 * G);
    assert_int_equal(counts(f).creates, 6);
    give(f, va, false);
    give(f, v8, false);
    give(f, v3, false);
    assert_clean(f);
}

/* A range takes spare chunks first, largest first, and creates only the rest. */
static void test_large_from_spare_largest_first(void **state)
{
    fx *f = *state;
    make_spare(f, 7 * G);  /* spare: 4, 2, 1 granules */
    assert_int_equal(counts(f).spare, 7 * G);
    assert_int_equal(sim_live_handles(&f->sim), 3);
    assert_int_equal(sim_live_maps(&f->sim), 0);
    assert_int_equal(sim_live_reserves(&f->sim), 0);
    /* 3 granules: the 4-granule chunk is too large; 2 and 1 make it, nothing created. */
    assert_int_equal(cs_pool_need(f->p, 3 * G, true), 0);
    size_t mark = f->sim.nlog;
    uint64_t created, released;
    uint64_t a = take(f, 3 * G, &created, &released);
    assert_int_equal(created, 0);
    assert_int_equal(released, 0);
    assert_string_equal(sim_log_from(&f->sim, mark), "VMMA");
    assert_int_equal(sim_mapped_at(&f->sim, a), 2 * G);
    assert_int_equal(sim_mapped_at(&f->sim, a + 2 * G), 1 * G);
    assert_int_equal(counts(f).spare, 4 * G);
    /* 5 granules: the 4-granule chunk, then 1 new. */
    assert_int_equal(cs_pool_need(f->p, 5 * G, true), 1 * G);
    uint64_t b = take(f, 5 * G, &created, &released);
    assert_int_equal(created, 1 * G);
    assert_int_equal(released, 0);
    assert_int_equal(sim_mapped_at(&f->sim, b), 4 * G);
    assert_int_equal(sim_mapped_at(&f->sim, b + 4 * G), 1 * G);
    assert_int_equal(counts(f).spare, 0);
    /* Chunks of the same size: both taken. */
    uint64_t x = take(f, 2 * G, &created, NULL);  /* new: the spare is empty */
    assert_int_equal(created, 2 * G);
    give(f, a, true);  /* spare: 2, 1 */
    give(f, x, true);  /* spare: 2, 2, 1 */
    assert_int_equal(cs_pool_need(f->p, 5 * G, true), 0);
    uint64_t c = take(f, 5 * G, &created, NULL);
    assert_int_equal(created, 0);
    assert_int_equal(sim_mapped_at(&f->sim, c), 2 * G);
    assert_int_equal(sim_mapped_at(&f->sim, c + 2 * G), 2 * G);
    assert_int_equal(sim_mapped_at(&f->sim, c + 4 * G), 1 * G);
    give(f, b, false);
    give(f, c, false);
    assert_clean(f);
}

/* New memory is needed while spare chunks remain that the range cannot use: they go back to
 * the driver first (largest first, only as many bytes as the range creates). */
static void test_trade(void **state)
{
    fx *f = *state;
    make_spare(f, 4 * G);
    assert_int_equal(cs_pool_need(f->p, 1 * G, true), 1 * G);
    size_t mark = f->sim.nlog;
    uint64_t created, released;
    uint64_t a = take(f, 1 * G, &created, &released);
    assert_int_equal(created, 1 * G);
    assert_int_equal(released, 4 * G);
    assert_string_equal(sim_log_from(&f->sim, mark), "RCVMA");
    assert_int_equal(counts(f).spare, 0);
    assert_int_equal(sim_live_handles(&f->sim), 1);
    give(f, a, false);
    /* Spare 4 and 1: 3 granules take the 1, trade the 4, create 2; spare chunks map first. */
    make_spare(f, 5 * G);
    uint64_t b = take(f, 3 * G, &created, &released);
    assert_int_equal(created, 2 * G);
    assert_int_equal(released, 4 * G);
    assert_int_equal(sim_mapped_at(&f->sim, b), 1 * G);
    assert_int_equal(sim_mapped_at(&f->sim, b + 1 * G), 2 * G);
    give(f, b, false);
    /* Two unusable chunks of 4: one traded is enough for 1 new granule; the other stays. */
    uint64_t x = take(f, 4 * G, NULL, NULL), y = take(f, 4 * G, NULL, NULL);
    give(f, x, true);
    give(f, y, true);
    uint64_t c = take(f, 1 * G, &created, &released);
    assert_int_equal(created, 1 * G);
    assert_int_equal(released, 4 * G);
    assert_int_equal(counts(f).spare, 4 * G);
    give(f, c, false);
    assert_int_equal(cs_pool_trim(f->p, UINT64_MAX), 4 * G);
    assert_clean(f);
}

/* At most max_new bytes of new memory: more is CS_BE_SHORT, before any driver call. */
static void test_max_new(void **state)
{
    fx *f = *state;
    make_spare(f, 2 * G);
    uint64_t a = 0, created = 1, released = 1;
    int raw = 0;
    size_t mark = f->sim.nlog;
    assert_int_equal(cs_pool_alloc(f->p, 3 * G, 0, &a, &created, &released, &raw), CS_BE_SHORT);
    assert_int_equal(cs_pool_alloc(f->p, 3 * G, 1 * G - 1, &a, &created, &released, &raw),
                     CS_BE_SHORT);
    assert_int_equal(created, 0);
    assert_int_equal(released, 0);
    assert_string_equal(sim_log_from(&f->sim, mark), "");
    assert_int_equal(counts(f).spare, 2 * G);
    /* Exactly what it needs: fine. A small range needs a granule, also limited. */
    assert_int_equal(cs_pool_alloc(f->p, 3 * G, 1 * G, &a, &created, &released, &raw), CS_BE_OK);
    assert_int_equal(created, 1 * G);
    uint64_t s = 0;
    assert_int_equal(cs_pool_alloc(f->p, 4 * KiB, G - 1, &s, &created, &released, &raw),
                     CS_BE_SHORT);
    assert_int_equal(cs_pool_alloc(f->p, 4 * KiB, G, &s, &created, &released, &raw), CS_BE_OK);
    assert_int_equal(created, G);
    give(f, a, false);
    give(f, s, false);
    assert_clean(f);
}

/* ---------------------------------------------------------------- slabs */

/* A small range is one granule of 32 pages (64 KiB here); a slab is the shortest run of pages
 * whose tail waste is at most an eighth, cut into slots handed out lowest first; a slab per
 * slot size; a new one on the first free run of pages. */
static void test_slab_addresses(void **state)
{
    fx *f = *state;
    const uint64_t page = G / 32;
    uint64_t created;
    uint64_t va = take(f, 4 * KiB, &created, NULL);
    assert_int_equal(created, G);
    assert_int_equal(sim_mapped_at(&f->sim, va), G);
    /* 4 KiB: one page, 16 slots. */
    for (uint64_t i = 1; i < 16; i++)
        assert_int_equal(take(f, 4 * KiB, &created, NULL), va + i * 4 * KiB);
    assert_int_equal(take(f, 4 * KiB, NULL, NULL), va + page);
    /* 3 KiB: one page (1 KiB of tail, less than an eighth), 21 slots, on page 2. */
    uint64_t s3 = take(f, 3 * KiB, NULL, NULL);
    assert_int_equal(s3, va + 2 * page);
    for (uint64_t i = 1; i < 21; i++)
        assert_int_equal(take(f, 3 * KiB, NULL, NULL), s3 + i * 3 * KiB);
    assert_int_equal(take(f, 3 * KiB, NULL, NULL), va + 3 * page);
    /* 48 KiB: one page wastes 16 KiB, two 32 KiB; three pages hold four slots exactly. */
    uint64_t s48 = take(f, 48 * KiB, NULL, NULL);
    assert_int_equal(s48, va + 4 * page);
    for (uint64_t i = 1; i < 4; i++)
        assert_int_equal(take(f, 48 * KiB, NULL, NULL), s48 + i * 48 * KiB);
    assert_int_equal(take(f, 48 * KiB, NULL, NULL), va + 7 * page);
    /* 1 MiB, the largest small block: 16 pages, one slot, on pages 10..25. */
    assert_int_equal(take(f, 1 * MiB, NULL, NULL), va + 10 * page);
    assert_int_equal(counts(f).creates, 1);  /* all of it in the first granule */
    /* No run of 16 pages left (26..31): a second small range. */
    uint64_t second = take(f, 1 * MiB, &created, NULL);
    assert_int_equal(created, G);
    assert_true(second < va || second >= va + G);
    /* Smaller slots take free pages of a small range: the newest range's first (small
     * ranges with free pages are kept newest first), then the older one's. */
    assert_int_equal(take(f, 512 * KiB, &created, NULL), second + 16 * page);
    assert_int_equal(take(f, 256 * KiB, &created, NULL), second + 24 * page);
    assert_int_equal(take(f, 256 * KiB, &created, NULL), second + 28 * page);
    assert_int_equal(take(f, 256 * KiB, &created, NULL), va + 26 * page);
    assert_int_equal(created, 0);
    assert_int_equal(counts(f).creates, 2);
}

/* Once a slab's slots are all free, its pages serve another slot size. */
static void test_slab_pages_reused_by_another_class(void **state)
{
    fx *f = *state;
    const uint64_t page = G / 32;
    uint64_t s4[16];
    for (int i = 0; i < 16; i++)
        s4[i] = take(f, 4 * KiB, NULL, NULL);  /* page 0 */
    uint64_t va = s4[0];
    uint64_t s8 = take(f, 8 * KiB, NULL, NULL);  /* page 1 */
    assert_int_equal(s8, va + page);
    for (int i = 0; i < 16; i++)
        assert_int_equal(give(f, s4[i], i % 2 == 0), 0);  /* keep or not: the range stays */
    assert_no_slot(f, va);  /* page 0 is free */
    assert_no_slot(f, va + 4 * KiB);
    uint64_t created;
    uint64_t s32 = take(f, 32 * KiB, &created, NULL);
    assert_int_equal(s32, va);
    assert_int_equal(created, 0);
    assert_found(f, va + 4 * KiB, va, 32 * KiB);
    assert_found(f, va + 32 * KiB, va + 32 * KiB, 32 * KiB);  /* its other (free) slot */
    assert_int_equal(counts(f).creates, 1);
    /* A slab of another size reuses a freed slab's own slots before new pages. */
    give(f, s8, false);
    assert_int_equal(take(f, 32 * KiB, NULL, NULL), va + 32 * KiB);
    assert_int_equal(take(f, 8 * KiB, NULL, NULL), va + page);
}

/* The last free slot of a range takes the range away: unmapped, its chunk kept or released;
 * before that, frees give nothing back. */
static void test_small_range_goes_when_all_free(void **state)
{
    fx *f = *state;
    for (int keep = 0; keep < 2; keep++) {
        uint64_t a = take(f, 512, NULL, NULL), b = take(f, 100 * KiB, NULL, NULL),
                 c = take(f, 1 * MiB, NULL, NULL);
        assert_int_equal(counts(f).slab_free, G - 512 - 100 * KiB - 1 * MiB);
        assert_int_equal(give(f, a, keep), 0);
        assert_int_equal(give(f, c, keep), 0);
        assert_int_equal(sim_live_maps(&f->sim), 1);
        size_t mark = f->sim.nlog;
        assert_int_equal(give(f, b, keep), keep ? 0 : G);
        assert_string_equal(sim_log_from(&f->sim, mark), keep ? "Uv" : "UvR");
        assert_int_equal(sim_live_maps(&f->sim), 0);
        assert_int_equal(sim_live_reserves(&f->sim), 0);
        assert_int_equal(counts(f).spare, keep ? G : 0);
        assert_int_equal(counts(f).slab_free, 0);
        assert_not_found(f, b);
    }
    /* The kept granule makes the next small range: no new memory. */
    assert_int_equal(cs_pool_need(f->p, 512, true), 0);
    uint64_t created;
    take(f, 512, &created, NULL);
    assert_int_equal(created, 0);
}

/* keep: the chunks stay as spare (nothing released, nothing counted as released); else they
 * go back to the driver. */
static void test_keep_or_release(void **state)
{
    fx *f = *state;
    uint64_t a = take(f, 3 * G, NULL, NULL), b = take(f, 3 * G, NULL, NULL);
    assert_int_equal(give(f, a, true), 0);
    assert_int_equal(sim_live_handles(&f->sim), 4);
    assert_int_equal(f->sim.calls[SIM_RELEASE], 0);
    assert_int_equal(counts(f).spare, 3 * G);
    assert_int_equal(counts(f).unmaps, 2);
    assert_int_equal(give(f, b, false), 3 * G);
    assert_int_equal(sim_live_handles(&f->sim), 2);
    assert_int_equal(f->sim.calls[SIM_RELEASE], 2);
    assert_int_equal(counts(f).releases, 2);
    assert_not_found(f, a);
    assert_not_found(f, b);
    /* Unknown addresses, and the interior of a large block, are no block to free. */
    uint64_t c = take(f, 1 * G, NULL, NULL), released = 7;
    int raw = 0;
    assert_int_equal(cs_pool_free(f->p, c + 4096, false, true, &released, &raw), CS_BE_ERROR);
    assert_int_equal(raw, 1);  /* CUDA_ERROR_INVALID_VALUE */
    assert_int_equal(released, 0);
    assert_int_equal(cs_pool_free(f->p, 0x1234000, false, true, &released, &raw), CS_BE_ERROR);
    uint64_t s = take(f, 4 * KiB, NULL, NULL);
    assert_int_equal(cs_pool_free(f->p, s + 512, false, true, &released, &raw), CS_BE_ERROR);
    assert_found(f, c, c, G);  /* still there */
    give(f, c, false);
    give(f, s, false);
    cs_pool_trim(f->p, UINT64_MAX);
    assert_clean(f);
}

/* Work not known done: the device is synchronized before the range is unmapped, or before a
 * slot becomes free to hand out again; once, even when that slot's free empties the range. */
static void test_not_done_syncs_first(void **state)
{
    fx *f = *state;
    uint64_t released;
    int raw;
    uint64_t a = take(f, 3 * G, NULL, NULL);
    sim_work(&f->sim, a + 5, 1);  /* work of epoch 1 on it, not done */
    size_t mark = f->sim.nlog;
    assert_int_equal(cs_pool_free(f->p, a, true, false, &released, &raw), CS_BE_OK);
    assert_string_equal(sim_log_from(&f->sim, mark), "SUUv");
    assert_int_equal(f->sim.unsafe_unmaps, 0);
    /* Done: no sync. */
    uint64_t b = take(f, 3 * G, NULL, NULL);
    mark = f->sim.nlog;
    assert_int_equal(cs_pool_free(f->p, b, false, true, &released, &raw), CS_BE_OK);
    assert_string_equal(sim_log_from(&f->sim, mark), "UUvRR");
    /* Slots: a sync and nothing else while the range stays; done, nothing at all. */
    uint64_t s1 = take(f, 4 * KiB, NULL, NULL), s2 = take(f, 4 * KiB, NULL, NULL);
    sim_work(&f->sim, s1, 2);
    mark = f->sim.nlog;
    assert_int_equal(cs_pool_free(f->p, s1, false, false, &released, &raw), CS_BE_OK);
    assert_string_equal(sim_log_from(&f->sim, mark), "S");
    assert_int_equal(f->sim.completed, 2);
    assert_int_equal(take(f, 4 * KiB, NULL, NULL), s1);  /* the slot, safe to reuse now */
    mark = f->sim.nlog;
    assert_int_equal(cs_pool_free(f->p, s1, false, true, &released, &raw), CS_BE_OK);
    assert_string_equal(sim_log_from(&f->sim, mark), "");
    /* The last slot, not done: one sync, then the range goes. */
    sim_work(&f->sim, s2, 3);
    mark = f->sim.nlog;
    assert_int_equal(cs_pool_free(f->p, s2, false, false, &released, &raw), CS_BE_OK);
    assert_string_equal(sim_log_from(&f->sim, mark), "SUvR");
    assert_int_equal(released, G);
    assert_int_equal(f->sim.unsafe_unmaps, 0);
    /* A failed sync is reported, and the range is unmapped all the same (nothing better). */
    uint64_t c = take(f, 1 * G, NULL, NULL);
    sim_fail_in(&f->sim, SIM_SYNC, 1, CS_BE_ERROR);
    assert_int_equal(cs_pool_free(f->p, c, false, false, &released, &raw), CS_BE_ERROR);
    assert_int_equal(released, G);
    assert_not_found(f, c);
    cs_pool_trim(f->p, UINT64_MAX);
    assert_int_equal(sim_live_handles(&f->sim), 0);
}

/* ---------------------------------------------------------------- lookups */

static void test_find(void **state)
{
    fx *f = *state;
    const uint64_t page = G / 32;
    uint64_t big = take(f, 3 * G, NULL, NULL);
    assert_found(f, big, big, 3 * G);
    assert_found(f, big + 1, big, 3 * G);
    assert_found(f, big + 2 * G, big, 3 * G);  /* in its second chunk */
    assert_found(f, big + 3 * G - 1, big, 3 * G);
    assert_not_found(f, big + 3 * G);
    assert_not_found(f, big - 1);
    assert_not_found(f, 0);
    /* Slots: each byte maps to its slot's base; a slot boundary starts the next slot. */
    uint64_t s = take(f, 3 * KiB, NULL, NULL), s2 = take(f, 3 * KiB, NULL, NULL);
    assert_int_equal(s2, s + 3 * KiB);
    assert_found(f, s, s, 3 * KiB);
    assert_found(f, s + 3 * KiB - 1, s, 3 * KiB);
    assert_found(f, s + 3 * KiB, s2, 3 * KiB);
    /* A slot not handed out is still a slot of the slab (the cache knows no block there). */
    assert_found(f, s + 20 * 3 * KiB + 5, s + 20 * 3 * KiB, 3 * KiB);
    /* The slab's tail (21 slots of 3 KiB in 64 KiB) and free pages are no slot. */
    assert_no_slot(f, s + 21 * 3 * KiB);
    assert_no_slot(f, s + page - 1);
    assert_no_slot(f, s + page);
    assert_no_slot(f, s + G - 1);
    assert_not_found(f, s + G);
    /* A freed block's range is gone. */
    give(f, big, false);
    assert_not_found(f, big + 1);
    assert_found(f, s2, s2, 3 * KiB);
}

/* New bytes a block would take now, for each way a block is made. */
static void test_need(void **state)
{
    fx *f = *state;
    /* Nothing: a large block is its granules, a small one a granule. */
    assert_int_equal(cs_pool_need(f->p, 3 * G, true), 3 * G);
    assert_int_equal(cs_pool_need(f->p, 2 * G + 1, true), 3 * G);
    assert_int_equal(cs_pool_need(f->p, 512, true), G);
    assert_int_equal(cs_pool_need(f->p, 1 * MiB, true), G);
    uint64_t s = take(f, 512, NULL, NULL);
    /* A slab of that size with a free slot, or free pages for a new one: nothing. */
    assert_int_equal(cs_pool_need(f->p, 512, true), 0);
    assert_int_equal(cs_pool_need(f->p, 64 * KiB, true), 0);
    assert_int_equal(cs_pool_need(f->p, 1 * MiB, true), 0);  /* 16 of the 31 free pages */
    uint64_t m = take(f, 1 * MiB, NULL, NULL);
    assert_int_equal(cs_pool_need(f->p, 1 * MiB, true), G);  /* 15 pages left: a new range */
    assert_int_equal(cs_pool_need(f->p, 512 * KiB, true), 0);
    /* Spare: used largest first, the rest new; a granule of spare serves a small range. */
    make_spare(f, 3 * G);  /* 2 and 1 */
    assert_int_equal(cs_pool_need(f->p, 1 * MiB, true), 0);
    assert_int_equal(cs_pool_need(f->p, 1 * G, true), 0);
    assert_int_equal(cs_pool_need(f->p, 2 * G, true), 0);
    assert_int_equal(cs_pool_need(f->p, 4 * G, true), 1 * G);
    assert_int_equal(cs_pool_need(f->p, 8 * G, true), 5 * G);
    /* What need says is what a build takes. */
    uint64_t created;
    take(f, 4 * G, &created, NULL);
    assert_int_equal(created, 1 * G);
    (void)s;
    (void)m;
}

/* ---------------------------------------------------------------- trim */

static void test_trim(void **state)
{
    fx *f = *state;
    make_spare(f, 7 * G);  /* 4, 2, 1 */
    assert_int_equal(cs_pool_trim(f->p, 0), 0);
    /* Largest first, until the bytes asked for are given back. */
    assert_int_equal(cs_pool_trim(f->p, 3 * G), 4 * G);
    assert_int_equal(counts(f).spare, 3 * G);
    assert_int_equal(cs_pool_trim(f->p, 2 * G + 1), 3 * G);
    assert_int_equal(cs_pool_trim(f->p, UINT64_MAX), 0);
    assert_int_equal(counts(f).releases, 3);
    assert_clean(f);
    /* More chunks than one batch (64): all go. */
    uint64_t a[70];
    for (int i = 0; i < 70; i++)
        a[i] = take(f, 1 * G, NULL, NULL);
    for (int i = 0; i < 70; i++)
        give(f, a[i], true);
    assert_int_equal(sim_live_handles(&f->sim), 70);
    assert_int_equal(cs_pool_trim(f->p, UINT64_MAX), 70 * G);
    assert_clean(f);
    /* Ranges in use are never trimmed. */
    uint64_t b = take(f, 1 * G, NULL, NULL);
    assert_int_equal(cs_pool_trim(f->p, UINT64_MAX), 0);
    assert_found(f, b, b, G);
}

/* ---------------------------------------------------------------- access grants */

static bool granted(vmm_sim *s, int from, uint64_t va, uint64_t size, int times)
{
    int n = 0;
    for (int i = from; i < s->naccess; i++)
        n += s->access_va[i % 256] == va && s->access_size[i % 256] == size;
    return n == times;
}

static void test_regrant(void **state)
{
    fx *f = *state;
    uint64_t a = take(f, 3 * G, NULL, NULL), b = take(f, 1 * G, NULL, NULL),
             s = take(f, 4 * KiB, NULL, NULL);
    int from = f->sim.naccess, raw = 0;
    assert_int_equal(cs_pool_regrant(f->p, &raw), CS_BE_OK);
    assert_int_equal(f->sim.naccess, from + 3);
    assert_true(granted(&f->sim, from, a, 3 * G, 1));
    assert_true(granted(&f->sim, from, b, G, 1));
    assert_true(granted(&f->sim, from, s, G, 1));  /* the small range, whole */
    /* One fails: every range is still asked, the first failure is returned. */
    int calls = f->sim.calls[SIM_ACCESS];
    sim_fail_in(&f->sim, SIM_ACCESS, 2, CS_BE_ERROR);
    assert_int_equal(cs_pool_regrant(f->p, &raw), CS_BE_ERROR);
    assert_int_equal(raw, 999);
    assert_int_equal(f->sim.calls[SIM_ACCESS], calls + 3);
    /* A range that is gone is not asked. */
    give(f, b, false);
    from = f->sim.naccess;
    assert_int_equal(cs_pool_regrant(f->p, &raw), CS_BE_OK);
    assert_int_equal(f->sim.naccess, from + 2);
    assert_true(granted(&f->sim, from, b, G, 0));
}

/* The allowed devices change while a range is being mapped (outside the pool's lock, so the
 * regrant cannot see it yet): the range gets the access op once more before it is handed out. */
static struct {
    cs_pool *p;
    int armed;
} regrant_hook;

static void regrant_in_map(vmm_sim *s, int op, void *arg)
{
    (void)s;
    (void)arg;
    if (op == SIM_MAP && regrant_hook.armed && --regrant_hook.armed == 0) {
        int raw;
        cs_pool_regrant(regrant_hook.p, &raw);
    }
}

static void test_regrant_during_build(void **state)
{
    fx *f = *state;
    uint64_t old = take(f, 1 * G, NULL, NULL);
    regrant_hook.p = f->p;
    regrant_hook.armed = 2;  /* during the new range's second map */
    f->sim.hook = regrant_in_map;
    int from = f->sim.naccess;
    uint64_t a = take(f, 3 * G, NULL, NULL);
    f->sim.hook = NULL;
    assert_int_equal(regrant_hook.armed, 0);
    assert_true(granted(&f->sim, from, old, G, 1));  /* by the regrant */
    assert_true(granted(&f->sim, from, a, 3 * G, 2));  /* by the build, then again */
    /* Without a regrant meanwhile: once. */
    from = f->sim.naccess;
    uint64_t b = take(f, 3 * G, NULL, NULL);
    assert_true(granted(&f->sim, from, b, 3 * G, 1));
}

/* ---------------------------------------------------------------- failures */

/* A build that fails at any driver call leaves nothing behind: what it created is released,
 * what it mapped unmapped, its reservation freed, the spare chunks it took back in the spare;
 * the failure's code and raw code come back. */
static void test_rollback(void **state)
{
    (void)state;
    static const struct {
        int op, nth, rc;
    } cases[] = {
        {SIM_CREATE, 1, CS_BE_OOM},  {SIM_CREATE, 2, CS_BE_OOM},  {SIM_CREATE, 2, CS_BE_ERROR},
        {SIM_RESERVE, 1, CS_BE_ERROR}, {SIM_MAP, 1, CS_BE_ERROR}, {SIM_MAP, 2, CS_BE_ERROR},
        {SIM_MAP, 3, CS_BE_ERROR},   {SIM_ACCESS, 1, CS_BE_ERROR},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (int small = 0; small < 2; small++) {
            fx *f;
            setup((void **)&f);
            /* Spare: a 1-granule chunk. A large block of 7 granules takes it and creates 4
             * and 2; a small range takes it alone (no create: skip those cases). */
            make_spare(f, 1 * G);
            if (small && (cases[i].op == SIM_CREATE || (cases[i].op == SIM_MAP && cases[i].nth > 1))) {
                teardown((void **)&f);
                continue;
            }
            size_t handles = sim_live_handles(&f->sim);
            cs_pool_counts before = counts(f);
            sim_fail_in(&f->sim, cases[i].op, cases[i].nth, cases[i].rc);
            uint64_t a = 0, created = 7, released = 7, bytes = small ? 4 * KiB : 7 * G;
            int raw = 0;
            int rc = cs_pool_alloc(f->p, bytes, UINT64_MAX, &a, &created, &released, &raw);
            if (rc != cases[i].rc)
                fail_msg("op %d, call %d, %s: rc %d", cases[i].op, cases[i].nth,
                         small ? "small" : "large", rc);
            assert_int_equal(raw, cases[i].rc == CS_BE_OOM ? 2 : 999);
            assert_int_equal(created, 0);
            assert_int_equal(released, 0);
            assert_int_equal(sim_live_handles(&f->sim), handles);  /* the spare chunk only */
            assert_int_equal(sim_live_reserves(&f->sim), 0);
            assert_int_equal(sim_live_maps(&f->sim), 0);
            assert_int_equal(f->sim.used, 1 * G);
            assert_int_equal(f->sim.misuse, 0);
            cs_pool_counts after = counts(f);
            assert_int_equal(after.spare, before.spare);
            assert_int_equal(after.slab_free, before.slab_free);
            assert_int_equal(after.reserves, before.reserves);
            assert_int_equal(after.maps, before.maps);
            /* What the pool counts matches what the driver saw. */
            assert_int_equal(after.creates - after.releases, sim_live_handles(&f->sim));
            assert_int_equal(cs_pool_need(f->p, bytes, true), small ? 0 : 6 * G);
            assert_not_found(f, f->sim.next_va - 1);
            /* And the same build works now. */
            uint64_t got = take(f, bytes, &created, NULL);
            assert_int_equal(created, small ? 0 : 6 * G);
            give(f, got, false);
            cs_pool_trim(f->p, UINT64_MAX);
            assert_clean(f);
            teardown((void **)&f);
        }
    }
}

/* A trade happens before the creates: when a create then fails, what was traded is gone (and
 * said so), the rest is as before. */
static void test_rollback_after_trade(void **state)
{
    fx *f = *state;
    make_spare(f, 4 * G);
    sim_fail_in(&f->sim, SIM_CREATE, 1, CS_BE_OOM);
    uint64_t a, created, released;
    int raw;
    assert_int_equal(cs_pool_alloc(f->p, 1 * G, UINT64_MAX, &a, &created, &released, &raw),
                     CS_BE_OOM);
    assert_int_equal(released, 4 * G);
    assert_int_equal(created, 0);
    assert_int_equal(counts(f).spare, 0);
    assert_clean(f);
}

/* An unmap that fails: reported; the range leaves the pool, its chunks are released rather
 * than kept (they may still be mapped). */
static void test_unmap_failure(void **state)
{
    fx *f = *state;
    uint64_t a = take(f, 3 * G, NULL, NULL), released;
    int raw;
    sim_fail_in(&f->sim, SIM_UNMAP, 1, CS_BE_ERROR);
    assert_int_equal(cs_pool_free(f->p, a, true, true, &released, &raw), CS_BE_ERROR);
    assert_int_equal(released, 3 * G);
    assert_int_equal(counts(f).spare, 0);
    assert_not_found(f, a);
    assert_int_equal(sim_live_handles(&f->sim), 0);
}

/* ---------------------------------------------------------------- threads */

/* Threads allocate and free blocks of mixed sizes (kept or released, done or not) while
 * another trims and regrants. No two live blocks overlap; at the end everything goes back
 * and the device holds nothing. */
enum { POOL_THREADS = 6, POOL_OPS = 4000, POOL_SLOTS = 32 };

typedef struct {
    fx *f;
    unsigned seed;
    int index, bad;
} pool_worker_arg;

static struct {
    pthread_mutex_t lock;
    uint64_t base[POOL_THREADS * POOL_SLOTS], end[POOL_THREADS * POOL_SLOTS];
    bool stop;  /* atomic */
} live = {PTHREAD_MUTEX_INITIALIZER, {0}, {0}, false};

/* Records [a, a + n) as live in slot k: false if it overlaps another live block. */
static bool live_add(int k, uint64_t a, uint64_t n)
{
    bool ok = true;
    pthread_mutex_lock(&live.lock);
    for (int i = 0; i < POOL_THREADS * POOL_SLOTS; i++)
        ok &= !(live.end[i] && a < live.end[i] && live.base[i] < a + n);
    live.base[k] = a;
    live.end[k] = a + n;
    pthread_mutex_unlock(&live.lock);
    return ok;
}

static void live_remove(int k)
{
    pthread_mutex_lock(&live.lock);
    live.base[k] = live.end[k] = 0;
    pthread_mutex_unlock(&live.lock);
}

static void *pool_worker(void *p)
{
    pool_worker_arg *w = p;
    static const uint64_t sizes[] = {512, 4 * KiB, 3 * KiB, 100 * KiB, 1 * MiB, 1 * G, 3 * G, 5 * G};
    uint64_t mine[POOL_SLOTS] = {0};
    int first = w->index;
    for (int i = 0; i < POOL_OPS; i++) {
        unsigned r = (unsigned)rand_r(&w->seed);
        int k = (int)(r % POOL_SLOTS);
        uint64_t released;
        int raw;
        if (mine[k]) {
            live_remove(first * POOL_SLOTS + k);
            w->bad += cs_pool_free(w->f->p, mine[k], (r >> 8) & 1, (r >> 9) & 1, &released, &raw) !=
                      CS_BE_OK;
            mine[k] = 0;
        } else {
            uint64_t bytes = sizes[(r >> 10) % 8], a, created;
            if (cs_pool_alloc(w->f->p, bytes, UINT64_MAX, &a, &created, &released, &raw) != CS_BE_OK) {
                w->bad++;
                continue;
            }
            mine[k] = a;
            w->bad += !live_add(first * POOL_SLOTS + k, a, bytes);
            uint64_t base, size;
            w->bad += !cs_pool_find(w->f->p, a + bytes - 1, &base, &size) || base != a ||
                      size < bytes;
        }
    }
    for (int k = 0; k < POOL_SLOTS; k++) {
        uint64_t released;
        int raw;
        if (mine[k]) {
            live_remove(first * POOL_SLOTS + k);
            w->bad += cs_pool_free(w->f->p, mine[k], false, true, &released, &raw) != CS_BE_OK;
        }
    }
    return NULL;
}

static void *pool_janitor(void *p)
{
    fx *f = p;
    while (!__atomic_load_n(&live.stop, __ATOMIC_ACQUIRE)) {
        int raw;
        cs_pool_trim(f->p, 3 * G);
        cs_pool_regrant(f->p, &raw);
        uint64_t need = cs_pool_need(f->p, 3 * G, true);
        (void)need;
    }
    return NULL;
}

static void test_threads(void **state)
{
    fx *f = *state;
    pthread_t t[POOL_THREADS], janitor;
    pool_worker_arg args[POOL_THREADS];
    __atomic_store_n(&live.stop, false, __ATOMIC_RELEASE);
    assert_int_equal(pthread_create(&janitor, NULL, pool_janitor, f), 0);
    for (int i = 0; i < POOL_THREADS; i++) {
        args[i] = (pool_worker_arg){f, 77u + (unsigned)i, i, 0};
        assert_int_equal(pthread_create(&t[i], NULL, pool_worker, &args[i]), 0);
    }
    for (int i = 0; i < POOL_THREADS; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(args[i].bad, 0);
    }
    __atomic_store_n(&live.stop, true, __ATOMIC_RELEASE);
    pthread_join(janitor, NULL);
    cs_pool_counts c = counts(f);
    assert_int_equal(c.slab_free, 0);
    cs_pool_trim(f->p, UINT64_MAX);
    assert_clean(f);
    c = counts(f);
    assert_int_equal(c.spare, 0);
    assert_int_equal(c.creates, c.releases);
    assert_int_equal(c.maps, c.unmaps);
    assert_int_equal(c.creates, (uint64_t)f->sim.calls[SIM_CREATE]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create),
        cmocka_unit_test_setup_teardown(test_large_new_is_binary, setup, teardown),
        cmocka_unit_test_setup_teardown(test_large_from_spare_largest_first, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trade, setup, teardown),
        cmocka_unit_test_setup_teardown(test_max_new, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slab_addresses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slab_pages_reused_by_another_class, setup, teardown),
        cmocka_unit_test_setup_teardown(test_small_range_goes_when_all_free, setup, teardown),
        cmocka_unit_test_setup_teardown(test_keep_or_release, setup, teardown),
        cmocka_unit_test_setup_teardown(test_not_done_syncs_first, setup, teardown),
        cmocka_unit_test_setup_teardown(test_find, setup, teardown),
        cmocka_unit_test_setup_teardown(test_need, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trim, setup, teardown),
        cmocka_unit_test_setup_teardown(test_regrant, setup, teardown),
        cmocka_unit_test_setup_teardown(test_regrant_during_build, setup, teardown),
        cmocka_unit_test(test_rollback),
        cmocka_unit_test_setup_teardown(test_rollback_after_trade, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unmap_failure, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
