/* Integration tests: this program runs under LD_PRELOAD=libcacheshim.so against the fake
 * driver (tests/fake), and reaches the driver the ways real programs do. argv[1] picks the
 * group; meson runs each group in its own process with its own CACHESHIM_* variables. */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "shim_util.h"

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*gpa2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa1_fn)(const char *, void **, int, cuuint64_t);

int cs_next_from_a(void);
int cs_next_b_present(void);
int cu_next_probe_from_a(void);

static CUcontext primary;
static void *libcuda;

static int setup(void **state)
{
    (void)state;
    CUdevice dev;
    assert_int_equal(cuInit(0), CUDA_SUCCESS);
    assert_int_equal(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    assert_int_equal(cuDevicePrimaryCtxRetain(&primary, dev), CUDA_SUCCESS);
    assert_int_equal(cuCtxSetCurrent(primary), CUDA_SUCCESS);
    libcuda = dlopen("libcuda.so.1", RTLD_NOW);
    assert_non_null(libcuda);
    return 0;
}

/* Found at run time, as the header recommends: the shim is preloaded, not linked. */
static int get_stats(int device, cacheshim_stats *out, size_t size)
{
    int (*fn)(int, cacheshim_stats *, size_t) =
        (int (*)(int, cacheshim_stats *, size_t))dlsym(RTLD_DEFAULT, "cacheshim_get_stats");
    return fn ? fn(device, out, size) : -2;
}

static cacheshim_stats stats(int device)
{
    return shim_stats(device);
}

/* The fake driver's own function, past the shim. */
static void *real_fn(const char *name)
{
    return fake_real_symbol(name);
}

/* ================================================================ paths */

/* The shim runs the backend its environment asks for (shim_util.h): a pooled block is
 * physical memory mapped into a span of an arena (the context's first block reserves the
 * arena; its chunks of a granule each are mapped, access set once over the block), a classic
 * block one cuMemAlloc; never both. The driver tells them apart too. */
static void test_backend_as_configured(void **state)
{
    (void)state;
    fake_reset_counters();
    CUdeviceptr p = must_alloc(5 * MiB + 1);  /* 6 MiB: three granules */
    /* Either backend's block can be exported (the shim exports a pooled one itself). */
    unsigned ipc = 2;
    assert_int_equal(cuPointerGetAttribute(&ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                           p),
                     CUDA_SUCCESS);
    assert_int_equal(ipc, 1);
    if (shim_pooled()) {
        assert_int_equal(fake_calls("cuMemAlloc_v2"), 0);
        assert_int_equal(fake_calls("cuMemCreate"), 3);  /* a chunk per granule */
        assert_int_equal(fake_calls("cuMemAddressReserve"), 1);  /* the arena */
        assert_int_equal(fake_calls("cuMemMap"), 3);
        assert_int_equal(fake_calls("cuMemSetAccess"), 1);
        assert_int_equal(fake_vmm_allocations(), 3);
        assert_int_equal(fake_vmm_reservations(), 1);
    } else {
        assert_int_equal(fake_calls("cuMemAlloc_v2"), 1);
        assert_int_equal(fake_calls("cuMemCreate"), 0);
        assert_int_equal(fake_calls("cuMemAddressReserve"), 0);
        assert_int_equal(fake_vmm_allocations(), 0);
    }
    assert_int_equal(fake_device_used(0), 6 * MiB);
    must_free(p);
}

static void test_direct_binding_is_cached(void **state)
{
    (void)state;
    shim_trim();  /* nothing cached: the first allocation takes new memory */
    cacheshim_stats before = stats(0);
    fake_reset_counters();
    for (int i = 0; i < 100; i++)
        must_free(must_alloc(1 * MiB));
    assert_int_equal(driver_allocs(), 1);
    assert_int_equal(driver_frees(), 0);
    assert_int_equal(stats(0).hits - before.hits, 99);
}

static void test_dlsym_path_gets_wrapper(void **state)
{
    (void)state;
    alloc_fn a = (alloc_fn)dlsym(libcuda, "cuMemAlloc_v2");
    free_fn f = (free_fn)dlsym(libcuda, "cuMemFree_v2");
    assert_non_null(a);
    assert_ptr_equal((void *)a, dlsym(RTLD_DEFAULT, "cuMemAlloc_v2")); /* the shim's */
    assert_ptr_not_equal((void *)a, real_fn("cuMemAlloc_v2"));
    fake_reset_counters();
    for (int i = 0; i < 50; i++) {
        CUdeviceptr p;
        assert_int_equal(a(&p, 3000), CUDA_SUCCESS);
        assert_int_equal(f(p), CUDA_SUCCESS);
    }
    assert_true(driver_allocs() <= 1);
    /* Unwrapped names come back as the driver's own; work entry points as the shim's. */
    assert_ptr_equal(dlsym(libcuda, "cuStreamQuery"), real_fn("cuStreamQuery"));
    assert_ptr_equal(dlsym(libcuda, "cuMemsetD8_v2"), dlsym(RTLD_DEFAULT, "cuMemsetD8_v2"));
    assert_ptr_not_equal(dlsym(libcuda, "cuMemsetD8_v2"), real_fn("cuMemsetD8_v2"));
}

static void test_get_proc_address_paths(void **state)
{
    (void)state;
    /* What cudart does: dlsym cuGetProcAddress_v2, ask it for "cuGetProcAddress", use that. */
    gpa2_fn gpa = (gpa2_fn)dlsym(libcuda, "cuGetProcAddress_v2");
    assert_non_null(gpa);
    CUdriverProcAddressQueryResult st;
    void *self = NULL;
    assert_int_equal(gpa("cuGetProcAddress", &self, 13000, 0, &st), CUDA_SUCCESS);
    assert_ptr_equal(self, dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2"));
    gpa2_fn gpa2 = (gpa2_fn)self;

    void *p = NULL;
    assert_int_equal(gpa2("cuMemAlloc", &p, 13000, 0, &st), CUDA_SUCCESS);
    assert_int_equal(st, CU_GET_PROC_ADDRESS_SUCCESS);
    assert_ptr_equal(p, (void *)dlsym(libcuda, "cuMemAlloc_v2")); /* one wrapper per entry */
    assert_int_equal(gpa2("cuMemFree", &p, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st), CUDA_SUCCESS);
    assert_ptr_equal(p, (void *)dlsym(libcuda, "cuMemFree_v2"));
    assert_int_equal(gpa2("cuMemGetInfo", &p, 13000, 0, &st), CUDA_SUCCESS);
    assert_ptr_equal(p, dlsym(RTLD_DEFAULT, "cuMemGetInfo_v2"));
    assert_int_equal(gpa2("cuStreamDestroy", &p, 13000, 0, &st), CUDA_SUCCESS);
    assert_ptr_equal(p, dlsym(RTLD_DEFAULT, "cuStreamDestroy_v2"));
    /* Per-thread default stream variants. */
    assert_int_equal(gpa2("cuStreamBeginCapture", &p, 13000,
                          CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st), CUDA_SUCCESS);
    assert_ptr_equal(p, dlsym(RTLD_DEFAULT, "cuStreamBeginCapture_v2_ptsz"));
    assert_int_equal(gpa2("cuStreamBeginCapture", &p, 13000,
                          CU_GET_PROC_ADDRESS_LEGACY_STREAM, &st), CUDA_SUCCESS);
    assert_ptr_equal(p, dlsym(RTLD_DEFAULT, "cuStreamBeginCapture_v2"));
    /* A per-thread request for an entry point without such a variant: the plain wrapper. */
    assert_int_equal(gpa2("cuMemAlloc", &p, 13000,
                          CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st), CUDA_SUCCESS);
    assert_ptr_equal(p, dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
    /* Work on streams, generated wrappers: each variant its own. */
    assert_int_equal(gpa2("cuMemsetD8", &p, 13000, 0, &st), CUDA_SUCCESS);
    assert_ptr_equal(p, dlsym(RTLD_DEFAULT, "cuMemsetD8_v2"));
    assert_int_equal(gpa2("cuMemsetD8", &p, 13000,
                          CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st), CUDA_SUCCESS);
    assert_ptr_equal(p, dlsym(RTLD_DEFAULT, "cuMemsetD8_v2_ptds"));
    /* Unwrapped and unknown names. */
    assert_int_equal(gpa2("cuStreamQuery", &p, 13000, 0, &st), CUDA_SUCCESS);
    assert_ptr_equal(p, real_fn("cuStreamQuery"));
    p = (void *)1;
    assert_int_equal(gpa2("cuNoSuchThing", &p, 13000, 0, &st), CUDA_ERROR_NOT_FOUND);
    assert_int_equal(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    assert_null(p);
    /* The v1 cuGetProcAddress reaches the same wrappers. */
    gpa1_fn gpa1 = (gpa1_fn)dlsym(libcuda, "cuGetProcAddress");
    assert_non_null(gpa1);
    assert_int_equal(gpa1("cuMemAlloc", &p, 11000, 0), CUDA_SUCCESS);
    assert_ptr_equal(p, dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));

    /* And the pointer from the table caches. */
    alloc_fn a = NULL;
    free_fn f = NULL;
    gpa2("cuMemAlloc", (void **)&a, 13000, 0, &st);
    gpa2("cuMemFree", (void **)&f, 13000, 0, &st);
    fake_reset_counters();
    for (int i = 0; i < 20; i++) {
        CUdeviceptr d;
        assert_int_equal(a(&d, 777), CUDA_SUCCESS);
        assert_int_equal(f(d), CUDA_SUCCESS);
    }
    assert_true(driver_allocs() <= 1);
}

static void test_dlsym_rtld_next_semantics(void **state)
{
    (void)state;
    /* next_a asks for the next cs_next_value after itself: next_b's (2). Were the shim's
     * dlsym not a tail call, glibc would search after the shim and find next_a's own (1). */
    assert_int_equal(cs_next_b_present(), 1);
    assert_int_equal(cs_next_from_a(), 2);
    /* The same for a name the shim's dlsym examines ("cu..."): chaining must still work. */
    assert_int_equal(cu_next_probe_from_a(), 2);
}

/* Streams, fences, stream-ordered reuse and capture: tests/test_streams.c. */

/* ================================================================ frees and queries */

static void test_foreign_double_null_frees(void **state)
{
    (void)state;
    alloc_fn real_alloc = (alloc_fn)real_fn("cuMemAlloc_v2");
    assert_non_null(real_alloc);
    CUdeviceptr foreign;
    assert_int_equal(real_alloc(&foreign, 4096), CUDA_SUCCESS);
    fake_reset_counters();
    assert_int_equal(cuMemFree(foreign), CUDA_SUCCESS);        /* the driver frees it */
    assert_int_equal(fake_calls("cuMemFree_v2"), 1);
    assert_int_equal(cuMemFree(foreign), CUDA_ERROR_INVALID_VALUE); /* driver's answer */
    assert_int_equal(cuMemFree(0), CUDA_SUCCESS); /* the real driver's answer */
    CUdeviceptr p = must_alloc(4096);
    must_free(p);
    assert_int_equal(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);  /* double free of a cached block */
    assert_int_equal(cuMemFree(p + 512), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemAlloc(NULL, 16), CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr z;
    assert_int_equal(cuMemAlloc(&z, 0), CUDA_ERROR_INVALID_VALUE);
    /* The cache still works after all that. */
    must_free(must_alloc(4096));
}

static void test_address_range_is_honest(void **state)
{
    (void)state;
    CUdeviceptr p = must_alloc(1000000);
    CUdeviceptr base;
    size_t size;
    assert_int_equal(cuMemGetAddressRange(&base, &size, p + 100), CUDA_SUCCESS);
    assert_int_equal(base, p);
    assert_int_equal(size, 1000000);  /* what was asked for, not the class size */
    must_free(p);
    assert_int_equal(cuMemGetAddressRange(&base, &size, p), CUDA_ERROR_NOT_FOUND);
    /* Memory works end to end: write and read back. */
    CUdeviceptr q = must_alloc(4096);
    char in[4096], out[4096];
    memset(in, 0x5a, sizeof in);
    assert_int_equal(cuMemcpyHtoD(q, in, sizeof in), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoH(out, q, sizeof out), CUDA_SUCCESS);
    assert_memory_equal(in, out, sizeof in);
    must_free(q);
}

static void test_mem_get_info_uncapped(void **state)
{
    (void)state;
    size_t f0, t0, f1, t1;
    assert_int_equal(cuMemGetInfo(&f0, &t0), CUDA_SUCCESS);
    CUdeviceptr p = must_alloc(64 * MiB);
    assert_int_equal(cuMemGetInfo(&f1, &t1), CUDA_SUCCESS);
    assert_int_equal(t1, t0);
    assert_int_equal(f1, f0 - 64 * MiB);
    must_free(p);  /* cached: the program sees it as free again */
    assert_int_equal(cuMemGetInfo(&f1, &t1), CUDA_SUCCESS);
    assert_int_equal(f1, f0);
}

/* ================================================================ contexts */

static void test_context_destroy_forgets_blocks(void **state)
{
    (void)state;
    CUcontext ctx;
    CUdevice dev;
    cuDeviceGet(&dev, 0);
    assert_int_equal(cuCtxCreate(&ctx, NULL, 0, dev), CUDA_SUCCESS);
    CUdeviceptr a = must_alloc(2 * MiB);
    must_free(a);  /* cached in ctx */
    assert_int_equal(cuCtxDestroy(ctx), CUDA_SUCCESS);
    assert_int_equal(cuCtxSetCurrent(primary), CUDA_SUCCESS);
    CUdeviceptr b = must_alloc(2 * MiB);
    assert_int_equal(cuMemsetD8(b, 1, 2 * MiB), CUDA_SUCCESS);  /* a live pointer */
    must_free(b);
    assert_int_equal(fake_calls_after_teardown(), 0);
}

/* The device memory of a context that is gone is given back, cached or in use, as the driver
 * gives back a context's cuMemAlloc memory: classic, the driver does it; pooled, the shim
 * must, since virtual memory belongs to no context and outlives it. Context after context,
 * nothing accumulates. */
static void test_context_gone_gives_memory_back(void **state)
{
    (void)state;
    CUdevice dev;
    cuDeviceGet(&dev, 0);
    uint64_t used = fake_device_used(0);
    long chunks = fake_vmm_allocations(), reservations = fake_vmm_reservations();
    for (int round = 0; round < 3; round++) {
        CUcontext ctx;
        assert_int_equal(cuCtxCreate(&ctx, NULL, 0, dev), CUDA_SUCCESS);
        CUdeviceptr idle = must_alloc(16 * MiB), busy = must_alloc(8 * MiB);
        CUdeviceptr small = must_alloc(5000);
        must_free(idle);
        launch(NULL, busy, 8 * MiB);  /* work the context's end waits for */
        assert_true(fake_device_used(0) > used);
        (void)small;  /* in use when the context goes, as busy */
        assert_int_equal(cuCtxDestroy(ctx), CUDA_SUCCESS);
        assert_int_equal(fake_device_used(0), used);
        assert_int_equal(fake_vmm_allocations(), chunks);
        assert_int_equal(fake_vmm_reservations(), reservations);
        assert_int_equal(fake_unmap_faults(), 0);
    }
    /* The primary context too. */
    CUdeviceptr held = must_alloc(6 * MiB);
    must_free(must_alloc(10 * MiB));
    (void)held;
    assert_int_equal(cuDevicePrimaryCtxReset(dev), CUDA_SUCCESS);
    assert_int_equal(fake_device_used(0), 0);
    assert_int_equal(fake_vmm_allocations(), 0);
    assert_int_equal(fake_vmm_reservations(), 0);
    assert_int_equal(cuDevicePrimaryCtxRetain(&primary, dev), CUDA_SUCCESS);
    assert_int_equal(cuCtxSetCurrent(primary), CUDA_SUCCESS);
    must_free(must_alloc(6 * MiB));  /* the cache works on */
    assert_int_equal(fake_calls_after_teardown(), 0);
}

static void test_primary_reset_forgets_blocks(void **state)
{
    (void)state;
    CUdevice dev;
    cuDeviceGet(&dev, 0);
    CUdeviceptr a = must_alloc(3 * MiB);
    CUdeviceptr b = must_alloc(3 * MiB);
    must_free(a);
    assert_int_equal(cuDevicePrimaryCtxReset(dev), CUDA_SUCCESS);
    assert_int_equal(cuDevicePrimaryCtxRetain(&primary, dev), CUDA_SUCCESS);
    assert_int_equal(cuCtxSetCurrent(primary), CUDA_SUCCESS);
    CUdeviceptr c = must_alloc(3 * MiB);
    assert_int_equal(cuMemsetD8(c, 2, 3 * MiB), CUDA_SUCCESS);
    must_free(c);
    /* b died with the context: the driver answers for it now. */
    assert_int_equal(cuMemFree(b), CUDA_ERROR_INVALID_VALUE);
    cacheshim_stats s = stats(0);
    assert_int_equal(s.bytes_in_use, 0);
}

/* ================================================================ injected failures */

static void test_driver_errors_pass_through(void **state)
{
    (void)state;
    CUdeviceptr p;
    fake_fail_nth(driver_alloc_call(), 1, CUDA_ERROR_UNKNOWN);
    assert_int_equal(cuMemAlloc(&p, 123 * MiB), CUDA_ERROR_UNKNOWN);
    /* No device for the context: the call goes to the driver unchanged. */
    fake_fail_nth("cuCtxGetCurrent", 1, CUDA_ERROR_INVALID_CONTEXT);
    fake_reset_counters();
    CUdeviceptr c = 0;
    cuMemAlloc(&c, 1 * MiB);
    if (c)
        cuMemFree(c);
    /* Stream creation failing is the driver's answer, as it is. */
    CUstream s;
    fake_fail_nth("cuStreamCreate", 1, CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_ERROR_OUT_OF_MEMORY);
    /* A failing launch is the driver's answer too. */
    CUdeviceptr a = must_alloc(1 * MiB);
    fake_fail_nth("cuLaunchKernel", 1, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
    void *params[] = {&a, &(size_t){1 * MiB}};
    assert_int_equal(cuLaunchKernel(fake_touch_kernel(), 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL),
                     CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
    must_free(a);
}

/* A driver call failing half-way through a pooled block (a later chunk's cuMemCreate, a
 * mapping, the access) fails the allocation with the driver's code and takes back everything
 * done before it: no chunk or mapping is left, the arena stays as it was, and the cache works
 * on. (The arena's reservation is made once, by the context's first pooled block: its
 * failure is test_pool's test_rollback.) Classic: the one cuMemAlloc failing leaves nothing
 * either. */
static void test_failure_half_way_rolls_back(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        long nth;
        CUresult err;
    } pooled_steps[] = {
        {"cuMemCreate", 2, CUDA_ERROR_UNKNOWN},          /* the second of seven chunks */
        {"cuMemCreate", 7, CUDA_ERROR_OUT_OF_MEMORY},    /* the last */
        {"cuMemMap", 3, CUDA_ERROR_NOT_PERMITTED},       /* the third of seven */
        {"cuMemMap", 7, CUDA_ERROR_INVALID_VALUE},       /* the last */
        {"cuMemSetAccess", 1, CUDA_ERROR_INVALID_DEVICE},
    }, classic_steps[] = {
        {"cuMemAlloc_v2", 1, CUDA_ERROR_UNKNOWN},
    };
    bool pooled = shim_pooled();
    int n = pooled ? 5 : 1;
    fake_retire_all();
    shim_trim();  /* no idle memory: the block is all new memory */
    for (int i = 0; i < n; i++) {
        const char *name = pooled ? pooled_steps[i].name : classic_steps[i].name;
        CUresult err = pooled ? pooled_steps[i].err : classic_steps[i].err;
        uint64_t used = fake_device_used(0);
        long allocs = fake_vmm_allocations(), reservations = fake_vmm_reservations();
        long live = fake_live_allocations();
        cacheshim_stats before = stats(0);
        fake_reset_counters();
        fake_fail_nth(name, pooled ? pooled_steps[i].nth : classic_steps[i].nth, err);
        CUdeviceptr p = 0;
        assert_int_equal(cuMemAlloc(&p, 13 * MiB), err);  /* 14 MiB: 7 chunks of a granule */
        assert_int_equal(fake_calls(name), pooled ? pooled_steps[i].nth : 1);
        assert_int_equal(fake_device_used(0), used);
        assert_int_equal(fake_vmm_allocations(), allocs);
        assert_int_equal(fake_vmm_reservations(), reservations);
        assert_int_equal(fake_live_allocations(), live);
        /* Every mapping made was unmapped (the failed call mapped nothing). */
        assert_int_equal(fake_calls("cuMemUnmap"),
                         fake_calls("cuMemMap") - (!strcmp(name, "cuMemMap") ? 1 : 0));
        cacheshim_stats after = stats(0);
        assert_int_equal(after.bytes_in_use, before.bytes_in_use);
        assert_int_equal(after.bytes_cached, before.bytes_cached);
        /* The same request then succeeds and the memory works. */
        p = must_alloc(13 * MiB);
        assert_int_equal(cuMemsetD8(p, 0xa5, 13 * MiB), CUDA_SUCCESS);
        must_free(p);
        shim_trim();
        assert_int_equal(fake_device_used(0), used);
    }
    if (!pooled) {
        assert_int_equal(fake_calls("cuMemCreate"), 0);
        assert_int_equal(fake_calls("cuMemMap"), 0);
    }
}

/* ================================================================ cap, threshold, OOM */

static void test_cap(void **state)
{
    (void)state;
    size_t f, t;
    assert_int_equal(cuMemGetInfo(&f, &t), CUDA_SUCCESS);
    assert_int_equal(t, 64 * MiB);
    assert_int_equal(f, 64 * MiB);
    CUdeviceptr p[8];
    int n = 0;
    CUresult r;
    while ((r = cuMemAlloc(&p[n], 10 * MiB)) == CUDA_SUCCESS)
        n++;
    assert_int_equal(r, CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(n, 6);
    assert_int_equal(cuMemGetInfo(&f, &t), CUDA_SUCCESS);
    assert_int_equal(f, 4 * MiB);
    cacheshim_stats s = stats(0);
    assert_int_equal(s.cap_refusals, 1);
    assert_int_equal(s.cap_bytes, 64 * MiB);
    for (int i = 0; i < n; i++)
        must_free(p[i]);
    /* Cached blocks of another size make room under the cap. */
    CUdeviceptr big = must_alloc(50 * MiB);
    s = stats(0);
    assert_true(s.peak_reserved <= 64 * MiB);
    assert_true(fake_device_used(0) <= 64 * MiB);
    must_free(big);
}

static void test_cap_takes_busy_block(void **state)
{
    (void)state;
    /* At the cap, a block whose kernel still runs is reused rather than refused: handed out
     * with the next work ordered after the kernel (ordered), or waited for (completed). */
    bool completed = getenv("CACHESHIM_REUSE") && !strcmp(getenv("CACHESHIM_REUSE"), "completed");
    CUstream s, t;
    assert_int_equal(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cuStreamCreate(&t, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr p[6];
    for (int i = 0; i < 6; i++)
        p[i] = must_alloc(10 * MiB);
    launch(s, p[0], 10 * MiB);
    must_free(p[0]);
    assert_int_equal(fake_stream_pending(s), 1);
    fake_reset_counters();
    CUdeviceptr q = must_alloc(10 * MiB);
    assert_int_equal(q, p[0]);
    assert_int_equal(fake_stream_pending(s), completed ? 0 : 1);  /* waited for, or not */
    launch(t, q, 10 * MiB);
    assert_int_equal(fake_races(), 0);
    fake_retire_all();
    for (int i = 1; i < 6; i++)
        must_free(p[i]);
    must_free(q);
    cuStreamDestroy(s);
    cuStreamDestroy(t);
}

static void test_cap_percent(void **state)
{
    (void)state;
    size_t f, t;
    assert_int_equal(cuMemGetInfo(&f, &t), CUDA_SUCCESS);
    assert_int_equal(t, 128 * MiB);  /* 50 % of 256 MiB */
    CUdeviceptr p;
    assert_int_equal(cuMemAlloc(&p, 129 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
    must_free(must_alloc(120 * MiB));
}

static void test_threshold(void **state)
{
    (void)state;
    CUdeviceptr p[4];
    for (int i = 0; i < 4; i++)
        p[i] = must_alloc(1 * MiB);
    fake_reset_counters();
    for (int i = 0; i < 4; i++)
        must_free(p[i]);
    cacheshim_stats s = stats(0);
    assert_int_equal(s.bytes_cached, 2 * MiB);
    if (shim_pooled()) {
        /* 1 MiB blocks are the two slots of a one-granule slab: four of them, two slabs.
         * The third free gives p0's slot up (its slab still holds p1: nothing goes back, the
         * slot counts as cached); the fourth gives p1's up, which empties that slab (its
         * granule goes back), then p2's (p3 keeps the second slab). Cached: p3 and the free
         * slot beside it. */
        assert_int_equal(fake_calls("cuMemRelease"), 1);
        assert_int_equal(fake_calls("cuMemUnmap"), 1);
        assert_int_equal(s.releases, 1);
        assert_int_equal(fake_device_used(0), 2 * MiB);
    } else {
        assert_int_equal(fake_calls("cuMemFree_v2"), 2);
        assert_int_equal(s.releases, 2);
        assert_int_equal(fake_device_used(0), 2 * MiB);
    }
}

/* Blocks of whole granules: each its own driver allocation or range, under both backends.
 * Each free past the threshold gives the oldest idle block back. */
static void test_threshold_large_blocks(void **state)
{
    (void)state;
    shim_trim();  /* what test_threshold left cached */
    assert_int_equal(fake_device_used(0), 0);
    CUdeviceptr p[4];
    for (int i = 0; i < 4; i++)
        p[i] = must_alloc(2 * MiB);
    cacheshim_stats before = stats(0);
    fake_reset_counters();
    for (int i = 0; i < 4; i++)
        must_free(p[i]);
    cacheshim_stats s = stats(0);
    assert_int_equal(s.bytes_cached, 2 * MiB);
    assert_int_equal(driver_frees(), 3);
    assert_int_equal(s.releases - before.releases, 3);
    assert_int_equal(fake_device_used(0), 2 * MiB);
    assert_int_equal(must_alloc(2 * MiB), p[3]);  /* the newest stayed */
    must_free(p[3]);
}

static void test_oom_recovery(void **state)
{
    (void)state;
    /* A 64 MiB device: cache 48 MiB in 16 MiB blocks, then ask for 40 MiB. */
    CUdeviceptr p[3];
    for (int i = 0; i < 3; i++)
        p[i] = must_alloc(16 * MiB);
    for (int i = 0; i < 3; i++)
        must_free(p[i]);
    fake_reset_counters();
    CUdeviceptr big = must_alloc(40 * MiB);
    cacheshim_stats s = stats(0);
    if (shim_pooled()) {
        /* The freed blocks' spans joined the pool's free space at their frees, beside each
         * other: the block is carved out of them with no driver call. The driver is never
         * out of memory; the 8 MiB left stay free (spare). */
        assert_int_equal(s.oom_recoveries, 0);
        assert_int_equal(s.moves, 0);
        assert_int_equal(fake_calls("cuMemCreate"), 0);
        assert_int_equal(fake_calls("cuMemMap"), 0);
        assert_int_equal(fake_calls("cuMemUnmap"), 0);
        assert_int_equal(fake_calls("cuMemRelease"), 0);
        assert_int_equal(s.bytes_cached, 8 * MiB);
        assert_int_equal(fake_device_used(0), 48 * MiB);
    } else {
        /* The driver is out of memory: the idle blocks go back, and the retry succeeds. */
        assert_int_equal(s.oom_recoveries, 1);
        assert_true(s.releases >= 2);
        assert_int_equal(fake_calls("cuMemAlloc_v2"), 2);
        assert_int_equal(fake_device_used(0), 40 * MiB);
    }
    /* What cannot fit fails with the driver's code, and the cache stays usable. */
    CUdeviceptr huge;
    assert_int_equal(cuMemAlloc(&huge, 40 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(stats(0).oom_failures, 1);
    must_free(big);
    must_free(must_alloc(40 * MiB));
}

static void test_oom_recovery_with_busy_blocks(void **state)
{
    (void)state;
    /* A busy block of another size stands in the way. Classic: it goes back to the driver,
     * whose free waits for the device, and the allocation is retried. Pooled, with one busy
     * stream: its memory joins the free space and the block is built on it, every stream's
     * next work made to wait for its work: no wait on the host, no driver out of memory. */
    CUstream s, t;
    assert_int_equal(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cuStreamCreate(&t, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr a = must_alloc(30 * MiB);
    launch(s, a, 30 * MiB);
    must_free(a);  /* busy */
    cacheshim_stats before = stats(0);
    CUdeviceptr b = must_alloc(50 * MiB);
    cacheshim_stats st = stats(0);
    if (shim_pooled()) {
        assert_int_equal(b, a);
        assert_int_equal(st.oom_recoveries - before.oom_recoveries, 0);
        /* A miss (20 MiB of new memory after a's), so no ordered hit: the order shows on the
         * GPU below (no race). */
        assert_int_equal(st.misses - before.misses, 1);
        assert_int_equal(st.ordered_hits - before.ordered_hits, 0);
        assert_int_equal(st.fence_waits - before.fence_waits, 0);
        assert_true(fake_stream_pending(s) > 0);  /* a's work still runs */
        launch(t, b, 50 * MiB);  /* ordered after it on the GPU */
    } else {
        assert_int_equal(st.oom_recoveries - before.oom_recoveries, 1);
        assert_true(st.releases > before.releases);
        assert_int_equal(fake_stream_pending(s), 0);
    }
    assert_int_equal(fake_races(), 0);
    fake_retire_all();
    must_free(b);
    cuStreamDestroy(s);
    cuStreamDestroy(t);
}

/* ================================================================ disabled */

static void test_disabled_passes_everything(void **state)
{
    (void)state;
    fake_reset_counters();
    for (int i = 0; i < 10; i++)
        must_free(must_alloc(1 * MiB));
    assert_int_equal(fake_calls("cuMemAlloc_v2"), 10);
    assert_int_equal(fake_calls("cuMemFree_v2"), 10);
    cacheshim_stats s;
    assert_int_equal(get_stats(-1, &s, sizeof s), -1);
    assert_ptr_equal(dlsym(libcuda, "cuMemAlloc_v2"), real_fn("cuMemAlloc_v2"));
}

/* ================================================================ threads, fork, exit */

#define RACERS 32
static pthread_barrier_t barrier;

static void *racer(void *arg)
{
    long i = (long)arg;
    pthread_barrier_wait(&barrier);
    assert_int_equal(cuCtxSetCurrent(primary), CUDA_SUCCESS);
    alloc_fn a;
    free_fn f;
    if (i % 3 == 0) {
        a = (alloc_fn)dlsym(libcuda, "cuMemAlloc_v2");
        f = (free_fn)dlsym(libcuda, "cuMemFree_v2");
    } else if (i % 3 == 1) {
        gpa2_fn g = (gpa2_fn)dlsym(libcuda, "cuGetProcAddress_v2");
        g("cuMemAlloc", (void **)&a, 13000, 0, NULL);
        g("cuMemFree", (void **)&f, 13000, 0, NULL);
    } else {
        a = cuMemAlloc;
        f = cuMemFree;
    }
    for (int k = 0; k < 500; k++) {
        CUdeviceptr p;
        if (a(&p, (size_t)(k % 5 + 1) * 4096) != CUDA_SUCCESS || f(p) != CUDA_SUCCESS)
            return (void *)1;
    }
    return NULL;
}

static void test_threads_race_first_call(void **state)
{
    (void)state;
    /* No setup before this test: the racers make the very first calls into the shim. */
    CUdevice dev;
    assert_int_equal(cuInit(0), CUDA_SUCCESS);
    assert_int_equal(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    assert_int_equal(cuDevicePrimaryCtxRetain(&primary, dev), CUDA_SUCCESS);
    libcuda = dlopen("libcuda.so.1", RTLD_NOW);
    pthread_t t[RACERS];
    pthread_barrier_init(&barrier, NULL, RACERS);
    for (long i = 0; i < RACERS; i++)
        pthread_create(&t[i], NULL, racer, (void *)i);
    for (int i = 0; i < RACERS; i++) {
        void *ret;
        pthread_join(t[i], &ret);
        assert_null(ret);
    }
    pthread_barrier_destroy(&barrier);
    cacheshim_stats s = stats(0);
    assert_int_equal(s.requests, RACERS * 500);
    assert_int_equal(s.frees, RACERS * 500);
    assert_int_equal(s.bytes_in_use, 0);
}

static void test_fork_child_is_usable(void **state)
{
    (void)state;
    CUdeviceptr p = must_alloc(1 * MiB);
    must_free(p);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* The parent's cache is not the child's: it starts empty, and works. */
        cacheshim_stats s;
        int r = get_stats(0, &s, sizeof s);
        _exit(r == -1 ? 0 : 3);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(must_alloc(1 * MiB), p);  /* the parent's cache is intact */
}

static int run_self(const char *mode, const char *const env[], char *err, size_t errlen)
{
    return shim_run_self("test_shim", mode, env, err, errlen);
}

static int exit_with_cached_blocks(void)
{
    setup(NULL);
    for (int i = 0; i < 10; i++) {
        CUdeviceptr p;
        if (cuMemAlloc(&p, (size_t)(i + 1) * MiB) != CUDA_SUCCESS || cuMemFree(p) != CUDA_SUCCESS)
            return 1;
    }
    CUdeviceptr held;
    cuMemAlloc(&held, 1 * MiB);  /* still in use at exit, too */
    exit(0);  /* destructors run: the fake driver's first, then the shim's */
}

static void test_exit_with_cached_blocks(void **state)
{
    (void)state;
    char err[8192];
    const char *env[] = {"CACHESHIM_STATS", "1", NULL};
    int status = run_self("exit-cached", env, err, sizeof err);
    assert_int_equal(status, 0);
    if (shim_pooled())
        /* 1..10 MiB, each freed, then 1 MiB. Blocks: 1 MiB a slab slot (in a new granule at
         * the arena's top), above that carved out of the arena's lower half. Each request
         * larger than the last finds no free span that fits: the new block starts on the free
         * span the last one left and maps only what is missing, a new granule (5 driver
         * allocations) or, beyond the headroom, free chunks moved there from elsewhere in
         * the arena (2 requests without new memory); 4 requests carved or hits without a driver call
         * (36.3 %). 9 MiB stay free, spare. Saved: 11 requests - 5 driver allocations + 10
         * frees = 16 calls, 6 x 45 us + 10 x 31 us = 580 us. */
        assert_string_equal(err,
                            "cacheshim: statistics            device 0\n"
                            "cacheshim:   requests                  11\n"
                            "cacheshim:   hit rate               36.3%\n"
                            "cacheshim:   peak in use         10.0 MiB\n"
                            "cacheshim:   peak reserved       10.0 MiB\n"
                            "cacheshim:   cached now          9.00 MiB\n"
                            "cacheshim:   driver calls saved        16\n"
                            "cacheshim:   est. time saved       580 us\n"
                            "cacheshim:   OOM recoveries             0\n"
                            "cacheshim:   cap refusals               0\n");
    else
        /* Blocks of 1, 2, 4, 4, 6, 6, 8, 8, 10 and 10 MiB: 6 misses, and 4, 6, 8, 10 and the last
         * 1 MiB hit. Held: 1 + 2 + 4 + 6 + 8 + 10 = 31 MiB. Saved: 11 requests - 6 driver
         * allocations + 10 frees = 15 calls, 5 x 45 us + 10 x 31 us = 535 us. */
        assert_string_equal(err,
                            "cacheshim: statistics            device 0\n"
                            "cacheshim:   requests                  11\n"
                            "cacheshim:   hit rate               45.4%\n"
                            "cacheshim:   peak in use         10.0 MiB\n"
                            "cacheshim:   peak reserved       31.0 MiB\n"
                            "cacheshim:   cached now          30.0 MiB\n"
                            "cacheshim:   driver calls saved        15\n"
                            "cacheshim:   est. time saved       535 us\n"
                            "cacheshim:   OOM recoveries             0\n"
                            "cacheshim:   cap refusals               0\n");
}

static int exit_two_devices(void)
{
    setup(NULL);
    for (int i = 0; i < 4; i++) {
        CUdeviceptr p;
        if (cuMemAlloc(&p, 1 * MiB) != CUDA_SUCCESS || cuMemFree(p) != CUDA_SUCCESS)
            return 1;
    }
    CUdeviceptr foreign;
    if (((alloc_fn)real_fn("cuMemAlloc_v2"))(&foreign, 4096) != CUDA_SUCCESS ||
        cuMemFree(foreign) != CUDA_SUCCESS)
        return 2;
    CUdevice dev;
    CUcontext ctx;
    if (cuDeviceGet(&dev, 1) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS ||
        cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
        return 3;
    CUdeviceptr a, b;
    if (cuMemAlloc(&a, 6 * MiB) != CUDA_SUCCESS ||
        cuMemAlloc(&b, 4 * MiB) != CUDA_ERROR_OUT_OF_MEMORY ||  /* over CACHESHIM_CAP */
        cuMemFree(a) != CUDA_SUCCESS ||
        cuMemAlloc(&b, 7 * MiB) != CUDA_SUCCESS ||  /* 8 MiB: the idle 6 MiB make room */
        cuMemFree(b) != CUDA_SUCCESS)
        return 4;
    exit(0);
}

static void test_exit_table_two_devices_with_details(void **state)
{
    (void)state;
    char err[16384];
    const char *env[] = {"CACHESHIM_STATS", "1", "CACHESHIM_VERBOSE", "1", "CACHESHIM_CAP", "8MiB",
                         "FAKE_CUDA_DEVICES", "2", NULL};
    int status = run_self("exit-two-devices", env, err, sizeof err);
    assert_int_equal(status, 0);
    assert_non_null(strstr(err, "cacheshim: allocation of 4.00 MiB failed: it would exceed "
                                "CACHESHIM_CAP; in use 6.00 MiB, cached 0 B, cap 8.00 MiB, "
                                "device free "));
    const char *table = strstr(err, "cacheshim: statistics ");
    assert_non_null(table);
    /* Device 0: 3 hits of 4, 7 calls saved (3 x 45 + 4 x 31 us); pooled, the 1 MiB block is
     * a slot of a one-granule slab, which is what the device holds. Device 1: the 6 MiB block
     * is in use, so the cap refuses 4 MiB more; the 7 MiB request (a block of 8 MiB, whole
     * granules, classic; of 7 MiB carved, pooled) fits once the idle 6 MiB are out of the way. Classic: the 6 MiB go back
     * to the driver: 3 requests + 2 frees - 2 driver allocations - 1 driver free = 2 calls
     * (45 + 31 us). Pooled: the 6 MiB move into the new block, one granule is new, nothing
     * goes back: 3 calls (45 + 2 x 31 us). */
    const char *pooled_rows[] = {"1.00 MiB  7.00 MiB", "2.00 MiB  8.00 MiB", "2.00 MiB  8.00 MiB",
                                 "7         3", "259 us    107 us", "0         0", "0         0"};
    const char *classic_rows[] = {"1.00 MiB  8.00 MiB", "1.00 MiB  8.00 MiB", "1.00 MiB  8.00 MiB",
                                  "7         2", "259 us   76.0 us", "0         1", "0         1"};
    const char **row = shim_pooled() ? pooled_rows : classic_rows;
    char want[4096];
    snprintf(want, sizeof want,
             "cacheshim: statistics            device 0  device 1\n"
             "cacheshim:   requests                   4         3\n"
             "cacheshim:   hit rate               75.0%%      0.0%%\n"
             "cacheshim:   peak in use         %s\n"
             "cacheshim:   peak reserved       %s\n"
             "cacheshim:   cached now          %s\n"
             "cacheshim:   driver calls saved         %s\n"
             "cacheshim:   est. time saved       %s\n"
             "cacheshim:   OOM recoveries             0         0\n"
             "cacheshim:   cap refusals               0         1\n"
             "cacheshim: details               device 0  device 1\n"
             "cacheshim:   hits                       3         0\n"
             "cacheshim:   ordered hits               0         0\n"
             "cacheshim:   misses                     1         3\n"
             "cacheshim:   frees                      4         2\n"
             "cacheshim:   in use now               0 B       0 B\n"
             "cacheshim:   peak requested      1.00 MiB  7.00 MiB\n"
             "cacheshim:   driver allocations         1         2\n"
             "cacheshim:   driver frees               %s\n"
             "cacheshim:   releases                   %s\n"
             "cacheshim:   fences                     0         0\n"
             "cacheshim:   fence waits                0         0\n"
             "cacheshim:   OOM failures               0         0\n"
             "cacheshim:   other paths now          0 B       0 B\n"
             "cacheshim:   cap                 8.00 MiB  8.00 MiB\n"
             "cacheshim: foreign frees: 1 (pointers the shim did not hand out, passed "
             "to the driver)\n"
             "cacheshim: work calls seen: 0 (driver calls that put work on a stream)\n",
             row[0], row[1], row[2], row[3], row[4], row[5], row[6]);
    assert_string_equal(table, want);
}

static int exit_nothing(void)
{
    setup(NULL);
    /* cudaFree(NULL), as programs start the runtime: the shim starts, no heap is made. */
    exit(cuMemFree(0) == CUDA_SUCCESS ? 0 : 1);
}

static void test_exit_nothing_allocated(void **state)
{
    (void)state;
    char err[8192];
    const char *env[] = {"CACHESHIM_STATS", "1", NULL};
    assert_int_equal(run_self("exit-nothing", env, err, sizeof err), 0);
    assert_string_equal(err,
                        "cacheshim: statistics: no device memory was allocated through the shim\n");
}

static void test_bad_option_is_reported(void **state)
{
    (void)state;
    char err[8192];
    const char *env[] = {"CACHESHIM_CAP", "8X", "CACHESHIM_STATS", "maybe", NULL};
    int status = run_self("exit-cached", env, err, sizeof err);
    assert_int_equal(status, 0);  /* the program runs on, with the defaults */
    assert_non_null(strstr(err, "cacheshim: CACHESHIM_CAP='8X' is not valid"));
    assert_non_null(strstr(err, "cacheshim: CACHESHIM_STATS='maybe' is not valid"));
}

static void test_oom_report_line(void **state)
{
    (void)state;
    char err[8192];
    const char *env[] = {"FAKE_CUDA_DEVICE_BYTES", "33554432", "CACHESHIM_VERBOSE", "1", NULL};
    int status = run_self("oom-report", env, err, sizeof err);
    assert_int_equal(status, 0);
    assert_non_null(strstr(err, "cacheshim: allocation of 64.0 MiB failed: the device is out of memory; "
                                "in use 16.0 MiB, cached 0 B, cap none, device free"));
}

static int oom_report(void)
{
    setup(NULL);
    CUdeviceptr a, b;
    if (cuMemAlloc(&a, 16 * MiB) != CUDA_SUCCESS)
        return 1;
    return cuMemAlloc(&b, 64 * MiB) == CUDA_ERROR_OUT_OF_MEMORY ? 0 : 2;
}

/* ================================================================ no VMM */

/* FAKE_CUDA_NO_VMM=1: the device offers no virtual memory management, and the shim, asked for
 * nothing (pooled is the default), takes the classic backend there by itself, and says so. */
static void test_no_vmm_says_classic(void **state)
{
    (void)state;
    assert_null(getenv("CACHESHIM_BACKEND"));
    assert_false(shim_pooled());
    int vmm = 1;
    assert_int_equal(
        cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0),
        CUDA_SUCCESS);
    assert_int_equal(vmm, 0);
    char err[8192];
    const char *env[] = {"CACHESHIM_VERBOSE", "1", NULL};
    assert_int_equal(run_self("exit-cached", env, err, sizeof err), 0);
    assert_non_null(strstr(err, "cacheshim: CACHESHIM_BACKEND = pooled (default)\n"));
    assert_non_null(strstr(err, "cacheshim: device 0 has no virtual memory management: "
                                "classic backend there\n"));
    /* Only the classic backend's calls: the VMM ones were never tried. */
    fake_reset_counters();
    must_free(must_alloc(7 * MiB + 3));
    assert_int_equal(fake_calls("cuMemAlloc_v2"), 1);
    assert_int_equal(fake_calls("cuMemCreate"), 0);
}

/* ================================================================ groups */

#define T(fn) cmocka_unit_test(fn)

int main(int argc, char **argv)
{
    const char *group = argc > 1 ? argv[1] : "";
    if (!strcmp(group, "exit-cached"))
        return exit_with_cached_blocks();
    if (!strcmp(group, "exit-two-devices"))
        return exit_two_devices();
    if (!strcmp(group, "exit-nothing"))
        return exit_nothing();
    if (!strcmp(group, "oom-report"))
        return oom_report();

    const struct CMUnitTest paths[] = {T(test_backend_as_configured),
                                       T(test_direct_binding_is_cached), T(test_dlsym_path_gets_wrapper),
                                       T(test_get_proc_address_paths), T(test_dlsym_rtld_next_semantics)};
    const struct CMUnitTest frees[] = {T(test_foreign_double_null_frees), T(test_address_range_is_honest),
                                       T(test_mem_get_info_uncapped)};
    const struct CMUnitTest contexts[] = {T(test_context_destroy_forgets_blocks),
                                          T(test_primary_reset_forgets_blocks),
                                          T(test_context_gone_gives_memory_back)};
    const struct CMUnitTest failures[] = {T(test_driver_errors_pass_through),
                                          T(test_failure_half_way_rolls_back)};
    const struct CMUnitTest process[] = {T(test_fork_child_is_usable), T(test_exit_with_cached_blocks),
                                         T(test_exit_table_two_devices_with_details),
                                         T(test_exit_nothing_allocated),
                                         T(test_bad_option_is_reported), T(test_oom_report_line)};
    const struct CMUnitTest cap[] = {T(test_cap), T(test_cap_takes_busy_block)};
    const struct CMUnitTest cap_percent[] = {T(test_cap_percent)};
    const struct CMUnitTest threshold[] = {T(test_threshold), T(test_threshold_large_blocks)};
    const struct CMUnitTest oom[] = {T(test_oom_recovery), T(test_oom_recovery_with_busy_blocks)};
    const struct CMUnitTest disabled[] = {T(test_disabled_passes_everything)};
    const struct CMUnitTest race[] = {T(test_threads_race_first_call)};
    const struct CMUnitTest no_vmm[] = {T(test_backend_as_configured),
                                        T(test_direct_binding_is_cached),
                                        T(test_no_vmm_says_classic)};

#define GROUP(name, tests, with_setup) \
    if (!strcmp(group, name)) \
        return _cmocka_run_group_tests(name, tests, sizeof tests / sizeof tests[0], \
                                       with_setup ? setup : NULL, NULL);
    GROUP("paths", paths, 1)
    GROUP("frees", frees, 1)
    GROUP("contexts", contexts, 1)
    GROUP("failures", failures, 1)
    GROUP("process", process, 1)
    GROUP("cap", cap, 1)
    GROUP("cap-percent", cap_percent, 1)
    GROUP("threshold", threshold, 1)
    GROUP("oom", oom, 1)
    GROUP("disabled", disabled, 1)
    GROUP("race", race, 0)
    GROUP("no-vmm", no_vmm, 1)
    fprintf(stderr, "test_shim: unknown group '%s'\n", group);
    return 2;
}
