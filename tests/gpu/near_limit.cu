// near_limit: a request the raw driver can serve must not fail because a cache holds idle
// memory or rounded the request up (DESIGN.md, "Memory follows the program").
//
//     near_limit [--margin-mib M] [--require-shim]          (default margin: 512 MiB)
//
// Sizes come from the device's total memory (cudaMemGetInfo), so the same steps fit an
// H100 (80 GB: about 79.2 GiB) and an H200 (about 139.8 GiB):
//   1. half:    cudaMalloc(50 % of total), write it with a kernel, verify, cudaFree. Under a
//               caching shim this block now sits in the cache.
//   2. near:    cudaMemGetInfo, then cudaMalloc(free - margin): what the program is told is
//               free, minus the margin. The shim must give back or reuse what it cached.
//   3. big:     cudaMalloc(7/8 of total, whole GiB; 69 GiB on an H100), the same checks.
//   4. again:   cudaMemGetInfo, cudaMalloc(free - margin) once more, after a block of a
//               different size was freed.
// Each step: cudaMalloc; one kernel writes a pattern derived from the word index and the step
// into every 32-bit word; a second kernel counts the words that do not hold it; 16 words
// (first, last, and spread between) are also copied back and compared on the host; cudaFree.
// A step prints
//     INFO near_limit: STEP requested_GiB=X free_GiB=F alloc_ms=A total_ms=T
// and at the end
//     NEAR_LIMIT ok requested_GiB=X free_GiB=F total_GiB=T half_GiB=H big_GiB=B again_GiB=G
// where X and F are step 2's request and the free memory it was derived from (GiB, 2
// decimals). A failure prints
//     NEAR_LIMIT FAIL step=STEP requested_GiB=X free_GiB=F: cudaMalloc -> ERROR (string)
// (or the failed check) and exits 1. With the shim loaded its statistics line is printed too.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "shim_probe.h"

static const double kGiB = 1024.0 * 1024.0 * 1024.0;

// A setup call that must succeed (not an allocation under test).
#define CK(call)                                                                              \
    do {                                                                                      \
        cudaError_t err_ = (call);                                                            \
        if (err_ != cudaSuccess) {                                                            \
            printf("NEAR_LIMIT FAIL %s:%d: %s -> %s (%s)\n", __FILE__, __LINE__, #call,       \
                   cudaGetErrorName(err_), cudaGetErrorString(err_));                         \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

__host__ __device__ static inline uint32_t pattern(size_t i, uint32_t seed)
{
    uint64_t x = (uint64_t)i * 0x9E3779B97F4A7C15ull + seed;
    return (uint32_t)(x ^ (x >> 29));
}

__global__ void fill(uint32_t *p, size_t n, uint32_t seed)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        p[i] = pattern(i, seed);
}

__global__ void verify(const uint32_t *p, size_t n, uint32_t seed, unsigned long long *bad)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    unsigned long long mine = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        mine += p[i] != pattern(i, seed);
    if (mine)
        atomicAdd(bad, mine);
}

