/* Unit tests of the physical pool (shim/cs_pool.c) on a simulated device (vmm_sim.h): blocks
 * carved out of arenas (free spans that coalesce, best fit), windows of free spans and holes
 * filled with new chunks or chunks moved from free spans (never a chunk partly used), the
 * overhang of a last chunk, the new-memory limit, slabs, frees that keep or release, the sync
 * before memory whose work is not known done is handed out or unmapped, address lookups,
 * trimming, access grants, the rollback of a fill that fails at any driver call, and the
 * context going while a thread is at work outside the pool's lock. */
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
/* Arenas of 1024 granules: large blocks (up to 256 granules) in the lower 512, small ranges in
 * the upper 512 (zones, cs_pool.c), the first at its top. */
#define ARENA (1024 * G)

typedef struct {
    vmm_sim sim;
    cs_pool *p;
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    sim_init(&f->sim, 1ull << 40);
    f->p = cs_pool_create(&sim_vmm_ops, &f->sim, G, ARENA, NULL, NULL);
    assert_non_null(f->p);
    *state = f;
    return 0;
}

/* A pool told which epochs completed (done_epoch): freed memory may stay busy in it. */
static uint64_t done_epoch;
static bool ready_upto(void *arg, uint64_t epoch)
{
    (void)arg;
    return epoch <= __atomic_load_n(&done_epoch, __ATOMIC_ACQUIRE);
}

static int setup_busy(void **state)
{
    setup(state);
    fx *f = *state;
    cs_pool_destroy(f->p);
    f->p = cs_pool_create(&sim_vmm_ops, &f->sim, G, ARENA, ready_upto, NULL);
    assert_non_null(f->p);
    __atomic_store_n(&done_epoch, 0, __ATOMIC_RELEASE);
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
    assert_int_equal(cs_pool_alloc(f->p, bytes, UINT64_MAX, false, &a, &c, &r, NULL, NULL, &raw), CS_BE_OK);
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
    assert_int_equal(cs_pool_free(f->p, addr, keep, true, 1, &released, &raw), CS_BE_OK);
    return released;
}

static cs_pool_counts counts(fx *f)
{
    cs_pool_counts c;
    cs_pool_counts_get(f->p, &c);
    return c;
}

/* A free span of `bytes` (rounded up to granules): a block of new chunks, kept on free. */
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

/* In the pool's memory, in no block: a free span, a hole, a slab's tail or a page no slab has. */
static void assert_no_block(fx *f, uint64_t addr)
{
    uint64_t b = 0, s = 7;
    if (!cs_pool_find(f->p, addr, &b, &s))
        fail_msg("0x%llx: not in an arena", (unsigned long long)addr);
    if (s != 0)
        fail_msg("0x%llx: in a block (base 0x%llx, size %llu)", (unsigned long long)addr,
                 (unsigned long long)b, (unsigned long long)s);
}

/* Nothing left on the device but the arenas' reservations (an arena stays reserved until the
 * context goes: cs_pool_release_all), nothing misused, no work unmapped before it was done. */
