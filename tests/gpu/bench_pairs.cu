// bench_pairs: latency of one allocation + free pair, three ways, medians over many runs.
//
//     bench_pairs [--runs N] [--pairs N] [--size BYTES] [--require-shim]
//                 (defaults: 31 runs x 10000 pairs of 1 MiB, after one warm-up run)
//
//   cuMemAlloc       cuMemAlloc_v2 + cuMemFree_v2 through the driver API, the pointers taken
//                    from cudaGetDriverEntryPointByVersion (under LD_PRELOAD the shim hands out
//                    its wrappers there too, so it is in the path)
//   cudaMalloc       cudaMalloc + cudaFree
//   cudaMallocAsync  cudaMallocAsync + cudaFreeAsync on one stream, default mempool kept warm
//                    (release threshold UINT64_MAX); the stream is synchronized once at the end
//                    of each run, inside the timing
//
// One line each:  bench NAME median_ns=X min_ns=X max_ns=X runs=N pairs=N
// (ns per pair; min/max are those of the runs' means). scripts/gpu-check runs it without and
// with the shim and prints the two side by side.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "shim_probe.h"

#define CK(call)                                                                              \
    do {                                                                                      \
        cudaError_t err_ = (call);                                                            \
        if (err_ != cudaSuccess) {                                                            \
            printf("FAIL bench_pairs: %s:%d: %s -> %s\n", __FILE__, __LINE__, #call,          \
                   cudaGetErrorName(err_));                                                   \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

#define CKD(call)                                                                             \
    do {                                                                                      \
        CUresult r_ = (call);                                                                 \
        if (r_ != CUDA_SUCCESS) {                                                             \
            printf("FAIL bench_pairs: %s:%d: %s -> CUresult %d\n", __FILE__, __LINE__, #call,  \
                   (int)r_);                                                                  \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);

static long runs = 31, pairs = 10000;

// fn(n) does n pairs; returns ns per pair of each timed run.
static void bench(const char *name, const std::function<void(long)> &fn)
{
    fn(std::max(100L, pairs / 10)); // warm-up
    std::vector<double> ns;
    for (long r = 0; r < runs; r++) {
        auto t0 = std::chrono::steady_clock::now();
        fn(pairs);
        auto t1 = std::chrono::steady_clock::now();
        ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / (double)pairs);
    }
    std::sort(ns.begin(), ns.end());
    printf("bench %s median_ns=%.1f min_ns=%.1f max_ns=%.1f runs=%ld pairs=%ld\n", name,
           ns[ns.size() / 2], ns.front(), ns.back(), runs, pairs);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    size_t size = 1u << 20;
    int require_shim = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--runs") && i + 1 < argc)
            runs = strtol(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--pairs") && i + 1 < argc)
            pairs = strtol(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--size") && i + 1 < argc)
            size = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--require-shim"))
            require_shim = 1;
        else
            runs = 0;
    }
    if (runs <= 0 || pairs <= 0 || size == 0) {
        printf("usage: bench_pairs [--runs N] [--pairs N] [--size BYTES] [--require-shim]\n");
        return 2;
    }
    CK(cudaFree(0));
    printf("bench_pairs: size=%zu runs=%ld pairs=%ld\n", size, runs, pairs);

    // (a) driver API through the entry-point table
    void *pa = nullptr, *pf = nullptr;
    cudaDriverEntryPointQueryResult qa, qf;
    CK(cudaGetDriverEntryPointByVersion("cuMemAlloc", &pa, 12000, cudaEnableDefault, &qa));
    CK(cudaGetDriverEntryPointByVersion("cuMemFree", &pf, 12000, cudaEnableDefault, &qf));
    if (qa != cudaDriverEntryPointSuccess || qf != cudaDriverEntryPointSuccess || !pa || !pf) {
        printf("FAIL bench_pairs: cudaGetDriverEntryPointByVersion cuMemAlloc/cuMemFree\n");
        return 1;
    }
    alloc_fn d_alloc = (alloc_fn)pa;
    free_fn d_free = (free_fn)pf;
    bench("cuMemAlloc", [&](long n) {
        for (long i = 0; i < n; i++) {
            CUdeviceptr p;
            CKD(d_alloc(&p, size));
            CKD(d_free(p));
        }
    });

    // (b) runtime API
    bench("cudaMalloc", [&](long n) {
        for (long i = 0; i < n; i++) {
            void *p;
            CK(cudaMalloc(&p, size));
            CK(cudaFree(p));
        }
    });

    // (c) stream-ordered allocator, default pool kept warm
    cudaMemPool_t pool;
    CK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t threshold = UINT64_MAX;
    CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    bench("cudaMallocAsync", [&](long n) {
        for (long i = 0; i < n; i++) {
            void *p;
            CK(cudaMallocAsync(&p, size, s));
            CK(cudaFreeAsync(p, s));
        }
        CK(cudaStreamSynchronize(s));
    });
    CK(cudaStreamDestroy(s));

    if (shim_require("bench_pairs", require_shim))
        return 1;
    printf("PASS bench_pairs\n");
    return 0;
}
