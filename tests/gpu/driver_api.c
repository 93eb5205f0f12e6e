/* driver_api: the driver API reached by direct symbol binding (linked with -lcuda), as plain
 * C programs do. Under LD_PRELOAD=libcacheshim.so the shim's exported cuMemAlloc_v2 etc. are
 * the ones bound.
 *
 *     driver_api [--require-shim]
 *
 * Checks, each printed as "PASS driver_api: NAME" or "FAIL driver_api: NAME: why", with
 * "INFO driver_api: ..." lines for what is only reported:
 *   - cuInit, primary context; cuMemGetInfo before and after (free <= total, total unchanged)
 *   - a cuMemAlloc/cuMemFree loop over a few sizes (ns per pair is reported)
 *   - 64 live blocks: 256-byte aligned, no overlap, each filled with cuMemsetD32 and read back
 *   - cuMemGetAddressRange of a 1000000-byte block, at its start and inside it: base equals
 *     the pointer, size >= requested; pointer attributes (memory type device, range start
 *     equals the pointer, range size >= requested, device ordinal 0)
 *   - cuMemFree of invalid pointers (0x1234, an interior pointer of a live block, a host
 *     address) returns CUDA_ERROR_INVALID_VALUE, and the live block is still intact after
 *   - double free returns CUDA_ERROR_INVALID_VALUE, and the next two allocations of that size
 *     are distinct (a cache that took the block twice would hand it out twice)
 *   - cuMemAlloc of 1 PiB returns CUDA_ERROR_OUT_OF_MEMORY and the next allocation works
 *   - cuMemFree(0) and cuMemAlloc(size 0): what the driver says is printed (INFO)
 * Ends with "PASS driver_api checks=N" or "FAIL driver_api failed=M checks=N" (exit 1).
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shim_probe.h"

static int checks, failed;

static const char *ename(CUresult r)
{
    const char *s = NULL;
    if (cuGetErrorName(r, &s) != CUDA_SUCCESS || !s)
        return "(unknown)";
    return s;
}

static void check(int ok, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void check(int ok, const char *name, const char *fmt, ...)
{
    checks++;
    if (ok) {
        printf("PASS driver_api: %s\n", name);
    } else {
        failed++;
        printf("FAIL driver_api: %s: ", name);
        va_list ap;
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        printf("\n");
    }
    fflush(stdout);
}

/* A setup call that must succeed for anything after it to mean something. */
#define MUST(call)                                                                            \
    do {                                                                                      \
        CUresult r_ = (call);                                                                 \
        if (r_ != CUDA_SUCCESS) {                                                             \
            printf("FAIL driver_api: %s:%d: %s -> %s\n", __FILE__, __LINE__, #call, ename(r_)); \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

/* Fill a block with a 32-bit pattern and read its first and last word back. */
static int fill_and_check(CUdeviceptr p, size_t bytes, unsigned int pat)
{
    size_t words = bytes / 4;
    unsigned int first = 0, last = 0;
    if (cuMemsetD32(p, pat, words) != CUDA_SUCCESS)
        return 0;
    if (cuMemcpyDtoH(&first, p, 4) != CUDA_SUCCESS)
        return 0;
    if (cuMemcpyDtoH(&last, p + (words - 1) * 4, 4) != CUDA_SUCCESS)
        return 0;
    return first == pat && last == pat;
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    int require_shim = argc > 1 && !strcmp(argv[1], "--require-shim");
    CUdevice dev;
    CUcontext ctx;
    MUST(cuInit(0));
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuDevicePrimaryCtxRetain(&ctx, dev));
    MUST(cuCtxSetCurrent(ctx));

    size_t free0 = 0, total0 = 0;
    MUST(cuMemGetInfo(&free0, &total0));
    check(total0 > 0 && free0 <= total0, "cuMemGetInfo before", "free=%zu total=%zu", free0, total0);
    printf("INFO driver_api: cuMemGetInfo before: free=%zu total=%zu\n", free0, total0);

    /* --- alloc/free loop -------------------------------------------------------------- */
    {
        static const size_t sizes[] = {1u << 20, 4096, (3u << 20) + 1};
        int ok = 1;
        const int n = 3000;
        double t0 = now_ns();
        for (int i = 0; i < n && ok; i++) {
            CUdeviceptr p = 0;
            CUresult r = cuMemAlloc(&p, sizes[i % 3]);
            if (r != CUDA_SUCCESS || !p) {
                printf("INFO driver_api: loop %d: cuMemAlloc(%zu) -> %s p=0x%llx\n", i,
                       sizes[i % 3], ename(r), (unsigned long long)p);
                ok = 0;
                break;
            }
            r = cuMemFree(p);
            if (r != CUDA_SUCCESS) {
                printf("INFO driver_api: loop %d: cuMemFree -> %s\n", i, ename(r));
                ok = 0;
            }
        }
        double dt = now_ns() - t0;
        check(ok, "alloc/free loop", "see INFO above");
        printf("INFO driver_api: alloc/free loop: %d pairs, %.0f ns per pair\n", n, dt / n);
    }

    /* --- 64 live blocks ----------------------------------------------------------------- */
    {
        enum { N = 64 };
        CUdeviceptr p[N];
        size_t sz[N];
        int ok_align = 1, ok_overlap = 1, ok_data = 1;
        for (int i = 0; i < N; i++) {
            sz[i] = ((size_t)(i % 8) + 1) * 65536 + (size_t)(i * 4);
            MUST(cuMemAlloc(&p[i], sz[i]));
            if (p[i] % 256)
                ok_align = 0;
        }
        for (int a = 0; a < N; a++)
            for (int b = a + 1; b < N; b++)
                if (p[a] < p[b] + sz[b] && p[b] < p[a] + sz[a])
                    ok_overlap = 0;
        for (int i = 0; i < N; i++)
            if (!fill_and_check(p[i], sz[i], 0xC0DE0000u + (unsigned)i))
                ok_data = 0;
        /* Re-read the first word of every block: a neighbour's fill must not have reached it. */
        for (int i = 0; i < N; i++) {
            unsigned int w = 0;
            MUST(cuMemcpyDtoH(&w, p[i], 4));
            if (w != 0xC0DE0000u + (unsigned)i)
                ok_data = 0;
        }
        check(ok_align, "live blocks 256-byte aligned", "a pointer is not");
        check(ok_overlap, "live blocks do not overlap", "two live blocks overlap");
        check(ok_data, "live blocks hold their data", "memset/readback mismatch");
        for (int i = 0; i < N; i++)
            MUST(cuMemFree(p[i]));
    }

    /* --- address range and pointer attributes ------------------------------------------- */
    CUdeviceptr live = 0;
    const size_t live_size = 1000000;
    MUST(cuMemAlloc(&live, live_size));
    {
        CUdeviceptr base = 0;
        size_t size = 0;
        CUresult r = cuMemGetAddressRange(&base, &size, live);
        printf("INFO driver_api: cuMemGetAddressRange(p) -> %s base=0x%llx (p=0x%llx) size=%zu\n",
               ename(r), (unsigned long long)base, (unsigned long long)live, size);
        check(r == CUDA_SUCCESS && base == live && size >= live_size,
              "cuMemGetAddressRange at start", "%s base=0x%llx p=0x%llx size=%zu requested=%zu",
              ename(r), (unsigned long long)base, (unsigned long long)live, size, live_size);
        CUdeviceptr base2 = 0;
        size_t size2 = 0;
        r = cuMemGetAddressRange(&base2, &size2, live + 4096);
        check(r == CUDA_SUCCESS && base2 == live && size2 == size, "cuMemGetAddressRange inside",
              "%s base=0x%llx p=0x%llx size=%zu (at start: %zu)", ename(r),
              (unsigned long long)base2, (unsigned long long)live, size2, size);

        unsigned int mtype = 0;
        r = cuPointerGetAttribute(&mtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, live);
        check(r == CUDA_SUCCESS && mtype == CU_MEMORYTYPE_DEVICE, "pointer memory type device",
              "%s type=%u", ename(r), mtype);
        CUdeviceptr start = 0;
        r = cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, live + 100);
        check(r == CUDA_SUCCESS && start == live, "pointer range start",
              "%s start=0x%llx p=0x%llx", ename(r), (unsigned long long)start,
              (unsigned long long)live);
        size_t rsize = 0;
        r = cuPointerGetAttribute(&rsize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, live);
        check(r == CUDA_SUCCESS && rsize >= live_size, "pointer range size", "%s size=%zu", ename(r),
              rsize);
        int ordinal = -1;
        r = cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, live);
        check(r == CUDA_SUCCESS && ordinal == 0, "pointer device ordinal", "%s ordinal=%d", ename(r),
              ordinal);
        check(fill_and_check(live, live_size, 0x5EED5EEDu), "block usable", "memset/readback");
    }

    /* --- invalid frees ------------------------------------------------------------------ */
    {
        int on_stack = 0;
        struct {
            const char *name;
            CUdeviceptr p;
        } bad[] = {
            {"cuMemFree(0x1234)", (CUdeviceptr)0x1234},
            {"cuMemFree(interior pointer of a live block)", live + 256},
            {"cuMemFree(host stack address)", (CUdeviceptr)(uintptr_t)&on_stack},
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            CUresult r = cuMemFree(bad[i].p);
            printf("INFO driver_api: %s -> %s\n", bad[i].name, ename(r));
            check(r == CUDA_ERROR_INVALID_VALUE, bad[i].name, "returned %s, expected "
                  "CUDA_ERROR_INVALID_VALUE", ename(r));
        }
        unsigned int w = 0;
        CUresult r = cuMemcpyDtoH(&w, live + live_size - 4, 4);
        check(r == CUDA_SUCCESS && w == 0x5EED5EEDu, "live block intact after invalid frees",
              "%s word=0x%08x", ename(r), w);
        r = cuMemFree(live);
        check(r == CUDA_SUCCESS, "free of the live block", "%s", ename(r));
    }

    /* --- double free -------------------------------------------------------------------- */
    {
        const size_t sz = 2u << 20;
        CUdeviceptr q = 0;
        MUST(cuMemAlloc(&q, sz));
        MUST(cuMemFree(q));
        CUresult r = cuMemFree(q);
        printf("INFO driver_api: double cuMemFree -> %s\n", ename(r));
        check(r == CUDA_ERROR_INVALID_VALUE, "double free", "returned %s, expected "
              "CUDA_ERROR_INVALID_VALUE", ename(r));
        CUdeviceptr a = 0, b = 0;
        MUST(cuMemAlloc(&a, sz));
        MUST(cuMemAlloc(&b, sz));
        check(a != b && (a + sz <= b || b + sz <= a), "allocations after double free are distinct",
              "a=0x%llx b=0x%llx", (unsigned long long)a, (unsigned long long)b);
        check(fill_and_check(a, sz, 0xAAAA0001u) && fill_and_check(b, sz, 0xBBBB0002u),
              "allocations after double free usable", "memset/readback");
        unsigned int w = 0;
        MUST(cuMemcpyDtoH(&w, a, 4));
        check(w == 0xAAAA0001u, "allocations after double free independent",
              "first block reads 0x%08x after the second was filled", w);
        MUST(cuMemFree(a));
        MUST(cuMemFree(b));
    }

    /* --- out of memory ------------------------------------------------------------------ */
    {
        CUdeviceptr p = 0;
        CUresult r = cuMemAlloc(&p, (size_t)1 << 50);
        printf("INFO driver_api: cuMemAlloc(1 PiB) -> %s\n", ename(r));
        check(r == CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc(1 PiB) out of memory",
              "returned %s", ename(r));
        if (r == CUDA_SUCCESS)
            cuMemFree(p);
        r = cuMemAlloc(&p, 1u << 20);
        check(r == CUDA_SUCCESS, "allocation after out of memory", "%s", ename(r));
        if (r == CUDA_SUCCESS)
            MUST(cuMemFree(p));
    }

    /* --- what the driver says about the edges (reported, not judged) --------------------- */
    {
        CUresult r = cuMemFree(0);
        printf("INFO driver_api: cuMemFree(0) -> %s\n", ename(r));
        CUdeviceptr p = 0;
        r = cuMemAlloc(&p, 0);
        printf("INFO driver_api: cuMemAlloc(0 bytes) -> %s p=0x%llx\n", ename(r),
               (unsigned long long)p);
        if (r == CUDA_SUCCESS && p)
            cuMemFree(p);
    }

    size_t free1 = 0, total1 = 0;
    MUST(cuMemGetInfo(&free1, &total1));
    printf("INFO driver_api: cuMemGetInfo after: free=%zu total=%zu (free changed by %+lld)\n",
           free1, total1, (long long)free1 - (long long)free0);
    check(free1 <= total1 && total1 == total0, "cuMemGetInfo after", "free=%zu total=%zu "
          "(total before %zu)", free1, total1, total0);

    if (shim_require("driver_api", require_shim))
        failed++;
    MUST(cuCtxSetCurrent(NULL));
    MUST(cuDevicePrimaryCtxRelease(dev));

    if (failed) {
        printf("FAIL driver_api failed=%d checks=%d\n", failed, checks);
        return 1;
    }
    printf("PASS driver_api checks=%d\n", checks);
    return 0;
}
