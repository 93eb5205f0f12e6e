// oom_recovery: a large allocation must succeed when the memory it needs sits idle in the cache.
//
//     oom_recovery [--require-shim]
//
// 1. cudaMemGetInfo; allocate 256 MiB chunks (each touched with cudaMemset) until 85 % of total
//    device memory is allocated (or the driver says out of memory), then free them all: under
//    the shim they are now idle in its cache, still held from the driver.
// 2. Allocate ONE block of 60 % of total memory (at most free-at-start - 512 MiB, and always
//    larger than any cached chunk): no cached block can serve it, and the device has room for
//    it only if the shim gives its cache back (OOM recovery, or its release threshold).
// 3. Touch the big block, free it, and allocate a few chunks again.
// Prints "PASS oom_recovery ..." or "FAIL oom_recovery ...", and the shim's statistics when it is
// loaded (oom_recoveries, releases, ...).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "shim_probe.h"

#define CK(call)                                                                              \
    do {                                                                                      \
        cudaError_t err_ = (call);                                                            \
        if (err_ != cudaSuccess) {                                                            \
            printf("FAIL oom_recovery: %s:%d: %s -> %s (%s)\n", __FILE__, __LINE__, #call,    \
                   cudaGetErrorName(err_), cudaGetErrorString(err_));                         \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static const size_t MiB = 1u << 20;

int main(int argc, char **argv)
{
    int require_shim = argc > 1 && !strcmp(argv[1], "--require-shim");
    const size_t chunk = 256 * MiB;

    CK(cudaFree(0));
    size_t free0, total;
    CK(cudaMemGetInfo(&free0, &total));
    printf("oom_recovery: start: free=%zu MiB total=%zu MiB\n", free0 / MiB, total / MiB);

    // 1. fill to 85 % of total
    size_t target = (size_t)(0.85 * (double)total);
    std::vector<void *> chunks;
    size_t held = 0;
    while (held + chunk <= target) {
        void *p = nullptr;
        cudaError_t e = cudaMalloc(&p, chunk);
        if (e == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            printf("oom_recovery: out of memory after %zu chunks (%zu MiB)\n", chunks.size(),
                   held / MiB);
            break;
        }
        CK(e);
        CK(cudaMemsetAsync(p, 0x11, chunk, 0));
        chunks.push_back(p);
        held += chunk;
    }
    CK(cudaDeviceSynchronize());
    size_t free_full, t2;
    CK(cudaMemGetInfo(&free_full, &t2));
    printf("oom_recovery: holding %zu chunks of 256 MiB = %zu MiB; free=%zu MiB\n", chunks.size(),
           held / MiB, free_full / MiB);
    for (void *p : chunks)
        CK(cudaFree(p));
    size_t free_after, t3;
    CK(cudaMemGetInfo(&free_after, &t3));
    printf("oom_recovery: all chunks freed; cudaMemGetInfo free=%zu MiB\n", free_after / MiB);
    shim_report("oom_recovery");

    // 2. one big block
    size_t big = (size_t)(0.60 * (double)total);
    if (free0 > 512 * MiB && big > free0 - 512 * MiB)
        big = free0 - 512 * MiB;
    big &= ~(2 * MiB - 1);
    if (big <= chunk || held < big) {
        printf("FAIL oom_recovery: setup: big block %zu MiB vs chunk 256 MiB, held %zu MiB: the "
               "test needs big > chunk and held >= big\n", big / MiB, held / MiB);
        return 1;
    }
    void *bigp = nullptr;
    cudaError_t e = cudaMalloc(&bigp, big);
    printf("oom_recovery: cudaMalloc(%zu MiB) -> %s\n", big / MiB, cudaGetErrorName(e));
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        shim_report("oom_recovery");
        printf("FAIL oom_recovery big=%zu MiB held_before=%zu MiB: %s (the cache was not given "
               "back)\n", big / MiB, held / MiB, cudaGetErrorName(e));
        return 1;
    }
    CK(cudaMemset(bigp, 0x5A, big));
    unsigned char probe[2] = {0, 0};
    CK(cudaMemcpy(&probe[0], bigp, 1, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&probe[1], (char *)bigp + big - 1, 1, cudaMemcpyDeviceToHost));
    if (probe[0] != 0x5A || probe[1] != 0x5A) {
        printf("FAIL oom_recovery: big block readback 0x%02x 0x%02x\n", probe[0], probe[1]);
        return 1;
    }
    CK(cudaFree(bigp));

    // 3. the allocator still works
    std::vector<void *> again(4);
    for (void *&p : again)
        CK(cudaMalloc(&p, chunk));
    for (void *p : again)
        CK(cudaFree(p));

    if (shim_require("oom_recovery", require_shim))
        return 1;
    printf("PASS oom_recovery big=%zu MiB held_before=%zu MiB total=%zu MiB\n", big / MiB,
           held / MiB, total / MiB);
    return 0;
}
