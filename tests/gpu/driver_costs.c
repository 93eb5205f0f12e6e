/* What the shim's own driver calls cost on this GPU, and whether cuGetProcAddress hands out
 * the same addresses as dlsym. Run without the shim. Prints medians of 31 runs. */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHECK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { \
    fprintf(stderr, "FAIL %s = %d\n", #x, (int)r_); exit(1); } } while (0)

enum { RUNS = 31, N = 20000 };

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static CUevent ev;
static CUcontext ctx;

static void op_get_current(void) { CUcontext c; cuCtxGetCurrent(&c); }
static void op_exchange(void) {
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
    cuThreadExchangeStreamCaptureMode(&m);
    cuThreadExchangeStreamCaptureMode(&m);
}
static void op_record_legacy(void) { cuEventRecord(ev, CU_STREAM_LEGACY); }
static void op_query(void) { cuEventQuery(ev); }
static void op_fence(void) { cuEventRecord(ev, CU_STREAM_LEGACY); cuEventQuery(ev); }

static void bench(const char *name, void (*op)(void))
{
    double per[RUNS];
    for (int i = 0; i < 1000; i++)
        op();
    for (int r = 0; r < RUNS; r++) {
        double t0 = now_ns();
        for (int i = 0; i < N; i++)
            op();
        per[r] = (now_ns() - t0) / N;
    }
    qsort(per, RUNS, sizeof per[0], cmp);
    printf("cost %-34s median_ns=%.1f min_ns=%.1f max_ns=%.1f\n", name, per[RUNS / 2], per[0],
           per[RUNS - 1]);
}

int main(void)
{
    CUdevice dev;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));

    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    const char *names[][2] = {{"cuMemAlloc", "cuMemAlloc_v2"}, {"cuMemFree", "cuMemFree_v2"},
                              {"cuStreamCreate", "cuStreamCreate"},
                              {"cuGetProcAddress", "cuGetProcAddress_v2"}};
    for (int i = 0; i < 4; i++) {
        void *p = NULL;
        CUdriverProcAddressQueryResult st;
        CHECK(cuGetProcAddress(names[i][0], &p, 13000, 0, &st));
        printf("procaddr %s -> %s %s\n", names[i][0], names[i][1],
               p == dlsym(h, names[i][1]) ? "same-as-dlsym" : "DIFFERENT-from-dlsym");
    }
    bench("cuCtxGetCurrent", op_get_current);
    bench("cuThreadExchangeStreamCaptureMode x2", op_exchange);
    bench("cuEventRecord(legacy stream)", op_record_legacy);
    bench("cuEventQuery", op_query);
    bench("fence: record + query", op_fence);
    printf("PASS driver_costs\n");
    return 0;
}
