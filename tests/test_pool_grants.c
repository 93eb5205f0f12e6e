/* The pool's peer-access grants when a regrant runs while a window is filled, and a window
 * fill whose rollback cannot unmap (tests/vmm_sim.h: the sim counts an access call over part
 * of a mapping, or a release of a mapped handle, as misuse, as the driver refuses them). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cs_pool.h"
#include "vmm_sim.h"

#define G (2ull * 1024 * 1024)

static vmm_sim sim;
static cs_pool *P;
static int armed, arm_op, fail_op, fail_nth, fail_rc, regrant_from = -1;

static void hook(vmm_sim *s, int op, void *arg)
{
    (void)arg;
    if (op == arm_op && armed && --armed == 0) {
        int raw;
        regrant_from = s->naccess;
        cs_pool_regrant(P, &raw);
        if (fail_nth)
            sim_fail_in(s, fail_op, fail_nth, fail_rc);
    }
}

static uint64_t take(uint64_t bytes)
{
    uint64_t a = 0, c, r;
    int raw;
    assert_int_equal(cs_pool_alloc(P, bytes, UINT64_MAX, false, &a, &c, &r, NULL, NULL, &raw), CS_BE_OK);
    return a;
}

static void give(uint64_t a, bool keep)
{
    uint64_t r;
    int raw;
    assert_int_equal(cs_pool_free(P, a, keep, true, 1, &r, &raw), CS_BE_OK);
}

/* Was [va, va + size) covered by access calls from record `from` on? */
static bool granted_since(int from, uint64_t va, uint64_t size)
{
    for (uint64_t x = va; x < va + size; x += 4096) {
        bool ok = false;
        for (int i = from; i < sim.naccess && !ok; i++)
            ok = sim.access_va[i % 256] <= x && x < sim.access_va[i % 256] + sim.access_size[i % 256];
        if (!ok)
            return false;
    }
    return true;
}

static int setup(void **state)
{
    (void)state;
    sim_init(&sim, 1ull << 40);
    P = cs_pool_create(&sim_vmm_ops, &sim, G, 256 * G, NULL, NULL);
    armed = fail_nth = 0;
    regrant_from = -1;
    sim.hook = hook;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    cs_pool_destroy(P);
    sim_destroy(&sim);
    return 0;
}

/* A window that starts mid-chunk (in a free span) is busy while it is filled: the regrant's
 * run before it ends mid-chunk, and the filler's second grant starts mid-chunk. cuMemSetAccess
 * takes whole mappings only (the sim counts such a call as misuse, as CUDA refuses it). */
static void test_regrant_window_mid_chunk(void **state)
{
    (void)state;
    uint64_t a = take(2 * G);          /* two chunks */
    give(a, true);
    uint64_t b = take(G + G / 2);      /* carved: [a, a + 1.5G) used, [a + 1.5G, a + 2G) free */
    assert_int_equal(b, a);
    assert_int_equal(sim.misuse, 0);
    arm_op = SIM_CREATE;
    armed = 1;                         /* regrant during the fill's first create */
    uint64_t c = take(2 * G);          /* window [a + 1.5G, a + 3.5G) */
    assert_int_equal(c, a + G + G / 2);
    assert_int_equal(sim.misuse, 0);
}

/* A fill whose create runs out of memory while a regrant runs: the window's free span was busy
 * (skipped by the regrant), and goes back free without the new access; a block carved from
 * it later is handed out with no access call at all. */
static void test_regrant_then_rollback(void **state)
{
    (void)state;
    uint64_t k = take(G);
    give(k, true);                     /* free granule, hole after */
    arm_op = SIM_CREATE;
    armed = 1;
    fail_op = SIM_CREATE;
    fail_nth = 1;                      /* the next create: OOM */
    fail_rc = CS_BE_OOM;
    uint64_t a = 0, c, r;
    int raw;
    assert_int_equal(cs_pool_alloc(P, 3 * G, UINT64_MAX, false, &a, &c, &r, NULL, NULL, &raw), CS_BE_OOM);
    assert_true(regrant_from >= 0);
    sim.hook = NULL;
    uint64_t v = take(G);              /* carved from k's span */
    assert_int_equal(v, k);
    assert_true(granted_since(regrant_from, k, G));
}

/* A fill fails (OOM), and one unmap of its rollback fails: that chunk is released while still
 * mapped in the window, whose span becomes a hole again; the next fill there maps over it. */
static void test_rollback_unmap_fails(void **state)
{
    (void)state;
    sim.hook = NULL;
    sim_fail_in(&sim, SIM_CREATE, 3, CS_BE_OOM);  /* third chunk of the fill */
    sim_fail_in(&sim, SIM_UNMAP, 1, CS_BE_ERROR); /* the rollback's first unmap */
    uint64_t a = 0, c, r;
    int raw;
    assert_int_equal(cs_pool_alloc(P, 4 * G, UINT64_MAX, false, &a, &c, &r, NULL, NULL, &raw), CS_BE_OOM);
    assert_int_equal(sim.misuse, 0);
    int rc = cs_pool_alloc(P, 4 * G, UINT64_MAX, false, &a, &c, &r, NULL, NULL, &raw);
    assert_int_equal(rc, CS_BE_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_regrant_window_mid_chunk, setup, teardown),
        cmocka_unit_test_setup_teardown(test_regrant_then_rollback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rollback_unmap_fails, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
