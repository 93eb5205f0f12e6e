/* Debug modes (CACHESHIM_DEBUG) and scopes, death-test style: each case runs a scenario in a
 * child process of its own (this program again, `test_debug child SCENARIO`, with the case's
 * CACHESHIM_* variables, since the shim reads them once at start) under
 * LD_PRELOAD=libcacheshim.so and the fake driver, and checks the child's stderr and how it
 * ended: a planted use after free with the detector on is reported with both call sites and
 * aborts; valid use with the detector on exits cleanly; the same planted write with the
 * detector off goes unnoticed (the control).
 *
 * The scenarios' call sites are exported (NOINLINE) so that the reports name them. */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "shim_util.h"

/* A function the reports must name: kept out of line and uncloned (at -O3 gcc calls a copy
 * for constant arguments, planted_alloc.constprop.0, which dladdr does not name), in the
 * dynamic symbol table (the project builds with hidden visibility), which is all dladdr reads. */
#define NOINLINE __attribute__((noipa, visibility("default")))

/* ================================================================ the children */

/* A failed check in a child: its exit status names the line. */
#define CHILD_CHECK(cond)                                                                  \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "child check failed: %s (line %d)\n", #cond, __LINE__);         \
            _exit(3);                                                                      \
        }                                                                                  \
    } while (0)

static CUcontext child_ctx;

/* (A failed cmocka assertion outside a running test ends the child too.) */
static void child_init(void)
{
    child_ctx = shim_test_primary();
}

static int (*api(const char *name))(void)
{
    void *sym = dlsym(RTLD_DEFAULT, name);
    int (*fn)(void);
    memcpy(&fn, &sym, sizeof fn);
    return fn;
}

NOINLINE CUdeviceptr planted_alloc(size_t n)
{
    CUdeviceptr p = 0;
    CHILD_CHECK(cuMemAlloc(&p, n) == CUDA_SUCCESS);
    return p;
}

NOINLINE void planted_free(CUdeviceptr p)
{
    CHILD_CHECK(cuMemFree(p) == CUDA_SUCCESS);
}

NOINLINE void planted_free_again(CUdeviceptr p)
{
    CHILD_CHECK(cuMemFree(p) == CUDA_ERROR_INVALID_VALUE);
}

/* The stale write: 16 bytes at offset 0x100 of a freed block, by a synchronous memset. */
static void uaf_memset(void)
{
    CUdeviceptr p = planted_alloc(4096);
    planted_free(p);
    CHILD_CHECK(cuMemsetD8(p + 0x100, 0x11, 16) == CUDA_SUCCESS);
}

/* Found at exit. */
static void scenario_uaf_exit(void)
{
    uaf_memset();
}

/* Found by the explicit check; with uaf-report it returns the count and the program goes on. */
static void scenario_uaf_check(void)
{
    uaf_memset();
    int found = api("cacheshim_debug_check")();
    printf("check found %d\n", found);
    fprintf(stderr, "after the check: %d\n", found);
    CHILD_CHECK(found == 1);
    CHILD_CHECK(api("cacheshim_debug_check")() == 1);  /* still quarantined, still changed */
}

/* Found when the block leaves the quarantine: later frees push it out (CACHESHIM_QUARANTINE
 * holds less than two of them). */
static void scenario_uaf_evict(void)
{
    uaf_memset();
    for (int i = 0; i < 4; i++) {
        CUdeviceptr q = planted_alloc(1 << 20);
        planted_free(q);
    }
    fprintf(stderr, "still running after the evictions\n");
}

/* A write issued on a stream after the free, without any synchronization (as a kernel
 * launched after cudaFree would be), by a copy from the host. */
static void scenario_uaf_async(void)
{
    CUstream s;
    CHILD_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    static unsigned char junk[64];
    memset(junk, 0x42, sizeof junk);
    CUdeviceptr p = planted_alloc(8192);
    launch(s, p, 8192);
    planted_free(p);
    CHILD_CHECK(cuMemcpyHtoDAsync(p + 4096, junk, sizeof junk, s) == CUDA_SUCCESS);
}

/* Valid use: work on the block before its free on two streams, frees, reuse, and
 * the GPU behind the host; nothing may be reported, and the fill must not race. */