static void assert_clean(fx *f)
{
    assert_int_equal(sim_live_handles(&f->sim), 0);
    assert_int_equal(sim_live_reserves(&f->sim), counts(f).reserves);
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
        assert_null(cs_pool_create(&sim_vmm_ops, &sim, bad[i], 1ull << 30, NULL, NULL));
    cs_pool *p = cs_pool_create(&sim_vmm_ops, &sim, 1024, 1ull << 30, NULL, NULL);
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

/* 7 granules from nothing: the pool reserves its first arena, then the block's hole gets new
 * chunks of one granule each (a chunk that size fits any hole when it moves later), created
 * and mapped one after the other, and one access grant over the whole block. From 32 granules
 * on, what a hole holds in whole multiples of 32 granules comes in binary (few handles: a
 * mapping costs per handle), the rest in single granules. Blocks follow each other in the
 * arena; the arena stays reserved when they go. */
static void test_large_new_chunks(void **state)
{
    fx *f = *state;
    assert_int_equal(cs_pool_need(f->p, 7 * G, true, false), 7 * G);
    uint64_t created, released;
    uint64_t va = take(f, 7 * G, &created, &released);
    assert_int_equal(created, 7 * G);
    assert_int_equal(released, 0);
    assert_string_equal(sim_log_from(&f->sim, 0), "VCMCMCMCMCMCMCMA");
    for (uint64_t i = 0; i < 7; i++)
        assert_int_equal(sim_mapped_at(&f->sim, va + i * G), G);
    assert_int_equal(f->sim.access_va[0], va);
    assert_int_equal(f->sim.access_size[0], 7 * G);
    assert_found(f, va, va, 7 * G);
    cs_pool_counts c = counts(f);
    assert_int_equal(c.creates, 7);
    assert_int_equal(c.maps, 7);
    assert_int_equal(c.reserves, 1);
    assert_int_equal(c.carves, 0);
    assert_int_equal(c.spare, 0);
    assert_int_equal(c.free_mapped, 0);
    /* 96 granules = 64 + 32: two chunks, the largest first. 40 = 32 + 8 single granules. */
    size_t mark = f->sim.nlog;
    uint64_t v96 = take(f, 96 * G, &created, NULL);
    assert_int_equal(v96, va + 7 * G);
    assert_int_equal(created, 96 * G);
    assert_string_equal(sim_log_from(&f->sim, mark), "CMCMA");
    assert_int_equal(sim_mapped_at(&f->sim, v96), 64 * G);
    assert_int_equal(sim_mapped_at(&f->sim, v96 + 64 * G), 32 * G);
    uint64_t v40 = take(f, 40 * G, &created, NULL);
    assert_int_equal(v40, v96 + 96 * G);
    assert_int_equal(sim_mapped_at(&f->sim, v40), 32 * G);
    for (uint64_t i = 32; i < 40; i++)
        assert_int_equal(sim_mapped_at(&f->sim, v40 + i * G), G);
    /* Bytes not a multiple of the granularity: the block is carved to 512 bytes; its last
     * granule is mapped whole, the rest of it a free span after the block. */
    uint64_t v3 = take(f, 2 * G + 1, &created, NULL);
    assert_int_equal(created, 3 * G);
    assert_found(f, v3 + 2 * G, v3, 2 * G + 512);
    assert_no_block(f, v3 + 2 * G + 512);
    assert_int_equal(counts(f).free_mapped, G - 512);
    assert_int_equal(counts(f).creates, 7 + 2 + 9 + 3);
    assert_int_equal(counts(f).reserves, 1);  /* all of it in one arena */
    give(f, va, false);
    give(f, v96, false);
    give(f, v40, false);
    give(f, v3, false);
    assert_clean(f);
}

/* A freed block's span turns free, mapped: a block that fits is carved out of it with no
 * driver call at all, from its start; the rest stays free. Memory of chunks wholly inside
 * free spans counts as spare (it can go back to the driver). */
static void test_carve_from_free_span(void **state)
{
    fx *f = *state;
    uint64_t a = take(f, 7 * G, NULL, NULL);
    give(f, a, true);
    assert_int_equal(sim_live_maps(&f->sim), 7);  /* kept: still mapped */
    assert_int_equal(counts(f).free_mapped, 7 * G);
    assert_int_equal(counts(f).spare, 7 * G);
    assert_no_block(f, a);
    assert_true(cs_pool_fits(f->p, 3 * G, false));
    assert_int_equal(cs_pool_need(f->p, 3 * G, true, false), 0);
    size_t mark = f->sim.nlog;
    uint64_t created, released;
    assert_int_equal(take(f, 3 * G, &created, &released), a);
    assert_int_equal(created, 0);
    assert_int_equal(released, 0);
    assert_found(f, a + 3 * G - 1, a, 3 * G);
    assert_no_block(f, a + 3 * G);
    cs_pool_counts c = counts(f);
    assert_int_equal(c.carves, 1);
    assert_int_equal(c.free_mapped, 4 * G);
    assert_int_equal(c.spare, 4 * G);
    /* The rest exactly: carved too. Nothing free is left. */
    assert_int_equal(take(f, 4 * G, &created, NULL), a + 3 * G);
    assert_int_equal(created, 0);
    assert_string_equal(sim_log_from(&f->sim, mark), "");
    assert_false(cs_pool_fits(f->p, 1 * G, false));
    assert_int_equal(counts(f).carves, 2);
    assert_int_equal(counts(f).free_mapped, 0);
    /* A small range goes to the arena's upper half (zones, below): with no new memory allowed,
     * a chunk of this free span moves there (unmapped, mapped, granted). */
    give(f, a, true);
    uint64_t s = 0;
    bool carved = true;
    int raw = 0;
    assert_int_equal(cs_pool_alloc(f->p, 4 * KiB, 0, false, &s, &created, &released, &carved,
                                   NULL, &raw), CS_BE_OK);
    assert_int_equal(s, a + ARENA - G);
    assert_int_equal(created, 0);
    assert_false(carved);
    assert_int_equal(counts(f).moves, 1);
    assert_string_equal(sim_log_from(&f->sim, mark), "UMA");
}

/* Zones: an arena's lower half takes large blocks, from its start, its upper half small
 * ranges, from its top, so slabs that empty never cut the free runs large blocks need. A
 * free span outside its zone takes a block only when new memory may not be taken (beyond the
 * headroom: max_new) or the driver has none; a block larger than a quarter of the arena goes
 * anywhere. */
static void test_zones(void **state)
{
    fx *f = *state;
    uint64_t created, released;
    uint64_t big = take(f, 3 * G, NULL, NULL);
    uint64_t arena = big, top = arena + ARENA - G, mid = arena + ARENA / 2;
    uint64_t s = take(f, 4 * KiB, &created, NULL);
    assert_int_equal(s, top);  /* a small range at the top */
    assert_int_equal(created, G);
    uint64_t s2 = take(f, 600 * KiB, NULL, NULL);  /* a second size, the same range */
    assert_true(s2 > top && s2 < top + G);
    /* Large blocks fill the lower half from its start. Larger than a quarter of an arena:
     * anywhere (here the upper half); one that would pass the middle goes into a new arena
     * while new memory may be taken. */
    uint64_t l1 = take(f, 509 * G, NULL, NULL);
    assert_int_equal(l1, big + 3 * G);
    uint64_t huge = take(f, 300 * G, NULL, NULL);
    assert_int_equal(huge, mid);
    assert_int_equal(counts(f).reserves, 1);
    give(f, big, false);
    uint64_t l2 = take(f, 4 * G, NULL, NULL);
    assert_int_equal(counts(f).reserves, 2);
    assert_true(l2 < arena || l2 >= arena + ARENA);
    /* A large block's free span in the upper half: a large block not ordered there while new
     * memory may be taken, but with none allowed it is carved there, no driver call. */
    give(f, huge, true);
    size_t mark = f->sim.nlog;
    uint64_t addr = 0;
    bool carved = false;
    int raw = 0;
    assert_false(cs_pool_fits(f->p, 5 * G, false));
    assert_int_equal(cs_pool_need(f->p, 5 * G, true, false), 0);  /* at the least: none */
    assert_true(cs_pool_need(f->p, 5 * G, false, false) > 0);
    assert_int_equal(cs_pool_alloc(f->p, 5 * G, 0, false, &addr, &created, &released, &carved,
                                   NULL, &raw), CS_BE_OK);
    assert_int_equal(addr, huge);
    assert_int_equal(created, 0);
    assert_true(carved);
    assert_string_equal(sim_log_from(&f->sim, mark), "");
    /* The device full: the driver's refusal, then the free span outside the zone. */
    give(f, addr, true);
    mark = f->sim.nlog;
    sim_fail_in(&f->sim, SIM_CREATE, 1, CS_BE_OOM);
    assert_int_equal(cs_pool_alloc(f->p, 6 * G, UINT64_MAX, false, &addr, &created, &released,
                                   &carved, NULL, &raw), CS_BE_OK);
    assert_int_equal(addr, huge);
    assert_true(carved);
    assert_int_equal(sim_live_handles(&f->sim), (int)(counts(f).creates - counts(f).releases));
    give(f, addr, false);
    /* No free span anywhere takes it: short stays short, before any driver call, and the
     * driver's refusal stays its refusal, with its code. */
    mark = f->sim.nlog;
    assert_int_equal(cs_pool_alloc(f->p, 5 * G, 0, false, &addr, &created, &released, &carved,
                                   NULL, &raw), CS_BE_SHORT);
    assert_string_equal(sim_log_from(&f->sim, mark), "");
    sim_fail_in(&f->sim, SIM_CREATE, 1, CS_BE_OOM);
    raw = 0;
    assert_int_equal(cs_pool_alloc(f->p, 5 * G, UINT64_MAX, false, &addr, &created, &released,
                                   &carved, NULL, &raw), CS_BE_OOM);
    assert_int_equal(raw, 2);  /* CUDA_ERROR_OUT_OF_MEMORY */
    assert_int_equal(sim_live_handles(&f->sim), (int)(counts(f).creates - counts(f).releases));
    give(f, l1, false);
    give(f, l2, false);
    give(f, s, false);
    give(f, s2, false);
    cs_pool_trim(f->p, UINT64_MAX, true);
    assert_clean(f);
}

/* A freed span joins the free spans beside it: three blocks freed one by one make one free
 * span that takes a block of all their granules, with no driver call. A block freed without
 * keep gives back the chunks then wholly free: its own and those of the free spans it joined. */
static void test_coalesce(void **state)
{
    fx *f = *state;
    uint64_t a = take(f, 2 * G, NULL, NULL), b = take(f, 2 * G, NULL, NULL),
             c = take(f, 2 * G, NULL, NULL), d = take(f, 1 * G, NULL, NULL);
    assert_int_equal(b, a + 2 * G);
    assert_int_equal(c, b + 2 * G);
    give(f, a, true);
    give(f, c, true);
    assert_false(cs_pool_fits(f->p, 3 * G, false));  /* two free spans of 2 granules */
    give(f, b, true);
    assert_true(cs_pool_fits(f->p, 6 * G, false));
    assert_false(cs_pool_fits(f->p, 7 * G, false));  /* d is in use, the hole after it unmapped */
    size_t mark = f->sim.nlog;
    uint64_t created;
    assert_int_equal(take(f, 6 * G, &created, NULL), a);
    assert_int_equal(created, 0);
    assert_string_equal(sim_log_from(&f->sim, mark), "");
    assert_found(f, a + 6 * G - 1, a, 6 * G);
    give(f, a, true);
    /* d freed without keep: it joins the 6 free granules, and all 7 go back. */
    assert_int_equal(give(f, d, false), 7 * G);
    assert_string_equal(sim_log_from(&f->sim, mark), "UUUUUUURRRRRRR");
    assert_int_equal(counts(f).free_mapped, 0);
    assert_no_block(f, a);  /* a hole now, in the arena still */
    assert_clean(f);
}

/* A block is carved out of the smallest free span it fits (best fit), not the first. */
static void test_best_fit(void **state)
{
    fx *f = *state;
    uint64_t a = take(f, 3 * G, NULL, NULL), x = take(f, 1 * G, NULL, NULL),
             b = take(f, 2 * G, NULL, NULL), y = take(f, 1 * G, NULL, NULL);
    give(f, a, true);
    give(f, b, true);
    size_t mark = f->sim.nlog;
    assert_int_equal(take(f, 2 * G, NULL, NULL), b);
    assert_int_equal(take(f, 2 * G, NULL, NULL), a);  /* the only one left that fits */
    assert_int_equal(take(f, 1 * G, NULL, NULL), a + 2 * G);
    assert_string_equal(sim_log_from(&f->sim, mark), "");
    assert_int_equal(counts(f).carves, 3);
    /* Among equal spans, the lowest address. */
    give(f, b, true);
    give(f, a, true);  /* a's first 2 granules: a free span of 2 like b's */
    assert_int_equal(take(f, 2 * G, NULL, NULL), a);
    (void)x;
    (void)y;
}

/* No free span fits: the block goes where it needs the least new mapping, a window of free
 * spans and holes. Here a free granule followed by the arena's hole: the block starts on the
 * free granule and only the hole's part is created and mapped, and granted access. */
static void test_window_mixes_free_and_holes(void **state)
{
    fx *f = *state;
    uint64_t a = take(f, 2 * G, NULL, NULL), b = take(f, 1 * G, NULL, NULL),
             c = take(f, 2 * G, NULL, NULL);
    give(f, c, false);  /* a hole again, one with the arena's rest */
    give(f, b, true);   /* free, mapped (freed before c, it would have gone with c's chunks) */
    assert_false(cs_pool_fits(f->p, 4 * G, false));
    assert_int_equal(cs_pool_need(f->p, 4 * G, true, false), 3 * G);
    size_t mark = f->sim.nlog;
    int from = f->sim.naccess;
    uint64_t created;
    assert_int_equal(take(f, 4 * G, &created, NULL), b);
    assert_int_equal(created, 3 * G);
    assert_string_equal(sim_log_from(&f->sim, mark), "CMCMCMA");
    assert_int_equal(f->sim.naccess, from + 1);
    assert_int_equal(f->sim.access_va[from % 256], b + 1 * G);  /* the hole's part only */
    assert_int_equal(f->sim.access_size[from % 256], 3 * G);
    assert_int_equal(sim_mapped_at(&f->sim, b), G);  /* b's chunk, where it was */
    assert_found(f, b + 4 * G - 1, b, 4 * G);
    assert_int_equal(counts(f).free_mapped, 0);
    (void)a;
}

/* The scene of the moves: x (2 granules) and z (1) kept free, y (1) in use between them,
 * the arena's hole after z. A block of 3 granules starts on z's free granule; without new
 * memory, x's two chunks are what can fill the rest. */
static void move_scene(fx *f, uint64_t *x, uint64_t *y, uint64_t *z)
{
    *x = take(f, 2 * G, NULL, NULL);
    *y = take(f, 1 * G, NULL, NULL);
    *z = take(f, 1 * G, NULL, NULL);
    give(f, *x, true);
    give(f, *z, true);
}

/* The scene of the overhang: blocks a, b, d of one 32-granule chunk each and e of a granule,
 * a, d and e kept free (d and e one free span of 33 granules, then the arena's hole). A
 * block of 34 granules without new memory: the only free chunk that can move is a's, for a
 * granule of hole. Returns d; *b is in use. */
static uint64_t overhang_scene(fx *f, uint64_t *a, uint64_t *b)
{
    *a = take(f, 32 * G, NULL, NULL);
    *b = take(f, 32 * G, NULL, NULL);
    uint64_t d = take(f, 32 * G, NULL, NULL), e = take(f, 1 * G, NULL, NULL);
    give(f, *a, true);
    give(f, d, true);
    give(f, e, true);
    return d;
}

/* When the cache allows no new memory, holes are filled with chunks moved from free spans
 * elsewhere in the arena: each is unmapped where it was (its span becomes a hole) and mapped
 * in the window. With new memory allowed, nothing moves. */
static void test_move_free_chunks(void **state)
{
    fx *f = *state;
    uint64_t x, y, z;
    move_scene(f, &x, &y, &z);
    assert_int_equal(cs_pool_need(f->p, 3 * G, true, false), 0);
    size_t mark = f->sim.nlog;
    uint64_t a = 0, created = 1, released = 1;
    int raw = 0;
    assert_int_equal(cs_pool_alloc(f->p, 3 * G, 0, false, &a, &created, &released, NULL, NULL, &raw), CS_BE_OK);
    assert_int_equal(a, z);
    assert_int_equal(created, 0);
    assert_int_equal(released, 0);
    assert_string_equal(sim_log_from(&f->sim, mark), "UMUMA");
    assert_int_equal(sim_live_handles(&f->sim), 4);
    assert_int_equal(sim_mapped_at(&f->sim, x), 0);  /* unmapped there ... */
    assert_int_equal(sim_mapped_at(&f->sim, z + 1 * G), G);  /* ... and mapped here */
    assert_int_equal(sim_mapped_at(&f->sim, z + 2 * G), G);
    assert_no_block(f, x);
    assert_false(cs_pool_fits(f->p, 1 * G, false));  /* x's span is a hole now, not free */
    cs_pool_counts c = counts(f);
    assert_int_equal(c.moves, 2);
    assert_int_equal(c.unmaps, 2);
    assert_int_equal(c.free_mapped, 0);
    assert_int_equal(c.spare, 0);
    /* New memory allowed: the hole gets new chunks, and a free chunk outside the window
     * stays where it is (y's granule, between the hole x left and the block). */
    give(f, y, true);
    mark = f->sim.nlog;
    uint64_t b = take(f, 4 * G, &created, NULL);
    assert_int_equal(b, a + 3 * G);
    assert_int_equal(created, 4 * G);
    assert_string_equal(sim_log_from(&f->sim, mark), "CMCMCMCMA");
    assert_int_equal(sim_mapped_at(&f->sim, y), G);
    assert_int_equal(counts(f).moves, 2);
}

/* Only a chunk whose every page is free moves (or goes back to the driver): never one that a
 * block still uses a part of. A 32-granule chunk with a granule carved out of it is stuck;
 * without new memory the block is short, and nothing is unmapped. */
static void test_move_never_partly_used(void **state)
{
    fx *f = *state;
    uint64_t a = take(f, 32 * G, NULL, NULL);
    give(f, a, true);
    assert_int_equal(take(f, 1 * G, NULL, NULL), a);  /* the 32-granule chunk, partly used */
    assert_int_equal(counts(f).spare, 0);             /* nothing of it can go back */
    assert_int_equal(counts(f).free_mapped, 31 * G);
    assert_int_equal(cs_pool_need(f->p, 40 * G, true, false), 9 * G);  /* the 31 free granules, and 9 */
    size_t mark = f->sim.nlog;
    uint64_t v = 0, created = 1, released = 1;
    int raw = 0;
    assert_int_equal(cs_pool_alloc(f->p, 40 * G, 0, false, &v, &created, &released, NULL, NULL, &raw), CS_BE_SHORT);
    assert_int_equal(created, 0);
    assert_string_equal(sim_log_from(&f->sim, mark), "");
    assert_int_equal(sim_mapped_at(&f->sim, a), 32 * G);
    assert_found(f, a, a, G);
    assert_no_block(f, a + G);
    assert_int_equal(counts(f).free_mapped, 31 * G);
    /* Nor is it trimmed. */
    assert_int_equal(cs_pool_trim(f->p, UINT64_MAX, true), 0);
    assert_int_equal(sim_live_maps(&f->sim), 1);
    assert_int_equal(f->sim.misuse, 0);
}

/* The last chunk may be larger than what is left of the window's last hole, when that hole
 * goes on past the window: its rest is a free span after the block. Here no new memory is
 * allowed and the only free chunk that can move is a 32-granule one, for 1 granule of hole. */
static void test_overhang(void **state)
{
    fx *f = *state;
    uint64_t a, b, d = overhang_scene(f, &a, &b), e = d + 32 * G;
    assert_false(cs_pool_fits(f->p, 34 * G, false));
    size_t mark = f->sim.nlog;
    uint64_t v = 0, created = 1, released = 1;
    int raw = 0;
    assert_int_equal(cs_pool_alloc(f->p, 34 * G, 0, false, &v, &created, &released, NULL, NULL, &raw), CS_BE_OK);
    assert_int_equal(v, d);
    assert_int_equal(created, 0);
    assert_string_equal(sim_log_from(&f->sim, mark), "UMA");
    assert_int_equal(sim_mapped_at(&f->sim, a), 0);
    assert_int_equal(sim_mapped_at(&f->sim, e + 1 * G), 32 * G);  /* a's chunk */
    assert_found(f, d + 34 * G - 1, d, 34 * G);
    assert_no_block(f, d + 34 * G);  /* the chunk's rest: free, mapped */
    assert_no_block(f, a);           /* where a's chunk was: a hole */
    cs_pool_counts c = counts(f);
    assert_int_equal(c.moves, 1);
    assert_int_equal(c.free_mapped, 31 * G);
    assert_int_equal(c.spare, 0);  /* the chunk is partly used */
    /* The free rest serves the next block with no driver call. */
    assert_true(cs_pool_fits(f->p, 31 * G, false));
    assert_int_equal(take(f, 31 * G, &created, NULL), d + 34 * G);
    assert_int_equal(created, 0);
    assert_string_equal(sim_log_from(&f->sim, mark), "UMA");
    give(f, v, false);  /* the block's own chunks go; a's chunk is still partly used */
    assert_int_equal(sim_live_handles(&f->sim), 2);  /* b's and a's */
    (void)b;
}

/* At most max_new bytes of new memory: more is CS_BE_SHORT, before any driver call. */
static void test_max_new(void **state)
{
    fx *f = *state;
    give(f, take(f, 2 * G, NULL, NULL), true);  /* a free span of 2 granules */
    uint64_t a = 0, created = 1, released = 1;
    int raw = 0;
    size_t mark = f->sim.nlog;
    assert_int_equal(cs_pool_alloc(f->p, 3 * G, 0, false, &a, &created, &released, NULL, NULL, &raw), CS_BE_SHORT);
    assert_int_equal(cs_pool_alloc(f->p, 3 * G, 1 * G - 1, false, &a, &created, &released, NULL, NULL, &raw),
                     CS_BE_SHORT);
    assert_int_equal(created, 0);
    assert_int_equal(released, 0);
    assert_string_equal(sim_log_from(&f->sim, mark), "");
    assert_int_equal(counts(f).free_mapped, 2 * G);
    /* Exactly what it needs: fine. A small range needs a granule, also limited. */
    assert_int_equal(cs_pool_alloc(f->p, 3 * G, 1 * G, false, &a, &created, &released, NULL, NULL, &raw), CS_BE_OK);
    assert_int_equal(created, 1 * G);
    uint64_t s = 0;
    assert_int_equal(cs_pool_alloc(f->p, 4 * KiB, G - 1, false, &s, &created, &released, NULL, NULL, &raw),
                     CS_BE_SHORT);
    assert_int_equal(cs_pool_alloc(f->p, 4 * KiB, G, false, &s, &created, &released, NULL, NULL, &raw), CS_BE_OK);
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

/* The last free slot of a small range frees the range: its span turns free (kept: it stays
 * mapped, a granule of spare) or its chunk goes back to the driver (its span a hole); the
 * arena stays reserved. Before that, frees give nothing back. */
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
        assert_string_equal(sim_log_from(&f->sim, mark), keep ? "" : "UR");
        assert_int_equal(sim_live_maps(&f->sim), keep ? 1 : 0);
        assert_int_equal(sim_live_reserves(&f->sim), 1);
        assert_int_equal(counts(f).spare, keep ? G : 0);
        assert_int_equal(counts(f).free_mapped, keep ? G : 0);
        assert_int_equal(counts(f).slab_free, 0);
        assert_no_block(f, b);
    }
    /* The kept granule makes the next small range: no new memory, no driver call. */
    assert_int_equal(cs_pool_need(f->p, 512, true, false), 0);
    size_t mark = f->sim.nlog;
    uint64_t created;
    take(f, 512, &created, NULL);
    assert_int_equal(created, 0);
    assert_string_equal(sim_log_from(&f->sim, mark), "");
}

