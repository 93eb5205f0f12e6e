// bench_pairs: latency of one allocation + free pair, three ways, medians over many runs.
//
//     bench_pairs [--runs N] [--pairs N] [--size BYTES] [--require-shim]
//                 (defaults: 31 runs x 10000 pairs of 1 MiB, after one warm-up run)
//     bench_pairs --sizes LIST [--threads LIST] [--runs N] [--pairs N] [--require-shim]
//                 (sweep: LIST like 512,4K,64K,1M,16M,256M,1G and 1,4,16; defaults 11 runs x
//                 200 pairs a thread, a quarter of that from 256 MiB, a tenth from 1 GiB, so
//                 that a full sweep of the raw driver stays within about a minute and a half)
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
//
// Sweep mode (--sizes or --threads), for every size x thread count x NAME, one line:
//   bench NAME size=BYTES threads=N median_ns=X pairs_per_s=Y runs=R pairs=P
// Each of the N threads loops its own P pairs (cudaMallocAsync: on its own stream); a run's
// latency is the mean over threads of each thread's time per pair, median_ns the median over
// runs; pairs_per_s is N*P over the run's wall time, median over runs. scripts/bench-gpu runs
// it without and with the shim.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <functional>
#include <string>
#include <thread>
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

// ---- sweep mode: sizes x threads -----------------------------------------------------------

// "512", "4K", "1M", "1G" (binary units); 0 on anything else.
static size_t parse_size(const std::string &t)
{
    char *end;
    unsigned long long v = strtoull(t.c_str(), &end, 10);
    std::string suf(end);
    if (suf == "" || suf == "B") return v;
    if (suf == "K" || suf == "KiB") return v << 10;
    if (suf == "M" || suf == "MiB") return v << 20;
    if (suf == "G" || suf == "GiB") return v << 30;
    return 0;
}

static std::vector<size_t> parse_list(const char *s, bool sizes)
{
    std::vector<size_t> out;
    std::string all(s), tok;
    size_t pos = 0;
    while (pos <= all.size()) {
        size_t comma = all.find(',', pos);
        if (comma == std::string::npos) comma = all.size();
        tok = all.substr(pos, comma - pos);
        size_t v = sizes ? parse_size(tok) : strtoul(tok.c_str(), nullptr, 10);
        if (v == 0 || (!sizes && v > 256)) return {};
        out.push_back(v);
        pos = comma + 1;
    }
    return out;
}

// One pair loop of one thread: n pairs of `size` bytes.
typedef std::function<void(int thread, long n)> pair_loop;

static void sweep_one(const char *name, size_t size, int threads, long p, const pair_loop &fn)
{
    std::vector<double> lat, rate;
    for (long r = -1; r < runs; r++) { // run -1 warms up (pools, first-touch costs)
        std::atomic<int> ready{0};
        std::atomic<bool> go{false};
        std::vector<double> per(threads);
        std::vector<std::thread> ts;
        for (int t = 0; t < threads; t++)
            ts.emplace_back([&, t] {
                CK(cudaSetDevice(0)); // makes the primary context current for the driver API
                ready++;
                while (!go.load()) {}
                auto t0 = std::chrono::steady_clock::now();
                fn(t, p);
                auto t1 = std::chrono::steady_clock::now();
                per[t] = std::chrono::duration<double, std::nano>(t1 - t0).count() / (double)p;
            });
        while (ready.load() < threads) {}
        auto w0 = std::chrono::steady_clock::now();
        go = true;
        for (auto &t : ts) t.join();
        auto w1 = std::chrono::steady_clock::now();
        if (r < 0) continue;
        double mean = 0;
        for (double x : per) mean += x / threads;
        lat.push_back(mean);
        rate.push_back((double)threads * (double)p /
                       std::chrono::duration<double>(w1 - w0).count());
    }
    std::sort(lat.begin(), lat.end());
    std::sort(rate.begin(), rate.end());
    printf("bench %s size=%zu threads=%d median_ns=%.1f pairs_per_s=%.0f runs=%ld pairs=%ld\n",
           name, size, threads, lat[lat.size() / 2], rate[rate.size() / 2], runs, p);
    fflush(stdout);
}