static void scenario_valid(void)
{
    CUstream a, b;
    CHILD_CHECK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CHILD_CHECK(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    for (int i = 0; i < 50; i++) {
        size_t n = (size_t)(1 + i % 5) << 16;
        CUdeviceptr p = planted_alloc(n), q = planted_alloc(4096);
        CHILD_CHECK(cuMemsetD8Async(p, 0x55, n, a) == CUDA_SUCCESS);
        launch(b, q, 4096);
        CHILD_CHECK(cuMemsetD8Async(q, 0x66, 4096, b) == CUDA_SUCCESS);
        planted_free(p);
        planted_free(q);
        if (i % 7 == 0)
            fake_retire_all();
    }
    fake_retire_all();
    CHILD_CHECK(api("cacheshim_debug_check")() == 0);
    CHILD_CHECK(fake_races() == 0);
}

static void scenario_double_free(void)
{
    CUdeviceptr p = planted_alloc(4096);
    planted_free(p);
    planted_free_again(p);
    /* Too large for the quarantine: the cache's own answer (its memory in the pool's free
     * space, or an idle block), same report. */
    CUdeviceptr big = planted_alloc(3 << 20);
    planted_free(big);
    planted_free_again(big);
}

NOINLINE void bad_free_stranger(void)
{
    CHILD_CHECK(cuMemFree((CUdeviceptr)0x1234) != CUDA_SUCCESS);
}

NOINLINE void bad_free_inside(CUdeviceptr p)
{
    CHILD_CHECK(cuMemFree(p + 512) != CUDA_SUCCESS);
}

NOINLINE void bad_free_in_free_memory(CUdeviceptr p)
{
    CHILD_CHECK(cuMemFree(p) == CUDA_ERROR_INVALID_VALUE);
}

static void scenario_bad_free(void)
{
    bad_free_stranger();
    CUdeviceptr p = planted_alloc(4096);
    bad_free_inside(p);
    planted_free(p);
    /* An address in the pool's free memory that no block of the program ever started at. */
    CUdeviceptr big = planted_alloc(3 << 20);
    planted_free(big);
    bad_free_in_free_memory(big + (1 << 20));
}

/* Not tail calls: their frames must stay on the stack. */
NOINLINE CUdeviceptr leak_big(void)
{
    CUdeviceptr p = planted_alloc(8 << 20);
    __asm__ volatile("" ::: "memory");
    return p;
}

NOINLINE CUdeviceptr leak_small(void)
{
    CUdeviceptr p = planted_alloc(4096);
    __asm__ volatile("" ::: "memory");
    return p;
}

static void scenario_leaks(void)
{
    for (volatile int i = 0; i < 3; i++)
        leak_small();  /* one site: the same stack three times (the loop is not unrolled) */
    leak_big();
    planted_free(planted_alloc(1 << 20));  /* freed: not a leak */
}

/* Scopes: nested, statistics at each end, and the exit report (CACHESHIM_STATS=1). */
static void scenario_scopes(void)
{
    cacheshim_scope_stats st;
    CHILD_CHECK(cacheshim_scope_end_if_loaded(&st) == -1);  /* none open */
    CHILD_CHECK(cacheshim_scope_begin_if_loaded("outer", 0) == 0);
    CUdeviceptr a = planted_alloc(1 << 20);
    CHILD_CHECK(cacheshim_scope_begin_if_loaded("inner", CACHESHIM_SCOPE_RELEASE) == 0);
    CUdeviceptr b = planted_alloc(2 << 20), c = planted_alloc(4096);
    planted_free(b);
    CHILD_CHECK(cacheshim_scope_end_if_loaded(&st) == 0);
    CHILD_CHECK(st.allocs == 2 && st.bytes_allocated == (2 << 20) + 4096);
    CHILD_CHECK(st.peak == (2 << 20) + 4096 && st.held_at_end == 4096);
    CHILD_CHECK(st.frees == 1 && st.bytes_freed == 2 << 20);
    CHILD_CHECK(st.released >= 2 << 20);  /* what it freed went back to the driver */
    planted_free(c);  /* after inner's end: counts for outer only */
    CHILD_CHECK(cacheshim_scope_end_if_loaded(&st) == 0);
    CHILD_CHECK(st.allocs == 3 && st.peak == (3 << 20) + 4096 && st.held_at_end == 1 << 20);
    CHILD_CHECK(st.frees == 2 && st.released == 0);
    planted_free(a);
    for (int i = 0; i < 3; i++) {  /* the same name three times: one line at exit */
        CHILD_CHECK(cacheshim_scope_begin_if_loaded("loop", 0) == 0);
        planted_free(planted_alloc(4096));
        CHILD_CHECK(cacheshim_scope_end_if_loaded(NULL) == 0);
    }
}

/* fork() in a child with quarantined blocks: the grandchild starts clean and can use memory. */
static void scenario_fork(void)
{
    uaf_memset();
    pid_t pid = fork();
    CHILD_CHECK(pid >= 0);
    if (pid == 0) {
        child_init();
        planted_free(planted_alloc(4096));
        _exit(api("cacheshim_debug_check")() == 0 ? 0 : 4);
    }
    int status;
    CHILD_CHECK(waitpid(pid, &status, 0) == pid);
    CHILD_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* The context is destroyed with blocks in the quarantine: nothing to check, no error. */
static void scenario_context_gone(void)
{
    CUcontext ctx;
    CUdevice dev;
    CHILD_CHECK(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
    CHILD_CHECK(cuCtxCreate(&ctx, NULL, 0, dev) == CUDA_SUCCESS);
    planted_free(planted_alloc(4096));
    planted_alloc(4096);  /* freed by the context's destruction: no leak */
    CHILD_CHECK(cuCtxDestroy(ctx) == CUDA_SUCCESS);
    CHILD_CHECK(cuCtxSetCurrent(child_ctx) == CUDA_SUCCESS);
    CHILD_CHECK(api("cacheshim_debug_check")() == 0);
}

/* Threads at once: each allocates, works on, frees and reallocates blocks inside scopes of its
 * own, and frees some of the others' blocks, with the detector on (a TSan case). */
enum { THREADS = 4, THREAD_ROUNDS = 150 };
static CUdeviceptr handed[THREADS][THREAD_ROUNDS];

static void *thread_body(void *arg)
{
    int t = (int)(intptr_t)arg;
    CHILD_CHECK(cuCtxSetCurrent(child_ctx) == CUDA_SUCCESS);
    CUstream s;
    CHILD_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CHILD_CHECK(cacheshim_scope_begin_if_loaded(t % 2 ? "odd" : "even", 0) == 0);
    for (int i = 0; i < THREAD_ROUNDS; i++) {
        size_t n = (size_t)(1 + (i + t) % 4) << 14;
        CUdeviceptr p = planted_alloc(n);
        CHILD_CHECK(cuMemsetD8Async(p, (unsigned char)i, n, s) == CUDA_SUCCESS);
        launch(s, p, n);
        if (i % 3 == 0)
            handed[t][i] = p;  /* freed by the next thread, after the join */
        else
            planted_free(p);
    }
    cacheshim_scope_stats st;
    CHILD_CHECK(cacheshim_scope_end_if_loaded(&st) == 0 && st.allocs == THREAD_ROUNDS);
    CHILD_CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS);
    return NULL;
}

static void scenario_threads(void)
{
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++)
        CHILD_CHECK(pthread_create(&th[t], NULL, thread_body, (void *)(intptr_t)t) == 0);
    for (int t = 0; t < THREADS; t++)
        CHILD_CHECK(pthread_join(th[t], NULL) == 0);
    for (int t = 0; t < THREADS; t++)
        for (int i = 0; i < THREAD_ROUNDS; i++)
            if (handed[(t + 1) % THREADS][i])
                planted_free(handed[(t + 1) % THREADS][i]);
    fake_retire_all();
    CHILD_CHECK(api("cacheshim_debug_check")() == 0);
    CHILD_CHECK(fake_races() == 0);
}

/* A block freed twice while its first free is being checked on its way out of the quarantine
 * (another thread's free pushed it out, CACHESHIM_QUARANTINE=0): still a double free, refused
 * and reported, never a second free into the cache. The check's read-back first completes a
 * host function on the legacy stream, which holds the checking thread there until the other
 * thread's second free returned: no timing involved. */
static CUdeviceptr leaving_block;
static int leaving_stage;  /* atomic: 1 the check is under way, 2 the second free returned */

static void CUDA_CB hold_the_check(void *arg)
{
    (void)arg;
    __atomic_store_n(&leaving_stage, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < 10000 && __atomic_load_n(&leaving_stage, __ATOMIC_ACQUIRE) != 2; i++)
        usleep(1000);  /* bounded: 10 s, then the second free's check below fails */
}

static void *free_leaving_again(void *arg)
{
    (void)arg;
    CHILD_CHECK(cuCtxSetCurrent(child_ctx) == CUDA_SUCCESS);
    while (__atomic_load_n(&leaving_stage, __ATOMIC_ACQUIRE) != 1)
        usleep(100);
    planted_free_again(leaving_block);
    __atomic_store_n(&leaving_stage, 2, __ATOMIC_RELEASE);
    return NULL;
}

static void scenario_double_free_leaving(void)
{
    leaving_block = planted_alloc(4096);
    planted_free(leaving_block);  /* quarantined: the newest block */
    CUdeviceptr next = planted_alloc(4096);
    pthread_t t;
    CHILD_CHECK(pthread_create(&t, NULL, free_leaving_again, NULL) == 0);
    CHILD_CHECK(cuLaunchHostFunc(NULL, hold_the_check, NULL) == CUDA_SUCCESS);
    planted_free(next);  /* pushes leaving_block out: its check completes hold_the_check */
    CHILD_CHECK(pthread_join(t, NULL) == 0);
    CHILD_CHECK(__atomic_load_n(&leaving_stage, __ATOMIC_ACQUIRE) == 2);
    /* The cache holds it once: two allocations get two blocks. */
    CUdeviceptr a = planted_alloc(4096), b = planted_alloc(4096);
    CHILD_CHECK(a != b);
    planted_free(a);
    planted_free(b);
}

/* cacheshim_debug_check() while a blocking stream captures: the read-back may not use the
 * legacy stream then (it would invalidate the program's capture); the block stays quarantined
 * and is checked at exit, where the stray write is found. */
static void scenario_check_in_capture(void)
{
    CUstream s;
    CHILD_CHECK(cuStreamCreate(&s, 0) == CUDA_SUCCESS);
    uaf_memset();
    CHILD_CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
    CHILD_CHECK(api("cacheshim_debug_check")() == 0);
    CUgraph g = NULL;
    CHILD_CHECK(cuStreamEndCapture(s, &g) == CUDA_SUCCESS);
    CHILD_CHECK(fake_capture_violations() == 0);
    CHILD_CHECK(cuStreamDestroy(s) == CUDA_SUCCESS);
}

/* The fill fails: the block goes back to the cache unchecked, the free still succeeds. */
static void scenario_fill_fails(void)
{
    fake_fail_always("cuMemsetD8Async", CUDA_ERROR_LAUNCH_FAILED);
    for (int i = 0; i < 3; i++)
        planted_free(planted_alloc(4096));
    fake_fail_always("cuMemsetD8Async", CUDA_SUCCESS);
    CHILD_CHECK(api("cacheshim_debug_check")() == 0);
}

/* The read-back fails: the block is not judged (no report, no abort), at the check or at exit. */
static void scenario_read_fails(void)
{
    uaf_memset();
    fake_fail_always("cuMemcpyDtoH_v2", CUDA_ERROR_LAUNCH_FAILED);
    CHILD_CHECK(api("cacheshim_debug_check")() == 0);
}

/* Out of memory with everything quarantined: the quarantine is checked and emptied, and the
 * allocation succeeds (a 16 MiB device, 1 MiB blocks, an unlimited quarantine). */
static void scenario_oom_drain(void)
{
    for (int i = 0; i < 64; i++)
        planted_free(planted_alloc(1 << 20));
}

static const struct {
    const char *name;
    void (*run)(void);
} scenarios[] = {
    {"threads", scenario_threads},         {"fill-fails", scenario_fill_fails},
    {"read-fails", scenario_read_fails},   {"oom-drain", scenario_oom_drain},
    {"uaf-exit", scenario_uaf_exit},       {"uaf-check", scenario_uaf_check},
    {"uaf-evict", scenario_uaf_evict},     {"uaf-async", scenario_uaf_async},
    {"valid", scenario_valid},             {"double-free", scenario_double_free},
    {"bad-free", scenario_bad_free},       {"leaks", scenario_leaks},
    {"scopes", scenario_scopes},           {"fork", scenario_fork},
    {"context-gone", scenario_context_gone},
    {"double-free-leaving", scenario_double_free_leaving},
    {"check-in-capture", scenario_check_in_capture},
};

static int child_main(const char *name)
{
    child_init();
    for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++)
        if (!strcmp(scenarios[i].name, name)) {
            scenarios[i].run();
            fprintf(stderr, "scenario %s returned\n", name);
            return 0;
        }
    fprintf(stderr, "no scenario %s\n", name);
    return 2;
}