/* keep: the block's span turns free and stays mapped (nothing unmapped, nothing released);
 * else the chunks then wholly free go back to the driver: the block's own, and those of the
 * free spans it joins. */
static void test_keep_or_release(void **state)
{
    fx *f = *state;
    uint64_t a = take(f, 3 * G, NULL, NULL), b = take(f, 3 * G, NULL, NULL),
             z = take(f, 1 * G, NULL, NULL), d = take(f, 2 * G, NULL, NULL);
    assert_int_equal(give(f, a, true), 0);
    assert_int_equal(sim_live_handles(&f->sim), 9);
    assert_int_equal(sim_live_maps(&f->sim), 9);
    assert_int_equal(f->sim.calls[SIM_RELEASE], 0);
    assert_int_equal(counts(f).spare, 3 * G);
    assert_int_equal(counts(f).unmaps, 0);
    /* b joins a's free span: both go. */
    assert_int_equal(give(f, b, false), 6 * G);
    assert_int_equal(sim_live_handles(&f->sim), 3);
    assert_int_equal(f->sim.calls[SIM_RELEASE], 6);
    assert_int_equal(counts(f).releases, 6);
    assert_int_equal(counts(f).spare, 0);
    /* d's neighbours are z (in use) and the hole: only its own chunks go. */
    assert_int_equal(give(f, d, false), 2 * G);
    assert_int_equal(sim_live_handles(&f->sim), 1);
    assert_no_block(f, a);
    assert_no_block(f, b);
    assert_found(f, z, z, G);
    /* Unknown addresses, the interior of a large block, a free span or a hole are no block
     * to free. */
    uint64_t c = take(f, 1 * G, NULL, NULL), released = 7;
    int raw = 0;
    assert_int_equal(cs_pool_free(f->p, c + 4096, false, true, 1, &released, &raw), CS_BE_ERROR);
    assert_int_equal(raw, 1);  /* CUDA_ERROR_INVALID_VALUE */
    assert_int_equal(released, 0);
    assert_int_equal(cs_pool_free(f->p, 0x1234000, false, true, 1, &released, &raw), CS_BE_ERROR);
    assert_int_equal(cs_pool_free(f->p, d + 8 * G, false, true, 1, &released, &raw), CS_BE_ERROR);
    give(f, z, true);
    assert_int_equal(cs_pool_free(f->p, z, false, true, 1, &released, &raw), CS_BE_ERROR);
    uint64_t s = take(f, 4 * KiB, NULL, NULL);
    assert_int_equal(cs_pool_free(f->p, s + 512, false, true, 1, &released, &raw), CS_BE_ERROR);
    assert_found(f, c, c, G);  /* still there */
    give(f, c, false);
    give(f, s, false);
    cs_pool_trim(f->p, UINT64_MAX, true);
    assert_clean(f);
}

/* Work not known done: the device is synchronized before the span turns free (to be handed
 * out again, or unmapped), or before a slot becomes free to hand out again; once, even when
 * that slot's free empties the range. */
static void test_not_done_syncs_first(void **state)
{
    fx *f = *state;
    uint64_t released;
    int raw;
    uint64_t a = take(f, 3 * G, NULL, NULL);
    sim_work(&f->sim, a + 5, 1);  /* work of epoch 1 on it, not done */
    size_t mark = f->sim.nlog;
    assert_int_equal(cs_pool_free(f->p, a, true, false, 1, &released, &raw), CS_BE_OK);
    assert_string_equal(sim_log_from(&f->sim, mark), "S");
    assert_int_equal(f->sim.completed, 1);
    /* Done: no sync. The block is carved out of a's free span, and its chunks go. */
    uint64_t b = take(f, 3 * G, NULL, NULL);
    assert_int_equal(b, a);
    mark = f->sim.nlog;
    assert_int_equal(cs_pool_free(f->p, b, false, true, 1, &released, &raw), CS_BE_OK);
    assert_string_equal(sim_log_from(&f->sim, mark), "UUURRR");
    /* Not done, not kept: the sync comes before the unmaps. */
    uint64_t d = take(f, 2 * G, NULL, NULL);
    sim_work(&f->sim, d + G, 2);
    mark = f->sim.nlog;
    assert_int_equal(cs_pool_free(f->p, d, false, false, 1, &released, &raw), CS_BE_OK);
    assert_string_equal(sim_log_from(&f->sim, mark), "SUURR");
    assert_int_equal(f->sim.unsafe_unmaps, 0);
    /* Slots: a sync and nothing else while the range stays; done, nothing at all. */
    uint64_t s1 = take(f, 4 * KiB, NULL, NULL), s2 = take(f, 4 * KiB, NULL, NULL);
    sim_work(&f->sim, s1, 3);
    mark = f->sim.nlog;
    assert_int_equal(cs_pool_free(f->p, s1, false, false, 1, &released, &raw), CS_BE_OK);
    assert_string_equal(sim_log_from(&f->sim, mark), "S");
    assert_int_equal(f->sim.completed, 3);
    assert_int_equal(take(f, 4 * KiB, NULL, NULL), s1);  /* the slot, safe to reuse now */
    mark = f->sim.nlog;
    assert_int_equal(cs_pool_free(f->p, s1, false, true, 1, &released, &raw), CS_BE_OK);
    assert_string_equal(sim_log_from(&f->sim, mark), "");
    /* The last slot, not done: one sync, then the range's chunk goes. */
    sim_work(&f->sim, s2, 4);
    mark = f->sim.nlog;
    assert_int_equal(cs_pool_free(f->p, s2, false, false, 1, &released, &raw), CS_BE_OK);
    assert_string_equal(sim_log_from(&f->sim, mark), "SUR");
    assert_int_equal(released, G);
    assert_int_equal(f->sim.unsafe_unmaps, 0);
    /* A failed sync is reported, and the block leaves all the same (nothing better). */
    uint64_t c = take(f, 1 * G, NULL, NULL);
    sim_fail_in(&f->sim, SIM_SYNC, 1, CS_BE_ERROR);
    assert_int_equal(cs_pool_free(f->p, c, false, false, 1, &released, &raw), CS_BE_ERROR);
    assert_int_equal(released, G);
    assert_no_block(f, c);
    cs_pool_trim(f->p, UINT64_MAX, true);
    assert_int_equal(sim_live_handles(&f->sim), 0);
}

/* ---------------------------------------------------------------- lookups */

/* A block's bytes find the block; an arena's bytes in no block (a free span, a hole, a slab's
 * tail, a page no slab has) are the pool's with size 0; bytes outside every arena are not. */
static void test_find(void **state)
{
    fx *f = *state;
    const uint64_t page = G / 32;
    uint64_t big = take(f, 3 * G, NULL, NULL);
    assert_found(f, big, big, 3 * G);
    assert_found(f, big + 1, big, 3 * G);
    assert_found(f, big + 2 * G, big, 3 * G);  /* in its third chunk */
    assert_found(f, big + 3 * G - 1, big, 3 * G);
    assert_no_block(f, big + 3 * G);           /* the arena's hole */
    assert_no_block(f, big + ARENA - 1);       /* the arena's last byte */
    assert_not_found(f, big + ARENA);
    assert_not_found(f, big - 1);
    assert_not_found(f, 0);
    /* Slots: each byte maps to its slot's base; a slot boundary starts the next slot. */
    uint64_t s = take(f, 3 * KiB, NULL, NULL), s2 = take(f, 3 * KiB, NULL, NULL);
    assert_int_equal(s, big + ARENA - G);  /* a small range: the arena's top (zones) */
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
    assert_no_block(f, s - 1);
    /* A freed block's span is free, then (released) a hole: in no block either way. */
    give(f, big, true);
    assert_no_block(f, big + 1);
    assert_int_equal(cs_pool_trim(f->p, UINT64_MAX, true), 3 * G);
    assert_no_block(f, big + 1);
    assert_found(f, s2, s2, 3 * KiB);
}

