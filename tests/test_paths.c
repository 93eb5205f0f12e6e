/* Integration tests of the allocation paths past cuMemAlloc: pinned host memory cached
 * (cuMemAllocHost, cuMemHostAlloc, cuMemFreeHost), the device calls the cache passes to the
 * driver but counts against CACHESHIM_CAP (cuMemAllocPitch, cuMemAllocManaged, cuMemAllocAsync,
 * cuMemAllocFromPoolAsync, cuMemCreate), and PyTorch's pluggable allocator functions. Runs
 * under LD_PRELOAD=libcacheshim.so on the fake driver; argv[1] picks the group, which meson
 * runs with its own CACHESHIM_* variables (tests/meson.build). */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include <cmocka.h>

#include "shim_util.h"

#define KiB 1024ull

typedef CUresult (*host_alloc_fn)(void **, size_t, unsigned int);
typedef CUresult (*host_free_fn)(void *);
typedef CUresult (*gpa2_fn)(const char *, void **, int, cuuint64_t,
                            CUdriverProcAddressQueryResult *);

static CUcontext primary;
static void *libcuda;

static int setup(void **state)
{
    (void)state;
    primary = shim_test_primary();
    libcuda = dlopen("libcuda.so.1", RTLD_NOW);
    assert_non_null(libcuda);
    return 0;
}

static cacheshim_stats host_stats(void)
{
    int (*fn)(cacheshim_stats *, size_t) =
        (int (*)(cacheshim_stats *, size_t))dlsym(RTLD_DEFAULT, "cacheshim_get_host_stats");
    cacheshim_stats s;
    assert_non_null(fn);
    assert_int_equal(fn(&s, sizeof s), 0);
    return s;
}

/* What cuGetProcAddress_v2 hands out for a name, as cudart asks (CUDA 12.0). */
static void *proc(const char *name, cuuint64_t flags)
{
    gpa2_fn gpa = (gpa2_fn)dlsym(libcuda, "cuGetProcAddress_v2");
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    assert_non_null(gpa);
    assert_int_equal(gpa(name, &p, 12000, flags, &st), CUDA_SUCCESS);
    return p;
}