/* ================================================================ the parent */

typedef struct {
    int status;
    char err[1 << 16];
} child_run;

/* Runs `test_debug child SCENARIO` with the variables given as NAME=VALUE strings (NULL
 * ends them; "NAME=" unsets NAME); its stderr into r->err. */
static void run_child(child_run *r, const char *scenario, ...)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        unsetenv("CACHESHIM_DEBUG");
        unsetenv("CACHESHIM_QUARANTINE");
        unsetenv("CACHESHIM_STATS");
        va_list ap;
        va_start(ap, scenario);
        for (const char *kv; (kv = va_arg(ap, const char *));) {
            char name[128];
            const char *eq = strchr(kv, '=');
            snprintf(name, sizeof name, "%.*s", (int)(eq - kv), kv);
            if (eq[1])
                setenv(name, eq + 1, 1);
            else
                unsetenv(name);
        }
        va_end(ap);
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        close(fds[1]);
        execl("/proc/self/exe", "test_debug", "child", scenario, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    size_t n = 0;
    for (;;) {
        ssize_t k = read(fds[0], r->err + n, sizeof r->err - 1 - n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        n += (size_t)k;
        if (n == sizeof r->err - 1)
            n = 0;  /* far too much: keep the tail */
    }
    r->err[n] = '\0';
    close(fds[0]);
    assert_int_equal(waitpid(pid, &r->status, 0), pid);
}

static child_run run;

static bool has(const char *text)
{
    return strstr(run.err, text) != NULL;
}

/* text occurs after the first occurrence of `after`. */
static bool has_after(const char *after, const char *text)
{
    const char *a = strstr(run.err, after);
    return a && strstr(a, text);
}

#define ASSERT_HAS(text)                                                                  \
    do {                                                                                  \
        if (!has(text))                                                                   \
            fail_msg("child stderr lacks \"%s\":\n%s", text, run.err);                   \
    } while (0)
#define ASSERT_LACKS(text)                                                                \
    do {                                                                                  \
        if (has(text))                                                                    \
            fail_msg("child stderr has \"%s\":\n%s", text, run.err);                     \
    } while (0)

static void assert_aborted(void)
{
    if (!WIFSIGNALED(run.status) || WTERMSIG(run.status) != SIGABRT)
        fail_msg("child did not abort (status 0x%x):\n%s", run.status, run.err);
}

static void assert_clean_exit(void)
{
    if (!WIFEXITED(run.status) || WEXITSTATUS(run.status) != 0)
        fail_msg("child did not exit cleanly (status 0x%x):\n%s", run.status, run.err);
}

/* The control: the scenario without CACHESHIM_DEBUG exits cleanly and prints nothing. */
static void assert_silent_when_off(const char *scenario)
{
    run_child(&run, scenario, NULL);
    assert_clean_exit();
    ASSERT_LACKS("cacheshim:");
}

/* The use-after-free report: block, size, offsets, both sites, in that order. */
static void assert_uaf_report(void)
{
    ASSERT_HAS("cacheshim: use after free: the block at 0x");
    ASSERT_HAS("was written after its free: 16 bytes changed, at offsets 0x100-0x10f");
    assert_true(has_after("use after free", "  allocated at:"));
    assert_true(has_after("  allocated at:", "planted_alloc+0x"));
    assert_true(has_after("  allocated at:", "  freed at:"));
    assert_true(has_after("  freed at:", "planted_free+0x"));
}

static void test_uaf_caught_at_exit(void **state)
{
    (void)state;
    run_child(&run, "uaf-exit", "CACHESHIM_DEBUG=uaf", NULL);
    assert_aborted();
    assert_uaf_report();
    ASSERT_HAS("of 4096 bytes");
    ASSERT_HAS("cacheshim: aborting: CACHESHIM_DEBUG=uaf found a use after free");
    ASSERT_HAS("scenario uaf-exit returned");  /* found at exit, after the program's end */
}

static void test_uaf_caught_by_check_and_report_goes_on(void **state)
{
    (void)state;
    run_child(&run, "uaf-check", "CACHESHIM_DEBUG=uaf", NULL);
    assert_aborted();
    assert_uaf_report();
    ASSERT_LACKS("after the check");
    run_child(&run, "uaf-check", "CACHESHIM_DEBUG=uaf-report", NULL);
    assert_clean_exit();
    assert_uaf_report();
    ASSERT_HAS("after the check: 1");
    ASSERT_LACKS("aborting");
}

static void test_uaf_caught_leaving_quarantine(void **state)
{
    (void)state;
    run_child(&run, "uaf-evict", "CACHESHIM_DEBUG=uaf", "CACHESHIM_QUARANTINE=1536K", NULL);
    assert_aborted();
    assert_uaf_report();
    ASSERT_LACKS("still running after the evictions");
}

static void test_uaf_async_write_after_free(void **state)
{
    (void)state;
    run_child(&run, "uaf-async", "CACHESHIM_DEBUG=uaf,leaks", NULL);
    assert_aborted();
    ASSERT_HAS("of 8192 bytes");
    ASSERT_HAS("64 bytes changed, at offsets 0x1000-0x103f");
    ASSERT_LACKS("race");  /* the stray copy was ordered after the fill, on its own stream */
    assert_true(has_after("  freed at:", "planted_free+0x"));
}

static void test_control_detector_off_is_silent(void **state)
{
    (void)state;
    assert_silent_when_off("uaf-exit");
    run_child(&run, "uaf-exit", "CACHESHIM_DEBUG=leaks", NULL);  /* leaks alone: no fill */
    assert_clean_exit();
    ASSERT_LACKS("use after free");
    ASSERT_HAS("cacheshim: leaks: none");
}

static void test_valid_use_is_clean(void **state)
{
    (void)state;
    run_child(&run, "valid", "CACHESHIM_DEBUG=uaf,leaks", NULL);
    assert_clean_exit();
    ASSERT_LACKS("use after free");
    ASSERT_LACKS("race");
    ASSERT_HAS("cacheshim: leaks: none");
    run_child(&run, "valid", "CACHESHIM_DEBUG=uaf", "CACHESHIM_QUARANTINE=0", NULL);
    assert_clean_exit();
    ASSERT_LACKS("cacheshim:");
}

static void test_double_free_names_both_frees(void **state)
{
    (void)state;
    run_child(&run, "double-free", "CACHESHIM_DEBUG=uaf", "CACHESHIM_QUARANTINE=1M", NULL);
    assert_clean_exit();
    ASSERT_HAS("cacheshim: double free of 0x");
    ASSERT_HAS("(4096 bytes): the block was freed already; the driver's answer, "
               "CUDA_ERROR_INVALID_VALUE, is returned");
    assert_true(has_after("double free", "  allocated at:"));
    assert_true(has_after("  first freed at:", "planted_free+0x"));
    assert_true(has_after("  freed again at:", "planted_free_again+0x"));
    /* The second one: its block was too large for the quarantine: the cache's answer. */
    const char *second = strstr(strstr(run.err, "double free") + 1, "double free");
    if (!second || !strstr(second, "first freed at:"))
        fail_msg("no second double-free report:\n%s", run.err);
    assert_silent_when_off("double-free");  /* the same error code, no message */
}

static void test_bad_frees_keep_the_driver_answer(void **state)
{
    (void)state;
    run_child(&run, "bad-free", "CACHESHIM_DEBUG=leaks", NULL);
    assert_clean_exit();
    ASSERT_HAS("cacheshim: bad free of 0x1234: cacheshim never handed out that pointer; the "
               "driver answered error");
    assert_true(has_after("bad free of 0x1234", "bad_free_stranger+0x"));
    ASSERT_HAS("bytes into the block at 0x");
    ASSERT_HAS(": it points 512 bytes into the block at 0x");
    assert_true(has_after("512 bytes into", "  block allocated at:"));
    assert_true(has_after("  block allocated at:", "planted_alloc+0x"));
    assert_true(has_after("  block allocated at:", "bad_free_inside+0x"));
    /* An address in free memory (pooled: the pool's; classic: inside an idle block, which
     * the driver refuses) is no double free of anything the program had. */
    const char *backend = getenv("CACHESHIM_BACKEND");
    if (backend && strcmp(backend, "classic") == 0) {
        assert_true(has_after("  block allocated at:", "cacheshim never handed out that pointer"));
    } else {
        ASSERT_HAS(": no block in use there, the address lies in memory the cache holds free (a "
                   "block freed twice, its first free not recorded, or an address cacheshim "
                   "never handed out); the driver's answer, CUDA_ERROR_INVALID_VALUE, is "
                   "returned");
    }
    assert_true(has_after("  block allocated at:", "bad_free_in_free_memory+0x"));
    ASSERT_LACKS("(0 bytes)");
    assert_silent_when_off("bad-free");
}

static void test_leaks_by_site_largest_first(void **state)
{
    (void)state;
    run_child(&run, "leaks", "CACHESHIM_DEBUG=leaks", NULL);
    assert_clean_exit();
    ASSERT_HAS("cacheshim: leaks: 4 blocks, 8.01 MiB, never freed, from 2 allocation sites "
               "(largest first)");
    ASSERT_HAS("cacheshim:   8.00 MiB in 1 block allocated at:");
    ASSERT_HAS("cacheshim:   12.0 KiB in 3 blocks allocated at:");
    assert_true(has_after("8.00 MiB in 1 block", "leak_big+0x"));
    assert_true(has_after("8.00 MiB in 1 block", "12.0 KiB in 3 blocks"));
    assert_true(has_after("12.0 KiB in 3 blocks", "leak_small+0x"));
    run_child(&run, "leaks", "CACHESHIM_DEBUG=uaf", NULL);  /* uaf alone reports no leaks */
    assert_clean_exit();
    ASSERT_LACKS("leaks:");
}

static void test_scopes(void **state)
{
    (void)state;
    run_child(&run, "scopes", "CACHESHIM_STATS=1", NULL);
    assert_clean_exit();
    ASSERT_HAS("cacheshim: scope outer: 1 times, 3 allocations, 3.00 MiB allocated, peak "
               "3.00 MiB, 1.00 MiB held at its last end, 0 B given back");
    ASSERT_HAS("cacheshim: scope inner: 1 times, 2 allocations, 2.00 MiB allocated, peak "
               "2.00 MiB, 4.00 KiB held at its last end, ");
    ASSERT_HAS("cacheshim: scope loop: 3 times, 3 allocations, 12.0 KiB allocated, peak "
               "4.00 KiB, 0 B held at its last end, 0 B given back");
    /* With the debug modes on as well. */
    run_child(&run, "scopes", "CACHESHIM_DEBUG=uaf,leaks", NULL);
    assert_clean_exit();
    ASSERT_HAS("cacheshim: leaks: none");
    ASSERT_LACKS("scope outer");  /* the scope lines come with CACHESHIM_STATS=1 */
}

static void test_fork_and_context_gone(void **state)
{
    (void)state;
    run_child(&run, "fork", "CACHESHIM_DEBUG=uaf-report", NULL);
    assert_clean_exit();
    assert_uaf_report();  /* the parent's block, at the parent's exit; the child's is clean */
    run_child(&run, "context-gone", "CACHESHIM_DEBUG=uaf,leaks", NULL);
    assert_clean_exit();
    ASSERT_HAS("cacheshim: leaks: none");
}

static void test_threads(void **state)
{
    (void)state;
    run_child(&run, "threads", "CACHESHIM_DEBUG=uaf,leaks", "CACHESHIM_QUARANTINE=1M",
              "CACHESHIM_STATS=1", NULL);
    assert_clean_exit();
    ASSERT_LACKS("use after free");
    ASSERT_LACKS("race");
    ASSERT_HAS("cacheshim: leaks: none");
    ASSERT_HAS("cacheshim: scope even: 2 times, 300 allocations");
    ASSERT_HAS("cacheshim: scope odd: 2 times, 300 allocations");
}

static void test_double_free_while_leaving_quarantine(void **state)
{
    (void)state;
    run_child(&run, "double-free-leaving", "CACHESHIM_DEBUG=uaf", "CACHESHIM_QUARANTINE=0",
              NULL);
    assert_clean_exit();
    ASSERT_HAS("cacheshim: double free of 0x");
    assert_true(has_after("  first freed at:", "planted_free+0x"));
    assert_true(has_after("  freed again at:", "planted_free_again+0x"));
    ASSERT_LACKS("use after free");
}

static void test_check_during_capture_waits(void **state)
{
    (void)state;
    run_child(&run, "check-in-capture", "CACHESHIM_DEBUG=uaf-report", NULL);
    assert_clean_exit();
    ASSERT_LACKS("child check failed");
    assert_uaf_report();  /* at exit */
    assert_true(has_after("scenario check-in-capture returned", "use after free"));
}

static void test_driver_failures_are_said_once(void **state)
{
    (void)state;
    run_child(&run, "fill-fails", "CACHESHIM_DEBUG=uaf", NULL);
    assert_clean_exit();
    ASSERT_HAS("cacheshim: use-after-free check: filling the freed block at 0x");
    ASSERT_HAS("failed (error 719); blocks that cannot be filled go back to the cache "
               "unchecked (said once)");
    const char *said = strstr(run.err, "filling the freed block");
    assert_null(strstr(said + 1, "filling the freed block"));  /* once, for three frees */
    run_child(&run, "read-fails", "CACHESHIM_DEBUG=uaf", NULL);
    assert_clean_exit();
    ASSERT_HAS("cacheshim: use-after-free check: reading back the block at 0x");
    ASSERT_HAS("failed (error 719); blocks that cannot be read are not checked (said once)");
    ASSERT_LACKS("use after free:");
    run_child(&run, "oom-drain", "CACHESHIM_DEBUG=uaf", "CACHESHIM_QUARANTINE=unlimited",
              "FAKE_CUDA_DEVICE_BYTES=16777216", NULL);
    assert_clean_exit();
    ASSERT_LACKS("cacheshim:");
}

static void test_bad_setting_is_reported(void **state)
{
    (void)state;
    run_child(&run, "leaks", "CACHESHIM_DEBUG=uaf,bogus", NULL);
    assert_clean_exit();
    ASSERT_LACKS("leaks:");
    ASSERT_HAS("cacheshim: CACHESHIM_DEBUG='uaf,bogus' is not valid: expected off, or a "
               "comma-separated list of uaf, uaf-report and leaks; using the default (off)");
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "child"))
        return child_main(argv[2]);
    /* "threads": the concurrency case alone (meson runs it under TSan too). */
    if (argc == 2 && !strcmp(argv[1], "threads")) {
        const struct CMUnitTest threads[] = {
            cmocka_unit_test(test_threads),
            cmocka_unit_test(test_double_free_while_leaving_quarantine),
        };
        return cmocka_run_group_tests(threads, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uaf_caught_at_exit),
        cmocka_unit_test(test_uaf_caught_by_check_and_report_goes_on),
        cmocka_unit_test(test_uaf_caught_leaving_quarantine),
        cmocka_unit_test(test_uaf_async_write_after_free),
        cmocka_unit_test(test_control_detector_off_is_silent),
        cmocka_unit_test(test_valid_use_is_clean),
        cmocka_unit_test(test_double_free_names_both_frees),
        cmocka_unit_test(test_bad_frees_keep_the_driver_answer),
        cmocka_unit_test(test_leaks_by_site_largest_first),
        cmocka_unit_test(test_scopes),
        cmocka_unit_test(test_fork_and_context_gone),
        cmocka_unit_test(test_driver_failures_are_said_once),
        cmocka_unit_test(test_check_during_capture_waits),
        cmocka_unit_test(test_bad_setting_is_reported),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