/* New bytes a block would take now, for each way a block is made. */
static void test_need(void **state)
{
    fx *f = *state;
    /* Nothing: a large block is its granules, a small one a granule. */
    assert_int_equal(cs_pool_need(f->p, 3 * G, true, false), 3 * G);
    assert_int_equal(cs_pool_need(f->p, 2 * G + 1, true, false), 3 * G);
    assert_int_equal(cs_pool_need(f->p, 512, true, false), G);
    assert_int_equal(cs_pool_need(f->p, 1 * MiB, true, false), G);
    uint64_t s = take(f, 512, NULL, NULL);
    /* A slab of that size with a free slot, or free pages for a new one: nothing. */
    assert_int_equal(cs_pool_need(f->p, 512, true, false), 0);
    assert_int_equal(cs_pool_need(f->p, 64 * KiB, true, false), 0);
    assert_int_equal(cs_pool_need(f->p, 1 * MiB, true, false), 0);  /* 16 of the 31 free pages */
    uint64_t m = take(f, 1 * MiB, NULL, NULL);
    assert_int_equal(cs_pool_need(f->p, 1 * MiB, true, false), G);  /* 15 pages left: a new range */
    assert_int_equal(cs_pool_need(f->p, 512 * KiB, true, false), 0);
    /* A free span of 3 granules: carved for what fits it (a small range too); a larger block
     * starts on it and creates only the hole's part of its window. */
    make_spare(f, 3 * G);
    assert_int_equal(cs_pool_need(f->p, 1 * MiB, true, false), 0);
    assert_int_equal(cs_pool_need(f->p, 1 * G, true, false), 0);
    assert_int_equal(cs_pool_need(f->p, 2 * G, true, false), 0);
    assert_int_equal(cs_pool_need(f->p, 4 * G, true, false), 1 * G);
    assert_int_equal(cs_pool_need(f->p, 8 * G, true, false), 5 * G);
    /* What need says is what a build takes. */
    uint64_t created;
    take(f, 4 * G, &created, NULL);
    assert_int_equal(created, 1 * G);
    (void)s;
    (void)m;
}

/* What cs_pool_need says is what a build allowed that much new memory takes: the plan of the
 * best window, or of the largest hole when that one needs less. Here 34 granules: c's free
 * span of 33 (a 32-granule chunk and a granule) and a granule of hole that ends at block d.
 * a's free 32-granule chunk cannot fill a granule of hole there. With the rest of the arena's
 * lower half (large blocks' zone) a hole (the first round), the block goes there instead, made of a's and c's chunks moved: no new
 * memory. With the rest in use (the second), it needs a granule: need says so, and a build
 * allowed nothing is short. */
static void test_need_is_what_a_build_takes(void **state)
{
    (void)state;
    for (int full = 0; full < 2; full++) {
        fx *f;
        setup((void **)&f);
        uint64_t a = take(f, 32 * G, NULL, NULL), b = take(f, 1 * G, NULL, NULL),
                 c = take(f, 33 * G, NULL, NULL), h = take(f, 1 * G, NULL, NULL),
                 d = take(f, 1 * G, NULL, NULL);
        if (full)
            take(f, ARENA / 2 - 68 * G, NULL, NULL);  /* the lower half's hole, all of it */
        give(f, a, true);
        give(f, h, false);
        give(f, c, true);
        uint64_t need = cs_pool_need(f->p, 34 * G, true, false), v = 0, created = 7, released;
        int raw;
        assert_int_equal(need, full ? 1 * G : 0);
        if (full)
            assert_int_equal(cs_pool_alloc(f->p, 34 * G, 0, false, &v, &created, &released, NULL, NULL, &raw),
                             CS_BE_SHORT);
        assert_int_equal(cs_pool_alloc(f->p, 34 * G, need, false, &v, &created, &released, NULL, NULL, &raw),
                         CS_BE_OK);
        assert_int_equal(created, need);
        assert_int_equal(v, full ? c : d + 1 * G);
        assert_int_equal(counts(f).moves, full ? 0 : 3);
        assert_int_equal(f->sim.misuse, 0);
        (void)b;
        teardown((void **)&f);
    }
}

/* ---------------------------------------------------------------- trim */

/* Trim gives back the chunks of free spans (each unmapped, then released; their spans turn
 * holes), until the bytes asked for are given back; blocks in use and chunks they use a part
 * of are never trimmed. */