/* A context of its own on device 0, made current. */
static CUcontext new_context(void)
{
    CUcontext ctx;
    CUdevice dev;
    CUctxCreateParams params = {0};
    assert_int_equal(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    assert_int_equal(cuCtxCreate_v4(&ctx, &params, 0, dev), CUDA_SUCCESS);
    return ctx;
}

/* ================================================================ pinned host memory */

/* Every way a program finds the three entry points reaches the shim's wrapper. */
static void test_host_paths_are_wrapped(void **state)
{
    (void)state;
    void *mine_alloc = dlsym(RTLD_DEFAULT, "cuMemHostAlloc");
    void *mine_free = dlsym(RTLD_DEFAULT, "cuMemFreeHost");
    void *mine_plain = dlsym(RTLD_DEFAULT, "cuMemAllocHost_v2");
    assert_ptr_not_equal(mine_alloc, fake_real_symbol("cuMemHostAlloc"));
    assert_ptr_equal(dlsym(libcuda, "cuMemHostAlloc"), mine_alloc);
    assert_ptr_equal(dlsym(libcuda, "cuMemFreeHost"), mine_free);
    assert_ptr_equal(dlsym(libcuda, "cuMemAllocHost_v2"), mine_plain);
    assert_ptr_equal(proc("cuMemHostAlloc", 0), mine_alloc);
    assert_ptr_equal(proc("cuMemFreeHost", 0), mine_free);
    assert_ptr_equal(proc("cuMemAllocHost", 0), mine_plain);

    /* and through them, a freed block is handed out again: one driver allocation */
    host_alloc_fn a = (host_alloc_fn)proc("cuMemHostAlloc", 0);
    host_free_fn f = (host_free_fn)proc("cuMemFreeHost", 0);
    fake_reset_counters();
    void *first = NULL, *p = NULL;
    assert_int_equal(a(&first, 4 * KiB, 0), CUDA_SUCCESS);
    assert_int_equal(f(first), CUDA_SUCCESS);
    for (int i = 0; i < 10; i++) {
        assert_int_equal(a(&p, 4 * KiB, 0), CUDA_SUCCESS);
        assert_ptr_equal(p, first);
        memset(p, 0x5a, 4 * KiB);  /* real, writable host memory */
        assert_int_equal(f(p), CUDA_SUCCESS);
    }
    assert_int_equal(fake_calls("cuMemHostAlloc"), 1);
    assert_int_equal(fake_calls("cuMemFreeHost"), 0);
}

/* cuMemAllocHost and cuMemHostAlloc with flags 0 are the same memory; other flags never share
 * blocks with them or with each other. */
static void test_host_flags_kept_apart(void **state)
{
    (void)state;
    void *plain = NULL, *portable = NULL, *mapped = NULL, *again = NULL;
    assert_int_equal(cuMemAllocHost(&plain, 64 * KiB), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(plain), CUDA_SUCCESS);
    assert_int_equal(cuMemHostAlloc(&portable, 64 * KiB, CU_MEMHOSTALLOC_PORTABLE), CUDA_SUCCESS);
    assert_ptr_not_equal(portable, plain);
    assert_int_equal(fake_host_flags(portable), CU_MEMHOSTALLOC_PORTABLE);
    assert_int_equal(cuMemFreeHost(portable), CUDA_SUCCESS);
    assert_int_equal(cuMemHostAlloc(&mapped, 64 * KiB, CU_MEMHOSTALLOC_DEVICEMAP), CUDA_SUCCESS);
    assert_ptr_not_equal(mapped, plain);
    assert_ptr_not_equal(mapped, portable);
    assert_int_equal(fake_host_flags(mapped), CU_MEMHOSTALLOC_DEVICEMAP);
    assert_int_equal(cuMemFreeHost(mapped), CUDA_SUCCESS);
    assert_int_equal(cuMemHostAlloc(&again, 64 * KiB, 0), CUDA_SUCCESS);
    assert_ptr_equal(again, plain);
    assert_int_equal(fake_host_flags(again), 0);
    assert_int_equal(cuMemFreeHost(again), CUDA_SUCCESS);
    /* the driver's own answer to flags it does not know */
    assert_int_equal(cuMemHostAlloc(&again, 4 * KiB, 0x80), CUDA_ERROR_INVALID_VALUE);
}

/* An asynchronous copy still reading a freed block: the block is not handed out again until
 * the copy is done (the program would write into it at once). */
static void test_host_block_waits_for_its_copy(void **state)
{
    (void)state;
    CUstream s;
    assert_int_equal(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr dev = must_alloc(256 * KiB);
    void *h = NULL, *other = NULL, *back = NULL;
    assert_int_equal(cuMemAllocHost(&h, 256 * KiB), CUDA_SUCCESS);
    launch(s, dev, 1);  /* pending: the copy after it waits */
    assert_int_equal(cuMemcpyHtoDAsync(dev, h, 256 * KiB, s), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(h), CUDA_SUCCESS);
    assert_true(fake_stream_pending(s) > 0);
    assert_int_equal(cuMemAllocHost(&other, 256 * KiB), CUDA_SUCCESS);
    assert_ptr_not_equal(other, h);
    fake_stream_retire(s, -1);
    assert_int_equal(cuMemAllocHost(&back, 256 * KiB), CUDA_SUCCESS);
    assert_ptr_equal(back, h);  /* done now: reused */
    assert_int_equal(cuMemFreeHost(back), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(other), CUDA_SUCCESS);
    must_free(dev);
    assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);
    assert_int_equal(fake_races(), 0);
}

/* A pinned block is every context's: memory of cuMemAllocHost is "accessible to all contexts
 * on all devices which support unified addressing" (cuda.h). A copy on a stream of another
 * context still reading the block after its free is waited for as its own context's is. */
static void test_host_block_waits_for_other_context_copy(void **state)
{
    (void)state;
    void *h = NULL, *other = NULL, *back = NULL;  /* a size no other test leaves idle */
    assert_int_equal(cuMemAllocHost(&h, 384 * KiB), CUDA_SUCCESS);  /* the primary context's */
    CUcontext b = new_context();
    CUstream s;
    assert_int_equal(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr dev = must_alloc(384 * KiB);
    launch(s, dev, 1);  /* pending: the copy after it waits */
    assert_int_equal(cuMemcpyHtoDAsync(dev, h, 384 * KiB, s), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(h), CUDA_SUCCESS);
    assert_true(fake_stream_pending(s) > 0);
    assert_int_equal(cuCtxSetCurrent(primary), CUDA_SUCCESS);
    assert_int_equal(cuMemAllocHost(&other, 384 * KiB), CUDA_SUCCESS);
    assert_ptr_not_equal(other, h);  /* the copy still reads h */
    fake_stream_retire(s, -1);
    assert_int_equal(cuMemAllocHost(&back, 384 * KiB), CUDA_SUCCESS);
    assert_ptr_equal(back, h);  /* done now: reused */
    assert_int_equal(cuMemFreeHost(back), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(other), CUDA_SUCCESS);
    assert_int_equal(cuCtxSetCurrent(b), CUDA_SUCCESS);
    must_free(dev);
    assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);
    assert_int_equal(cuCtxDestroy(b), CUDA_SUCCESS);
    assert_int_equal(cuCtxSetCurrent(primary), CUDA_SUCCESS);
    assert_int_equal(fake_races(), 0);
}

/* Pointers the shim never handed out go to the driver; a double free is refused as the
 * driver refuses it; NULL is the driver's to answer. */
static void test_host_foreign_and_double_frees(void **state)
{
    (void)state;
    host_alloc_fn real = (host_alloc_fn)fake_real_symbol("cuMemHostAlloc");
    void *foreign = NULL, *p = NULL;
    assert_int_equal(real(&foreign, 8 * KiB, 0), CUDA_SUCCESS);
    long before = fake_host_allocations();
    assert_int_equal(cuMemFreeHost(foreign), CUDA_SUCCESS);
    assert_int_equal(fake_host_allocations(), before - 1);
    assert_int_equal(cuMemAllocHost(&p, 8 * KiB), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(p), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(p), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemFreeHost(NULL), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemAllocHost(NULL, 8 * KiB), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemAllocHost(&p, 0), CUDA_ERROR_INVALID_VALUE);
}

/* The statistics of the host cache are its own, apart from the device's. */
static void test_host_statistics(void **state)
{
    (void)state;
    cacheshim_stats dev_before = shim_stats(0), before = host_stats();
    void *p = NULL;
    for (int i = 0; i < 5; i++) {
        assert_int_equal(cuMemAllocHost(&p, 3 * MiB), CUDA_SUCCESS);
        assert_int_equal(cuMemFreeHost(p), CUDA_SUCCESS);
    }
    cacheshim_stats after = host_stats(), dev_after = shim_stats(0);
    assert_int_equal(after.requests - before.requests, 5);
    assert_true(after.hits - before.hits >= 4);
    assert_int_equal(after.frees - before.frees, 5);
    assert_true(after.bytes_cached >= 3 * MiB);
    assert_int_equal(after.cap_bytes, UINT64_MAX);
    assert_int_equal(dev_after.requests, dev_before.requests);
    /* cacheshim_trim gives idle pinned blocks back too */
    shim_trim();
    assert_int_equal(host_stats().bytes_cached, 0);
}

/* Out of pinned memory: the cache's idle pinned blocks go back and the call is retried. */
static void test_host_oom_releases_idle(void **state)
{
    (void)state;
    shim_trim();
    void *a = NULL, *b = NULL;
    fake_set_host_bytes(fake_host_used() + 8 * MiB);
    assert_int_equal(cuMemAllocHost(&a, 6 * MiB), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(a), CUDA_SUCCESS);  /* idle, cached */
    cacheshim_stats before = host_stats();
    assert_int_equal(cuMemAllocHost(&b, 7 * MiB), CUDA_SUCCESS);
    assert_int_equal(host_stats().oom_recoveries - before.oom_recoveries, 1);
    assert_int_equal(cuMemFreeHost(b), CUDA_SUCCESS);
    /* more than there is: the driver's answer, after the same recovery */
    assert_int_equal(cuMemAllocHost(&a, 9 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
    fake_set_host_bytes(UINT64_MAX);
}

/* Destroying a context frees its pinned memory: the cache forgets those blocks. */
static void test_host_context_destroyed(void **state)
{
    (void)state;
    CUcontext ctx = new_context();
    void *p = NULL, *q = NULL;
    assert_int_equal(cuMemAllocHost(&p, 16 * KiB), CUDA_SUCCESS);
    assert_int_equal(cuMemAllocHost(&q, 32 * KiB), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(p), CUDA_SUCCESS);  /* one idle, one in use */
    long live = fake_host_allocations();
    assert_int_equal(cuCtxDestroy(ctx), CUDA_SUCCESS);
    assert_int_equal(fake_host_allocations(), live - 2);
    assert_int_equal(cuCtxSetCurrent(primary), CUDA_SUCCESS);
    fake_reset_counters();
    shim_trim();  /* nothing of the dead context reaches the driver */
    assert_int_equal(fake_calls("cuMemFreeHost"), 0);
    void *r = NULL;
    assert_int_equal(cuMemAllocHost(&r, 16 * KiB), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(r), CUDA_SUCCESS);
}

/* Without a current context the call is the driver's. */
static void test_host_without_context(void **state)
{
    (void)state;
    assert_int_equal(cuCtxSetCurrent(NULL), CUDA_SUCCESS);
    void *p = NULL;
    assert_int_equal(cuMemAllocHost(&p, 4 * KiB), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cuCtxSetCurrent(primary), CUDA_SUCCESS);
}

/* Threads allocate and free pinned blocks of a few sizes, and free each other's: every block
 * handed out is one no other thread holds (its first word says whose it is). */
#define HOST_THREADS 4
#define HOST_ROUNDS 3000

static void *host_worker(void *arg)
{
    uintptr_t me = (uintptr_t)arg;
    void *mine[8] = {0};
    unsigned seed = (unsigned)me * 2654435761u;
    assert_int_equal(cuCtxSetCurrent(primary), CUDA_SUCCESS);
    for (int i = 0; i < HOST_ROUNDS; i++) {
        int k = (int)((seed = seed * 1103515245u + 12345u) >> 16) % 8;
        if (mine[k]) {
            assert_int_equal(*(volatile uintptr_t *)mine[k], me);
            assert_int_equal(cuMemFreeHost(mine[k]), CUDA_SUCCESS);
            mine[k] = NULL;
        } else {
            size_t size = (size_t)(k + 1) * 3 * KiB;
            assert_int_equal(cuMemHostAlloc(&mine[k], size, k & 1 ? CU_MEMHOSTALLOC_PORTABLE : 0),
                             CUDA_SUCCESS);
            *(volatile uintptr_t *)mine[k] = me;
        }
    }
    for (int k = 0; k < 8; k++)
        if (mine[k])
            assert_int_equal(cuMemFreeHost(mine[k]), CUDA_SUCCESS);
    return NULL;
}

static void *free_for_other(void *p)
{
    assert_int_equal(cuCtxSetCurrent(primary), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(p), CUDA_SUCCESS);
    return NULL;
}

static void test_host_threads(void **state)
{
    (void)state;
    pthread_t t[HOST_THREADS];
    for (uintptr_t i = 0; i < HOST_THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, host_worker, (void *)(i + 1)), 0);
    for (int i = 0; i < HOST_THREADS; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    /* a block freed by another thread than the one that allocated it */
    void *p = NULL;
    assert_int_equal(cuMemAllocHost(&p, 5 * KiB), CUDA_SUCCESS);
    pthread_t other;
    assert_int_equal(pthread_create(&other, NULL, free_for_other, p), 0);
    assert_int_equal(pthread_join(other, NULL), 0);
    assert_int_equal(cuMemFreeHost(p), CUDA_ERROR_INVALID_VALUE);  /* freed already */
    cacheshim_stats st = host_stats();
    assert_int_equal(st.bytes_in_use, 0);
}

/* A forked child starts with an empty pinned cache and can use it; the parent's is intact. */
static void test_host_fork(void **state)
{
    (void)state;
    void *p = NULL;
    assert_int_equal(cuMemAllocHost(&p, 12 * KiB), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(p), CUDA_SUCCESS);
    pid_t pid = fork();
    if (pid == 0) {
        cacheshim_stats s;
        int (*get)(cacheshim_stats *, size_t) =
            (int (*)(cacheshim_stats *, size_t))dlsym(RTLD_DEFAULT, "cacheshim_get_host_stats");
        _exit(get(&s, sizeof s) == -1 ? 0 : 3);  /* nothing of the parent's */
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    void *q = NULL;
    assert_int_equal(cuMemAllocHost(&q, 12 * KiB), CUDA_SUCCESS);
    assert_ptr_equal(q, p);  /* the parent's cache is intact */
    assert_int_equal(cuMemFreeHost(q), CUDA_SUCCESS);
}

static int exit_with_host_blocks(void)
{
    setup(NULL);
    void *p = NULL;
    for (int i = 0; i < 4; i++)
        if (cuMemAllocHost(&p, 4 * KiB) != CUDA_SUCCESS || cuMemFreeHost(p) != CUDA_SUCCESS)
            return 1;
    /* pooled: one 6 MiB block takes two chunks, and the trim gives both back */
    CUdeviceptr d;
    if (cuMemAlloc(&d, 5 * MiB + 1) != CUDA_SUCCESS || cuMemFree(d) != CUDA_SUCCESS)
        return 2;
    shim_trim();
    exit(0);
}

/* The exit table has a column for pinned host memory, and no negative count anywhere. */
static void test_exit_table_host_column(void **state)
{
    (void)state;
    char err[16384];
    const char *env[] = {"CACHESHIM_STATS", "1", NULL};
    assert_int_equal(shim_run_self("test_paths", "exit-host", env, err, sizeof err), 0);
    assert_non_null(strstr(err, "cacheshim: statistics            pinned host\n"
                                "cacheshim:   requests                      4\n"
                                "cacheshim:   hit rate                  75.0%\n"));
    assert_non_null(strstr(err, "cacheshim:   driver calls saved            6\n"
                                "cacheshim:   est. time saved               -\n"));
    assert_non_null(strstr(err, "cacheshim:   driver calls saved         0\n"
                                "cacheshim:   est. time saved         0 us\n"));  /* device */
    for (const char *m = strstr(err, " -"); m; m = strstr(m + 1, " -"))
        assert_false(m[2] >= '0' && m[2] <= '9');  /* no negative number anywhere */
}

static uint64_t cs_test_host_total(void)
{
    return (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
}

static int cap_tiny(void)
{
    setup(NULL);
    CUdeviceptr p;
    return cuMemAlloc(&p, 64 * MiB) == CUDA_SUCCESS ? 0 : 1;
}

/* A cap in percent that comes to less than one allocation on the device: no cap there, and
 * a line that says so; the same for pinned memory. */
static void test_cap_percent_too_small(void **state)
{
    (void)state;
    char err[8192];
    const char *env[] = {"CACHESHIM_CAP", "0.5%", "FAKE_CUDA_DEVICE_BYTES", "268435456",
                         "CACHESHIM_HOST_CAP", "0.000001%", NULL};
    assert_int_equal(shim_run_self("test_paths", "cap-tiny", env, err, sizeof err), 0);
    assert_non_null(strstr(err, "cacheshim: CACHESHIM_CAP (0.5% of device memory) is 1.28 MiB "
                                "for device 0, less than one allocation (2.00 MiB): no cap "
                                "there\n"));
    /* 0.000001% of the machine's memory: less than 4 KiB below 400 GB */
    if (cs_test_host_total() < (400ull << 30))
        assert_non_null(strstr(err, "cacheshim: CACHESHIM_HOST_CAP (0.000001% of the machine's "
                                    "memory) is "));
    if (cs_test_host_total() < (400ull << 30))
        assert_non_null(strstr(err, "for pinned host memory, less than one allocation "
                                    "(4.00 KiB): no cap there\n"));
}

/* ================================================================ the host cap */

static void test_host_cap(void **state)
{
    (void)state;
    void *a = NULL, *b = NULL, *c = NULL;
    assert_int_equal(cuMemAllocHost(&a, 32 * KiB), CUDA_SUCCESS);
    assert_int_equal(cuMemAllocHost(&b, 32 * KiB), CUDA_SUCCESS);
    fake_reset_counters();
    assert_int_equal(cuMemAllocHost(&c, 32 * KiB), CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(fake_calls("cuMemHostAlloc"), 0);  /* refused before the driver */
    cacheshim_stats st = host_stats();
    assert_int_equal(st.cap_bytes, 64 * KiB);
    assert_int_equal(st.cap_refusals, 1);
    /* a different size makes room by giving an idle block back */
    assert_int_equal(cuMemFreeHost(b), CUDA_SUCCESS);
    assert_int_equal(cuMemAllocHost(&c, 16 * KiB), CUDA_SUCCESS);
    assert_int_equal(fake_calls("cuMemFreeHost"), 1);
    assert_int_equal(cuMemFreeHost(c), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(a), CUDA_SUCCESS);
    /* the device is not capped by it */
    must_free(must_alloc(64 * MiB));
}

static int host_cap_report(void)
{
    setup(NULL);
    void *a = NULL;
    if (cuMemAllocHost(&a, 48 * KiB) != CUDA_SUCCESS)
        return 1;
    return cuMemAllocHost(&a, 32 * KiB) == CUDA_ERROR_OUT_OF_MEMORY ? 0 : 2;
}

static void test_host_cap_report_line(void **state)
{
    (void)state;
    char err[8192];
    const char *env[] = {"CACHESHIM_VERBOSE", "1", "CACHESHIM_HOST_RELEASE_THRESHOLD", "1M",
                         NULL};
    assert_int_equal(shim_run_self("test_paths", "host-cap-report", env, err, sizeof err), 0);
    assert_non_null(strstr(err, "cacheshim: CACHESHIM_HOST_CAP = 64 KiB (set)\n"));
    assert_non_null(strstr(err, "cacheshim: CACHESHIM_HOST_RELEASE_THRESHOLD (1 MiB) is above "
                                "CACHESHIM_HOST_CAP (64 KiB) for pinned host memory: the cap "
                                "gives idle memory back first, and the threshold never acts\n"));
    assert_non_null(strstr(err, "cacheshim: pinned host allocation of 32.0 KiB failed: it would "
                                "exceed CACHESHIM_HOST_CAP; in use 48.0 KiB, cached 0 B, cap "
                                "64.0 KiB\n"));
}

/* ================================================================ device paths under the cap */

static uint64_t outside(void)
{
    return shim_stats(0).bytes_outside;
}

/* cuMemAllocPitch: charged at the pitch the driver chose, refused at the cap without a driver
 * call, uncharged by cuMemFree. */
static void test_pitch_counted(void **state)
{
    (void)state;
    CUdeviceptr p[4];
    size_t pitch = 0;
    for (int i = 0; i < 4; i++) {
        assert_int_equal(cuMemAllocPitch(&p[i], &pitch, 1000, 16 * KiB, 4), CUDA_SUCCESS);
        assert_int_equal(pitch, 1024);
    }
    assert_int_equal(outside(), 64 * MiB);
    fake_reset_counters();
    CUdeviceptr q;
    assert_int_equal(cuMemAllocPitch(&q, &pitch, 512, 1, 4), CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(fake_calls("cuMemAllocPitch_v2"), 0);
    assert_int_equal(shim_stats(0).cap_refusals > 0, 1);
    /* the cache is bound by the same cap */
    CUdeviceptr c;
    assert_int_equal(cuMemAlloc(&c, 1 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
    size_t free_b = 1, total_b = 0;
    assert_int_equal(cuMemGetInfo(&free_b, &total_b), CUDA_SUCCESS);
    assert_int_equal(free_b, 0);
    assert_int_equal(total_b, 64 * MiB);
    for (int i = 0; i < 4; i++)
        must_free(p[i]);
    assert_int_equal(outside(), 0);
    assert_int_equal(cuMemGetInfo(&free_b, &total_b), CUDA_SUCCESS);
    assert_int_equal(free_b, 64 * MiB);
}

/* A pitched size past 2^64 (rows too many for the width) is the driver's to refuse: it
 * must not wrap to a small charge, nor make the cache give its idle memory back. */
static void test_pitch_overflow_passes_to_driver(void **state)
{
    (void)state;
    must_free(must_alloc(8 * MiB));  /* idle, cached */
    uint64_t cached = shim_stats(0).bytes_cached;
    assert_true(cached >= 8 * MiB);
    fake_reset_counters();
    CUdeviceptr p;
    size_t pitch;
    assert_int_equal(cuMemAllocPitch(&p, &pitch, 1, 1ull << 60, 4), CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(cuMemAllocPitch(&p, &pitch, 100, SIZE_MAX / 300, 4),
                     CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(fake_calls("cuMemAllocPitch_v2"), 2);  /* once each: no retry */
    assert_int_equal(shim_stats(0).bytes_cached, cached);
    assert_int_equal(outside(), 0);
    shim_trim();
}

/* A pitch wider than the estimate charges the difference, which here takes idle cached
 * memory back to the driver, slowly: meanwhile another thread's free of memory outside the
 * cache must not wait for it (no lock is held across a driver call that can block). */
static CUdeviceptr wide;
static size_t wide_pitch;
static CUresult wide_rc;
static void *alloc_wide(void *arg)
{
    (void)arg;
    wide_rc = cuCtxSetCurrent(primary);
    if (wide_rc == CUDA_SUCCESS)  /* 4 MiB estimated */
        wide_rc = cuMemAllocPitch(&wide, &wide_pitch, 1000, 4096, 4);
    return NULL;
}

static double seconds_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

static void test_pitch_adjust_does_not_block_frees(void **state)
{
    (void)state;
    const char *backend = getenv("CACHESHIM_BACKEND");
    bool classic = backend && !strcmp(backend, "classic");
    shim_trim();
    assert_int_equal(outside(), 0);
    must_free(must_alloc(52 * MiB));  /* idle: 52 held */
    /* 8 more outside the cache, freed by a call the slow one is not. */
    CUdeviceptr m = 0;
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    if (classic)
        assert_int_equal(cuMemCreate(&h, 8 * MiB, &prop, 0), CUDA_SUCCESS);
    else
        assert_int_equal(cuMemAllocManaged(&m, 8 * MiB, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    /* The driver pads rows to 2 KiB: 8 MiB, 4 more than estimated, over the cap of 64 with
     * the cache's 52: some idle memory goes back, by the slow call. */
    fake_set_pitch_alignment(2048);
    const char *slow = classic ? "cuMemFree_v2" : "cuMemUnmap";
    fake_set_delay_ns(slow, 1000000000ull);
    long before = fake_calls(slow);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, alloc_wide, NULL), 0);
    /* Until the other thread is in the slow call (counted as it enters, before its delay);
     * 20 s at most. */
    struct timespec pause = {0, 1000000}, t0, start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (fake_calls(slow) == before && seconds_since(&start) < 20)
        nanosleep(&pause, NULL);
    assert_true(fake_calls(slow) > before);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(classic ? cuMemRelease(h) : cuMemFree(m), CUDA_SUCCESS);
    double took = seconds_since(&t0);
    fake_set_delay_ns(slow, 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    fake_set_pitch_alignment(512);
    assert_int_equal(wide_rc, CUDA_SUCCESS);
    assert_int_equal(wide_pitch, 2048);
    assert_int_equal(outside(), 8 * MiB);
    must_free(wide);
    assert_int_equal(outside(), 0);
    /* 40 MiB estimated, 80 padded: past the cap, given back to the driver. */
    long live = fake_live_allocations();
    fake_set_pitch_alignment(2048);
    assert_int_equal(cuMemAllocPitch(&wide, &wide_pitch, 1000, 40960, 4),
                     CUDA_ERROR_OUT_OF_MEMORY);
    fake_set_pitch_alignment(512);
    assert_int_equal(fake_live_allocations(), live);
    assert_int_equal(outside(), 0);
    if (took > 0.5)
        fail_msg("the free waited %.2f s for the other thread's driver call", took);
}

/* cuMemAllocManaged, through cuGetProcAddress as cudart finds it; the cache's idle memory
 * goes back to the driver to make room under the cap. */
static void test_managed_counted_and_makes_room(void **state)
{
    (void)state;
    must_free(must_alloc(40 * MiB));  /* 40 MiB idle in the cache */
    CUresult (*managed)(CUdeviceptr *, size_t, unsigned) =
        (CUresult(*)(CUdeviceptr *, size_t, unsigned))proc("cuMemAllocManaged", 0);
    assert_ptr_equal((void *)managed, dlsym(RTLD_DEFAULT, "cuMemAllocManaged"));
    CUdeviceptr m;
    assert_int_equal(managed(&m, 48 * MiB, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(outside(), 48 * MiB);
    assert_true(shim_stats(0).bytes_cached <= 16 * MiB);
    CUdeviceptr n;
    assert_int_equal(managed(&n, 17 * MiB, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(managed(&n, 1 * MiB, 7), CUDA_ERROR_INVALID_VALUE);  /* the driver's */
    assert_int_equal(outside(), 48 * MiB);
    must_free(m);
    assert_int_equal(outside(), 0);
}

/* Stream-ordered memory: counted until cuMemFreeAsync (or cuMemFree); the work they put on
 * the stream is seen as other work is. */
static void test_async_counted(void **state)
{
    (void)state;
    CUstream s;
    assert_int_equal(cuStreamCreate(&s, 0), CUDA_SUCCESS);
    CUdeviceptr a, b, c;
    assert_int_equal(cuMemAllocAsync(&a, 32 * MiB, s), CUDA_SUCCESS);
    CUresult (*from_pool)(CUdeviceptr *, size_t, CUmemoryPool, CUstream) =
        (CUresult(*)(CUdeviceptr *, size_t, CUmemoryPool, CUstream))proc(
            "cuMemAllocFromPoolAsync", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    assert_ptr_equal((void *)from_pool, dlsym(RTLD_DEFAULT, "cuMemAllocFromPoolAsync_ptsz"));
    CUmemoryPool pool;
    assert_int_equal(cuDeviceGetDefaultMemPool(&pool, 0), CUDA_SUCCESS);
    assert_int_equal(from_pool(&b, 32 * MiB, pool, s), CUDA_SUCCESS);
    assert_int_equal(outside(), 64 * MiB);
    fake_reset_counters();
    assert_int_equal(cuMemAllocAsync(&c, 1, s), CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(fake_calls("cuMemAllocAsync"), 0);
    assert_int_equal(cuMemFreeAsync(a, s), CUDA_SUCCESS);
    assert_int_equal(outside(), 32 * MiB);
    assert_int_equal(cuMemFree(b), CUDA_SUCCESS);  /* freed the synchronous way */
    assert_int_equal(outside(), 0);
    /* a cache block freed on a stream stays the cache's */
    CUdeviceptr blk = must_alloc(2 * MiB);
    assert_int_equal(cuMemFreeAsync(blk, s), CUDA_SUCCESS);
    assert_int_equal(must_alloc(2 * MiB), blk);
    must_free(blk);
    assert_int_equal(cuMemFreeAsync(blk, s), CUDA_ERROR_INVALID_VALUE);  /* double free */
    assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);
}

/* "The specified memory pool may be from a device different than that of the specified
 * hStream" (cuda.h, cuMemAllocFromPoolAsync), or the host's: its memory is charged to the
 * pool's device, under that device's cap, and a host pool's to none. Two devices, each capped
 * at 64 MiB; the stream is device 0's. */
static void test_pool_of_another_device(void **state)
{
    (void)state;
    CUstream s;
    assert_int_equal(cuStreamCreate(&s, 0), CUDA_SUCCESS);
    CUmemoryPool def0, def1, made1, host;
    assert_int_equal(cuDeviceGetDefaultMemPool(&def0, 0), CUDA_SUCCESS);
    assert_int_equal(cuDeviceGetDefaultMemPool(&def1, 1), CUDA_SUCCESS);
    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                            .location = {CU_MEM_LOCATION_TYPE_DEVICE, 1}};
    assert_int_equal(cuMemPoolCreate(&made1, &props), CUDA_SUCCESS);
    props.location = (CUmemLocation){CU_MEM_LOCATION_TYPE_HOST, 0};
    assert_int_equal(cuMemPoolCreate(&host, &props), CUDA_SUCCESS);
    CUdeviceptr a, b, c, x;
    /* Device 1 holds nothing through the shim yet: its memory is not counted (as cuMemCreate's
     * there), and not on device 0 either. */
    assert_int_equal(cuMemAllocFromPoolAsync(&x, 8 * MiB, def1, s), CUDA_SUCCESS);
    assert_int_equal(outside(), 0);
    assert_int_equal(cuMemFreeAsync(x, s), CUDA_SUCCESS);
    /* Now it does (a block of its primary context's). */
    CUdevice d1;
    CUcontext c1;
    assert_int_equal(cuDeviceGet(&d1, 1), CUDA_SUCCESS);
    assert_int_equal(cuDevicePrimaryCtxRetain(&c1, d1), CUDA_SUCCESS);
    assert_int_equal(cuCtxPushCurrent(c1), CUDA_SUCCESS);
    must_free(must_alloc(1 * MiB));
    assert_int_equal(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
    assert_int_equal(cuMemAllocFromPoolAsync(&a, 40 * MiB, def1, s), CUDA_SUCCESS);
    assert_int_equal(fake_device_used(1) >= 40 * MiB, 1);
    assert_int_equal(outside(), 0);
    assert_int_equal(shim_stats(1).bytes_outside, 40 * MiB);
    x = must_alloc(48 * MiB);  /* device 0's cap has its room */
    must_free(x);
    /* Device 1's cap holds the pool's memory: refused without a driver call, then room. */
    fake_reset_counters();
    assert_int_equal(cuMemAllocFromPoolAsync(&b, 32 * MiB, made1, s), CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(fake_calls("cuMemAllocFromPoolAsync"), 0);
    assert_int_equal(cuMemAllocFromPoolAsync(&b, 16 * MiB, made1, s), CUDA_SUCCESS);
    assert_int_equal(shim_stats(1).bytes_outside, 56 * MiB);
    /* A host pool's memory is no device's: more than a cap, counted nowhere. */
    assert_int_equal(cuMemAllocFromPoolAsync(&c, 80 * MiB, host, s), CUDA_SUCCESS);
    assert_int_equal(outside(), 0);
    assert_int_equal(shim_stats(1).bytes_outside, 56 * MiB);
    assert_int_equal(cuMemFreeAsync(a, s), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(b), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeAsync(c, s), CUDA_SUCCESS);
    assert_int_equal(shim_stats(1).bytes_outside, 0);
    /* The stream's own device's pool, as before; and a destroyed pool's handle is forgotten. */
    assert_int_equal(cuMemAllocFromPoolAsync(&a, 8 * MiB, def0, s), CUDA_SUCCESS);
    assert_int_equal(outside(), 8 * MiB);
    assert_int_equal(cuMemFreeAsync(a, s), CUDA_SUCCESS);
    assert_int_equal(outside(), 0);
    assert_int_equal(cuMemPoolDestroy(made1), CUDA_SUCCESS);
    assert_int_equal(cuMemPoolDestroy(host), CUDA_SUCCESS);
    assert_int_equal(cuMemAllocFromPoolAsync(&a, 8 * MiB, made1, s), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(outside(), 0);
    assert_int_equal(shim_stats(1).bytes_outside, 0);
    assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);
    assert_int_equal(cuDevicePrimaryCtxRelease(d1), CUDA_SUCCESS);
}

/* cuMemCreate of the program is counted until cuMemRelease; the pooled backend's own
 * cuMemCreate calls are its blocks, counted once. */
static void test_create_counted_once(void **state)
{
    (void)state;
    shim_trim();
    CUdeviceptr blk = must_alloc(4 * MiB);
    assert_int_equal(outside(), 0);
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle h1, h2;
    assert_int_equal(cuMemCreate(&h1, 32 * MiB, &prop, 0), CUDA_SUCCESS);
    assert_int_equal(outside(), 32 * MiB);
    assert_int_equal(cuMemCreate(&h2, 30 * MiB, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
    must_free(blk);  /* idle now: the cap takes it back for the program's call */
    assert_int_equal(cuMemCreate(&h2, 30 * MiB, &prop, 0), CUDA_SUCCESS);
    assert_int_equal(outside(), 62 * MiB);
    assert_int_equal(cuMemRelease(h1), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h2), CUDA_SUCCESS);
    assert_int_equal(outside(), 0);
    assert_int_equal(cuMemRelease(h2), CUDA_ERROR_INVALID_VALUE);  /* the driver's answer */
}

/* cuMemRelease of a handle still mapped frees nothing: the memory stays until its last
 * mapping goes (and its last reference: cuMemRetainAllocationHandle takes one more), and
 * stays counted until then. */
static void test_create_released_while_mapped(void **state)
{
    (void)state;
    shim_trim();
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle h, again;
    CUdeviceptr va, p;
    uint64_t used = fake_device_used(0);
    assert_int_equal(cuMemCreate(&h, 32 * MiB, &prop, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressReserve(&va, 64 * MiB, 0, 0, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemMap(va, 16 * MiB, 0, h, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemMap(va + 32 * MiB, 32 * MiB, 0, h, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);  /* as the CUDA samples do */
    assert_int_equal(fake_device_used(0), used + 32 * MiB);
    assert_int_equal(outside(), 32 * MiB);
    assert_int_equal(cuMemAlloc(&p, 40 * MiB), CUDA_ERROR_OUT_OF_MEMORY);  /* 32 + 40 > 64 */
    assert_int_equal(cuMemUnmap(va, 16 * MiB), CUDA_SUCCESS);
    assert_int_equal(outside(), 32 * MiB);  /* one mapping left */
    /* One more reference, from the address: two releases to go. */
    assert_int_equal(cuMemRetainAllocationHandle(&again, (void *)(va + 32 * MiB)), CUDA_SUCCESS);
    assert_int_equal(cuMemUnmap(va + 32 * MiB, 32 * MiB), CUDA_SUCCESS);
    assert_int_equal(outside(), 32 * MiB);
    assert_int_equal(fake_device_used(0), used + 32 * MiB);
    assert_int_equal(cuMemRelease(again), CUDA_SUCCESS);
    assert_int_equal(fake_device_used(0), used);
    assert_int_equal(outside(), 0);
    assert_int_equal(cuMemAddressFree(va, 64 * MiB), CUDA_SUCCESS);
    /* A handle the program retains and releases while it holds its own: counted until both
     * are released. */
    assert_int_equal(cuMemCreate(&h, 32 * MiB, &prop, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressReserve(&va, 32 * MiB, 0, 0, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemMap(va, 32 * MiB, 0, h, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemRetainAllocationHandle(&again, (void *)va), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(again), CUDA_SUCCESS);
    assert_int_equal(cuMemUnmap(va, 32 * MiB), CUDA_SUCCESS);
    assert_int_equal(outside(), 32 * MiB);
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(outside(), 0);
    assert_int_equal(fake_device_used(0), used);
    /* cudart finds the same wrappers. */
    assert_ptr_equal(proc("cuMemMap", 0), dlsym(RTLD_DEFAULT, "cuMemMap"));
    assert_ptr_equal(proc("cuMemUnmap", 0), dlsym(RTLD_DEFAULT, "cuMemUnmap"));
    assert_ptr_equal(proc("cuMemRetainAllocationHandle", 0),
                     dlsym(RTLD_DEFAULT, "cuMemRetainAllocationHandle"));
    /* Failed calls change nothing. */
    assert_int_equal(cuMemMap(va, 32 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemUnmap(va, 32 * MiB), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(outside(), 0);
    assert_int_equal(cuMemAddressFree(va, 32 * MiB), CUDA_SUCCESS);
}

/* The driver may hand a freed pointer's address to another thread's allocation before the
 * free's thread has forgotten the pointer: here, at once, from a host function that the
 * free's wait for the context's work completes (the fake runs it as the free returns, with
 * the memory already given back). Each allocation must stay counted until its own free. */
static CUdeviceptr reused;
static CUresult reused_rc;
static void CUDA_CB alloc_in_free(void *arg)
{
    reused_rc = cuMemAllocManaged(&reused, (size_t)(uintptr_t)arg, CU_MEM_ATTACH_GLOBAL);
}

static void test_outside_address_reused_during_free(void **state)
{
    (void)state;
    CUstream s;
    assert_int_equal(cuStreamCreate(&s, 0), CUDA_SUCCESS);
    for (int path = 0; path < 2; path++) {
        CUdeviceptr a;
        reused = 0;
        if (path == 0)
            assert_int_equal(cuMemAllocManaged(&a, 16 * MiB, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
        else
            assert_int_equal(cuMemAllocAsync(&a, 16 * MiB, s), CUDA_SUCCESS);
        assert_int_equal(outside(), 16 * MiB);
        assert_int_equal(cuLaunchHostFunc(s, alloc_in_free, (void *)(uintptr_t)(16 * MiB)),
                         CUDA_SUCCESS);
        assert_int_equal(path == 0 ? cuMemFree(a) : cuMemFreeAsync(a, s), CUDA_SUCCESS);
        assert_int_equal(reused_rc, CUDA_SUCCESS);
        if (reused != a)
            fail_msg("the fake did not give the address again (%llx, %llx): the case is not "
                     "shown", (unsigned long long)a, (unsigned long long)reused);
        assert_int_equal(outside(), 16 * MiB);  /* the new allocation's */
        assert_int_equal(cuMemFree(reused), CUDA_SUCCESS);
        assert_int_equal(outside(), 0);
    }
    assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);
}

/* A free or release the driver refuses keeps the memory counted, and a later one that
 * succeeds uncounts it once. */
static void test_outside_free_refused_stays_counted(void **state)
{
    (void)state;
    CUstream s;
    assert_int_equal(cuStreamCreate(&s, 0), CUDA_SUCCESS);
    CUdeviceptr m, a;
    assert_int_equal(cuMemAllocManaged(&m, 8 * MiB, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(cuMemAllocAsync(&a, 8 * MiB, s), CUDA_SUCCESS);
    fake_fail_nth("cuMemFree_v2", 1, CUDA_ERROR_UNKNOWN);
    assert_int_equal(cuMemFree(m), CUDA_ERROR_UNKNOWN);
    fake_fail_nth("cuMemFreeAsync", 1, CUDA_ERROR_UNKNOWN);
    assert_int_equal(cuMemFreeAsync(a, s), CUDA_ERROR_UNKNOWN);
    assert_int_equal(outside(), 16 * MiB);
    assert_int_equal(cuMemFree(m), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeAsync(a, s), CUDA_SUCCESS);
    assert_int_equal(outside(), 0);
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemGenericAllocationHandle h;
    assert_int_equal(cuMemCreate(&h, 8 * MiB, &prop, 0), CUDA_SUCCESS);
    fake_fail_nth("cuMemRelease", 1, CUDA_ERROR_UNKNOWN);
    assert_int_equal(cuMemRelease(h), CUDA_ERROR_UNKNOWN);
    assert_int_equal(outside(), 8 * MiB);
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(outside(), 0);
    assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);
}

/* A context's pitched and managed memory goes with it, and off the cap. */
static void test_outside_context_destroyed(void **state)
{
    (void)state;
    CUcontext ctx = new_context();
    CUdeviceptr m;
    assert_int_equal(cuMemAllocManaged(&m, 8 * MiB, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(outside(), 8 * MiB);
    assert_int_equal(cuCtxDestroy(ctx), CUDA_SUCCESS);
    assert_int_equal(outside(), 0);
    assert_int_equal(cuCtxSetCurrent(primary), CUDA_SUCCESS);
}

/* PyTorch's pluggable allocator: blocks of the cache, under the cap, NULL when refused. */
static void test_torch_pluggable(void **state)
{
    (void)state;
    void *(*torch_alloc)(ssize_t, int, void *) =
        (void *(*)(ssize_t, int, void *))dlsym(RTLD_DEFAULT, "cacheshim_torch_alloc");
    void (*torch_free)(void *, ssize_t, int, void *) =
        (void (*)(void *, ssize_t, int, void *))dlsym(RTLD_DEFAULT, "cacheshim_torch_free");
    assert_non_null(torch_alloc);
    assert_non_null(torch_free);
    CUstream s;
    assert_int_equal(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    cacheshim_stats before = shim_stats(0);
    void *p = torch_alloc(3 * MiB, 0, s);
    assert_non_null(p);
    launch(s, (CUdeviceptr)p, 3 * MiB);
    torch_free(p, 3 * MiB, 0, s);
    void *q = torch_alloc(3 * MiB, 0, s);  /* the same block, on the same stream */
    assert_ptr_equal(q, p);
    assert_int_equal(shim_stats(0).hits - before.hits, 1);
    assert_null(torch_alloc(65 * MiB, 0, s));  /* over the cap */
    assert_null(torch_alloc(0, 0, s));
    assert_null(torch_alloc(1 * MiB, 99, s));  /* no such device */
    torch_free(q, 3 * MiB, 0, s);
    torch_free(NULL, 0, 0, s);
    /* from a thread with no context current: the device's primary context */
    assert_int_equal(cuCtxSetCurrent(NULL), CUDA_SUCCESS);
    void *r = torch_alloc(1 * MiB, 0, NULL);
    assert_non_null(r);
    torch_free(r, 1 * MiB, 0, NULL);
    assert_int_equal(cuCtxSetCurrent(primary), CUDA_SUCCESS);
    fake_retire_all();
    assert_int_equal(fake_races(), 0);
    assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);
}

/* ================================================================ out of memory */

/* Out of device memory on any path: the cache's idle memory goes back and the call is retried
 * (the device holds 64 MiB). */
static void test_paths_oom_release_idle(void **state)
{
    (void)state;
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUstream s;
    assert_int_equal(cuStreamCreate(&s, 0), CUDA_SUCCESS);
    for (int path = 0; path < 4; path++) {
        must_free(must_alloc(48 * MiB));  /* idle, cached */
        assert_true(fake_device_used(0) >= 48 * MiB);
        CUdeviceptr p = 0;
        size_t pitch;
        CUmemGenericAllocationHandle h;
        CUresult r = path == 0   ? cuMemAllocPitch(&p, &pitch, 2048, 16 * KiB, 4)
                     : path == 1 ? cuMemAllocManaged(&p, 32 * MiB, CU_MEM_ATTACH_GLOBAL)
                     : path == 2 ? cuMemAllocAsync(&p, 32 * MiB, s)
                                 : cuMemCreate(&h, 32 * MiB, &prop, 0);
        assert_int_equal(r, CUDA_SUCCESS);
        assert_true(fake_device_used(0) < 48 * MiB + 32 * MiB);
        assert_int_equal(path == 3 ? cuMemRelease(h) : cuMemFree(p), CUDA_SUCCESS);
        assert_int_equal(outside(), 0);
    }
    /* more than the device has: the driver's answer */
    CUdeviceptr p;
    assert_int_equal(cuMemAllocManaged(&p, 65 * MiB, CU_MEM_ATTACH_GLOBAL),
                     CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(outside(), 0);
    assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);
}

/* ================================================================ disabled */

static void test_disabled_passes_paths(void **state)
{
    (void)state;
    fake_reset_counters();
    void *h = NULL;
    assert_int_equal(cuMemAllocHost(&h, 4 * KiB), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(h), CUDA_SUCCESS);
    assert_int_equal(cuMemAllocHost(&h, 4 * KiB), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(h), CUDA_SUCCESS);
    assert_int_equal(fake_calls("cuMemAllocHost_v2"), 2);
    assert_int_equal(fake_calls("cuMemFreeHost"), 2);
    CUdeviceptr m;
    assert_int_equal(cuMemAllocManaged(&m, 1 * MiB, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(m), CUDA_SUCCESS);
    int (*get)(cacheshim_stats *, size_t) =
        (int (*)(cacheshim_stats *, size_t))dlsym(RTLD_DEFAULT, "cacheshim_get_host_stats");
    cacheshim_stats st;
    assert_int_equal(get(&st, sizeof st), -1);
    void *(*torch_alloc)(ssize_t, int, void *) =
        (void *(*)(ssize_t, int, void *))dlsym(RTLD_DEFAULT, "cacheshim_torch_alloc");
    void (*torch_free)(void *, ssize_t, int, void *) =
        (void (*)(void *, ssize_t, int, void *))dlsym(RTLD_DEFAULT, "cacheshim_torch_free");
    void *p = torch_alloc(1 * MiB, 0, NULL);  /* the driver's memory, still usable */
    assert_non_null(p);
    torch_free(p, 1 * MiB, 0, NULL);
    assert_int_equal(fake_calls("cuMemAlloc_v2"), 1);
    assert_int_equal(fake_calls("cuMemFree_v2"), 2);
}

/* ================================================================ groups */

#define T(fn) cmocka_unit_test(fn)

int main(int argc, char **argv)
{
    const char *group = argc > 1 ? argv[1] : "";
    if (!strcmp(group, "exit-host"))
        return exit_with_host_blocks();
    if (!strcmp(group, "host-cap-report"))
        return host_cap_report();
    if (!strcmp(group, "cap-tiny"))
        return cap_tiny();

    const struct CMUnitTest host[] = {T(test_host_paths_are_wrapped), T(test_host_flags_kept_apart),
                                      T(test_host_block_waits_for_its_copy),
                                      T(test_host_block_waits_for_other_context_copy),
                                      T(test_host_foreign_and_double_frees),
                                      T(test_host_statistics), T(test_host_oom_releases_idle),
                                      T(test_host_context_destroyed),
                                      T(test_host_without_context),
                                      T(test_host_threads), T(test_host_fork),
                                      T(test_exit_table_host_column),
                                      T(test_cap_percent_too_small)};
    const struct CMUnitTest host_cap[] = {T(test_host_cap), T(test_host_cap_report_line)};
    const struct CMUnitTest device_cap[] = {T(test_pitch_counted),
                                            T(test_pitch_overflow_passes_to_driver),
                                            T(test_pitch_adjust_does_not_block_frees),
                                            T(test_managed_counted_and_makes_room),
                                            T(test_async_counted), T(test_create_counted_once),
                                            T(test_create_released_while_mapped),
                                            T(test_outside_address_reused_during_free),
                                            T(test_outside_free_refused_stays_counted),
                                            T(test_outside_context_destroyed),
                                            T(test_torch_pluggable)};
    const struct CMUnitTest pool_devices[] = {T(test_pool_of_another_device)};
    const struct CMUnitTest oom[] = {T(test_paths_oom_release_idle)};
    const struct CMUnitTest disabled[] = {T(test_disabled_passes_paths)};

#define GROUP(name, tests) \
    if (!strcmp(group, name)) \
        return _cmocka_run_group_tests(name, tests, sizeof tests / sizeof tests[0], setup, NULL);
    GROUP("host", host)
    GROUP("host-cap", host_cap)
    GROUP("device-cap", device_cap)
    GROUP("paths-oom", oom)
    GROUP("pool-devices", pool_devices)
    GROUP("paths-disabled", disabled)
    fprintf(stderr, "test_paths: unknown group '%s'\n", group);
    return 2;
}
