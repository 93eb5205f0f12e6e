/* Tests of the fake CUDA driver itself, linked directly against it. */
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
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "fake_control.h"

/* The per-thread-default-stream twins; cuda.h declares them only for code built with
 * CUDA_API_PER_THREAD_DEFAULT_STREAM, which would rename every other call too. */
CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream);
CUresult cuStreamQuery_ptsz(CUstream hStream);
CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags);
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                             unsigned int gridDimZ, unsigned int blockDimX,
                             unsigned int blockDimY, unsigned int blockDimZ,
                             unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
                             void **extra);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                               void **extra);
CUresult cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void *userData);
CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream);
CUresult cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                              CUstream hStream);
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                                   CUstream hStream);
CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                   CUstream hStream);
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                   size_t ByteCount, CUstream hStream);
CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N);
CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount);

#define MiB (1024ull * 1024)
#define GiB (1024ull * MiB)
#define DEFAULT_BYTES (16 * GiB)

static CUcontext g_ctx; /* device 0's primary context, current in every test */

/* ---- fixtures --------------------------------------------------------------------------- */

static int setup(void **state)
{
    (void)state;
    if (cuDevicePrimaryCtxRetain(&g_ctx, 0) != CUDA_SUCCESS)
        return -1;
    if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS)
        return -1;
    fake_reset_counters();
    return 0;
}

/* Leave nothing behind: every context gone, the stack empty, the devices as at start. */
static int teardown(void **state)
{
    (void)state;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
    cuThreadExchangeStreamCaptureMode(&mode);
    fake_set_work_ticks(0);
    fake_set_ignore_stream_waits(0);
    fake_retire_all();
    int n = 0;
    cuDeviceGetCount(&n);
    for (int d = 0; d < n; d++)
        cuDevicePrimaryCtxReset(d);
    while (cuCtxPopCurrent(NULL) == CUDA_SUCCESS)
        ;
    fake_set_device_count(1);
    fake_set_device_bytes(0, DEFAULT_BYTES);
    return fake_live_allocations() == 0 && fake_device_used(0) == 0 ? 0 : -1;
}

static int group_setup(void **state)
{
    (void)state;
    return cuInit(0) == CUDA_SUCCESS ? 0 : -1;
}

/* Runs fn in a child process and returns its exit status: for what can only happen once per
 * process (the first cuInit, the driver's teardown). */