static void test_trim(void **state)
{
    fx *f = *state;
    uint64_t a = take(f, 7 * G, NULL, NULL);
    give(f, a, true);
    assert_int_equal(cs_pool_trim(f->p, 0, true), 0);
    size_t mark = f->sim.nlog;
    assert_int_equal(cs_pool_trim(f->p, 3 * G, true), 3 * G);
    assert_string_equal(sim_log_from(&f->sim, mark), "UUURRR");
    assert_int_equal(counts(f).spare, 4 * G);
    assert_int_equal(counts(f).free_mapped, 4 * G);
    assert_false(cs_pool_fits(f->p, 5 * G, false));  /* the first 3 granules are a hole now */
    assert_true(cs_pool_fits(f->p, 4 * G, false));
    assert_int_equal(cs_pool_trim(f->p, 2 * G + 1, true), 3 * G);
    assert_int_equal(cs_pool_trim(f->p, UINT64_MAX, true), 1 * G);
    assert_int_equal(cs_pool_trim(f->p, UINT64_MAX, true), 0);
    assert_int_equal(counts(f).releases, 7);
    assert_int_equal(counts(f).unmaps, 7);
    assert_no_block(f, a);
    assert_clean(f);
    /* More chunks than one batch (64), in one free span: all go. */
    uint64_t b[70];
    for (int i = 0; i < 70; i++)
        b[i] = take(f, 1 * G, NULL, NULL);
    for (int i = 0; i < 70; i++)
        give(f, b[i], true);
    assert_true(cs_pool_fits(f->p, 70 * G, false));
    assert_int_equal(sim_live_handles(&f->sim), 70);
    assert_int_equal(cs_pool_trim(f->p, UINT64_MAX, true), 70 * G);
    assert_clean(f);
    /* Blocks in use are never trimmed, nor a chunk a block uses a part of. */
    uint64_t c = take(f, 1 * G, NULL, NULL);
    assert_int_equal(cs_pool_trim(f->p, UINT64_MAX, true), 0);
    assert_found(f, c, c, G);
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
             s = take(f, 4 * KiB, NULL, NULL), d = take(f, 2 * G, NULL, NULL);
    assert_int_equal(s, a + ARENA - G);  /* the small range: the arena's top (zones) */
    assert_int_equal(d, b + G);
    give(f, d, true);  /* free, still mapped: granted too */
    int from = f->sim.naccess, raw = 0;
    assert_int_equal(cs_pool_regrant(f->p, &raw), CS_BE_OK);
    assert_int_equal(f->sim.naccess, from + 2);
    assert_true(granted(&f->sim, from, a, 6 * G, 1));  /* a, b, d's span */
    assert_true(granted(&f->sim, from, s, G, 1));      /* the small range */
    /* b's chunks released, and d's free chunks beside them: a hole after a. */
    give(f, b, false);
    from = f->sim.naccess;
    assert_int_equal(cs_pool_regrant(f->p, &raw), CS_BE_OK);
    assert_int_equal(f->sim.naccess, from + 2);
    assert_true(granted(&f->sim, from, a, 3 * G, 1));
    assert_true(granted(&f->sim, from, s, G, 1));
    /* One fails: every run is still asked, the first failure is returned. */
    int calls = f->sim.calls[SIM_ACCESS];
    sim_fail_in(&f->sim, SIM_ACCESS, 1, CS_BE_ERROR);
    assert_int_equal(cs_pool_regrant(f->p, &raw), CS_BE_ERROR);
    assert_int_equal(raw, 999);
    assert_int_equal(f->sim.calls[SIM_ACCESS], calls + 2);
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

/* The same while the last chunk overhangs (test_overhang's build), with the regrant during
 * the build's own access call (its devices were read before the regrant): everything the
 * chunk maps is granted again once the regrant is over, the block and the chunk's rest, a
 * free span after the block that the regrant skipped while it was busy. */
static int regrant_started, regrant_over;  /* access records: the regrant's first, and past it */

static void regrant_in_access(vmm_sim *s, int op, void *arg)
{
    (void)arg;
    if (op == SIM_ACCESS && regrant_hook.armed && --regrant_hook.armed == 0) {
        int raw;
        regrant_started = s->naccess;
        cs_pool_regrant(regrant_hook.p, &raw);
        regrant_over = s->naccess + 1;  /* the interrupted call is recorded at naccess */
    }
}

static void test_regrant_during_overhang(void **state)
{
    fx *f = *state;
    uint64_t a, b, d = overhang_scene(f, &a, &b);
    regrant_hook.p = f->p;
    regrant_hook.armed = 1;  /* the build's one access call: the window has one hole */
    f->sim.hook = regrant_in_access;
    uint64_t v = 0, created, released;
    int raw = 0;
    assert_int_equal(cs_pool_alloc(f->p, 34 * G, 0, false, &v, &created, &released, NULL, NULL, &raw), CS_BE_OK);
    f->sim.hook = NULL;
    assert_int_equal(regrant_hook.armed, 0);
    assert_int_equal(v, d);
    assert_no_block(f, d + 34 * G);  /* the rest: free */
    /* By the regrant: one call over the run of mappings b is in (regrant joins mappings that
     * touch, never a part of one). */
    bool by_regrant = false;
    for (int i = regrant_started; i < regrant_over; i++) {
        uint64_t va = f->sim.access_va[i % 256], end = va + f->sim.access_size[i % 256];
        by_regrant |= va <= b && end >= b + 32 * G;
    }
    assert_true(by_regrant);
    assert_int_equal(f->sim.misuse, 0);  /* every call over whole mappings */
    /* The regrant (the window's mapped free part) and the build's own grants after it (its
     * new chunks, the last one's overhang too) cover [d, d + 65 granules). */
    uint64_t covered = d;
    for (int pass = 0; pass < 2; pass++)
        for (int i = regrant_started; i < f->sim.naccess; i++) {
            uint64_t va = f->sim.access_va[i % 256], end = va + f->sim.access_size[i % 256];
            if (va <= covered && end > covered)
                covered = end;
        }
    if (covered < d + 65 * G)
        fail_msg("granted again up to granule %llu of 65", (unsigned long long)((covered - d) / G));
}

/* ---------------------------------------------------------------- failures */

/* The pool's counts match what the driver holds; nothing misused. */
static void assert_counts_match(fx *f)
{
    cs_pool_counts c = counts(f);
    assert_int_equal(c.creates - c.releases, sim_live_handles(&f->sim));
    assert_int_equal(c.maps - c.unmaps, sim_live_maps(&f->sim));
    assert_int_equal(f->sim.misuse, 0);
}

typedef struct {
    int op, nth, rc;
} fail_case;

/* A window fill that fails at any driver call leaves the arena as it was: the window's free
 * span still free and mapped, its hole a hole, what it created released, nothing else
 * mapped; the failure's code and raw code come back. Here the window is a free granule k and
 * 6 granules of hole (6 creates, 6 maps, one access). A small range, in a hole, likewise. */
static void test_rollback(void **state)
{
    (void)state;
    static const fail_case cases[] = {
        {SIM_CREATE, 1, CS_BE_OOM}, {SIM_CREATE, 2, CS_BE_OOM}, {SIM_CREATE, 6, CS_BE_ERROR},
        {SIM_MAP, 1, CS_BE_ERROR},  {SIM_MAP, 2, CS_BE_ERROR},  {SIM_MAP, 6, CS_BE_ERROR},
        {SIM_ACCESS, 1, CS_BE_ERROR},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (int small = 0; small < 2; small++) {
            if (small && cases[i].nth > 1)
                continue;  /* a small range is one chunk */
            fx *f;
            setup((void **)&f);
            uint64_t k = take(f, 1 * G, NULL, NULL);
            if (!small)
                give(f, k, true);
            cs_pool_counts before = counts(f);
            sim_fail_in(&f->sim, cases[i].op, cases[i].nth, cases[i].rc);
            uint64_t a = 0, created = 7, released = 7, bytes = small ? 4 * KiB : 7 * G;
            int raw = 0;
            int rc = cs_pool_alloc(f->p, bytes, UINT64_MAX, false, &a, &created, &released, NULL, NULL, &raw);
            if (rc != cases[i].rc)
                fail_msg("op %d, call %d, %s: rc %d", cases[i].op, cases[i].nth,
                         small ? "small" : "large", rc);
            assert_int_equal(raw, cases[i].rc == CS_BE_OOM ? 2 : 999);
            assert_int_equal(created, 0);
            assert_int_equal(released, 0);
            assert_int_equal(sim_live_handles(&f->sim), 1);  /* k's chunk */
            assert_int_equal(sim_live_maps(&f->sim), 1);
            assert_int_equal(sim_mapped_at(&f->sim, k), G);
            assert_int_equal(sim_live_reserves(&f->sim), 1);
            assert_int_equal(f->sim.used, 1 * G);
            assert_counts_match(f);
            cs_pool_counts after = counts(f);
            assert_int_equal(after.spare, before.spare);
            assert_int_equal(after.free_mapped, before.free_mapped);
            assert_int_equal(after.slab_free, before.slab_free);
            assert_int_equal(after.reserves, 1);
            if (small) {
                assert_found(f, k, k, G);
            } else {
                assert_no_block(f, k);                  /* free again ... */
                assert_true(cs_pool_fits(f->p, 1 * G, false));  /* ... on its own: */
                assert_false(cs_pool_fits(f->p, 2 * G, false)); /* the rest a hole */
            }
            assert_no_block(f, k + G);
            assert_int_equal(cs_pool_need(f->p, bytes, true, false), small ? G : 6 * G);
            /* And the same build works now. */
            uint64_t got = take(f, bytes, &created, NULL);
            assert_int_equal(got, small ? k + ARENA - G : k);  /* small: the top (zones) */
            assert_int_equal(created, small ? G : 6 * G);
            assert_counts_match(f);
            give(f, got, false);
            if (small)
                give(f, k, false);
            cs_pool_trim(f->p, UINT64_MAX, true);
            assert_clean(f);
            teardown((void **)&f);
        }
    }
    /* The first reservation fails: nothing is left, and the next block reserves. */
    fx *f;
    setup((void **)&f);
    sim_fail_in(&f->sim, SIM_RESERVE, 1, CS_BE_ERROR);
    uint64_t a = 0, created = 7, released = 7;
    int raw = 0;
    assert_int_equal(cs_pool_alloc(f->p, 3 * G, UINT64_MAX, false, &a, &created, &released, NULL, NULL, &raw),
                     CS_BE_ERROR);
    assert_int_equal(raw, 999);
    assert_int_equal(counts(f).reserves, 0);
    assert_int_equal(sim_live_reserves(&f->sim), 0);
    assert_int_equal(f->sim.calls[SIM_CREATE], 0);
    give(f, take(f, 3 * G, NULL, NULL), false);
    assert_clean(f);
    teardown((void **)&f);
}

/* A fill that moves chunks fails at any of its driver calls: a chunk not yet unmapped stays
 * mapped in its free span; one unmapped already is kept as an unmapped spare chunk (its span
 * a hole), never released; nothing stays mapped in the window. The pool's spare is what it
 * was, and the same block is built with no new memory afterwards (the spare chunk first).
 * Window: z's free granule and 2 of hole; x's two free chunks move (unmap 1, map 1, unmap 2,
 * map 2, access). */
static void test_rollback_move(void **state)
{
    (void)state;
    static const fail_case cases[] = {
        {SIM_UNMAP, 1, CS_BE_ERROR}, {SIM_MAP, 1, CS_BE_ERROR}, {SIM_UNMAP, 2, CS_BE_ERROR},
        {SIM_MAP, 2, CS_BE_ERROR},   {SIM_ACCESS, 1, CS_BE_ERROR},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fx *f;
        setup((void **)&f);
        uint64_t x, y, z;
        move_scene(f, &x, &y, &z);
        cs_pool_counts before = counts(f);
        sim_fail_in(&f->sim, cases[i].op, cases[i].nth, cases[i].rc);
        uint64_t a = 0, created = 7, released = 7;
        int raw = 0;
        int rc = cs_pool_alloc(f->p, 3 * G, 0, false, &a, &created, &released, NULL, NULL, &raw);
        if (rc != cases[i].rc)
            fail_msg("op %d, call %d: rc %d", cases[i].op, cases[i].nth, rc);
        assert_int_equal(created, 0);
        assert_int_equal(released, 0);
        assert_int_equal(sim_live_handles(&f->sim), 4);
        assert_counts_match(f);
        /* Unmapped at its place (and so kept as spare): the chunks whose unmap succeeded. */
        bool first_gone = !(cases[i].op == SIM_UNMAP && cases[i].nth == 1);
        bool second_gone = cases[i].op == SIM_ACCESS ||
                           (cases[i].op == SIM_MAP && cases[i].nth == 2);
        assert_int_equal(sim_mapped_at(&f->sim, x), first_gone ? 0 : G);
        assert_int_equal(sim_mapped_at(&f->sim, x + G), second_gone ? 0 : G);
        assert_int_equal(sim_live_maps(&f->sim), 4 - first_gone - second_gone);
        assert_int_equal(sim_mapped_at(&f->sim, z + G), 0);  /* nothing left in the window */
        assert_int_equal(sim_mapped_at(&f->sim, z + 2 * G), 0);
        cs_pool_counts after = counts(f);
        assert_int_equal(after.spare, before.spare);
        assert_int_equal(after.free_mapped, before.free_mapped - (first_gone + second_gone) * G);
        assert_no_block(f, x);
        assert_no_block(f, z);
        assert_found(f, y, y, G);
        assert_true(cs_pool_fits(f->p, 1 * G, false));          /* z's span free again */
        assert_int_equal(cs_pool_fits(f->p, 2 * G, false), !first_gone);  /* x's, if whole */
        assert_int_equal(cs_pool_need(f->p, 3 * G, true, false), 0);
        /* And the same build works now, with no new memory. */
        assert_int_equal(cs_pool_alloc(f->p, 3 * G, 0, false, &a, &created, &released, NULL, NULL, &raw), CS_BE_OK);
        assert_int_equal(a, z);
        assert_int_equal(created, 0);
        assert_int_equal(sim_live_handles(&f->sim), 4);
        assert_counts_match(f);
        assert_int_equal(counts(f).spare, 0);
        give(f, a, false);
        give(f, y, false);
        cs_pool_trim(f->p, UINT64_MAX, true);
        assert_clean(f);
        teardown((void **)&f);
    }
}

/* An unmap that fails while chunks go back to the driver: that chunk stays mapped in its free
 * span (releasing a mapped chunk would be misuse), the others go; a later trim gives it
 * back. */
static void test_unmap_failure(void **state)
{
    fx *f = *state;
    uint64_t a = take(f, 3 * G, NULL, NULL), released;
    int raw;
    sim_fail_in(&f->sim, SIM_UNMAP, 1, CS_BE_ERROR);
    assert_int_equal(cs_pool_free(f->p, a, false, true, 1, &released, &raw), CS_BE_OK);
    assert_int_equal(released, 2 * G);
    assert_int_equal(sim_mapped_at(&f->sim, a), G);
    assert_int_equal(counts(f).free_mapped, G);
    assert_int_equal(counts(f).spare, G);
    assert_no_block(f, a);
    assert_int_equal(sim_live_handles(&f->sim), 1);
    assert_counts_match(f);
    assert_int_equal(cs_pool_trim(f->p, UINT64_MAX, true), G);
    assert_clean(f);
}

/* ---------------------------------------------------------------- release_all */

/* The context goes (cs_pool_release_all) while another thread fills a window, moves chunks or
 * trims, outside the pool's lock (here: inside one of its driver calls). The thread's work
 * goes straight back: the build answers that the context is gone, nothing stays mapped,
 * created or reserved, and nothing is misused. */
static struct {
    cs_pool *p;
    int op, armed;
    uint64_t released;
} gone_hook;

static void release_all_in(vmm_sim *s, int op, void *arg)
{
    (void)s;
    (void)arg;
    if (op == gone_hook.op && gone_hook.armed && --gone_hook.armed == 0)
        gone_hook.released = cs_pool_release_all(gone_hook.p);
}

static void assert_all_gone(fx *f)
{
    assert_int_equal(sim_live_handles(&f->sim), 0);
    assert_int_equal(sim_live_maps(&f->sim), 0);
    assert_int_equal(sim_live_reserves(&f->sim), 0);
    assert_int_equal(f->sim.used, 0);
    assert_int_equal(f->sim.misuse, 0);
}

static void gone_during(fx *f, int op, int nth)
{
    gone_hook.p = f->p;
    gone_hook.op = op;
    gone_hook.armed = nth;
    f->sim.hook = release_all_in;
}

static void test_release_all_during_build(void **state)
{
    (void)state;
    for (int c = 0; c < 4; c++) {
        fx *f;
        setup((void **)&f);
        uint64_t x, y, z;
        move_scene(f, &x, &y, &z);
        uint64_t a = 0, created = 7, released = 7, max_new = UINT64_MAX, bytes = 3 * G;
        int raw = 0;
        if (c == 0)
            gone_during(f, SIM_MAP, 2);  /* new chunks: after the first map */
        else if (c == 1)
            gone_during(f, SIM_CREATE, 1);  /* before any map */
        else if (c == 2)
            gone_during(f, SIM_MAP, 1);  /* a move: its chunk unmapped, not mapped yet */
        else
            gone_during(f, SIM_UNMAP, 2);  /* a move: one moved, the other still in place */
        if (c >= 2)
            max_new = 0;
        int rc = cs_pool_alloc(f->p, bytes, max_new, false, &a, &created, &released, NULL, NULL, &raw);
        f->sim.hook = NULL;
        assert_int_equal(gone_hook.armed, 0);
        assert_int_equal(rc, CS_BE_ERROR);
        assert_int_equal(raw, 709);  /* CUDA_ERROR_CONTEXT_IS_DESTROYED */
        assert_int_equal(created, 0);
        assert_all_gone(f);
        assert_true(gone_hook.released >= G);  /* y's chunk at least */
        /* Nothing more is made for a pool whose context is gone. */
        int calls[SIM_OPS];
        memcpy(calls, f->sim.calls, sizeof calls);
        assert_int_equal(cs_pool_alloc(f->p, 1 * G, UINT64_MAX, false, &a, &created, &released, NULL, NULL, &raw),
                         CS_BE_ERROR);
        assert_int_equal(raw, 709);
        assert_memory_equal(calls, f->sim.calls, sizeof calls);
        (void)y;
        teardown((void **)&f);
    }
}

/* The context goes while a trim unmaps a free span's chunks: they are released all the
 * same, once each. */
static void test_release_all_during_trim(void **state)
{
    fx *f = *state;
    uint64_t a = take(f, 3 * G, NULL, NULL), b = take(f, 1 * G, NULL, NULL);
    give(f, a, true);
    gone_during(f, SIM_UNMAP, 2);
    uint64_t n = cs_pool_trim(f->p, UINT64_MAX, true);
    f->sim.hook = NULL;
    assert_int_equal(gone_hook.armed, 0);
    assert_int_equal(n + gone_hook.released, 4 * G);  /* each chunk released once */
    assert_all_gone(f);
    (void)b;
}

/* Peer access changes while a window is filled (a regrant during its map), so the thread
 * grants the window again once it is built, without the lock; the context goes during that
 * grant. The thread is then the last one busy on the detached arena: it gives the reservation
 * back, nothing stays reserved (it kept it for good). */
static int regrant_stage;

static void regrant_then_gone(vmm_sim *s, int op, void *arg)
{
    (void)s;
    (void)arg;
    if (regrant_stage == 0 && op == SIM_MAP) {
        regrant_stage = 1;
        int raw;
        cs_pool_regrant(gone_hook.p, &raw);
    } else if (regrant_stage == 1 && op == SIM_ACCESS) {
        regrant_stage = 2;  /* the window's own grant, in the fill */
    } else if (regrant_stage == 2 && op == SIM_ACCESS) {
        regrant_stage = 3;  /* the grant again, the lock dropped */
        gone_hook.released = cs_pool_release_all(gone_hook.p);
    }
}

static void test_release_all_during_late_grant(void **state)
{
    fx *f = *state;
    uint64_t a = 0, created = 0, released = 0;
    int raw = 0;
    gone_hook.p = f->p;
    regrant_stage = 0;
    f->sim.hook = regrant_then_gone;
    cs_pool_alloc(f->p, 1 * G, UINT64_MAX, false, &a, &created, &released, NULL, NULL, &raw);
    f->sim.hook = NULL;
    assert_int_equal(regrant_stage, 3);
    assert_int_equal(gone_hook.released, G);
    assert_int_equal(sim_live_reserves(&f->sim), 0);
    assert_int_equal(sim_live_handles(&f->sim), 0);
    assert_int_equal(sim_live_maps(&f->sim), 0);
    /* The grant itself found the window unmapped (the hook runs before the call): refused,
     * as the driver would, and harmless. */
    assert_int_equal(f->sim.misuse, 1);
}

/* ---------------------------------------------------------------- threads */

/* Threads allocate and free blocks of mixed sizes (kept or released, done or not; some with
 * no new memory allowed: moves) while another trims and regrants. No two live blocks
 * overlap; at the end everything goes back and the device holds nothing. */
enum { POOL_THREADS = 6, POOL_OPS = 4000, POOL_SLOTS = 32 };

typedef struct {
    fx *f;
    unsigned seed;
    int index, bad;
    int busy;  /* blocks handed out over work still under way, ordered after it */
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
            w->bad += cs_pool_free(w->f->p, mine[k], (r >> 8) & 1, (r >> 9) & 1, 1, &released, &raw) !=
                      CS_BE_OK;
            mine[k] = 0;
        } else {
            /* One in four allows no new memory: it moves free chunks, or is short. */
            uint64_t bytes = sizes[(r >> 10) % 8], a, created;
            uint64_t max_new = (r >> 13) % 4 ? UINT64_MAX : 0;
            int rc = cs_pool_alloc(w->f->p, bytes, max_new, false, &a, &created, &released, NULL, NULL, &raw);
            if (rc != CS_BE_OK) {
                w->bad += !(rc == CS_BE_SHORT && max_new == 0);
                continue;
            }
            w->bad += max_new == 0 && created != 0;
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
            w->bad += cs_pool_free(w->f->p, mine[k], false, true, 1, &released, &raw) != CS_BE_OK;
        }
    }
    return NULL;
}