static int sweep(const std::vector<size_t> &sizes, const std::vector<size_t> &threads,
                 long base_pairs, alloc_fn d_alloc, free_fn d_free)
{
    size_t tmax = *std::max_element(threads.begin(), threads.end());
    std::vector<cudaStream_t> streams(tmax);
    for (auto &s : streams) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaMemPool_t pool;
    CK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t threshold = UINT64_MAX;
    CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    for (size_t size : sizes) {
        // Raw pairs of large blocks cost hundreds of us: fewer of them keeps the sweep short.
        long p = size >= (1ull << 30) ? base_pairs / 10 : size >= (256ull << 20) ? base_pairs / 4
                                                                                 : base_pairs;
        p = std::max(p, 5L);
        for (size_t nt : threads) {
            int n = (int)nt;
            sweep_one("cuMemAlloc", size, n, p, [&](int, long k) {
                for (long i = 0; i < k; i++) {
                    CUdeviceptr d;
                    CKD(d_alloc(&d, size));
                    CKD(d_free(d));
                }
            });
            sweep_one("cudaMalloc", size, n, p, [&](int, long k) {
                for (long i = 0; i < k; i++) {
                    void *d;
                    CK(cudaMalloc(&d, size));
                    CK(cudaFree(d));
                }
            });
            sweep_one("cudaMallocAsync", size, n, p, [&](int t, long k) {
                for (long i = 0; i < k; i++) {
                    void *d;
                    CK(cudaMallocAsync(&d, size, streams[t]));
                    CK(cudaFreeAsync(d, streams[t]));
                }
                CK(cudaStreamSynchronize(streams[t]));
            });
        }
    }
    for (auto &s : streams) CK(cudaStreamDestroy(s));
    return 0;
}

int main(int argc, char **argv)
{
    size_t size = 1u << 20;
    int require_shim = 0;
    const char *sizes_arg = nullptr, *threads_arg = nullptr;
    bool runs_set = false, pairs_set = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--runs") && i + 1 < argc)
            runs = strtol(argv[++i], NULL, 10), runs_set = true;
        else if (!strcmp(argv[i], "--pairs") && i + 1 < argc)
            pairs = strtol(argv[++i], NULL, 10), pairs_set = true;
        else if (!strcmp(argv[i], "--sizes") && i + 1 < argc)
            sizes_arg = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads_arg = argv[++i];
        else if (!strcmp(argv[i], "--size") && i + 1 < argc)
            size = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--require-shim"))
            require_shim = 1;
        else
            runs = 0;
    }
    bool sweeping = sizes_arg || threads_arg;
    std::vector<size_t> sizes, threads;
    if (sweeping) {
        sizes = sizes_arg ? parse_list(sizes_arg, true) : std::vector<size_t>{size};
        threads = threads_arg ? parse_list(threads_arg, false) : std::vector<size_t>{1};
        if (!runs_set) runs = 11;
        if (!pairs_set) pairs = 200;
    }
    if (runs <= 0 || pairs <= 0 || size == 0 || (sweeping && (sizes.empty() || threads.empty()))) {
        printf("usage: bench_pairs [--runs N] [--pairs N] [--size BYTES] [--require-shim]\n"
               "       bench_pairs --sizes LIST [--threads LIST] [--runs N] [--pairs N] "
               "[--require-shim]\n");
        return 2;
    }
    CK(cudaFree(0));
    if (sweeping)
        printf("bench_pairs: sweep sizes=%s threads=%s runs=%ld pairs=%ld\n",
               sizes_arg ? sizes_arg : "(--size)", threads_arg ? threads_arg : "1", runs, pairs);
    else
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
    if (sweeping) {
        sweep(sizes, threads, pairs, d_alloc, d_free);
        if (shim_require("bench_pairs", require_shim))
            return 1;
        printf("PASS bench_pairs\n");
        return 0;
    }
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