static double now_ms()
{
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

static int g_blocks;                  // grid size for the fill and verify kernels
static unsigned long long *g_bad;     // device counter of wrong words

// One step: allocate `bytes`, write, verify, free. Returns 0, or prints the failure and 1.
static int step(const char *name, size_t bytes, size_t free_before, uint32_t seed)
{
    double t0 = now_ms();
    void *v = nullptr;
    cudaError_t err = cudaMalloc(&v, bytes);
    double t1 = now_ms();
    if (err != cudaSuccess) {
        printf("NEAR_LIMIT FAIL step=%s requested_GiB=%.2f free_GiB=%.2f: cudaMalloc -> %s (%s)\n",
               name, bytes / kGiB, free_before / kGiB, cudaGetErrorName(err),
               cudaGetErrorString(err));
        cudaGetLastError();  // an allocation failure is not sticky: reset the last error
        return 1;
    }
    uint32_t *p = (uint32_t *)v;
    size_t n = bytes / 4;
    CK(cudaMemset(g_bad, 0, sizeof *g_bad));
    fill<<<g_blocks, 256>>>(p, n, seed);
    CK(cudaGetLastError());
    verify<<<g_blocks, 256>>>(p, n, seed, g_bad);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    unsigned long long bad = 0;
    CK(cudaMemcpy(&bad, g_bad, sizeof bad, cudaMemcpyDeviceToHost));

    // 16 words read back on the host: first, last, and 14 spread between.
    int host_bad = 0;
    for (int k = 0; k < 16; k++) {
        size_t i = k == 15 ? n - 1 : (size_t)((double)n * k / 15.0);
        if (i >= n)
            i = n - 1;
        uint32_t w = 0;
        CK(cudaMemcpy(&w, p + i, sizeof w, cudaMemcpyDeviceToHost));
        if (w != pattern(i, seed)) {
            if (host_bad++ < 4)
                printf("INFO near_limit: %s: word %zu holds 0x%08x, expected 0x%08x\n", name, i,
                       w, pattern(i, seed));
        }
    }
    CK(cudaFree(v));
    double t2 = now_ms();
    printf("INFO near_limit: %s requested_GiB=%.2f free_GiB=%.2f alloc_ms=%.1f total_ms=%.1f "
           "bad_words=%llu host_bad=%d\n",
           name, bytes / kGiB, free_before / kGiB, t1 - t0, t2 - t0, bad, host_bad);
    fflush(stdout);
    if (bad || host_bad) {
        printf("NEAR_LIMIT FAIL step=%s requested_GiB=%.2f: %llu words wrong on the device, %d of "
               "16 read back\n",
               name, bytes / kGiB, bad, host_bad);
        return 1;
    }
    return 0;
}

// A near-limit step: ask cudaMemGetInfo, then run step() with free - margin. The free memory
// and the request go to *free_b and *req. Returns 0, or prints the failure and 1.
static int near_step(const char *name, size_t margin, uint32_t seed, size_t *free_b, size_t *req)
{
    size_t total = 0;
    CK(cudaMemGetInfo(free_b, &total));
    if (*free_b <= margin) {
        printf("NEAR_LIMIT FAIL step=%s: free_GiB=%.2f is not above the margin\n", name,
               *free_b / kGiB);
        return 1;
    }
    *req = *free_b - margin;
    return step(name, *req, *free_b, seed);
}

int main(int argc, char **argv)
{
    size_t margin = (size_t)512 << 20;
    int require_shim = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--margin-mib") && i + 1 < argc)
            margin = (size_t)strtoull(argv[++i], nullptr, 10) << 20;
        else if (!strcmp(argv[i], "--require-shim"))
            require_shim = 1;
        else {
            fprintf(stderr, "usage: near_limit [--margin-mib M] [--require-shim]\n");
            return 2;
        }
    }

    CK(cudaFree(0));  // the context
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    g_blocks = prop.multiProcessorCount * 8;
    CK(cudaMalloc(&g_bad, sizeof *g_bad));

    size_t free0 = 0, total = 0;
    CK(cudaMemGetInfo(&free0, &total));
    const size_t two_mib = (size_t)2 << 20;
    const size_t half = total / 2 / two_mib * two_mib;
    const size_t big = (size_t)((double)total * 7.0 / 8.0 / kGiB) * (size_t)kGiB;
    printf("INFO near_limit: device %s total_GiB=%.2f free_GiB=%.2f margin_MiB=%zu half_GiB=%.2f "
           "big_GiB=%.2f\n",
           prop.name, total / kGiB, free0 / kGiB, margin >> 20, half / kGiB, big / kGiB);
    fflush(stdout);

    // The steps in order; the first that fails ends the sequence.
    size_t free1 = 0, free2 = 0, free3 = 0, near = 0, again = 0;
    int rc = step("half", half, free0, 1);
    if (!rc)
        rc = near_step("near", margin, 2, &free1, &near);
    if (!rc) {
        CK(cudaMemGetInfo(&free2, &total));
        rc = step("big", big, free2, 3);
    }
    if (!rc)
        rc = near_step("again", margin, 4, &free3, &again);

    size_t free_end = 0;
    if (cudaMemGetInfo(&free_end, &total) == cudaSuccess)
        printf("INFO near_limit: at the end free_GiB=%.2f total_GiB=%.2f\n", free_end / kGiB,
               total / kGiB);
    if (shim_require("near_limit", require_shim))
        rc = 1;
    if (!rc)
        printf("NEAR_LIMIT ok requested_GiB=%.2f free_GiB=%.2f total_GiB=%.2f half_GiB=%.2f "
               "big_GiB=%.2f again_GiB=%.2f\n",
               near / kGiB, free1 / kGiB, total / kGiB, half / kGiB, big / kGiB, again / kGiB);
    fflush(stdout);
    cudaFree(g_bad);
    return rc;
}