static void *pool_janitor(void *p)
{
    fx *f = p;
    while (!__atomic_load_n(&live.stop, __ATOMIC_ACQUIRE)) {
        int raw;
        cs_pool_trim(f->p, 3 * G, true);
        cs_pool_regrant(f->p, &raw);
        uint64_t need = cs_pool_need(f->p, 3 * G, true, false);
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
        args[i] = (pool_worker_arg){.f = f, .seed = 77u + (unsigned)i, .index = i};
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
    cs_pool_trim(f->p, UINT64_MAX, true);
    assert_clean(f);
    c = counts(f);
    assert_int_equal(c.spare, 0);
    assert_int_equal(c.creates, c.releases);
    assert_int_equal(c.maps, c.unmaps);
    assert_int_equal(c.creates, (uint64_t)f->sim.calls[SIM_CREATE]);
    assert_true(c.moves > 0);
    assert_true(c.carves > 0);
}

/* The same with memory freed while the GPU still works on it: blocks freed with their work's
 * epoch (most kept, busy), blocks taken ordered or not, the GPU completing epochs in order now
 * and then, trims that may or may not wait. No block is handed out over work beyond the epoch
 * it comes with (none when not ordered), and nothing is unmapped while its work runs. */
static uint64_t busy_epoch;  /* atomic: the newest epoch work was given */

static void *busy_worker(void *p)
{
    pool_worker_arg *w = p;
    static const uint64_t sizes[] = {4 * KiB, 3 * MiB / 2, 1 * G, 2 * G + 512, 3 * G, 5 * G};
    vmm_sim *sim = &w->f->sim;
    uint64_t mine[POOL_SLOTS] = {0}, bytes_of[POOL_SLOTS] = {0};
    int first = w->index;
    for (int i = 0; i <= POOL_OPS + POOL_SLOTS; i++) {
        unsigned r = (unsigned)rand_r(&w->seed);
        bool last = i >= POOL_OPS;  /* the end: every block goes back */
        int k = last ? i - POOL_OPS - 1 : (int)(r % POOL_SLOTS);
        uint64_t released, e;
        int raw;
        if (k >= 0 && mine[k]) {
            live_remove(first * POOL_SLOTS + k);
            e = __atomic_add_fetch(&busy_epoch, 1, __ATOMIC_ACQ_REL);
            sim_issue(sim, e);
            sim_work(sim, mine[k], e);
            sim_work(sim, mine[k] + bytes_of[k] - 1, e);
            bool keep = !last && (r >> 8) % 8 != 0;
            w->bad += cs_pool_free(w->f->p, mine[k], keep, false, e, &released, &raw) != CS_BE_OK;
            mine[k] = 0;
        } else if (!last) {
            uint64_t bytes = sizes[(r >> 10) % 6], a, created;
            uint64_t max_new = (r >> 13) % 4 ? UINT64_MAX : 0;
            bool ordered = (r >> 15) & 1;
            int rc = cs_pool_alloc(w->f->p, bytes, max_new, ordered, &a, &created, &released,
                                   NULL, &e, &raw);
            if (rc != CS_BE_OK) {
                w->bad += !(rc == CS_BE_SHORT && max_new == 0);
                continue;
            }
            w->bad += !ordered && e != 0;
            w->busy += e != 0;
            w->bad += sim_pending_beyond(sim, a, bytes, e) != 0;
            mine[k] = a;
            bytes_of[k] = bytes;
            w->bad += !live_add(first * POOL_SLOTS + k, a, bytes);
        }
    }
    return NULL;
}

/* The GPU: completes epochs in order, some way behind; and trims, regrants, asks. */
static void *busy_janitor(void *p)
{
    fx *f = p;
    unsigned seed = 5;
    while (!__atomic_load_n(&live.stop, __ATOMIC_ACQUIRE)) {
        unsigned r = (unsigned)rand_r(&seed);
        uint64_t issued = __atomic_load_n(&busy_epoch, __ATOMIC_ACQUIRE);
        uint64_t lag = r % 64;
        if (issued > lag) {
            sim_complete(&f->sim, issued - lag);  /* the device first, then what it says */
            uint64_t d = __atomic_load_n(&done_epoch, __ATOMIC_RELAXED);
            while (d < issued - lag &&
                   !__atomic_compare_exchange_n(&done_epoch, &d, issued - lag, false,
                                                __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
                ;
        }
        int raw;
        if ((r >> 8) % 8 == 0)
            cs_pool_trim(f->p, 3 * G, (r >> 11) & 1);
        if ((r >> 12) % 16 == 0)
            cs_pool_regrant(f->p, &raw);
        cs_pool_need(f->p, 3 * G, true, (r >> 16) & 1);
    }
    return NULL;
}

static void test_threads_busy(void **state)
{
    fx *f = *state;
    pthread_t t[POOL_THREADS], janitor;
    pool_worker_arg args[POOL_THREADS];
    __atomic_store_n(&busy_epoch, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&live.stop, false, __ATOMIC_RELEASE);
    assert_int_equal(pthread_create(&janitor, NULL, busy_janitor, f), 0);
    for (int i = 0; i < POOL_THREADS; i++) {
        args[i] = (pool_worker_arg){.f = f, .seed = 177u + (unsigned)i, .index = i};
        assert_int_equal(pthread_create(&t[i], NULL, busy_worker, &args[i]), 0);
    }
    int bad = 0, busy = 0;
    for (int i = 0; i < POOL_THREADS; i++) {
        pthread_join(t[i], NULL);
        bad += args[i].bad;
        busy += args[i].busy;
    }
    __atomic_store_n(&live.stop, true, __ATOMIC_RELEASE);
    pthread_join(janitor, NULL);
    assert_int_equal(bad, 0);  /* every thread joined: a failure leaves none running */
    assert_int_equal(f->sim.unsafe_unmaps, 0);
    assert_true(busy > 0);  /* the case is what it claims */
    cs_pool_trim(f->p, UINT64_MAX, true);
    assert_clean(f);
    cs_pool_counts c = counts(f);
    assert_int_equal(c.creates, c.releases);
    assert_int_equal(c.maps, c.unmaps);
    assert_true(c.carves > 0);
}

/* Two threads find no arena with room at once: the one that reserves second gives its
 * reservation back and carves from the first one's arena (here the second is a nested
 * allocation made from inside the first's reserve call, without the pool's lock). */
static fx *race_fx;
static uint64_t race_inner;
static int race_armed;

static void reserve_race(vmm_sim *s, int op, void *arg)
{
    (void)s;
    (void)arg;
    if (op != SIM_RESERVE || !race_armed)
        return;
    race_armed = 0;  /* only inside the outer reserve, the first */
    race_inner = take(race_fx, 4 * G, NULL, NULL);
}

static void test_arena_reserve_race(void **state)
{
    fx *f = *state;
    race_fx = f;
    race_armed = 1;
    f->sim.hook = reserve_race;
    uint64_t outer = take(f, 4 * G, NULL, NULL);
    f->sim.hook = NULL;
    assert_int_equal(f->sim.calls[SIM_RESERVE], 2);  /* both reserved ... */
    assert_int_equal(sim_live_reserves(&f->sim), 1);  /* ... one arena kept */
    assert_int_equal(counts(f).reserves, 1);
    assert_true(outer == race_inner + 4 * G || race_inner == outer + 4 * G);  /* one arena */
    assert_int_equal(f->sim.misuse, 0);
}

/* ---------------------------------------------------------------- busy free memory */

/* Memory freed while the GPU works on it (kept, with its epoch): carved only for a caller that
 * orders after the epoch, which it is told; never moved or given back before the epoch
 * completes, unless the pool waited for the device first. */
static void test_busy_free_memory(void **state)
{
    (void)state;
    vmm_sim sim;
    sim_init(&sim, 1ull << 40);
    cs_pool *p = cs_pool_create(&sim_vmm_ops, &sim, G, 256 * G, ready_upto, NULL);
    done_epoch = 0;
    uint64_t x, y, c, r, e = 99;
    int raw;
    bool carved;
    assert_int_equal(cs_pool_alloc(p, 2 * G, UINT64_MAX, true, &x, &c, &r, NULL, &e, &raw), CS_BE_OK);
    assert_int_equal(e, 0);  /* new memory: no work on it */
    assert_int_equal(cs_pool_alloc(p, 1 * G, UINT64_MAX, true, &y, &c, &r, NULL, &e, &raw), CS_BE_OK);
    sim_work(&sim, x, 5);
    assert_int_equal(cs_pool_free(p, x, true, false, 5, &r, &raw), CS_BE_OK);
    assert_int_equal(sim.calls[SIM_SYNC], 0);  /* nobody waited */
    assert_false(cs_pool_fits(p, 2 * G, false));
    assert_true(cs_pool_fits(p, 2 * G, true));
    /* Not ordered, with no new memory allowed: x's chunks cannot move while its work runs. */
    assert_int_equal(cs_pool_need(p, 1 * G, true, false), G);
    assert_int_equal(cs_pool_alloc(p, 1 * G, 0, false, &c, &c, &r, NULL, &e, &raw), CS_BE_SHORT);
    assert_int_equal(sim.calls[SIM_UNMAP], 0);
    /* Ordered: carved out of x, told its epoch. */
    assert_int_equal(cs_pool_need(p, 1 * G, true, true), 0);
    uint64_t z;
    assert_int_equal(cs_pool_alloc(p, 1 * G, 0, true, &z, &c, &r, &carved, &e, &raw), CS_BE_OK);
    assert_int_equal(z, x);
    assert_true(carved);
    assert_int_equal(e, 5);
    /* Freed again with a newer epoch: the span joined keeps the newest. */
    assert_int_equal(cs_pool_free(p, z, true, false, 6, &r, &raw), CS_BE_OK);
    done_epoch = 5;
    assert_false(cs_pool_fits(p, 1 * G, false));
    assert_int_equal(cs_pool_alloc(p, 2 * G, 0, true, &z, &c, &r, NULL, &e, &raw), CS_BE_OK);
    assert_int_equal(e, 6);
    assert_int_equal(cs_pool_free(p, z, true, true, 0, &r, &raw), CS_BE_OK);
    /* Done: like any free memory. A small block not ordered never takes busy memory. */
    done_epoch = 6;
    assert_true(cs_pool_fits(p, 2 * G, false));
    assert_int_equal(cs_pool_alloc(p, 2 * G, 0, false, &z, &c, &r, NULL, &e, &raw), CS_BE_OK);
    assert_int_equal(e, 0);
    sim_work(&sim, z, 7);
    assert_int_equal(cs_pool_free(p, z, true, false, 7, &r, &raw), CS_BE_OK);
    assert_int_equal(cs_pool_alloc(p, 4 * KiB, 0, false, &c, &c, &r, NULL, &e, &raw), CS_BE_SHORT);
    /* y's memory, done, joins the busy span beside it and is busy with it (a free span keeps
     * its newest epoch). A trim takes only what is done, then waits for the device once and
     * takes the rest; one that may not wait (a capture runs) leaves the rest. */
    assert_int_equal(cs_pool_free(p, y, true, true, 0, &r, &raw), CS_BE_OK);
    assert_false(cs_pool_fits(p, 1 * G, false));
    assert_int_equal(cs_pool_trim(p, UINT64_MAX, false), 0);
    assert_int_equal(sim.calls[SIM_SYNC], 0);
    /* A wait that fails leaves the busy memory where it is. */
    sim_fail_in(&sim, SIM_SYNC, 1, CS_BE_ERROR);
    assert_int_equal(cs_pool_trim(p, UINT64_MAX, true), 0);
    assert_int_equal(sim.calls[SIM_SYNC], 1);
    assert_int_equal(sim.calls[SIM_UNMAP], 0);
    assert_false(cs_pool_fits(p, 1 * G, false));
    assert_int_equal(cs_pool_trim(p, UINT64_MAX, true), 3 * G);
    assert_int_equal(sim.calls[SIM_SYNC], 2);
    assert_int_equal(cs_pool_trim(p, UINT64_MAX, true), 0);
    assert_int_equal(sim.calls[SIM_SYNC], 2);
    assert_int_equal(sim.unsafe_unmaps, 0);
    assert_int_equal(sim.misuse, 0);
    cs_pool_destroy(p);
    sim_destroy(&sim);
}

/* The GPU finished some of the busy free memory, not all: memory whose work completed serves
 * a block that takes only such memory (a small range here, at the arena's top: a chunk of
 * x's moves there, with no new memory allowed) although newer work is still under way
 * elsewhere. */
static void test_done_part_of_busy_memory(void **state)
{
    fx *f = *state;
    cs_pool *p = f->p;
    vmm_sim *sim = &f->sim;
    uint64_t x = take(f, 2 * G, NULL, NULL), r;
    take(f, 1 * G, NULL, NULL);  /* in use between x and y: they never join */
    uint64_t y = take(f, 2 * G, NULL, NULL);
    take(f, 1 * G, NULL, NULL);
    int raw;
    assert_int_equal(cs_pool_free(p, x, true, false, 5, &r, &raw), CS_BE_OK);
    assert_int_equal(cs_pool_free(p, y, true, false, 6, &r, &raw), CS_BE_OK);
    done_epoch = 5;  /* x's work done, y's still under way */
    assert_true(cs_pool_fits(p, 2 * G, false));
    assert_int_equal(cs_pool_need(p, 4 * KiB, true, false), 0);
    uint64_t k, created = 7, e = 7;
    bool carved;
    assert_int_equal(cs_pool_alloc(p, 4 * KiB, 0, false, &k, &created, &r, &carved, &e, &raw), CS_BE_OK);
    assert_int_equal(created, 0);
    assert_false(carved);
    assert_int_equal(e, 0);
    assert_int_equal(k, x + ARENA - G);
    assert_int_equal(counts(f).moves, 1);
    assert_true(sim_mapped_at(sim, y) != 0);  /* y's busy memory stays */
    assert_int_equal(sim->unsafe_unmaps, 0);
    assert_int_equal(sim->misuse, 0);
}

/* A small block given back while its work is not known done: the pool waits for the device
 * without its lock, and the context may go meanwhile (cs_pool_release_all): the free then
 * finds the pool gone and says so. */
static void test_release_all_during_small_free_wait(void **state)
{
    fx *f = *state;
    uint64_t s = take(f, 4 * KiB, NULL, NULL), released = 7;
    int raw = 0;
    gone_during(f, SIM_SYNC, 1);
    assert_int_equal(cs_pool_free(f->p, s, false, false, 3, &released, &raw), CS_BE_ERROR);
    f->sim.hook = NULL;
    assert_int_equal(gone_hook.armed, 0);
    assert_int_equal(raw, 709);  /* CUDA_ERROR_CONTEXT_IS_DESTROYED */
    assert_int_equal(released, 0);
    assert_all_gone(f);
}

/* ---------------------------------------------------------------- chunks moved while busy */

/* Nothing misused, no memory unmapped while work on it could still run. */
static void assert_safe(fx *f)
{
    assert_int_equal(f->sim.unsafe_unmaps, 0);
    assert_int_equal(f->sim.misuse, 0);
}

/* The GPU finished the work of every epoch up to `epoch`. */
static void work_done(fx *f, uint64_t epoch)
{
    __atomic_store_n(&done_epoch, epoch, __ATOMIC_RELEASE);
    sim_complete(&f->sim, epoch);
}

/* The scene of the moves (move_scene), x freed while the GPU still works on it (epoch 5). */
static void busy_move_scene(fx *f, uint64_t *x, uint64_t *y, uint64_t *z)
{
    *x = take(f, 2 * G, NULL, NULL);
    *y = take(f, 1 * G, NULL, NULL);
    *z = take(f, 1 * G, NULL, NULL);
    sim_work(&f->sim, *x, 5);
    sim_work(&f->sim, *x + G, 5);
    uint64_t r;
    int raw;
    assert_int_equal(cs_pool_free(f->p, *x, true, false, 5, &r, &raw), CS_BE_OK);
    give(f, *z, true);
}

/* The scene of the moves with x busy, and the block of 3 granules on z taken ordered: x's
 * chunks moved while their work runs. Returns the block. */
static uint64_t busy_moved_block(fx *f, uint64_t *x, uint64_t *z)
{
    uint64_t y, a = 0, c, r, e = 0;
    int raw = 0;
    busy_move_scene(f, x, &y, z);
    assert_int_equal(cs_pool_alloc(f->p, 3 * G, 0, true, &a, &c, &r, NULL, &e, &raw), CS_BE_OK);
    assert_int_equal(e, 5);
    return a;
}

/* Ordered, x's chunks move while its work runs: mapped where the block needs them, and still
 * where they were (an unmap does not wait for the GPU) until that work completes; the block
 * is told the epoch to order after. Not ordered, they stay where they are. */
static void test_busy_chunks_move_ordered(void **state)
{
    fx *f = *state;
    uint64_t x, y, z, a = 0, created = 1, released = 1, e = 0;
    busy_move_scene(f, &x, &y, &z);
    uint64_t hx = sim_handle_at(&f->sim, x), hx1 = sim_handle_at(&f->sim, x + G);
    int raw = 0;
    assert_int_equal(cs_pool_need(f->p, 3 * G, true, false), 2 * G);
    assert_int_equal(cs_pool_alloc(f->p, 3 * G, 0, false, &a, &created, &released, NULL, &e, &raw),
                     CS_BE_SHORT);
    assert_int_equal(f->sim.calls[SIM_UNMAP], 0);
    assert_int_equal(cs_pool_need(f->p, 3 * G, true, true), 0);
    size_t mark = f->sim.nlog;
    assert_int_equal(cs_pool_alloc(f->p, 3 * G, 0, true, &a, &created, &released, NULL, &e, &raw),
                     CS_BE_OK);
    assert_int_equal(a, z);
    assert_int_equal(created, 0);
    assert_int_equal(e, 5);
    assert_string_equal(sim_log_from(&f->sim, mark), "MMA");  /* no unmap */
    assert_int_equal(sim_handle_at(&f->sim, x), hx);  /* still mapped there ... */
    assert_int_equal(sim_handle_at(&f->sim, x + G), hx1);
    uint64_t here[2] = {sim_handle_at(&f->sim, z + G), sim_handle_at(&f->sim, z + 2 * G)};
    assert_true((here[0] == hx && here[1] == hx1) || (here[0] == hx1 && here[1] == hx));
    assert_no_block(f, x);  /* ... in no block, neither free nor a hole */
    assert_false(cs_pool_fits(f->p, 1 * G, true));
    assert_int_equal(counts(f).moves, 2);
    assert_int_equal(counts(f).unmaps, 0);
    /* Nothing unmaps them before their work completes; then the next trim does. */
    assert_int_equal(cs_pool_trim(f->p, UINT64_MAX, false), 0);
    assert_int_equal(f->sim.calls[SIM_UNMAP], 0);
    work_done(f, 5);
    assert_int_equal(cs_pool_trim(f->p, 0, false), 0);
    assert_int_equal(sim_mapped_at(&f->sim, x), 0);
    assert_int_equal(sim_mapped_at(&f->sim, x + G), 0);
    assert_int_equal(counts(f).unmaps, 2);
    assert_int_equal(sim_mapped_at(&f->sim, z + G), G);  /* the block's, untouched */
    /* x's place is a hole again: a block there maps new memory. */
    uint64_t b = take(f, 2 * G, &created, NULL);
    assert_int_equal(b, x);
    assert_int_equal(created, 2 * G);
    give(f, a, false);
    give(f, b, false);
    assert_safe(f);
}

/* A chunk that moved busy, then given back to the driver once its work completed but before a
 * trim came by: its old mapping goes first (a driver keeps memory mapped anywhere). */
static void test_busy_moved_chunk_released(void **state)
{
    fx *f = *state;
    uint64_t x, z, a = busy_moved_block(f, &x, &z);
    work_done(f, 5);
    size_t mark = f->sim.nlog;
    assert_int_equal(give(f, a, false), 3 * G);
    /* The block's three chunks unmapped, then released, x's two each after its old mapping. */
    assert_string_equal(sim_log_from(&f->sim, mark), "UUURURUR");
    assert_int_equal(sim_mapped_at(&f->sim, x), 0);
    assert_int_equal(sim_mapped_at(&f->sim, x + G), 0);
    assert_int_equal(sim_live_handles(&f->sim), 1);  /* y's */
    assert_safe(f);
}

/* A move of busy chunks whose mapping fails: the block's window is undone, and the chunks are
 * free where they were, still busy, mapped once. */
static void test_busy_move_rolled_back(void **state)
{
    fx *f = *state;
    uint64_t x, y, z, a = 0, c, r, e;
    busy_move_scene(f, &x, &y, &z);
    uint64_t hx = sim_handle_at(&f->sim, x);
    int raw = 0;
    sim_fail_in(&f->sim, SIM_MAP, 2, CS_BE_ERROR);
    assert_int_not_equal(cs_pool_alloc(f->p, 3 * G, 0, true, &a, &c, &r, NULL, &e, &raw),
                         CS_BE_OK);
    assert_int_equal(sim_handle_at(&f->sim, x), hx);
    assert_int_equal(sim_mapped_at(&f->sim, z + G), 0);
    assert_int_equal(sim_mapped_at(&f->sim, z + 2 * G), 0);
    assert_false(cs_pool_fits(f->p, 2 * G, false));  /* free, busy */
    assert_true(cs_pool_fits(f->p, 2 * G, true));
    /* Done: a move as any other. */
    work_done(f, 5);
    assert_int_equal(cs_pool_alloc(f->p, 3 * G, 0, false, &a, &c, &r, NULL, &e, &raw), CS_BE_OK);
    assert_int_equal(a, z);
    assert_int_equal(e, 0);
    assert_int_equal(sim_mapped_at(&f->sim, x), 0);
    give(f, a, false);
    assert_safe(f);
}

/* The context goes while a chunk that moved busy is still mapped where it was: everything is
 * unmapped and released, its old mapping too. */
static void test_release_all_with_old_mapping(void **state)
{
    fx *f = *state;
    uint64_t x, z;
    busy_moved_block(f, &x, &z);
    sim_complete(&f->sim, 5);  /* the context's work went with it */
    cs_pool_release_all(f->p);
    assert_all_gone(f);
}

/* A small block freed while the GPU works on it goes back to its slab at once (no wait), its
 * range remembering the epoch: a block ordered after it takes the slot, told the epoch; one
 * that is not takes other memory (here none may be new: short). Once done, any takes it. */
static void test_small_slot_back_busy(void **state)
{
    fx *f = *state;
    uint64_t s1 = take(f, 4 * KiB, NULL, NULL), s2 = take(f, 4 * KiB, NULL, NULL);
    uint64_t a = 0, c, r, e = 0;
    int raw = 0;
    sim_work(&f->sim, s1, 5);
    assert_int_equal(cs_pool_free(f->p, s1, true, false, 5, &r, &raw), CS_BE_OK);
    assert_int_equal(f->sim.calls[SIM_SYNC], 0);
    assert_int_equal(counts(f).slab_free, G - 4 * KiB);  /* its slot is free again */
    assert_int_equal(cs_pool_need(f->p, 4 * KiB, true, false), G);
    assert_int_equal(cs_pool_alloc(f->p, 4 * KiB, 0, false, &a, &c, &r, NULL, &e, &raw),
                     CS_BE_SHORT);
    assert_int_equal(cs_pool_need(f->p, 4 * KiB, true, true), 0);
    assert_int_equal(cs_pool_alloc(f->p, 4 * KiB, 0, true, &a, &c, &r, NULL, &e, &raw), CS_BE_OK);
    assert_int_equal(a, s1);
    assert_int_equal(e, 5);
    assert_int_equal(cs_pool_free(f->p, a, true, false, 6, &r, &raw), CS_BE_OK);
    work_done(f, 6);
    assert_int_equal(cs_pool_alloc(f->p, 4 * KiB, 0, false, &a, &c, &r, NULL, &e, &raw), CS_BE_OK);
    assert_int_equal(a, s1);
    assert_int_equal(e, 0);
    /* The last slot of a range goes busy: the range's granule is free memory with that epoch,
     * which a small block of another size takes only ordered after it. */
    give(f, a, true);
    sim_work(&f->sim, s2, 7);
    assert_int_equal(cs_pool_free(f->p, s2, true, false, 7, &r, &raw), CS_BE_OK);
    assert_int_equal(counts(f).slab_free, 0);
    assert_int_equal(counts(f).free_mapped, G);
    assert_int_equal(cs_pool_alloc(f->p, 64 * KiB, 0, false, &a, &c, &r, NULL, &e, &raw),
                     CS_BE_SHORT);
    assert_int_equal(cs_pool_alloc(f->p, 64 * KiB, 0, true, &a, &c, &r, NULL, &e, &raw), CS_BE_OK);
    assert_int_equal(e, 7);
    assert_safe(f);
}

/* A busy move whose second chunk's mapping fails, and whose rollback cannot unmap the first
 * chunk's new mapping: that mapping becomes an old mapping, unmapped once it can be, so that
 * the chunk never goes back to the driver while mapped anywhere. */
static void test_busy_move_rollback_stuck(void **state)
{
    fx *f = *state;
    uint64_t x, y, z, a = 0, c, r, e;
    busy_move_scene(f, &x, &y, &z);
    int raw = 0;
    sim_fail_in(&f->sim, SIM_MAP, 2, CS_BE_ERROR);
    sim_fail_in(&f->sim, SIM_UNMAP, 1, CS_BE_ERROR);
    assert_int_not_equal(cs_pool_alloc(f->p, 3 * G, 0, true, &a, &c, &r, NULL, &e, &raw),
                         CS_BE_OK);
    assert_int_equal(sim_live_maps(&f->sim), 5);  /* x's two, y, z and the stuck one */
    work_done(f, 5);
    cs_pool_trim(f->p, UINT64_MAX, true);
    assert_int_equal(sim_live_maps(&f->sim), 1);  /* y's */
    assert_safe(f);
    give(f, y, false);
    assert_int_equal(sim_live_handles(&f->sim), 0);
    assert_int_equal(f->sim.misuse, 0);
}

/* A free that waits for the device covers the work issued before the wait, not work another
 * thread issued on a slot of the same range during it: the range, whole once both are free,
 * keeps that later slot's epoch and is not given back before it completes. */
static vmm_sim *later_sim;
static cs_pool *later_pool;
static uint64_t later_slot;
static int later_armed;

static int sync_then_later_free(void *dev, int *raw)
{
    int rc = sim_sync(dev, raw);  /* the device idle now; then the other thread's work */
    if (later_armed) {
        later_armed = 0;
        uint64_t r;
        int raw2;
        sim_issue(later_sim, 7);
        sim_work(later_sim, later_slot, 7);
        assert_int_equal(cs_pool_free(later_pool, later_slot, true, false, 7, &r, &raw2),
                         CS_BE_OK);
    }
    return rc;
}

static void test_wait_keeps_later_busy_slots(void **state)
{
    fx *f = *state;
    static cs_vmm_ops ops;
    ops = sim_vmm_ops;
    ops.sync = sync_then_later_free;
    cs_pool_destroy(f->p);
    f->p = cs_pool_create(&ops, &f->sim, G, ARENA, ready_upto, NULL);
    later_sim = &f->sim;
    later_pool = f->p;
    uint64_t s1 = take(f, 4 * KiB, NULL, NULL), released = 1;
    later_slot = take(f, 4 * KiB, NULL, NULL);  /* the same slab, the same range */
    sim_issue(&f->sim, 3);
    sim_work(&f->sim, s1, 3);
    later_armed = 1;
    int raw = 0;
    assert_int_equal(cs_pool_free(f->p, s1, false, false, 3, &released, &raw), CS_BE_OK);
    assert_int_equal(released, 0);  /* the range stays, busy with epoch 7 */
    assert_int_equal(f->sim.unsafe_unmaps, 0);
    work_done(f, 7);
    assert_int_equal(cs_pool_trim(f->p, UINT64_MAX, false), G);
    assert_safe(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create),
        cmocka_unit_test(test_busy_free_memory),
        cmocka_unit_test_setup_teardown(test_done_part_of_busy_memory, setup_busy, teardown),
        cmocka_unit_test_setup_teardown(test_release_all_during_small_free_wait, setup_busy,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_busy_chunks_move_ordered, setup_busy, teardown),
        cmocka_unit_test_setup_teardown(test_busy_moved_chunk_released, setup_busy, teardown),
        cmocka_unit_test_setup_teardown(test_busy_move_rolled_back, setup_busy, teardown),
        cmocka_unit_test_setup_teardown(test_release_all_with_old_mapping, setup_busy, teardown),
        cmocka_unit_test_setup_teardown(test_small_slot_back_busy, setup_busy, teardown),
        cmocka_unit_test_setup_teardown(test_busy_move_rollback_stuck, setup_busy, teardown),
        cmocka_unit_test_setup_teardown(test_wait_keeps_later_busy_slots, setup_busy, teardown),
        cmocka_unit_test_setup_teardown(test_large_new_chunks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_carve_from_free_span, setup, teardown),
        cmocka_unit_test_setup_teardown(test_zones, setup, teardown),
        cmocka_unit_test_setup_teardown(test_coalesce, setup, teardown),
        cmocka_unit_test_setup_teardown(test_best_fit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_window_mixes_free_and_holes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_move_free_chunks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_move_never_partly_used, setup, teardown),
        cmocka_unit_test_setup_teardown(test_overhang, setup, teardown),
        cmocka_unit_test_setup_teardown(test_max_new, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slab_addresses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slab_pages_reused_by_another_class, setup, teardown),
        cmocka_unit_test_setup_teardown(test_small_range_goes_when_all_free, setup, teardown),
        cmocka_unit_test_setup_teardown(test_keep_or_release, setup, teardown),
        cmocka_unit_test_setup_teardown(test_not_done_syncs_first, setup, teardown),
        cmocka_unit_test_setup_teardown(test_find, setup, teardown),
        cmocka_unit_test_setup_teardown(test_need, setup, teardown),
        cmocka_unit_test(test_need_is_what_a_build_takes),
        cmocka_unit_test_setup_teardown(test_trim, setup, teardown),
        cmocka_unit_test_setup_teardown(test_regrant, setup, teardown),
        cmocka_unit_test_setup_teardown(test_regrant_during_build, setup, teardown),
        cmocka_unit_test_setup_teardown(test_regrant_during_overhang, setup, teardown),
        cmocka_unit_test(test_rollback),
        cmocka_unit_test(test_rollback_move),
        cmocka_unit_test_setup_teardown(test_unmap_failure, setup, teardown),
        cmocka_unit_test(test_release_all_during_build),
        cmocka_unit_test_setup_teardown(test_release_all_during_trim, setup, teardown),
        cmocka_unit_test_setup_teardown(test_release_all_during_late_grant, setup, teardown),
        cmocka_unit_test_setup_teardown(test_arena_reserve_race, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads_busy, setup_busy, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
