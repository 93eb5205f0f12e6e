// alloc_loop: cudaMalloc / kernel writes and verifies / cudaFree, over a mix of sizes.
//
//     alloc_loop [ITERATIONS] [--require-shim]      (default 200 iterations)
//
// Each iteration allocates every size of the mix (256 B ... 64 MiB, odd sizes included) so
// they are all live at once, checks each pointer is 256-byte aligned and that no two blocks
// overlap, fills each block (every byte of the requested size) with an iteration- and
// block-specific pattern, verifies it on the device (mismatches summed into a long-lived
// counter), reads one word back from one block on the host, and frees the blocks in a rotating
// order. Every CUDA result is checked. Prints iterations/s and
//     PASS alloc_loop iterations=N allocs=N mismatches=0 it/s=X allocs/s=X
// or FAIL lines; exits 1 on failure. Built twice by scripts/gpu-check: static cudart (nvcc's
// default) and -cudart shared, the two ways cudart reaches the driver.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "shim_probe.h"

#define CK(call)                                                                              \
    do {                                                                                      \
        cudaError_t err_ = (call);                                                            \
        if (err_ != cudaSuccess) {                                                            \
            printf("FAIL alloc_loop: %s:%d: %s -> %s (%s)\n", __FILE__, __LINE__, #call,      \
                   cudaGetErrorName(err_), cudaGetErrorString(err_));                         \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static const size_t kSizes[] = {
    256, 1000, 4096, 65536, (256u << 10) + 100, 1u << 20, (3u << 20) + 17, 8u << 20, 16u << 20,
    64u << 20,
};
static const int kNumSizes = sizeof kSizes / sizeof kSizes[0];

__host__ __device__ static inline uint32_t pattern(uint32_t seed, size_t i)
{
    return seed ^ (uint32_t)(i * 2654435761u) ^ (uint32_t)(i >> 32);
}

__global__ void fill(uint8_t *buf, size_t bytes, uint32_t seed)
{
    uint32_t *w = (uint32_t *)buf;
    size_t words = bytes / 4;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride)
        w[i] = pattern(seed, i);
    if (blockIdx.x == 0 && threadIdx.x == 0)
        for (size_t b = words * 4; b < bytes; b++)
            buf[b] = (uint8_t)(seed + b);
}

__global__ void verify(const uint8_t *buf, size_t bytes, uint32_t seed,
                       unsigned long long *mismatches)
{
    const uint32_t *w = (const uint32_t *)buf;
    size_t words = bytes / 4;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    unsigned long long bad = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride)
        bad += w[i] != pattern(seed, i);
    if (blockIdx.x == 0 && threadIdx.x == 0)
        for (size_t b = words * 4; b < bytes; b++)
            bad += buf[b] != (uint8_t)(seed + b);
    if (bad)
        atomicAdd(mismatches, bad);
}

static unsigned blocks_for(size_t bytes)
{
    size_t b = (bytes / 4 + 255) / 256;
    return (unsigned)std::max<size_t>(1, std::min<size_t>(b, 1024));
}

int main(int argc, char **argv)
{
    long iters = 200;
    int require_shim = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--require-shim"))
            require_shim = 1;
        else if ((iters = strtol(argv[i], NULL, 10)) <= 0) {
            printf("usage: alloc_loop [ITERATIONS] [--require-shim]\n");
            return 2;
        }
    }

    CK(cudaFree(0)); // context
    unsigned long long *d_mismatch;
    CK(cudaMalloc(&d_mismatch, sizeof *d_mismatch));
    CK(cudaMemset(d_mismatch, 0, sizeof *d_mismatch));
    CK(cudaDeviceSynchronize());

    uint8_t *buf[kNumSizes];
    long allocs = 0, failures = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (long it = 0; it < iters; it++) {
        for (int k = 0; k < kNumSizes; k++) {
            CK(cudaMalloc(&buf[k], kSizes[k]));
            allocs++;
            if ((uintptr_t)buf[k] % 256) {
                printf("FAIL alloc_loop: iteration %ld: cudaMalloc(%zu) returned %p, not 256-byte "
                       "aligned\n", it, kSizes[k], (void *)buf[k]);
                failures++;
            }
        }
        for (int a = 0; a < kNumSizes; a++)
            for (int b = a + 1; b < kNumSizes; b++) {
                uintptr_t pa = (uintptr_t)buf[a], pb = (uintptr_t)buf[b];
                if (pa < pb + kSizes[b] && pb < pa + kSizes[a]) {
                    printf("FAIL alloc_loop: iteration %ld: live blocks overlap: %p+%zu and "
                           "%p+%zu\n", it, (void *)buf[a], kSizes[a], (void *)buf[b], kSizes[b]);
                    failures++;
                }
            }
        for (int k = 0; k < kNumSizes; k++) {
            uint32_t seed = (uint32_t)(it * 131 + k * 7 + 1);
            fill<<<blocks_for(kSizes[k]), 256>>>(buf[k], kSizes[k], seed);
            CK(cudaGetLastError());
        }
        for (int k = 0; k < kNumSizes; k++) {
            uint32_t seed = (uint32_t)(it * 131 + k * 7 + 1);
            verify<<<blocks_for(kSizes[k]), 256>>>(buf[k], kSizes[k], seed, d_mismatch);
            CK(cudaGetLastError());
        }
        // Host-side check of one word of one block (synchronous copy).
        int k = (int)(it % kNumSizes);
        size_t word = (kSizes[k] / 4) - 1;
        uint32_t got;
        CK(cudaMemcpy(&got, buf[k] + word * 4, 4, cudaMemcpyDeviceToHost));
        uint32_t want = pattern((uint32_t)(it * 131 + k * 7 + 1), word);
        if (got != want) {
            printf("FAIL alloc_loop: iteration %ld: block %zu B word %zu reads 0x%08x, wrote "
                   "0x%08x\n", it, kSizes[k], word, got, want);
            failures++;
        }
        for (int j = 0; j < kNumSizes; j++)
            CK(cudaFree(buf[(j + it) % kNumSizes]));
        if (failures > 20) {
            printf("FAIL alloc_loop: too many failures, stopping\n");
            return 1;
        }
    }
    CK(cudaDeviceSynchronize());
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    unsigned long long mismatches;
    CK(cudaMemcpy(&mismatches, d_mismatch, sizeof mismatches, cudaMemcpyDeviceToHost));
    CK(cudaFree(d_mismatch));

    if (shim_require("alloc_loop", require_shim))
        return 1;
    if (mismatches || failures) {
        printf("FAIL alloc_loop iterations=%ld allocs=%ld mismatches=%llu failures=%ld\n", iters,
               allocs, mismatches, failures);
        return 1;
    }
    printf("PASS alloc_loop iterations=%ld allocs=%ld mismatches=0 it/s=%.1f allocs/s=%.0f\n",
           iters, allocs, iters / secs, allocs / secs);
    return 0;
}