static int in_child(void (*fn)(void))
{
    pid_t pid = fork();
    if (pid == 0) {
        fn();
        _exit(99);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

/* ---- before cuInit ----------------------------------------------------------------------- */

static void test_before_init(void **state)
{
    (void)state;
    CUdeviceptr p;
    int v = 0;
    const char *s = NULL;
    void *fn = NULL;
    assert_int_equal(cuMemAlloc(&p, 16), CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(cuDeviceGetCount(&v), CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(cuDriverGetVersion(&v), CUDA_SUCCESS);
    assert_int_equal(v, 13000);
    assert_int_equal(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s), CUDA_SUCCESS);
    assert_string_equal(s, "CUDA_ERROR_OUT_OF_MEMORY");
    assert_int_equal(cuGetProcAddress("cuInit", &fn, 13000, 0, NULL), CUDA_SUCCESS);
    assert_ptr_equal(fn, (void *)(uintptr_t)cuInit);
    assert_int_equal(fake_calls("cuMemAlloc_v2"), 1);
}

static void child_env(void)
{
    setenv("FAKE_CUDA_DEVICES", "3", 1);
    setenv("FAKE_CUDA_DEVICE_BYTES", "1048576", 1);
    int n = 0;
    size_t total = 0;
    if (cuInit(0) || cuDeviceGetCount(&n) || n != 3 || cuDeviceTotalMem(&total, 2) ||
        total != MiB)
        _exit(1);
    _exit(0);
}

static void child_no_device(void)
{
    fake_set_device_count(0);
    _exit(cuInit(0) == CUDA_ERROR_NO_DEVICE ? 0 : 1);
}

static void test_environment(void **state)
{
    (void)state;
    assert_int_equal(in_child(child_env), 0);
    assert_int_equal(in_child(child_no_device), 0);
}

/* ---- memory ------------------------------------------------------------------------------ */

static void test_alloc_free(void **state)
{
    (void)state;
    CUdeviceptr p = 0, base = 0;
    size_t size = 0, free_b = 0, total = 0;
    assert_int_equal(cuMemAlloc(&p, MiB + 3), CUDA_SUCCESS);
    assert_true(p != 0);
    assert_int_equal(fake_device_used(0), MiB + 3);
    assert_int_equal(fake_live_allocations(), 1);
    assert_int_equal(cuMemGetInfo(&free_b, &total), CUDA_SUCCESS);
    assert_int_equal(total, DEFAULT_BYTES);
    assert_int_equal(free_b, DEFAULT_BYTES - MiB - 3);

    assert_int_equal(cuMemGetAddressRange(&base, &size, p + 100), CUDA_SUCCESS);
    assert_true(base == p);
    assert_int_equal(size, MiB + 3);

    char in[64], out[64];
    memset(in, 0x5a, sizeof in);
    assert_int_equal(cuMemsetD8(p, 0x11, MiB + 3), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyHtoD(p + MiB + 3 - 64, in, 64), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoD(p, p + MiB + 3 - 64, 64), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoH(out, p, 64), CUDA_SUCCESS);
    assert_memory_equal(in, out, 64);
    assert_int_equal(cuMemcpyDtoH(out, p + 64, 1), CUDA_SUCCESS);
    assert_int_equal(out[0], 0x11);
    /* One byte past the end of the allocation is out of bounds, page slack or not. */
    assert_int_equal(cuMemcpyHtoD(p + MiB + 3 - 63, in, 64), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemsetD8(p, 0, MiB + 4), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemcpyDtoH(out, p + MiB + 3, 1), CUDA_ERROR_INVALID_VALUE);

    assert_int_equal(cuMemFree(p + 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemFree(p), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemFree(0), CUDA_SUCCESS); /* the real driver's answer */
    assert_int_equal(cuMemFree((CUdeviceptr)(uintptr_t)&base), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemGetAddressRange(&base, &size, p), CUDA_ERROR_NOT_FOUND);
    assert_int_equal(cuMemAlloc(&p, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(fake_device_used(0), 0);
    assert_int_equal(fake_live_allocations(), 0);
    assert_int_equal(fake_calls("cuMemAlloc_v2"), 2);
    assert_int_equal(fake_calls("cuMemFree_v2"), 5);
    /* Every counter can be read by walking the names. */
    int n = 0, seen = 0;
    for (const char *name; (name = fake_entry_at(n)); n++)
        seen += !strcmp(name, "cuMemAlloc_v2") || !strcmp(name, "cuMemFree_v2");
    assert_int_equal(seen, 2);
    assert_true(n > 100);
    assert_null(fake_entry_at(-1));
}

static void test_oom_at_budget(void **state)
{
    (void)state;
    CUdeviceptr a, b, c;
    fake_set_device_bytes(0, MiB);
    assert_int_equal(cuMemAlloc(&a, MiB), CUDA_SUCCESS);
    assert_int_equal(cuMemAlloc(&b, 1), CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(cuMemFree(a), CUDA_SUCCESS);
    assert_int_equal(cuMemAlloc(&a, MiB / 2), CUDA_SUCCESS);
    assert_int_equal(cuMemAlloc(&b, MiB / 2), CUDA_SUCCESS);
    assert_int_equal(cuMemAlloc(&c, 1), CUDA_ERROR_OUT_OF_MEMORY);
    size_t free_b, total;
    assert_int_equal(cuMemGetInfo(&free_b, &total), CUDA_SUCCESS);
    assert_int_equal(free_b, 0);
    assert_int_equal(total, MiB);
    assert_int_equal(cuMemFree(a), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(b), CUDA_SUCCESS);
}

static void test_huge_device_costs_nothing(void **state)
{
    (void)state;
    CUdeviceptr p;
    assert_int_equal(cuMemAlloc(&p, 12 * GiB), CUDA_SUCCESS);
    assert_int_equal(cuMemsetD8(p + 6 * GiB, 1, 4096), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(p), CUDA_SUCCESS);
}

static void test_no_context(void **state)
{
    (void)state;
    CUdeviceptr p;
    CUcontext c = NULL;
    assert_int_equal(cuCtxPopCurrent(&c), CUDA_SUCCESS);
    assert_ptr_equal(c, g_ctx);
    assert_int_equal(cuMemAlloc(&p, 16), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cuMemFree(16), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cuCtxGetCurrent(&c), CUDA_SUCCESS);
    assert_null(c);
    assert_int_equal(cuCtxPopCurrent(&c), CUDA_ERROR_INVALID_CONTEXT);
}

static void test_v1_entry_points(void **state)
{
    (void)state;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    assert_non_null(h);
    CUresult (*alloc_v1)(unsigned int *, unsigned int) =
        (CUresult(*)(unsigned int *, unsigned int))(uintptr_t)dlsym(h, "cuMemAlloc");
    CUresult (*info_v1)(unsigned int *, unsigned int *) =
        (CUresult(*)(unsigned int *, unsigned int *))(uintptr_t)dlsym(h, "cuMemGetInfo");
    assert_non_null(alloc_v1);
    assert_non_null(info_v1);
    unsigned int p = 0, f = 0, t = 0;
    assert_int_equal(alloc_v1(&p, 16), CUDA_ERROR_NOT_SUPPORTED);
    assert_int_equal(info_v1(&f, &t), CUDA_SUCCESS);
    assert_int_equal(t, 0xffffffffu);
    assert_int_equal(fake_calls("cuMemAlloc"), 1);
    assert_int_equal(fake_calls("cuMemAlloc_v2"), 0);
    dlclose(h);
}

/* ---- discovery paths ---------------------------------------------------------------------- */

struct lookup {
    const char *base;
    int version;
    cuuint64_t flags;
    const char *expect; /* exported name, NULL: not found */
};

static const struct lookup g_lookups[] = {
    {"cuMemAlloc", 13000, 0, "cuMemAlloc_v2"},
    {"cuMemAlloc", 3020, 0, "cuMemAlloc_v2"},
    {"cuMemAlloc", 3010, 0, "cuMemAlloc"},
    {"cuMemFree", 12000, 0, "cuMemFree_v2"},
    {"cuMemFree", 3000, 0, "cuMemFree"},
    {"cuMemGetInfo", 12000, 0, "cuMemGetInfo_v2"},
    {"cuMemGetInfo", 2000, 0, "cuMemGetInfo"},
    {"cuMemGetAddressRange", 12000, 0, "cuMemGetAddressRange_v2"},
    {"cuMemcpyHtoD", 12000, 0, "cuMemcpyHtoD_v2"},
    {"cuMemcpyHtoD", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemcpyHtoD_v2_ptds"},
    {"cuMemcpyDtoH", 3000, 0, "cuMemcpyDtoH"},
    {"cuMemcpyDtoD", 12000, 0, "cuMemcpyDtoD_v2"},
    {"cuMemsetD8", 12000, 0, "cuMemsetD8_v2"},
    {"cuDeviceTotalMem", 12000, 0, "cuDeviceTotalMem_v2"},
    {"cuDeviceTotalMem", 3000, 0, "cuDeviceTotalMem"},
    {"cuStreamDestroy", 4000, 0, "cuStreamDestroy_v2"},
    {"cuStreamDestroy", 3020, 0, "cuStreamDestroy"},
    {"cuEventDestroy", 12000, 0, "cuEventDestroy_v2"},
    {"cuEventDestroy", 3020, 0, "cuEventDestroy"},
    {"cuCtxDestroy", 12000, 0, "cuCtxDestroy_v2"},
    {"cuCtxDestroy", 3020, 0, "cuCtxDestroy"},
    {"cuCtxPushCurrent", 12000, 0, "cuCtxPushCurrent_v2"},
    {"cuCtxPopCurrent", 3020, 0, "cuCtxPopCurrent"},
    {"cuDevicePrimaryCtxRelease", 11000, 0, "cuDevicePrimaryCtxRelease_v2"},
    {"cuDevicePrimaryCtxRelease", 10020, 0, "cuDevicePrimaryCtxRelease"},
    {"cuDevicePrimaryCtxReset", 12000, 0, "cuDevicePrimaryCtxReset_v2"},
    {"cuDevicePrimaryCtxReset", 10000, 0, "cuDevicePrimaryCtxReset"},
    {"cuStreamBeginCapture", 10010, 0, "cuStreamBeginCapture_v2"},
    {"cuStreamBeginCapture", 10000, 0, "cuStreamBeginCapture"},
    {"cuStreamBeginCapture", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
     "cuStreamBeginCapture_v2_ptsz"},
    {"cuStreamBeginCapture", 10000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
     "cuStreamBeginCapture_ptsz"},
    {"cuCtxCreate", 12050, 0, "cuCtxCreate_v4"},
    {"cuCtxCreate", 12000, 0, NULL},
    {"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"},
    {"cuGetProcAddress", 11030, 0, "cuGetProcAddress"},
    {"cuEventRecord", 12000, 0, "cuEventRecord"},
    {"cuEventRecord", 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuEventRecord"},
    {"cuEventRecord", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuEventRecord_ptsz"},
    {"cuStreamEndCapture", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
     "cuStreamEndCapture_ptsz"},
    {"cuStreamIsCapturing", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
     "cuStreamIsCapturing_ptsz"},
    {"cuStreamIsCapturing", 12000, 0, "cuStreamIsCapturing"},
    {"cuStreamQuery", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuStreamQuery_ptsz"},
    {"cuStreamGetCtx", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuStreamGetCtx_ptsz"},
    {"cuStreamBeginCaptureToGraph", 12030, 0, "cuStreamBeginCaptureToGraph"},
    {"cuStreamBeginCaptureToGraph", 12030, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
     "cuStreamBeginCaptureToGraph_ptsz"},
    {"cuCtxGetApiVersion", 12000, 0, "cuCtxGetApiVersion"},
    {"cuLaunchKernel", 12000, 0, "cuLaunchKernel"},
    {"cuLaunchKernel", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
     "cuLaunchKernel_ptsz"},
    {"cuLaunchKernelEx", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
     "cuLaunchKernelEx_ptsz"},
    {"cuLaunchHostFunc", 12000, 0, "cuLaunchHostFunc"},
    {"cuStreamWaitEvent", 12000, 0, "cuStreamWaitEvent"},
    {"cuStreamWaitEvent", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
     "cuStreamWaitEvent_ptsz"},
    {"cuGraphLaunch", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuGraphLaunch_ptsz"},
    {"cuMemsetD8Async", 12000, 0, "cuMemsetD8Async"},
    {"cuMemcpyHtoDAsync", 12000, 0, "cuMemcpyHtoDAsync_v2"},
    {"cuMemcpyDtoHAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
     "cuMemcpyDtoHAsync_v2_ptsz"},
    {"cuMemcpyDtoDAsync", 12000, 0, "cuMemcpyDtoDAsync_v2"},
    {"cuMemcpyDtoDAsync", 3010, 0, NULL}, /* the v1 form is not in the fake */
    /* No _ptsz variant: the plain one, flag or not. */
    {"cuStreamCreate", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuStreamCreate"},
    {"cuInit", 2000, 0, "cuInit"},
    {"cuThreadExchangeStreamCaptureMode", 13000, 0, "cuThreadExchangeStreamCaptureMode"},
    /* Versioned names are not base names. */
    {"cuMemAlloc_v2", 13000, 0, NULL},
    {"cuNoSuchThing", 13000, 0, NULL},
};

static void test_get_proc_address(void **state)
{
    (void)state;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    assert_non_null(h);
    for (size_t i = 0; i < sizeof g_lookups / sizeof g_lookups[0]; i++) {
        const struct lookup *l = &g_lookups[i];
        void *fn = (void *)1;
        CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)-1;
        CUresult rc = cuGetProcAddress(l->base, &fn, l->version, l->flags, &st);
        if (!l->expect) {
            assert_int_equal(rc, CUDA_ERROR_NOT_FOUND);
            assert_int_equal(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
            assert_null(fn);
            continue;
        }
        void *want = dlsym(h, l->expect);
        assert_ptr_equal(want, fake_real_symbol(l->expect));
        if (rc != CUDA_SUCCESS || fn != want || !want)
            fail_msg("%s @%d flags %llu: want %s", l->base, l->version,
                     (unsigned long long)l->flags, l->expect);
        assert_int_equal(st, CU_GET_PROC_ADDRESS_SUCCESS);
    }
    dlclose(h);
}

/* cudart's path: dlsym the _v2 entry, ask it for "cuGetProcAddress", use what comes back. */
static void test_get_proc_address_through_itself(void **state)
{
    (void)state;
    typedef CUresult (*gpa_v2_t)(const char *, void **, int, cuuint64_t,
                                 CUdriverProcAddressQueryResult *);
    typedef CUresult (*gpa_v1_t)(const char *, void **, int, cuuint64_t);
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    gpa_v2_t gpa = (gpa_v2_t)(uintptr_t)dlsym(h, "cuGetProcAddress_v2");
    assert_non_null(gpa);
    void *fn = NULL;
    assert_int_equal(gpa("cuGetProcAddress", &fn, 13000, 0, NULL), CUDA_SUCCESS);
    assert_ptr_equal(fn, (void *)(uintptr_t)gpa);
    assert_int_equal(gpa("cuGetProcAddress", &fn, 11030, 0, NULL), CUDA_SUCCESS);
    gpa_v1_t v1 = (gpa_v1_t)(uintptr_t)fn;
    assert_ptr_equal(fn, dlsym(h, "cuGetProcAddress"));
    void *alloc = NULL;
    assert_int_equal(v1("cuMemAlloc", &alloc, 12000, 0), CUDA_SUCCESS);
    assert_ptr_equal(alloc, dlsym(h, "cuMemAlloc_v2"));
    assert_int_equal(v1("nope", &alloc, 12000, 0), CUDA_ERROR_NOT_FOUND);
    assert_null(alloc);

    /* The pointer works like the symbol, and is counted under the versioned name. */
    CUresult (*alloc_fn)(CUdeviceptr *, size_t) =
        (CUresult(*)(CUdeviceptr *, size_t))(uintptr_t)dlsym(h, "cuMemAlloc_v2");
    CUdeviceptr p;
    assert_int_equal(alloc_fn(&p, 64), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(p), CUDA_SUCCESS);
    assert_int_equal(fake_calls("cuMemAlloc_v2"), 1);
    assert_int_equal(fake_calls("cuGetProcAddress"), 2);
    assert_int_equal(fake_calls("cuGetProcAddress_v2"), 2);
    dlclose(h);
}

static void test_error_strings(void **state)
{
    (void)state;
    const char *s = NULL;
    assert_int_equal(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s), CUDA_SUCCESS);
    assert_string_equal(s, "out of memory");
    assert_int_equal(cuGetErrorName(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, &s), CUDA_SUCCESS);
    assert_string_equal(s, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED");
    assert_int_equal(cuGetErrorName((CUresult)12345, &s), CUDA_ERROR_INVALID_VALUE);
    assert_null(s);
}

/* ---- devices and contexts ------------------------------------------------------------------- */

static void test_device_queries(void **state)
{
    (void)state;
    CUdevice d = -1;
    int v = 0;
    char name[64];
    size_t bytes = 0;
    assert_int_equal(cuDeviceGet(&d, 0), CUDA_SUCCESS);
    assert_int_equal(d, 0);
    assert_int_equal(cuDeviceGet(&d, 1), CUDA_ERROR_INVALID_DEVICE);
    assert_int_equal(cuDeviceGetName(name, sizeof name, 0), CUDA_SUCCESS);
    assert_string_equal(name, "Fake CUDA Device 0");
    assert_int_equal(cuDeviceTotalMem(&bytes, 0), CUDA_SUCCESS);
    assert_int_equal(bytes, DEFAULT_BYTES);
    assert_int_equal(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0),
                     CUDA_SUCCESS);
    assert_int_equal(v, 1);
    assert_int_equal(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 0),
                     CUDA_SUCCESS);
    assert_int_equal(v, 0);
    assert_int_equal(cuCtxGetDevice(&d), CUDA_SUCCESS);
    assert_int_equal(d, 0);
}

static void test_context_stack(void **state)
{
    (void)state;
    CUcontext c2 = NULL, cur = NULL;
    CUdeviceptr p;
    assert_int_equal(cuCtxCreate(&c2, NULL, 0, 0), CUDA_SUCCESS);
    assert_true(c2 != g_ctx);
    assert_int_equal(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
    assert_ptr_equal(cur, c2);
    assert_int_equal(cuMemAlloc(&p, 4096), CUDA_SUCCESS);
    assert_int_equal(cuCtxPopCurrent(&cur), CUDA_SUCCESS);
    assert_ptr_equal(cur, c2);
    assert_int_equal(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
    assert_ptr_equal(cur, g_ctx);
    assert_int_equal(cuCtxPushCurrent(c2), CUDA_SUCCESS);
    assert_int_equal(cuCtxSetCurrent(g_ctx), CUDA_SUCCESS); /* replaces the top */
    assert_int_equal(cuCtxPopCurrent(&cur), CUDA_SUCCESS);
    assert_ptr_equal(cur, g_ctx);
    assert_int_equal(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
    assert_ptr_equal(cur, g_ctx);
    assert_int_equal(cuCtxDestroy(g_ctx), CUDA_ERROR_INVALID_CONTEXT); /* primary */

    /* Destroying a context unmaps its memory; the handle never comes back. */
    assert_int_equal(fake_live_allocations(), 1);
    assert_int_equal(cuCtxDestroy(c2), CUDA_SUCCESS);
    assert_int_equal(fake_live_allocations(), 0);
    assert_int_equal(cuCtxDestroy(c2), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cuCtxPushCurrent(c2), CUDA_ERROR_INVALID_CONTEXT);
    CUcontext c3 = NULL;
    assert_int_equal(cuCtxCreate(&c3, NULL, 0, 0), CUDA_SUCCESS);
    assert_true(c3 != c2);
    assert_int_equal(cuCtxDestroy(c3), CUDA_SUCCESS); /* current: popped */
    assert_int_equal(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
    assert_ptr_equal(cur, g_ctx);
}

static void test_primary_release_and_reset(void **state)
{
    (void)state;
    CUcontext again = NULL, old = g_ctx;
    CUdeviceptr p;
    CUstream s;
    unsigned flags = 1;
    int active = 0;
    assert_int_equal(cuDevicePrimaryCtxRetain(&again, 0), CUDA_SUCCESS);
    assert_ptr_equal(again, g_ctx);
    assert_int_equal(cuMemAlloc(&p, 4096), CUDA_SUCCESS);
    assert_int_equal(cuStreamCreate(&s, 0), CUDA_SUCCESS);
    assert_int_equal(fake_stream_launch(s), 0);

    assert_int_equal(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS); /* 2 -> 1 */
    assert_int_equal(fake_live_allocations(), 1);
    assert_int_equal(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS); /* 1 -> 0: gone */
    assert_int_equal(fake_live_allocations(), 0);
    assert_int_equal(fake_device_used(0), 0);
    assert_int_equal(cuDevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
    assert_int_equal(active, 0);
    assert_int_equal(cuDevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);

    /* The stale context stays current, unusable; its objects are invalid. */
    CUcontext cur = NULL;
    assert_int_equal(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
    assert_ptr_equal(cur, old);
    assert_int_equal(cuMemAlloc(&p, 16), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    assert_int_equal(cuStreamQuery(s), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(fake_stream_pending(s), 0); /* its work was completed */

    assert_int_equal(cuDevicePrimaryCtxRetain(&g_ctx, 0), CUDA_SUCCESS);
    assert_true(g_ctx != old);
    assert_int_equal(cuCtxSetCurrent(g_ctx), CUDA_SUCCESS);
    assert_int_equal(cuDevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
    assert_int_equal(active, 1);

    /* Reset destroys at once, whatever the count. */
    assert_int_equal(cuDevicePrimaryCtxRetain(&again, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemAlloc(&p, 4096), CUDA_SUCCESS);
    assert_int_equal(cuDevicePrimaryCtxReset(0), CUDA_SUCCESS);
    assert_int_equal(fake_live_allocations(), 0);
    assert_int_equal(cuMemFree(p), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    assert_int_equal(cuDevicePrimaryCtxRetain(&g_ctx, 0), CUDA_SUCCESS);
    assert_int_equal(cuCtxSetCurrent(g_ctx), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(p), CUDA_ERROR_INVALID_VALUE); /* vanished with its context */
}

static void test_multiple_devices(void **state)
{
    (void)state;
    fake_set_device_count(3);
    fake_set_device_bytes(1, MiB);
    int n = 0;
    CUdevice d = -1;
    CUcontext c1 = NULL;
    CUdeviceptr p, q;
    assert_int_equal(cuDeviceGetCount(&n), CUDA_SUCCESS);
    assert_int_equal(n, 3);
    assert_int_equal(cuDeviceGet(&d, 3), CUDA_ERROR_INVALID_DEVICE);
    assert_int_equal(cuDevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
    assert_true(c1 != g_ctx);
    assert_int_equal(cuCtxPushCurrent(c1), CUDA_SUCCESS);
    assert_int_equal(cuCtxGetDevice(&d), CUDA_SUCCESS);
    assert_int_equal(d, 1);
    assert_int_equal(cuMemAlloc(&p, MiB), CUDA_SUCCESS);
    assert_int_equal(cuMemAlloc(&q, 1), CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(fake_device_used(1), MiB);
    assert_int_equal(fake_device_used(0), 0);
    assert_int_equal(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
    assert_int_equal(cuMemAlloc(&q, MiB), CUDA_SUCCESS); /* device 0 has room */
    assert_int_equal(fake_device_used(0), MiB);
    /* A free from another context's thread works; the memory knows its device. */
    assert_int_equal(cuMemFree(p), CUDA_SUCCESS);
    assert_int_equal(fake_device_used(1), 0);
    assert_int_equal(cuMemFree(q), CUDA_SUCCESS);
    assert_int_equal(cuDevicePrimaryCtxReset(1), CUDA_SUCCESS);
    fake_set_device_bytes(1, DEFAULT_BYTES);
}

/* A pool's allocations are its device's memory, whatever the stream's device; a host pool's
 * are no device's. */
static void test_pools_keep_their_device(void **state)
{
    (void)state;
    fake_set_device_count(2);
    CUmemoryPool def1, mine, host;
    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                            .location = {CU_MEM_LOCATION_TYPE_DEVICE, 1}};
    assert_int_equal(cuDeviceGetDefaultMemPool(&def1, 1), CUDA_SUCCESS);
    CUmemoryPool again;
    assert_int_equal(cuDeviceGetDefaultMemPool(&again, 1), CUDA_SUCCESS);
    assert_ptr_equal(again, def1);
    assert_int_equal(cuDeviceGetDefaultMemPool(&again, 2), CUDA_ERROR_INVALID_DEVICE);
    assert_int_equal(cuMemPoolCreate(&mine, &props), CUDA_SUCCESS);
    props.location = (CUmemLocation){CU_MEM_LOCATION_TYPE_HOST, 0};
    assert_int_equal(cuMemPoolCreate(&host, &props), CUDA_SUCCESS);
    props.location = (CUmemLocation){CU_MEM_LOCATION_TYPE_DEVICE, 2};
    assert_int_equal(cuMemPoolCreate(&again, &props), CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr a, b, c;
    /* Ordered on the legacy stream of device 0's context. */
    assert_int_equal(cuMemAllocFromPoolAsync(&a, MiB, def1, NULL), CUDA_SUCCESS);
    assert_int_equal(cuMemAllocFromPoolAsync(&b, 2 * MiB, mine, NULL), CUDA_SUCCESS);
    assert_int_equal(cuMemAllocFromPoolAsync(&c, 4 * MiB, host, NULL), CUDA_SUCCESS);
    assert_int_equal(fake_device_used(0), 0);
    assert_int_equal(fake_device_used(1), 3 * MiB);
    int ordinal = -1;
    assert_int_equal(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, b),
                     CUDA_SUCCESS);
    assert_int_equal(ordinal, 1);
    assert_int_equal(cuMemAllocFromPoolAsync(&c, MiB, (CUmemoryPool)&props, NULL),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemPoolDestroy(def1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemPoolDestroy(mine), CUDA_SUCCESS);
    assert_int_equal(cuMemPoolDestroy(mine), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemPoolDestroy(host), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeAsync(b, NULL), CUDA_SUCCESS);  /* outlived its pool */
    assert_int_equal(cuMemFreeAsync(a, NULL), CUDA_SUCCESS);
    assert_int_equal(fake_device_used(1), 0);
    assert_int_equal(cuMemFree(c), CUDA_SUCCESS);
    assert_int_equal(fake_live_allocations(), 0);
}

/* ---- ordering ----------------------------------------------------------------------------- */

static void test_legacy_event_waits_for_blocking_streams(void **state)
{
    (void)state;
    CUstream blk, nb;
    CUevent ev;
    assert_int_equal(cuStreamCreate(&blk, 0), CUDA_SUCCESS);
    assert_int_equal(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cuEventCreate(&ev, 0), CUDA_SUCCESS);
    assert_int_equal(cuEventQuery(ev), CUDA_SUCCESS); /* never recorded */

    assert_int_equal(fake_stream_launch(blk), 0);
    assert_int_equal(cuEventRecord(ev, NULL), CUDA_SUCCESS);
    assert_int_equal(cuEventQuery(ev), CUDA_ERROR_NOT_READY);
    assert_int_equal(cuStreamQuery(NULL), CUDA_ERROR_NOT_READY);
    assert_int_equal(cuStreamQuery(blk), CUDA_ERROR_NOT_READY);
    fake_stream_retire(blk, 1);
    assert_int_equal(cuEventQuery(ev), CUDA_SUCCESS);
    assert_int_equal(cuStreamQuery(CU_STREAM_LEGACY), CUDA_SUCCESS);

    /* The legacy stream does not wait for non-blocking streams. */
    assert_int_equal(fake_stream_launch(nb), 0);
    assert_int_equal(cuEventRecord(ev, CU_STREAM_LEGACY), CUDA_SUCCESS);
    assert_int_equal(cuEventQuery(ev), CUDA_SUCCESS);
    assert_int_equal(cuStreamQuery(NULL), CUDA_SUCCESS);
    /* An event on the non-blocking stream waits for its work. */
    assert_int_equal(cuEventRecord(ev, nb), CUDA_SUCCESS);
    assert_int_equal(cuEventQuery(ev), CUDA_ERROR_NOT_READY);
    fake_stream_retire(nb, -1);
    assert_int_equal(cuEventQuery(ev), CUDA_SUCCESS);

    /* Legacy work itself. */
    assert_int_equal(fake_stream_launch(NULL), 0);
    assert_int_equal(cuEventRecord(ev, NULL), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(CU_STREAM_LEGACY), 1);
    assert_int_equal(cuEventQuery(ev), CUDA_ERROR_NOT_READY);
    fake_stream_retire(NULL, 1);
    assert_int_equal(cuEventQuery(ev), CUDA_SUCCESS);

    assert_int_equal(cuEventDestroy(ev), CUDA_SUCCESS);
    assert_int_equal(cuEventQuery(ev), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuStreamDestroy(blk), CUDA_SUCCESS);
    assert_int_equal(cuStreamDestroy(nb), CUDA_SUCCESS);
}

static void test_fifo_and_partial_retire(void **state)
{
    (void)state;
    CUstream s;
    CUevent e1, e2;
    assert_int_equal(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cuEventCreate(&e1, 0), CUDA_SUCCESS);
    assert_int_equal(cuEventCreate(&e2, 0), CUDA_SUCCESS);
    for (int i = 0; i < 3; i++)
        fake_stream_launch(s);
    assert_int_equal(cuEventRecord(e1, s), CUDA_SUCCESS);
    fake_stream_launch(s);
    assert_int_equal(cuEventRecord(e2, s), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(s), 4);
    fake_stream_retire(s, 2);
    assert_int_equal(cuEventQuery(e1), CUDA_ERROR_NOT_READY);
    fake_stream_retire(s, 1);
    assert_int_equal(cuEventQuery(e1), CUDA_SUCCESS);
    assert_int_equal(cuEventQuery(e2), CUDA_ERROR_NOT_READY);
    /* Synchronizing on an event completes just the work it captured. */
    fake_stream_launch(s);
    assert_int_equal(cuEventSynchronize(e2), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(s), 1);
    assert_int_equal(cuStreamSynchronize(s), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(s), 0);
    unsigned flags = 0;
    assert_int_equal(cuStreamGetFlags(s, &flags), CUDA_SUCCESS);
    assert_int_equal(flags, CU_STREAM_NON_BLOCKING);
    cuEventDestroy(e1);
    cuEventDestroy(e2);
    cuStreamDestroy(s);
}

static void test_destroyed_stream_work_outlives_it(void **state)
{
    (void)state;
    CUstream s, b;
    CUevent ev, leg;
    assert_int_equal(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cuStreamCreate(&b, 0), CUDA_SUCCESS);
    assert_int_equal(cuEventCreate(&ev, 0), CUDA_SUCCESS);
    assert_int_equal(cuEventCreate(&leg, 0), CUDA_SUCCESS);
    fake_stream_launch(s);
    assert_int_equal(cuEventRecord(ev, s), CUDA_SUCCESS);
    assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);
    assert_int_equal(cuStreamDestroy(s), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuStreamQuery(s), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(fake_stream_launch(s), -1);
    assert_int_equal(cuEventQuery(ev), CUDA_ERROR_NOT_READY);
    assert_int_equal(fake_stream_pending(s), 1);
    fake_stream_retire(s, -1);
    assert_int_equal(cuEventQuery(ev), CUDA_SUCCESS);

    /* A destroyed blocking stream's leftover work still holds the legacy stream back. */
    fake_stream_launch(b);
    assert_int_equal(cuStreamDestroy(b), CUDA_SUCCESS);
    assert_int_equal(cuEventRecord(leg, NULL), CUDA_SUCCESS);
    assert_int_equal(cuEventQuery(leg), CUDA_ERROR_NOT_READY);
    fake_retire_all();
    assert_int_equal(cuEventQuery(leg), CUDA_SUCCESS);
    cuEventDestroy(ev);
    cuEventDestroy(leg);
}

static void test_per_thread_stream_is_blocking(void **state)
{
    (void)state;
    CUevent ev;
    assert_int_equal(cuEventCreate(&ev, 0), CUDA_SUCCESS);
    assert_int_equal(fake_stream_launch(CU_STREAM_PER_THREAD), 0);
    assert_int_equal(cuEventRecord(ev, NULL), CUDA_SUCCESS);
    assert_int_equal(cuEventQuery(ev), CUDA_ERROR_NOT_READY);
    /* The _ptsz entry takes NULL as the per-thread stream. */
    assert_int_equal(cuEventRecord_ptsz(ev, NULL), CUDA_SUCCESS);
    assert_int_equal(cuEventQuery(ev), CUDA_ERROR_NOT_READY);
    assert_int_equal(cuStreamQuery_ptsz(NULL), CUDA_ERROR_NOT_READY);
    assert_int_equal(cuStreamQuery(CU_STREAM_LEGACY), CUDA_ERROR_NOT_READY);
    assert_int_equal(cuStreamSynchronize(CU_STREAM_PER_THREAD), CUDA_SUCCESS);
    assert_int_equal(cuEventQuery(ev), CUDA_SUCCESS);
    cuEventDestroy(ev);
}

static void test_synchronizing_calls(void **state)
{
    (void)state;
    CUstream nb, blk;
    CUdeviceptr p;
    assert_int_equal(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cuStreamCreateWithPriority(&blk, 0, -1), CUDA_SUCCESS);
    assert_int_equal(cuMemAlloc(&p, 256), CUDA_SUCCESS);
    fake_stream_launch(nb);
    fake_stream_launch(blk);
    fake_stream_launch(NULL);
    /* cuStreamSynchronize on the legacy stream waits for blocking streams only. */
    assert_int_equal(cuStreamSynchronize(NULL), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(blk), 0);
    assert_int_equal(fake_stream_pending(nb), 1);
    /* cuMemFree waits for everything in the context, non-blocking streams included. */
    fake_stream_launch(blk);
    assert_int_equal(cuMemFree(p), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(nb), 0);
    assert_int_equal(fake_stream_pending(blk), 0);
    fake_stream_launch(nb);
    fake_stream_launch(NULL);
    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(nb), 0);
    assert_int_equal(fake_stream_pending(NULL), 0);
    cuStreamDestroy(nb);
    cuStreamDestroy(blk);
}

static void test_event_on_other_context(void **state)
{
    (void)state;
    CUevent ev;
    CUstream s2;
    CUcontext c2;
    assert_int_equal(cuEventCreate(&ev, 0), CUDA_SUCCESS);
    assert_int_equal(cuCtxCreate(&c2, NULL, 0, 0), CUDA_SUCCESS);
    assert_int_equal(cuStreamCreate(&s2, 0), CUDA_SUCCESS);
    assert_int_equal(cuEventRecord(ev, s2), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuEventRecord(ev, NULL), CUDA_ERROR_INVALID_HANDLE); /* c2's legacy */
    assert_int_equal(cuCtxDestroy(c2), CUDA_SUCCESS);
    assert_int_equal(cuEventRecord(ev, NULL), CUDA_SUCCESS);
    assert_int_equal(cuStreamQuery(s2), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuEventRecord(ev, (CUstream)&ev), CUDA_ERROR_INVALID_HANDLE); /* garbage */
    cuEventDestroy(ev);
}

/* ---- the timeline: units, their order, completion, races ------------------------------------ */

static CUstream new_stream(unsigned flags)
{
    CUstream s = NULL;
    assert_int_equal(cuStreamCreate(&s, flags), CUDA_SUCCESS);
    return s;
}

static CUevent new_event(void)
{
    CUevent e = NULL;
    assert_int_equal(cuEventCreate(&e, 0), CUDA_SUCCESS);
    return e;
}

static CUdeviceptr new_mem(size_t n)
{
    CUdeviceptr p = 0;
    assert_int_equal(cuMemAlloc(&p, n), CUDA_SUCCESS);
    return p;
}

/* The fake's touch kernel over [p, p + n) on stream s. */
static CUresult touch(CUstream s, CUdeviceptr p, size_t n)
{
    void *params[] = {&p, &n};
    return cuLaunchKernel(fake_touch_kernel(), 1, 1, 1, 32, 1, 1, 0, s, params, NULL);
}

/* n driver calls: n ticks. cuDriverGetVersion takes no lock, so the timeline only catches up
 * at the next call that does (or a control call). */
static void burn(int n)
{
    int v;
    for (int i = 0; i < n; i++)
        cuDriverGetVersion(&v);
}

static void test_touch_kernel(void **state)
{
    (void)state;
    CUstream s = new_stream(CU_STREAM_NON_BLOCKING);
    CUdeviceptr p = new_mem(4096), bogus = 16;
    size_t n = 4096, big = 4097, zero = 0;
    void *params[] = {&p, &n};
    void *too_big[] = {&p, &big};
    void *nothing[] = {&bogus, &zero};
    CUfunction k = fake_touch_kernel();
    assert_non_null(k);
    assert_ptr_equal(fake_touch_kernel(), k);
    assert_int_equal(cuLaunchKernel(k, 2, 1, 1, 128, 1, 1, 0, s, params, NULL), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(s), 1);
    assert_int_equal(cuStreamQuery(s), CUDA_ERROR_NOT_READY);

    /* Refused launches add no work. */
    assert_int_equal(cuLaunchKernel((CUfunction)(void *)&n, 1, 1, 1, 1, 1, 1, 0, s, params, NULL),
                     CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, s, params, NULL),
                     CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, s, too_big, NULL),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuLaunchKernel(k, 0, 1, 1, 1, 1, 1, 0, s, params, NULL),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuLaunchKernel(k, 1, 1, 1, 1025, 1, 1, 0, s, params, NULL),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, (CUstream)&n, params, NULL),
                     CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(fake_stream_pending(s), 1);
    /* Zero bytes touch nothing, wherever they point. */
    assert_int_equal(cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, s, nothing, NULL), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(s), 2);

    /* cuLaunchKernelEx takes its stream from the configuration. */
    CUlaunchConfig cfg = {.gridDimX = 4, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 256,
                          .blockDimY = 1, .blockDimZ = 1, .hStream = s};
    assert_int_equal(cuLaunchKernelEx(&cfg, k, params, NULL), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(s), 3);
    assert_int_equal(cuLaunchKernelEx(NULL, k, params, NULL), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuLaunchKernelEx(&cfg, NULL, params, NULL), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuStreamSynchronize(s), CUDA_SUCCESS);

    /* NULL is the legacy stream, or the per-thread stream in the _ptsz forms. */
    cfg.hStream = NULL;
    assert_int_equal(cuLaunchKernelEx(&cfg, k, params, NULL), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(CU_STREAM_LEGACY), 1);
    assert_int_equal(cuLaunchKernelEx_ptsz(&cfg, k, params, NULL), CUDA_SUCCESS);
    assert_int_equal(cuLaunchKernel_ptsz(k, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL),
                     CUDA_SUCCESS);
    assert_int_equal(touch(CU_STREAM_PER_THREAD, p, 8), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(CU_STREAM_PER_THREAD), 3);
    assert_int_equal(fake_stream_pending(CU_STREAM_LEGACY), 1);
    assert_int_equal(fake_calls("cuLaunchKernel"), 10);
    assert_int_equal(fake_calls("cuLaunchKernel_ptsz"), 1);
    assert_int_equal(fake_calls("cuLaunchKernelEx"), 4);
    assert_int_equal(fake_calls("cuLaunchKernelEx_ptsz"), 1);
    assert_int_equal(fake_races(), 0); /* all on one stream, or ordered by the legacy rules */
    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(CU_STREAM_PER_THREAD), 0);
    assert_int_equal(cuMemFree(p), CUDA_SUCCESS);
    cuStreamDestroy(s);
}

static void test_async_copies_and_memsets(void **state)
{
    (void)state;
    CUstream s = new_stream(CU_STREAM_NON_BLOCKING);
    CUdeviceptr p = new_mem(256), q = new_mem(256);
    unsigned char in[256], out[256];
    memset(in, 7, sizeof in);
    memset(out, 0, sizeof out);
    assert_int_equal(cuMemsetD8Async(p, 0x33, 256, s), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyHtoDAsync(q, in, 128, s), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoDAsync(p + 128, q, 128, s), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoHAsync(out, p, 256, s), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(s), 4);
    /* The fake moves the bytes at submission. */
    assert_int_equal(out[0], 0x33);
    assert_int_equal(out[127], 0x33);
    assert_int_equal(out[128], 7);
    assert_int_equal(out[255], 7);

    /* Ranges are checked as for the synchronous calls; a refused call adds no work. */
    assert_int_equal(cuMemsetD8Async(p, 0, 257, s), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemcpyHtoDAsync(q, NULL, 1, s), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemcpyDtoHAsync(NULL, q, 1, s), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemcpyDtoDAsync(p, q + 1, 256, s), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemcpyDtoDAsync(p + 1, q, 256, s), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemsetD8Async(p, 0, 1, (CUstream)in), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(fake_stream_pending(s), 4);
    assert_int_equal(cuStreamSynchronize(s), CUDA_SUCCESS);

    /* NULL is the legacy stream, or the per-thread stream in the _ptsz forms. */
    assert_int_equal(cuMemsetD8Async(p, 1, 1, NULL), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(NULL), 1);
    assert_int_equal(cuMemsetD8Async_ptsz(p, 2, 1, NULL), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyHtoDAsync_v2_ptsz(q, in, 1, NULL), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoHAsync_v2_ptsz(out, p, 1, NULL), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoDAsync_v2_ptsz(p + 1, q, 1, NULL), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(CU_STREAM_PER_THREAD), 4);
    assert_int_equal(out[0], 2);
    assert_int_equal(fake_races(), 0);
    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(CU_STREAM_PER_THREAD), 0);
    assert_int_equal(fake_stream_pending(NULL), 0);
    cuMemFree(p);
    cuMemFree(q);
    cuStreamDestroy(s);
}

static void test_sync_copies_are_legacy_units(void **state)
{
    (void)state;
    CUstream blk = new_stream(0), nb = new_stream(CU_STREAM_NON_BLOCKING);
    CUdeviceptr p = new_mem(64), q = new_mem(64);
    char buf[64] = {0};
    fake_stream_launch(blk);
    fake_stream_launch(nb);
    fake_stream_launch(NULL);
    assert_int_equal(cuMemsetD8(p, 1, 64), CUDA_SUCCESS);
    /* It waited for the legacy stream, and so for the blocking streams; not for nb. */
    assert_int_equal(fake_stream_pending(NULL), 0);
    assert_int_equal(fake_stream_pending(blk), 0);
    assert_int_equal(fake_stream_pending(nb), 1);

    /* The _ptds forms run on the per-thread stream, which like any blocking stream is
     * ordered after the legacy stream's earlier work. */
    fake_stream_launch(NULL);
    fake_stream_launch(CU_STREAM_PER_THREAD);
    assert_int_equal(cuMemcpyDtoH_v2_ptds(buf, p, 64), CUDA_SUCCESS);
    assert_int_equal(buf[63], 1);
    assert_int_equal(fake_stream_pending(CU_STREAM_PER_THREAD), 0);
    assert_int_equal(fake_stream_pending(NULL), 0);
    assert_int_equal(fake_stream_pending(nb), 1);
    assert_int_equal(cuMemsetD8_v2_ptds(q, 2, 64), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoD(p, q, 64), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoH(buf, p, 64), CUDA_SUCCESS);
    assert_int_equal(buf[0], 2);
    assert_int_equal(fake_calls("cuMemsetD8_v2_ptds"), 1);
    assert_int_equal(fake_calls("cuMemcpyDtoH_v2"), 1);
    assert_int_equal(fake_races(), 0); /* nb's unit touches nothing */
    cuMemFree(p);
    cuMemFree(q);
    cuStreamDestroy(blk);
    cuStreamDestroy(nb);
}

static void test_legacy_and_blocking_order(void **state)
{
    (void)state;
    CUstream blk = new_stream(0), nb = new_stream(CU_STREAM_NON_BLOCKING);
    /* A legacy unit is after the blocking streams' earlier units, not the non-blocking ones':
     * completing it completes them first. */
    fake_stream_launch(blk);
    fake_stream_launch(nb);
    fake_stream_launch(NULL);
    fake_stream_retire(NULL, 1);
    assert_int_equal(fake_stream_pending(blk), 0);
    assert_int_equal(fake_stream_pending(nb), 1);
    /* A blocking stream's unit is after the legacy stream's earlier units. */
    fake_stream_launch(NULL);
    fake_stream_launch(blk);
    fake_stream_retire(blk, 1);
    assert_int_equal(fake_stream_pending(NULL), 0);
    /* The legacy stream and a non-blocking stream are not ordered either way. */
    fake_stream_launch(NULL);
    fake_stream_retire(nb, -1);
    assert_int_equal(fake_stream_pending(NULL), 1);
    fake_stream_launch(nb);
    fake_stream_retire(NULL, -1);
    assert_int_equal(fake_stream_pending(nb), 1);
    fake_stream_retire(nb, -1);
    /* The order is the order of submission: a blocking unit is not after later legacy work. */
    fake_stream_launch(blk);
    fake_stream_launch(NULL);
    fake_stream_retire(blk, 1);
    assert_int_equal(fake_stream_pending(NULL), 1);
    fake_stream_retire(NULL, -1);

    /* The legacy stream is ordered with the blocking streams of its own context only. */
    CUcontext c2;
    assert_int_equal(cuCtxCreate(&c2, NULL, 0, 0), CUDA_SUCCESS);
    CUstream other = new_stream(0);
    fake_stream_launch(other);
    assert_int_equal(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
    fake_stream_launch(NULL);
    fake_stream_retire(NULL, -1);
    assert_int_equal(fake_stream_pending(other), 1);
    assert_int_equal(cuCtxDestroy(c2), CUDA_SUCCESS); /* completes its work */
    assert_int_equal(fake_stream_pending(other), 0);
    cuStreamDestroy(blk);
    cuStreamDestroy(nb);
}

static void test_stream_wait_event(void **state)
{
    (void)state;
    CUstream a = new_stream(CU_STREAM_NON_BLOCKING), b = new_stream(CU_STREAM_NON_BLOCKING);
    CUevent e = new_event(), fresh = new_event();
    fake_stream_launch(a);
    fake_stream_launch(a);
    assert_int_equal(cuEventRecord(e, a), CUDA_SUCCESS);
    fake_stream_launch(a); /* after the record: not waited for */
    assert_int_equal(cuStreamWaitEvent(b, e, 0), CUDA_SUCCESS);
    /* The wait is enqueued on b: b is not idle until a's first two units complete. */
    assert_int_equal(cuStreamQuery(b), CUDA_ERROR_NOT_READY);
    fake_stream_launch(b);
    fake_stream_retire(b, 1);
    assert_int_equal(fake_stream_pending(a), 1);
    assert_int_equal(cuStreamQuery(b), CUDA_SUCCESS);

    /* An event never recorded orders nothing; CU_EVENT_WAIT_EXTERNAL is a valid flag. */
    assert_int_equal(cuStreamWaitEvent(b, fresh, CU_EVENT_WAIT_EXTERNAL), CUDA_SUCCESS);
    assert_int_equal(cuStreamQuery(b), CUDA_SUCCESS);
    assert_int_equal(cuStreamWaitEvent(b, e, 2), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuStreamWaitEvent(b, NULL, 0), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuStreamWaitEvent(b, (CUevent)a, 0), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuStreamWaitEvent((CUstream)e, e, 0), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuStreamWaitEvent((CUstream)&e, e, 0), CUDA_ERROR_INVALID_HANDLE);

    /* NULL is the legacy stream, or the per-thread stream in the _ptsz form. */
    assert_int_equal(cuEventRecord(e, a), CUDA_SUCCESS); /* a's third unit */
    assert_int_equal(cuStreamWaitEvent(NULL, e, 0), CUDA_SUCCESS);
    assert_int_equal(cuStreamQuery(NULL), CUDA_ERROR_NOT_READY);
    assert_int_equal(cuStreamWaitEvent_ptsz(NULL, e, 0), CUDA_SUCCESS);
    assert_int_equal(cuStreamQuery_ptsz(NULL), CUDA_ERROR_NOT_READY);
    assert_int_equal(cuStreamSynchronize(NULL), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(a), 0);
    assert_int_equal(cuStreamQuery_ptsz(NULL), CUDA_SUCCESS);

    /* Waiting on another context's event is allowed, and orders as any other. */
    CUcontext c2;
    assert_int_equal(cuCtxCreate(&c2, NULL, 0, 0), CUDA_SUCCESS);
    CUstream o = new_stream(CU_STREAM_NON_BLOCKING);
    CUevent eo = new_event();
    fake_stream_launch(o);
    assert_int_equal(cuEventRecord(eo, o), CUDA_SUCCESS);
    assert_int_equal(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
    assert_int_equal(cuStreamWaitEvent(b, eo, 0), CUDA_SUCCESS);
    fake_stream_launch(b);
    fake_stream_retire(b, -1);
    assert_int_equal(fake_stream_pending(o), 0);
    assert_int_equal(fake_calls("cuStreamWaitEvent"), 9);
    assert_int_equal(fake_calls("cuStreamWaitEvent_ptsz"), 1);
    assert_int_equal(cuCtxDestroy(c2), CUDA_SUCCESS);
    cuEventDestroy(e);
    cuEventDestroy(fresh);
    cuStreamDestroy(a);
    cuStreamDestroy(b);
}

static void test_events_over_waits(void **state)
{
    (void)state;
    CUstream a = new_stream(CU_STREAM_NON_BLOCKING), b = new_stream(CU_STREAM_NON_BLOCKING);
    CUevent e1 = new_event(), e2 = new_event();
    /* An event recorded after a wait covers what was waited for, even with no unit between. */
    fake_stream_launch(a);
    assert_int_equal(cuEventRecord(e1, a), CUDA_SUCCESS);
    assert_int_equal(cuStreamWaitEvent(b, e1, 0), CUDA_SUCCESS);
    assert_int_equal(cuEventRecord(e2, b), CUDA_SUCCESS);
    assert_int_equal(cuEventQuery(e2), CUDA_ERROR_NOT_READY);
    fake_stream_retire(a, -1);
    assert_int_equal(cuEventQuery(e2), CUDA_SUCCESS);
    /* Synchronizing on it completes both streams' work. */
    fake_stream_launch(a);
    assert_int_equal(cuEventRecord(e1, a), CUDA_SUCCESS);
    assert_int_equal(cuStreamWaitEvent(b, e1, 0), CUDA_SUCCESS);
    fake_stream_launch(b);
    assert_int_equal(cuEventRecord(e2, b), CUDA_SUCCESS);
    assert_int_equal(cuEventSynchronize(e2), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(a), 0);
    assert_int_equal(fake_stream_pending(b), 0);
    /* A wait takes the event as it is at the wait: a later record does not move it. */
    fake_stream_launch(a);
    assert_int_equal(cuEventRecord(e1, a), CUDA_SUCCESS);
    assert_int_equal(cuStreamWaitEvent(b, e1, 0), CUDA_SUCCESS);
    fake_stream_launch(a);
    assert_int_equal(cuEventRecord(e1, a), CUDA_SUCCESS);
    fake_stream_launch(b);
    fake_stream_retire(b, -1);
    assert_int_equal(fake_stream_pending(a), 1);
    assert_int_equal(cuEventQuery(e1), CUDA_ERROR_NOT_READY);
    cuEventDestroy(e1);
    cuEventDestroy(e2);
    cuStreamDestroy(a);
    cuStreamDestroy(b);
}

static void test_completion_cascades(void **state)
{
    (void)state;
    CUstream a = new_stream(CU_STREAM_NON_BLOCKING), b = new_stream(CU_STREAM_NON_BLOCKING),
             c = new_stream(CU_STREAM_NON_BLOCKING), blk = new_stream(0);
    CUevent ea = new_event(), eb = new_event();
    /* a -> b -> c: completing c's unit completes the chain, not a's later unit. */
    fake_stream_launch(a);
    assert_int_equal(cuEventRecord(ea, a), CUDA_SUCCESS);
    fake_stream_launch(a);
    assert_int_equal(cuStreamWaitEvent(b, ea, 0), CUDA_SUCCESS);
    fake_stream_launch(b);
    assert_int_equal(cuEventRecord(eb, b), CUDA_SUCCESS);
    assert_int_equal(cuStreamWaitEvent(c, eb, 0), CUDA_SUCCESS);
    fake_stream_launch(c);
    fake_stream_launch(c);
    fake_stream_retire(c, 1);
    assert_int_equal(fake_stream_pending(c), 1);
    assert_int_equal(fake_stream_pending(b), 0);
    assert_int_equal(fake_stream_pending(a), 1);
    /* cuStreamSynchronize completes what the stream is ordered after too. */
    fake_stream_launch(b);
    assert_int_equal(cuEventRecord(eb, b), CUDA_SUCCESS);
    assert_int_equal(cuStreamWaitEvent(c, eb, 0), CUDA_SUCCESS);
    assert_int_equal(cuStreamSynchronize(c), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(b), 0);
    assert_int_equal(fake_stream_pending(c), 0);
    assert_int_equal(fake_stream_pending(a), 1);
    /* Through the legacy rules: legacy -> blocking stream -> event -> c. */
    fake_stream_launch(NULL);
    fake_stream_launch(blk);
    assert_int_equal(cuEventRecord(eb, blk), CUDA_SUCCESS);
    assert_int_equal(cuStreamWaitEvent(c, eb, 0), CUDA_SUCCESS);
    fake_stream_launch(c);
    fake_stream_retire(c, -1);
    assert_int_equal(fake_stream_pending(NULL), 0);
    assert_int_equal(fake_stream_pending(blk), 0);
    assert_int_equal(fake_stream_pending(a), 1);
    /* fake_stream_retire on a destroyed stream still cascades. */
    assert_int_equal(cuEventRecord(ea, a), CUDA_SUCCESS);
    assert_int_equal(cuStreamWaitEvent(b, ea, 0), CUDA_SUCCESS);
    fake_stream_launch(b);
    assert_int_equal(cuStreamDestroy(b), CUDA_SUCCESS);
    fake_stream_retire(b, -1);
    assert_int_equal(fake_stream_pending(a), 0);
    cuEventDestroy(ea);
    cuEventDestroy(eb);
    cuStreamDestroy(a);
    cuStreamDestroy(c);
    cuStreamDestroy(blk);
}

struct ptds_worker {
    CUcontext ctx;
    CUevent ev;
    CUresult rc;
};

/* Launches on its own per-thread stream, records there, and exits: the stream dies, its
 * work stays. */
static void *ptds_thread(void *arg)
{
    struct ptds_worker *w = arg;
    w->rc = cuCtxSetCurrent(w->ctx);
    if (w->rc == CUDA_SUCCESS && fake_stream_launch(CU_STREAM_PER_THREAD) != 0)
        w->rc = CUDA_ERROR_UNKNOWN;
    if (w->rc == CUDA_SUCCESS)
        w->rc = cuEventRecord_ptsz(w->ev, NULL);
    return NULL;
}

static void test_per_thread_streams(void **state)
{
    (void)state;
    struct ptds_worker w = {.ctx = g_ctx, .ev = new_event()};
    pthread_t t;
    fake_stream_launch(CU_STREAM_PER_THREAD);
    pthread_create(&t, NULL, ptds_thread, &w);
    pthread_join(t, NULL);
    assert_int_equal(w.rc, CUDA_SUCCESS);
    /* Each thread has its own: this one's holds one unit, not two. */
    assert_int_equal(fake_stream_pending(CU_STREAM_PER_THREAD), 1);
    assert_int_equal(cuEventQuery(w.ev), CUDA_ERROR_NOT_READY);
    /* Both are blocking: a legacy unit is after both, the dead thread's included. */
    fake_stream_launch(NULL);
    fake_stream_retire(NULL, 1);
    assert_int_equal(cuEventQuery(w.ev), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(CU_STREAM_PER_THREAD), 0);
    /* And a per-thread unit is after earlier legacy work. */
    fake_stream_launch(NULL);
    fake_stream_launch(CU_STREAM_PER_THREAD);
    fake_stream_retire(CU_STREAM_PER_THREAD, 1);
    assert_int_equal(fake_stream_pending(NULL), 0);
    cuEventDestroy(w.ev);
}

static void test_work_ticks(void **state)
{
    (void)state;
    CUstream a = new_stream(CU_STREAM_NON_BLOCKING), b = new_stream(CU_STREAM_NON_BLOCKING);
    CUevent e = new_event();
    fake_set_work_ticks(3);
    /* Submitted by a control call (not a tick): done 3 driver calls later. */
    assert_int_equal(fake_stream_launch(a), 0);
    burn(2);
    assert_int_equal(fake_stream_pending(a), 1);
    burn(1);
    assert_int_equal(fake_stream_pending(a), 0);
    /* A unit starts when its stream's previous unit completes. */
    fake_stream_launch(a);
    fake_stream_launch(a);
    burn(3);
    assert_int_equal(fake_stream_pending(a), 1);
    burn(2);
    assert_int_equal(fake_stream_pending(a), 1);
    burn(1);
    assert_int_equal(fake_stream_pending(a), 0);
    /* ... and when what it waits for completes: a's unit ends at +3 (the record and the wait
     * are ticks 1 and 2), b's starts then and ends at +6. */
    fake_stream_launch(a);
    assert_int_equal(cuEventRecord(e, a), CUDA_SUCCESS);
    assert_int_equal(cuStreamWaitEvent(b, e, 0), CUDA_SUCCESS);
    fake_stream_launch(b);
    burn(1);
    assert_int_equal(fake_stream_pending(a), 0);
    assert_int_equal(fake_stream_pending(b), 1);
    burn(2);
    assert_int_equal(fake_stream_pending(b), 1);
    burn(1);
    assert_int_equal(fake_stream_pending(b), 0);

    /* Units from before the setting wait for a retire, and hold back those after them. */
    fake_set_work_ticks(0);
    fake_stream_launch(a);
    fake_set_work_ticks(2);
    fake_stream_launch(a);
    burn(10);
    assert_int_equal(fake_stream_pending(a), 2);
    fake_stream_retire(a, 1); /* the second can start now */
    burn(1);
    assert_int_equal(fake_stream_pending(a), 1);
    assert_int_equal(cuStreamQuery(a), CUDA_SUCCESS); /* itself the second tick */

    /* A host loop that runs ahead of a GPU needing 4 ticks a kernel, 2 ticks an iteration:
     * work piles up while it runs, then drains by itself. */
    CUdeviceptr p = new_mem(64);
    fake_set_work_ticks(4);
    int most = 0;
    for (int i = 0; i < 20; i++) {
        assert_int_equal(touch(a, p, 64), CUDA_SUCCESS);
        assert_int_equal(cuEventRecord(e, a), CUDA_SUCCESS);
        int n = fake_stream_pending(a);
        most = n > most ? n : most;
    }
    assert_true(most > 5 && most < 20);
    assert_int_equal(cuEventQuery(e), CUDA_ERROR_NOT_READY);
    burn(4 * 20);
    assert_int_equal(cuEventQuery(e), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(a), 0);
    assert_int_equal(fake_races(), 0);
    cuMemFree(p);
    cuEventDestroy(e);
    cuStreamDestroy(a);
    cuStreamDestroy(b);
}

static void test_race_check(void **state)
{
    (void)state;
    CUstream a = new_stream(CU_STREAM_NON_BLOCKING), b = new_stream(CU_STREAM_NON_BLOCKING),
             blk = new_stream(0);
    CUevent e = new_event();
    CUdeviceptr p = new_mem(4096);
    /* Overlapping bytes on two unordered streams: a race. */
    assert_int_equal(touch(a, p, 1024), CUDA_SUCCESS);
    assert_int_equal(touch(b, p + 512, 16), CUDA_SUCCESS);
    assert_int_equal(fake_races(), 1);
    /* Disjoint bytes: none. */
    assert_int_equal(touch(b, p + 2048, 16), CUDA_SUCCESS);
    assert_int_equal(fake_races(), 1);
    fake_retire_all();
    fake_reset_counters();
    assert_int_equal(fake_races(), 0);

    /* One stream is ordered; so are streams joined by an event wait. */
    assert_int_equal(touch(a, p, 4096), CUDA_SUCCESS);
    assert_int_equal(touch(a, p, 4096), CUDA_SUCCESS);
    assert_int_equal(cuEventRecord(e, a), CUDA_SUCCESS);
    assert_int_equal(cuStreamWaitEvent(b, e, 0), CUDA_SUCCESS);
    assert_int_equal(touch(b, p, 4096), CUDA_SUCCESS);
    assert_int_equal(fake_races(), 0);
    /* ... but work submitted on a after the record is not ordered before b's. */
    assert_int_equal(touch(a, p, 1), CUDA_SUCCESS);
    assert_int_equal(fake_races(), 1);
    /* Completed work is no race. */
    fake_retire_all();
    assert_int_equal(touch(b, p, 4096), CUDA_SUCCESS);
    assert_int_equal(fake_races(), 1);
    fake_retire_all();
    fake_reset_counters();

    /* The legacy stream and blocking streams are ordered; a non-blocking stream is not. */
    assert_int_equal(touch(blk, p, 64), CUDA_SUCCESS);
    assert_int_equal(touch(NULL, p, 64), CUDA_SUCCESS);
    assert_int_equal(touch(blk, p, 64), CUDA_SUCCESS);
    assert_int_equal(fake_races(), 0);
    assert_int_equal(touch(b, p + 63, 1), CUDA_SUCCESS);
    assert_int_equal(fake_races(), 3);
    fake_retire_all();

    /* cuMemFree waits for the context's work: nothing is left touching freed memory. */
    assert_int_equal(touch(a, p, 64), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(p), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(a), 0);
    assert_int_equal(fake_races(), 3);
    cuEventDestroy(e);
    cuStreamDestroy(a);
    cuStreamDestroy(b);
    cuStreamDestroy(blk);
}

static void test_race_check_copies(void **state)
{
    (void)state;
    CUstream a = new_stream(CU_STREAM_NON_BLOCKING), b = new_stream(CU_STREAM_NON_BLOCKING),
             blk = new_stream(0);
    CUdeviceptr p = new_mem(4096), q = new_mem(64);
    char buf[64];
    /* Asynchronous copies and memsets check too, both ranges of a device-to-device copy. */
    assert_int_equal(touch(a, p, 1024), CUDA_SUCCESS);
    assert_int_equal(cuMemsetD8Async(p + 512, 0, 16, b), CUDA_SUCCESS);
    assert_int_equal(fake_races(), 1);
    assert_int_equal(touch(a, q, 64), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoDAsync(p + 2048, q, 64, b), CUDA_SUCCESS);
    assert_int_equal(fake_races(), 2);
    assert_int_equal(cuMemcpyHtoDAsync(p + 3072, buf, 64, b), CUDA_SUCCESS); /* disjoint */
    assert_int_equal(fake_races(), 2);
    fake_retire_all();
    fake_reset_counters();

    /* A synchronous copy first completes the legacy and blocking streams' work; work on a
     * non-blocking stream that still touches the bytes races with the host's access. */
    assert_int_equal(touch(blk, p, 64), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoH(buf, p, 64), CUDA_SUCCESS);
    assert_int_equal(fake_races(), 0);
    assert_int_equal(touch(a, p, 64), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoH(buf, p, 64), CUDA_SUCCESS);
    assert_int_equal(fake_races(), 1);
    assert_int_equal(cuMemsetD8(p + 8, 0, 1), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyHtoD(p + 64, buf, 64), CUDA_SUCCESS); /* other bytes */
    assert_int_equal(fake_races(), 2);
    assert_int_equal(cuStreamSynchronize(a), CUDA_SUCCESS);
    assert_int_equal(cuMemsetD8(p, 0, 64), CUDA_SUCCESS);
    assert_int_equal(fake_races(), 2);
    cuMemFree(p);
    cuMemFree(q);
    cuStreamDestroy(a);
    cuStreamDestroy(b);
    cuStreamDestroy(blk);
}

/* What the fake writes on stderr while fn runs. */
static void capture_stderr(void (*fn)(void *), void *arg, char *out, size_t len)
{
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    fflush(stderr);
    int saved = dup(2);
    dup2(fileno(tmp), 2);
    fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    size_t n = fread(out, 1, len - 1, tmp);
    out[n] = '\0';
    fclose(tmp);
}

struct race_setup {
    CUstream a, b;
    CUdeviceptr p;
};

static void race_two_streams(void *arg)
{
    struct race_setup *r = arg;
    touch(r->a, r->p, 64);
    touch(r->b, r->p + 8, 8);
}

static void test_race_report(void **state)
{
    (void)state;
    struct race_setup r = {new_stream(CU_STREAM_NON_BLOCKING),
                           new_stream(CU_STREAM_NON_BLOCKING), new_mem(64)};
    char got[1024], want[1024];
    capture_stderr(race_two_streams, &r, got, sizeof got);
    snprintf(want, sizeof want,
             "fake cuda: race: cuLaunchKernel on stream %p touches [0x%llx,0x%llx) while "
             "cuLaunchKernel on stream %p, not ordered before it, still uses it\n",
             (void *)r.b, (unsigned long long)r.p + 8, (unsigned long long)r.p + 16,
             (void *)r.a);
    assert_string_equal(got, want);
    assert_int_equal(fake_races(), 1);
    cuMemFree(r.p);
    cuStreamDestroy(r.a);
    cuStreamDestroy(r.b);
}

static void race_with_host(void *arg)
{
    struct race_setup *r = arg;
    char buf[4];
    touch(r->a, r->p, 64);
    cuMemcpyDtoH(buf, r->p + 60, 4);
}

static void test_race_report_host(void **state)
{
    (void)state;
    struct race_setup r = {new_stream(CU_STREAM_NON_BLOCKING), NULL, new_mem(64)};
    char got[1024], want[1024];
    capture_stderr(race_with_host, &r, got, sizeof got);
    snprintf(want, sizeof want,
             "fake cuda: race: cuMemcpyDtoH_v2 on the host touches [0x%llx,0x%llx) while "
             "cuLaunchKernel on stream %p, not ordered before it, still uses it\n",
             (unsigned long long)r.p + 60, (unsigned long long)r.p + 64, (void *)r.a);
    assert_string_equal(got, want);
    assert_int_equal(fake_races(), 1);
    cuMemFree(r.p);
    cuStreamDestroy(r.a);
}

/* The switch that breaks cuStreamWaitEvent makes the ordered case above a race. */
static void test_ignore_stream_waits(void **state)
{
    (void)state;
    CUstream a = new_stream(CU_STREAM_NON_BLOCKING), b = new_stream(CU_STREAM_NON_BLOCKING);
    CUevent e = new_event();
    CUdeviceptr p = new_mem(64);
    for (int ignore = 0; ignore <= 1; ignore++) {
        fake_set_ignore_stream_waits(ignore);
        assert_int_equal(touch(a, p, 64), CUDA_SUCCESS);
        assert_int_equal(cuEventRecord(e, a), CUDA_SUCCESS);
        assert_int_equal(cuStreamWaitEvent(b, e, 0), CUDA_SUCCESS);
        assert_int_equal(touch(b, p, 64), CUDA_SUCCESS);
        assert_int_equal(fake_races(), ignore);
        /* Without the wait, completing b leaves a's kernel running. */
        fake_stream_retire(b, -1);
        assert_int_equal(fake_stream_pending(a), ignore);
        fake_retire_all();
    }
    fake_set_ignore_stream_waits(0);
    cuMemFree(p);
    cuEventDestroy(e);
    cuStreamDestroy(a);
    cuStreamDestroy(b);
}

struct host_calls {
    int n;
    CUstream query; /* if set, the function calls cuStreamQuery on it */
    CUresult rc;
};

static void host_fn(void *data)
{
    struct host_calls *h = data;
    h->n++;
    if (h->query)
        h->rc = cuStreamQuery(h->query);
}

static void test_host_functions(void **state)
{
    (void)state;
    CUstream a = new_stream(CU_STREAM_NON_BLOCKING), b = new_stream(CU_STREAM_NON_BLOCKING);
    CUevent e = new_event();
    struct host_calls h = {0};
    /* Called when its unit completes, not before. */
    assert_int_equal(cuLaunchHostFunc(a, host_fn, &h), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(a), 1);
    assert_int_equal(h.n, 0);
    fake_stream_retire(a, 1);
    assert_int_equal(h.n, 1);
    /* Outside the driver lock: it may call the driver. */
    h.query = a;
    assert_int_equal(cuLaunchHostFunc(a, host_fn, &h), CUDA_SUCCESS);
    fake_stream_launch(a);
    fake_stream_retire(a, 1);
    assert_int_equal(h.n, 2);
    assert_int_equal(h.rc, CUDA_ERROR_NOT_READY);
    fake_stream_retire(a, -1);
    h.query = NULL;
    /* Completed because other work is ordered after it. */
    assert_int_equal(cuLaunchHostFunc(a, host_fn, &h), CUDA_SUCCESS);
    assert_int_equal(cuEventRecord(e, a), CUDA_SUCCESS);
    assert_int_equal(cuStreamWaitEvent(b, e, 0), CUDA_SUCCESS);
    fake_stream_launch(b);
    assert_int_equal(cuStreamSynchronize(b), CUDA_SUCCESS);
    assert_int_equal(h.n, 3);
    /* By ticks: run by whichever call finds the unit done. */
    fake_set_work_ticks(1);
    assert_int_equal(cuLaunchHostFunc(a, host_fn, &h), CUDA_SUCCESS);
    assert_int_equal(h.n, 3);
    assert_int_equal(cuStreamQuery(a), CUDA_SUCCESS);
    assert_int_equal(h.n, 4);
    fake_set_work_ticks(0);
    /* NULL is the per-thread stream in the _ptsz form. */
    assert_int_equal(cuLaunchHostFunc_ptsz(NULL, host_fn, &h), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(CU_STREAM_PER_THREAD), 1);
    assert_int_equal(cuLaunchHostFunc(NULL, host_fn, &h), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(NULL), 1);
    assert_int_equal(cuLaunchHostFunc(a, NULL, &h), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuLaunchHostFunc((CUstream)&h, host_fn, &h), CUDA_ERROR_INVALID_HANDLE);
    fake_retire_all();
    assert_int_equal(h.n, 6);
    cuEventDestroy(e);
    cuStreamDestroy(a);
    cuStreamDestroy(b);
}

static void test_graph_launch(void **state)
{
    (void)state;
    CUstream s = new_stream(CU_STREAM_NON_BLOCKING);
    CUgraphExec g = (CUgraphExec)(uintptr_t)0x1234;
    assert_int_equal(cuGraphLaunch(NULL, s), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuGraphLaunch(g, (CUstream)&g), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cuGraphLaunch(g, s), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(s), 1);
    assert_int_equal(cuGraphLaunch(g, NULL), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(NULL), 1);
    assert_int_equal(cuGraphLaunch_ptsz(g, NULL), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(CU_STREAM_PER_THREAD), 1);
    assert_int_equal(fake_calls("cuGraphLaunch"), 4);
    assert_int_equal(fake_calls("cuGraphLaunch_ptsz"), 1);
    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(s), 0);
    cuStreamDestroy(s);
}

/* Several threads, each with its own memory, per-thread stream and ticking "GPU": no races,
 * and the host functions all run (under TSan, the timeline's locking is checked too). */
#define TL_THREADS 4
#define TL_ROUNDS 300

struct tl_worker {
    CUdeviceptr p;
    struct host_calls h;
    int failures;
};

static void *timeline_loop(void *arg)
{
    struct tl_worker *w = arg;
    if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS)
        w->failures++;
    for (int i = 0; i < TL_ROUNDS; i++) {
        if (touch(CU_STREAM_PER_THREAD, w->p, 256) != CUDA_SUCCESS ||
            cuMemsetD8Async_ptsz(w->p, (unsigned char)i, 256, NULL) != CUDA_SUCCESS ||
            cuLaunchHostFunc_ptsz(NULL, host_fn, &w->h) != CUDA_SUCCESS)
            w->failures++;
        CUresult rc = cuStreamQuery_ptsz(NULL);
        if (rc != CUDA_SUCCESS && rc != CUDA_ERROR_NOT_READY)
            w->failures++;
    }
    if (cuStreamSynchronize(CU_STREAM_PER_THREAD) != CUDA_SUCCESS)
        w->failures++;
    return NULL;
}

static void test_timeline_threads(void **state)
{
    (void)state;
    pthread_t t[TL_THREADS];
    struct tl_worker w[TL_THREADS];
    memset(w, 0, sizeof w);
    fake_set_work_ticks(2);
    for (int i = 0; i < TL_THREADS; i++) {
        w[i].p = new_mem(256);
        pthread_create(&t[i], NULL, timeline_loop, &w[i]);
    }
    for (int i = 0; i < TL_THREADS; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < TL_THREADS; i++) {
        assert_int_equal(w[i].failures, 0);
        assert_int_equal(w[i].h.n, TL_ROUNDS);
        assert_int_equal(cuMemFree(w[i].p), CUDA_SUCCESS);
    }
    assert_int_equal(fake_races(), 0);
}

/* ---- stream capture ------------------------------------------------------------------------ */

static void test_capture_global_violations(void **state)
{
    (void)state;
    CUstream s;
    CUevent ev;
    CUdeviceptr p, keep;
    CUgraph g = (CUgraph)1;
    CUstreamCaptureStatus st;
    assert_int_equal(cuMemAlloc(&keep, 64), CUDA_SUCCESS);
    assert_int_equal(cuStreamCreate(&s, 0), CUDA_SUCCESS);
    assert_int_equal(cuEventCreate(&ev, 0), CUDA_SUCCESS);
    assert_int_equal(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL),
                     CUDA_ERROR_ILLEGAL_STATE);
    assert_int_equal(cuStreamIsCapturing(s, &st), CUDA_SUCCESS);
    assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
    assert_int_equal(cuStreamIsCapturing(NULL, &st), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    assert_int_equal(fake_capture_violations(), 0);

    /* Launches into the capture are not work. */
    assert_int_equal(fake_stream_launch(s), 0);
    assert_int_equal(fake_stream_pending(s), 0);
    /* Recording into the capturing stream is allowed, but is no fence. */
    assert_int_equal(cuEventRecord(ev, s), CUDA_SUCCESS);

    assert_int_equal(cuMemAlloc(&p, 64), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_int_equal(fake_capture_violations(), 1);
    assert_int_equal(cuMemFree(keep), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_int_equal(cuEventRecord(ev, NULL), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    assert_int_equal(cuEventQuery(ev), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_int_equal(cuStreamSynchronize(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_int_equal(cuCtxSynchronize(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_int_equal(fake_capture_violations(), 6);
    assert_int_equal(cuStreamIsCapturing(s, &st), CUDA_SUCCESS);
    assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    assert_int_equal(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    assert_null(g);
    assert_int_equal(cuStreamEndCapture(s, &g), CUDA_ERROR_ILLEGAL_STATE);
    assert_int_equal(cuStreamIsCapturing(s, &st), CUDA_SUCCESS);
    assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_NONE);

    /* After the capture all is allowed again. */
    assert_int_equal(cuMemFree(keep), CUDA_SUCCESS);
    assert_int_equal(cuEventRecord(ev, NULL), CUDA_SUCCESS);
    assert_int_equal(fake_capture_violations(), 6);
    assert_int_equal(cuStreamBeginCapture(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL),
                     CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    cuEventDestroy(ev);
    cuStreamDestroy(s);
}

static void test_capture_relaxed_and_nonblocking(void **state)
{
    (void)state;
    CUstream nb;
    CUevent ev;
    CUdeviceptr p;
    CUgraph g = NULL;
    assert_int_equal(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cuEventCreate(&ev, 0), CUDA_SUCCESS);
    assert_int_equal(cuStreamBeginCapture(nb, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);

    /* A RELAXED thread may make the calls a capture forbids, as a caching allocator must. */
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    assert_int_equal(cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
    assert_int_equal(mode, CU_STREAM_CAPTURE_MODE_GLOBAL);
    assert_int_equal(cuMemAlloc(&p, 64), CUDA_SUCCESS);
    assert_int_equal(cuEventRecord(ev, NULL), CUDA_SUCCESS); /* nb is not blocking */
    assert_int_equal(cuEventQuery(ev), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(p), CUDA_SUCCESS);
    assert_int_equal(cuEventRecord(ev, nb), CUDA_SUCCESS);
    assert_int_equal(cuEventQuery(ev), CUDA_ERROR_CAPTURED_EVENT);
    assert_int_equal(cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
    assert_int_equal(mode, CU_STREAM_CAPTURE_MODE_RELAXED);

    assert_int_equal(fake_capture_violations(), 0);
    assert_int_equal(cuStreamEndCapture(nb, &g), CUDA_SUCCESS);
    assert_non_null(g);
    cuEventDestroy(ev);
    cuStreamDestroy(nb);
}

static void test_capture_to_graph_and_stream_ctx(void **state)
{
    (void)state;
    CUstream s;
    CUcontext c = NULL;
    CUgraph mine = (CUgraph)(uintptr_t)0x1000, g = NULL;
    unsigned v = 0;
    assert_int_equal(cuStreamCreate(&s, 0), CUDA_SUCCESS);
    assert_int_equal(cuStreamGetCtx(s, &c), CUDA_SUCCESS);
    assert_ptr_equal(c, g_ctx);
    assert_int_equal(cuStreamGetCtx(NULL, &c), CUDA_SUCCESS);
    assert_ptr_equal(c, g_ctx);
    assert_int_equal(cuCtxGetApiVersion(NULL, &v), CUDA_SUCCESS);
    assert_int_equal(v, 3020);
    assert_int_equal(cuStreamBeginCaptureToGraph(s, NULL, NULL, NULL, 0,
                                                 CU_STREAM_CAPTURE_MODE_RELAXED),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuStreamBeginCaptureToGraph(s, mine, NULL, NULL, 0,
                                                 CU_STREAM_CAPTURE_MODE_RELAXED),
                     CUDA_SUCCESS);
    CUdeviceptr p;
    assert_int_equal(cuMemAlloc(&p, 64), CUDA_SUCCESS); /* a RELAXED capture forbids nothing */
    assert_int_equal(cuMemFree(p), CUDA_SUCCESS);
    assert_int_equal(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
    assert_ptr_equal(g, mine);
    assert_int_equal(fake_capture_violations(), 0);
    cuStreamDestroy(s);
}

struct capturer {
    CUcontext ctx;
    CUstream s;
    pthread_barrier_t begun, done;
    CUresult begin_rc, end_rc;
};

static void *capture_thread_local(void *arg)
{
    struct capturer *c = arg;
    CUgraph g;
    cuCtxSetCurrent(c->ctx);
    c->begin_rc = cuStreamBeginCapture(c->s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    pthread_barrier_wait(&c->begun);
    pthread_barrier_wait(&c->done);
    c->end_rc = cuStreamEndCapture(c->s, &g);
    return NULL;
}

/* Another thread's THREAD_LOCAL capture does not restrict this thread. */
static void test_capture_thread_local_elsewhere(void **state)
{
    (void)state;
    struct capturer c = {.ctx = g_ctx};
    CUdeviceptr p;
    CUgraph g;
    pthread_t t;
    assert_int_equal(cuStreamCreate(&c.s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    pthread_barrier_init(&c.begun, NULL, 2);
    pthread_barrier_init(&c.done, NULL, 2);
    pthread_create(&t, NULL, capture_thread_local, &c);
    pthread_barrier_wait(&c.begun);
    assert_int_equal(cuMemAlloc(&p, 64), CUDA_SUCCESS);
    assert_int_equal(cuMemFree(p), CUDA_SUCCESS);
    assert_int_equal(cuStreamEndCapture(c.s, &g), CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
    pthread_barrier_wait(&c.done);
    pthread_join(t, NULL);
    assert_int_equal(c.begin_rc, CUDA_SUCCESS);
    assert_int_equal(c.end_rc, CUDA_SUCCESS);
    assert_int_equal(fake_capture_violations(), 0);
    pthread_barrier_destroy(&c.begun);
    pthread_barrier_destroy(&c.done);
    cuStreamDestroy(c.s);
}

/* Work for a capturing stream becomes graph nodes: no unit, no effect, no host call. */
static void test_capture_new_entry_points(void **state)
{
    (void)state;
    CUstream s = new_stream(0);
    CUdeviceptr p = new_mem(64);
    struct host_calls h = {0};
    CUgraph g = NULL;
    CUgraphExec exec = (CUgraphExec)(uintptr_t)0x1234;
    CUstreamCaptureStatus st;
    assert_int_equal(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(touch(s, p, 64), CUDA_SUCCESS);
    assert_int_equal(cuLaunchHostFunc(s, host_fn, &h), CUDA_SUCCESS);
    assert_int_equal(cuGraphLaunch(exec, s), CUDA_SUCCESS);
    /* Arguments are still checked. */
    assert_int_equal(touch(s, p, 65), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(fake_stream_pending(s), 0);
    assert_int_equal(fake_capture_violations(), 0);

    /* The legacy stream may not be used meanwhile (an implicit dependency on the capture). */
    assert_int_equal(touch(NULL, p, 64), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    assert_int_equal(fake_capture_violations(), 1);
    assert_int_equal(cuStreamIsCapturing(s, &st), CUDA_SUCCESS);
    assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    /* An invalidated capture takes no more work. */
    assert_int_equal(touch(s, p, 64), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    assert_int_equal(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    fake_retire_all();
    assert_int_equal(h.n, 0);
    assert_int_equal(fake_races(), 0);
    cuMemFree(p);
    cuStreamDestroy(s);
}

/* Copies and memsets for a capturing stream move nothing; synchronous ones, which run on
 * the legacy stream, are refused while a blocking stream captures. */
static void test_capture_copies(void **state)
{
    (void)state;
    CUstream s = new_stream(0);
    CUdeviceptr p = new_mem(64), q = new_mem(64);
    unsigned char in[64], out[64];
    CUgraph g = NULL;
    memset(in, 9, sizeof in);
    memset(out, 0xaa, sizeof out);
    assert_int_equal(cuMemsetD8(p, 5, 64), CUDA_SUCCESS);
    assert_int_equal(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(cuMemsetD8Async(p, 1, 64, s), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyHtoDAsync(p, in, 64, s), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoHAsync(out, p, 64, s), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyDtoDAsync(q, p, 64, s), CUDA_SUCCESS);
    assert_int_equal(cuMemsetD8Async(p, 1, 65, s), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(fake_stream_pending(s), 0);
    assert_int_equal(out[0], 0xaa);
    assert_int_equal(fake_capture_violations(), 0);
    assert_int_equal(cuMemsetD8(p, 1, 64), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    assert_int_equal(fake_capture_violations(), 1);
    assert_int_equal(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    /* None of it ran. */
    assert_int_equal(cuMemcpyDtoH(out, p, 64), CUDA_SUCCESS);
    assert_int_equal(out[0], 5);
    assert_int_equal(fake_races(), 0);
    cuMemFree(p);
    cuMemFree(q);
    cuStreamDestroy(s);
}

/* Waiting on an event recorded in a capture joins the capture (a fork of the graph). */
static void test_capture_join_by_wait(void **state)
{
    (void)state;
    CUstream s = new_stream(CU_STREAM_NON_BLOCKING), t = new_stream(CU_STREAM_NON_BLOCKING),
             u = new_stream(CU_STREAM_NON_BLOCKING);
    CUevent e = new_event(), real = new_event();
    CUdeviceptr p = new_mem(64), keep;
    CUgraph g = NULL;
    CUstreamCaptureStatus st;
    assert_int_equal(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(cuEventRecord(e, s), CUDA_SUCCESS);
    assert_int_equal(cuStreamWaitEvent(t, e, 0), CUDA_SUCCESS);
    assert_int_equal(cuStreamIsCapturing(t, &st), CUDA_SUCCESS);
    assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
    /* Work on the joined stream is captured too. */
    assert_int_equal(touch(t, p, 64), CUDA_SUCCESS);
    assert_int_equal(fake_stream_launch(t), 0);
    assert_int_equal(fake_stream_pending(t), 0);
    assert_int_equal(cuStreamWaitEvent(t, e, 0), CUDA_SUCCESS); /* same sequence: nothing */
    /* The capture ends on the stream that began it, for every stream in it. */
    assert_int_equal(cuStreamEndCapture(t, &g), CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
    assert_int_equal(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
    assert_non_null(g);
    assert_int_equal(cuStreamIsCapturing(t, &st), CUDA_SUCCESS);
    assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_NONE);
    /* An event from a capture that has ended leaves nothing to join or wait for. */
    assert_int_equal(cuStreamWaitEvent(t, e, 0), CUDA_SUCCESS);
    assert_int_equal(cuStreamIsCapturing(t, &st), CUDA_SUCCESS);
    assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_NONE);
    assert_int_equal(cuStreamQuery(t), CUDA_SUCCESS);

    /* A capturing stream waiting on an event recorded outside capture: nothing is added. */
    fake_stream_launch(u);
    assert_int_equal(cuEventRecord(real, u), CUDA_SUCCESS);
    assert_int_equal(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(cuStreamWaitEvent(s, real, 0), CUDA_SUCCESS);
    assert_int_equal(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
    assert_int_equal(cuStreamQuery(s), CUDA_SUCCESS);
    assert_int_equal(fake_stream_pending(u), 1);

    /* Two capture sequences do not merge. */
    assert_int_equal(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(cuStreamBeginCapture(t, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(cuEventRecord(e, s), CUDA_SUCCESS);
    assert_int_equal(cuStreamWaitEvent(t, e, 0), CUDA_ERROR_STREAM_CAPTURE_MERGE);
    /* The legacy stream cannot capture, so it cannot join either. */
    assert_int_equal(cuStreamWaitEvent(NULL, e, 0), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_int_equal(cuStreamEndCapture(t, &g), CUDA_SUCCESS);
    assert_int_equal(cuStreamEndCapture(s, &g), CUDA_SUCCESS);

    /* A violation invalidates the whole sequence, joined streams included. */
    assert_int_equal(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(cuEventRecord(e, s), CUDA_SUCCESS);
    assert_int_equal(cuStreamWaitEvent_ptsz(t, e, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemAlloc(&keep, 64), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_int_equal(cuStreamIsCapturing(t, &st), CUDA_SUCCESS);
    assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    assert_int_equal(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    assert_int_equal(cuStreamIsCapturing(t, &st), CUDA_SUCCESS);
    assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_NONE);

    /* Destroying the stream that began a capture ends it for the joined ones. */
    assert_int_equal(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(cuEventRecord(e, s), CUDA_SUCCESS);
    assert_int_equal(cuStreamWaitEvent(t, e, 0), CUDA_SUCCESS);
    assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);
    assert_int_equal(cuStreamIsCapturing(t, &st), CUDA_SUCCESS);
    assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_NONE);
    assert_int_equal(fake_capture_violations(), 1);
    cuMemFree(p);
    cuEventDestroy(e);
    cuEventDestroy(real);
    cuStreamDestroy(t);
    cuStreamDestroy(u);
}

/* ---- injected failures and delays ---------------------------------------------------------- */

static void test_fail_nth_and_always(void **state)
{
    (void)state;
    CUdeviceptr p[4];
    fake_fail_nth("cuMemAlloc_v2", 3, CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(cuMemAlloc(&p[0], 64), CUDA_SUCCESS);
    assert_int_equal(cuMemAlloc(&p[1], 64), CUDA_SUCCESS);
    assert_int_equal(cuMemAlloc(&p[2], 64), CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(cuMemAlloc(&p[2], 64), CUDA_SUCCESS);
    assert_int_equal(fake_live_allocations(), 3); /* the failed call did nothing */
    assert_int_equal(fake_calls("cuMemAlloc_v2"), 4);

    fake_fail_always("cuMemFree_v2", CUDA_ERROR_LAUNCH_FAILED);
    assert_int_equal(cuMemFree(p[0]), CUDA_ERROR_LAUNCH_FAILED);
    assert_int_equal(cuMemFree(p[0]), CUDA_ERROR_LAUNCH_FAILED);
    /* Keyed by exact name: the v1 entry point and other names are untouched. */
    assert_int_equal(cuMemAlloc(&p[3], 64), CUDA_SUCCESS);
    fake_fail_always("cuMemFree_v2", CUDA_SUCCESS);
    for (int i = 0; i < 4; i++)
        assert_int_equal(cuMemFree(p[i]), CUDA_SUCCESS);
    assert_int_equal(fake_calls("cuMemFree_v2"), 6);

    /* A newer injection replaces the pending one. */
    fake_fail_nth("cuStreamCreate", 1, CUDA_ERROR_INVALID_VALUE);
    fake_fail_nth("cuStreamCreate", 2, CUDA_ERROR_NOT_SUPPORTED);
    CUstream s;
    assert_int_equal(cuStreamCreate(&s, 0), CUDA_SUCCESS);
    cuStreamDestroy(s);
    assert_int_equal(cuStreamCreate(&s, 0), CUDA_ERROR_NOT_SUPPORTED);
    assert_int_equal(cuStreamCreate(&s, 0), CUDA_SUCCESS);
    cuStreamDestroy(s);

    /* Works before cuInit's check too: cuInit itself can be made to fail. */
    fake_fail_nth("cuInit", 1, CUDA_ERROR_NO_DEVICE);
    assert_int_equal(cuInit(0), CUDA_ERROR_NO_DEVICE);
    assert_int_equal(cuInit(0), CUDA_SUCCESS);

    assert_int_equal(fake_calls("cuNoSuchEntry"), -1);
    assert_null(fake_real_symbol("cuNoSuchEntry"));
    fake_reset_counters();
    assert_int_equal(fake_calls("cuMemAlloc_v2"), 0);
}

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void test_delay(void **state)
{
    (void)state;
    int v;
    fake_set_delay_ns("cuDriverGetVersion", 3000000);
    uint64_t t0 = now_ns();
    assert_int_equal(cuDriverGetVersion(&v), CUDA_SUCCESS);
    assert_true(now_ns() - t0 >= 3000000);
    fake_set_delay_ns("cuDriverGetVersion", 0);
    assert_int_equal(cuDriverGetVersion(&v), CUDA_SUCCESS);
}

/* ---- injected failures of the work entry points ---- */

struct work_env {
    CUstream s;
    CUdeviceptr p;
    unsigned char host[64];
    CUevent e;
    struct host_calls h;
};

static CUresult w_launch(struct work_env *v) { return touch(v->s, v->p, 64); }
static CUresult w_launch_ptsz(struct work_env *v)
{
    size_t n = 64;
    void *params[] = {&v->p, &n};
    return cuLaunchKernel_ptsz(fake_touch_kernel(), 1, 1, 1, 1, 1, 1, 0, v->s, params, NULL);
}
static CUresult launch_ex(struct work_env *v, bool ptsz)
{
    size_t n = 64;
    void *params[] = {&v->p, &n};
    CUlaunchConfig cfg = {.gridDimX = 1, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 1,
                          .blockDimY = 1, .blockDimZ = 1, .hStream = v->s};
    return ptsz ? cuLaunchKernelEx_ptsz(&cfg, fake_touch_kernel(), params, NULL)
                : cuLaunchKernelEx(&cfg, fake_touch_kernel(), params, NULL);
}
static CUresult w_launch_ex(struct work_env *v) { return launch_ex(v, false); }
static CUresult w_launch_ex_ptsz(struct work_env *v) { return launch_ex(v, true); }
static CUresult w_host(struct work_env *v) { return cuLaunchHostFunc(v->s, host_fn, &v->h); }
static CUresult w_host_ptsz(struct work_env *v)
{
    return cuLaunchHostFunc_ptsz(v->s, host_fn, &v->h);
}
static CUresult w_wait(struct work_env *v) { return cuStreamWaitEvent(v->s, v->e, 0); }
static CUresult w_wait_ptsz(struct work_env *v) { return cuStreamWaitEvent_ptsz(v->s, v->e, 0); }
static CUresult w_set(struct work_env *v) { return cuMemsetD8Async(v->p, 1, 64, v->s); }
static CUresult w_set_ptsz(struct work_env *v) { return cuMemsetD8Async_ptsz(v->p, 1, 64, v->s); }
static CUresult w_htod(struct work_env *v) { return cuMemcpyHtoDAsync(v->p, v->host, 64, v->s); }
static CUresult w_htod_ptsz(struct work_env *v)
{
    return cuMemcpyHtoDAsync_v2_ptsz(v->p, v->host, 64, v->s);
}
static CUresult w_dtoh(struct work_env *v) { return cuMemcpyDtoHAsync(v->host, v->p, 64, v->s); }
static CUresult w_dtoh_ptsz(struct work_env *v)
{
    return cuMemcpyDtoHAsync_v2_ptsz(v->host, v->p, 64, v->s);
}
static CUresult w_dtod(struct work_env *v) { return cuMemcpyDtoDAsync(v->p, v->p, 64, v->s); }
static CUresult w_dtod_ptsz(struct work_env *v)
{
    return cuMemcpyDtoDAsync_v2_ptsz(v->p, v->p, 64, v->s);
}
static CUresult w_graph(struct work_env *v) { return cuGraphLaunch((CUgraphExec)v, v->s); }
static CUresult w_graph_ptsz(struct work_env *v)
{
    return cuGraphLaunch_ptsz((CUgraphExec)v, v->s);
}

static const struct {
    const char *name;
    CUresult (*call)(struct work_env *);
    int units; /* units a successful call adds */
} g_work_entries[] = {
    {"cuLaunchKernel", w_launch, 1},
    {"cuLaunchKernel_ptsz", w_launch_ptsz, 1},
    {"cuLaunchKernelEx", w_launch_ex, 1},
    {"cuLaunchKernelEx_ptsz", w_launch_ex_ptsz, 1},
    {"cuLaunchHostFunc", w_host, 1},
    {"cuLaunchHostFunc_ptsz", w_host_ptsz, 1},
    {"cuStreamWaitEvent", w_wait, 0},
    {"cuStreamWaitEvent_ptsz", w_wait_ptsz, 0},
    {"cuMemsetD8Async", w_set, 1},
    {"cuMemsetD8Async_ptsz", w_set_ptsz, 1},
    {"cuMemcpyHtoDAsync_v2", w_htod, 1},
    {"cuMemcpyHtoDAsync_v2_ptsz", w_htod_ptsz, 1},
    {"cuMemcpyDtoHAsync_v2", w_dtoh, 1},
    {"cuMemcpyDtoHAsync_v2_ptsz", w_dtoh_ptsz, 1},
    {"cuMemcpyDtoDAsync_v2", w_dtod, 1},
    {"cuMemcpyDtoDAsync_v2_ptsz", w_dtod_ptsz, 1},
    {"cuGraphLaunch", w_graph, 1},
    {"cuGraphLaunch_ptsz", w_graph_ptsz, 1},
};

/* Every new entry point can be made to fail (doing nothing), counts its calls, and is what
 * dlsym and fake_real_symbol find. */
static void test_work_entries_fail_and_count(void **state)
{
    (void)state;
    struct work_env v = {.s = new_stream(CU_STREAM_NON_BLOCKING), .p = new_mem(64)};
    size_t n = sizeof g_work_entries / sizeof g_work_entries[0];
    v.e = new_event();
    fake_stream_launch(v.s);
    assert_int_equal(cuEventRecord(v.e, v.s), CUDA_SUCCESS);
    fake_stream_retire(v.s, -1);
    assert_int_equal(cuMemsetD8(v.p, 7, 64), CUDA_SUCCESS);
    memset(v.host, 3, sizeof v.host);
    for (size_t i = 0; i < n; i++) {
        assert_non_null(fake_real_symbol(g_work_entries[i].name));
        fake_fail_nth(g_work_entries[i].name, 1, CUDA_ERROR_LAUNCH_FAILED);
    }
    for (size_t i = 0; i < n; i++)
        if (g_work_entries[i].call(&v) != CUDA_ERROR_LAUNCH_FAILED)
            fail_msg("%s did not fail", g_work_entries[i].name);
    assert_int_equal(fake_stream_pending(v.s), 0);
    /* The failed copies and memsets moved nothing. */
    assert_int_equal(v.host[0], 3);
    unsigned char dev[64];
    assert_int_equal(cuMemcpyDtoH(dev, v.p, 64), CUDA_SUCCESS);
    assert_int_equal(dev[0], 7);
    int units = 0;
    for (size_t i = 0; i < n; i++) {
        if (g_work_entries[i].call(&v) != CUDA_SUCCESS)
            fail_msg("%s failed twice", g_work_entries[i].name);
        units += g_work_entries[i].units;
        assert_int_equal(fake_calls(g_work_entries[i].name), 2);
    }
    assert_int_equal(fake_stream_pending(v.s), units);
    assert_int_equal(fake_races(), 0);

    /* And can be slowed down. */
    fake_set_delay_ns("cuStreamWaitEvent", 2000000);
    uint64_t t0 = now_ns();
    assert_int_equal(cuStreamWaitEvent(v.s, v.e, 0), CUDA_SUCCESS);
    assert_true(now_ns() - t0 >= 2000000);
    fake_set_delay_ns("cuStreamWaitEvent", 0);
    fake_retire_all();
    assert_int_equal(v.h.n, 2);
    cuMemFree(v.p);
    cuEventDestroy(v.e);
    cuStreamDestroy(v.s);
}

/* ---- threads ------------------------------------------------------------------------------- */

#define THREADS 8
#define ROUNDS 2000

struct worker {
    int failures;
};

static void *alloc_free_loop(void *arg)
{
    struct worker *w = arg;
    if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS)
        w->failures++;
    CUdeviceptr live[4] = {0};
    for (int i = 0; i < ROUNDS; i++) {
        int k = i % 4;
        if (live[k] && cuMemFree(live[k]) != CUDA_SUCCESS)
            w->failures++;
        if (cuMemAlloc(&live[k], (size_t)(k + 1) * 4096 + (size_t)i) != CUDA_SUCCESS)
            w->failures++;
        fake_stream_launch(CU_STREAM_PER_THREAD);
    }
    for (int k = 0; k < 4; k++)
        if (cuMemFree(live[k]) != CUDA_SUCCESS)
            w->failures++;
    return NULL;
}

static void test_threads_exact_counts(void **state)
{
    (void)state;
    pthread_t t[THREADS];
    struct worker w[THREADS] = {{0}};
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, alloc_free_loop, &w[i]);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(w[i].failures, 0);
    assert_int_equal(fake_calls("cuMemAlloc_v2"), THREADS * ROUNDS);
    assert_int_equal(fake_calls("cuMemFree_v2"), THREADS * ROUNDS);
    assert_int_equal(fake_calls("cuCtxSetCurrent"), THREADS);
    assert_int_equal(fake_live_allocations(), 0);
    assert_int_equal(fake_device_used(0), 0);
}

/* ---- teardown ------------------------------------------------------------------------------ */

/* Runs after the fake's destructor (see fake_teardown_probe.c). */
static void late_exit_handler(void)
{
    int v;
    CUresult rc = cuDriverGetVersion(&v);
    _exit(rc == CUDA_ERROR_DEINITIALIZED && fake_calls_after_teardown() == 1 ? 0 : 1);
}

static void child_teardown(void)
{
    int v;
    if (cuDriverGetVersion(&v) != CUDA_SUCCESS || fake_calls_after_teardown() != 0)
        _exit(2);
    void *probe = dlopen(FAKE_PROBE_PATH, RTLD_NOW);
    void (*arm)(void (*)(void)) =
        probe ? (void (*)(void (*)(void)))(uintptr_t)dlsym(probe, "fake_probe_arm") : NULL;
    if (!arm)
        _exit(4);
    arm(late_exit_handler);
    exit(3); /* the late handler replaces this status */
}

static void test_after_teardown(void **state)
{
    (void)state;
    assert_int_equal(in_child(child_teardown), 0);
}

int main(void)
{
    const struct CMUnitTest before_init[] = {
        cmocka_unit_test(test_environment),
        cmocka_unit_test(test_after_teardown),
        cmocka_unit_test(test_before_init),
    };
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_alloc_free),
        T(test_oom_at_budget),
        T(test_huge_device_costs_nothing),
        T(test_no_context),
        T(test_v1_entry_points),
        T(test_get_proc_address),
        T(test_get_proc_address_through_itself),
        T(test_error_strings),
        T(test_device_queries),
        T(test_context_stack),
        T(test_primary_release_and_reset),
        T(test_multiple_devices),
        T(test_pools_keep_their_device),
        T(test_legacy_event_waits_for_blocking_streams),
        T(test_fifo_and_partial_retire),
        T(test_destroyed_stream_work_outlives_it),
        T(test_per_thread_stream_is_blocking),
        T(test_synchronizing_calls),
        T(test_event_on_other_context),
        T(test_touch_kernel),
        T(test_async_copies_and_memsets),
        T(test_sync_copies_are_legacy_units),
        T(test_legacy_and_blocking_order),
        T(test_stream_wait_event),
        T(test_events_over_waits),
        T(test_completion_cascades),
        T(test_per_thread_streams),
        T(test_work_ticks),
        T(test_race_check),
        T(test_race_check_copies),
        T(test_race_report),
        T(test_race_report_host),
        T(test_ignore_stream_waits),
        T(test_host_functions),
        T(test_graph_launch),
        T(test_timeline_threads),
        T(test_capture_global_violations),
        T(test_capture_relaxed_and_nonblocking),
        T(test_capture_thread_local_elsewhere),
        T(test_capture_to_graph_and_stream_ctx),
        T(test_capture_new_entry_points),
        T(test_capture_copies),
        T(test_capture_join_by_wait),
        T(test_fail_nth_and_always),
        T(test_delay),
        T(test_work_entries_fail_and_count),
        T(test_threads_exact_counts),
    };
#undef T
    int failed = cmocka_run_group_tests_name("before cuInit", before_init, NULL, NULL);
    failed += cmocka_run_group_tests_name("fake driver", tests, group_setup, NULL);
    return failed ? 1 : 0;
}
