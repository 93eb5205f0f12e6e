// bench_pairs: latency of one allocation + free pair, three ways, medians over many runs.
//
//     bench_pairs [--runs N] [--pairs N] [--size BYTES] [--streams N]
//                 [--kernel [--kernel-on one|rr|legacy]] [--require-shim]
//                 (defaults: 31 runs x 10000 pairs of 1 MiB, after one warm-up run)
//     bench_pairs --sizes LIST [--threads LIST] [--runs N] [--pairs N] [--streams N]
//                 [--require-shim]
//                 (sweep: LIST like 512,4K,64K,1M,16M,256M,1G and 1,4,16; defaults 11 runs x
//                 200 pairs a thread, a quarter of that from 256 MiB, a tenth from 1 GiB, so
//                 that a full sweep of the raw driver stays within about a minute and a half)
//
//   --streams N      create N non-blocking streams before any timing and keep them alive to
//                    the end (an allocator that fences every live stream pays for each)
//   --kernel         per pair, launch one tiny kernel that writes the first 4 KiB of the
//                    block, between the allocation and the free, on: the first of the N
//                    streams (--kernel-on one, the default; the legacy stream when N = 0),
//                    each of them in turn (rr), or the legacy default stream (legacy).
//                    cudaMallocAsync then allocates and frees on that stream too. Nothing
//                    waits within a run; each run ends with one cudaDeviceSynchronize, inside
//                    the timing. Not in sweep mode.
//
//   cuMemAlloc       cuMemAlloc_v2 + cuMemFree_v2 through the driver API, the pointers taken
//                    from cudaGetDriverEntryPointByVersion (under LD_PRELOAD the shim hands out
//                    its wrappers there too, so it is in the path)
//   cudaMalloc       cudaMalloc + cudaFree
//   cudaMallocAsync  cudaMallocAsync + cudaFreeAsync on one stream, default mempool kept warm
//                    (release threshold UINT64_MAX); the stream is synchronized once at the end
//                    of each run, inside the timing
//
// One line each:  bench NAME median_ns=X min_ns=X max_ns=X runs=N pairs=N streams=N kernel=K
// (K: none, one, rr or legacy)
// (ns per pair; min/max are those of the runs' means). scripts/gpu-check runs it without and
// with the shim and prints the two side by side.
//
// Sweep mode (--sizes or --threads), for every size x thread count x NAME, one line:
//   bench NAME size=BYTES threads=N median_ns=X pairs_per_s=Y runs=R pairs=P streams=N kernel=none
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

// --streams and --kernel: the streams kept alive, and where each pair's kernel goes.
enum KernelOn { kNone, kOne, kRoundRobin, kLegacy };
static const char *const kKernelName[] = {"none", "one", "rr", "legacy"};
static KernelOn kernel_on = kNone;
static std::vector<cudaStream_t> alive;

enum { kTouchBytes = 4096, kTouchThreads = 256 };

// The tiny kernel of --kernel: writes the first min(size, 4 KiB) bytes of the block.
__global__ void touch(unsigned char *p, size_t n)
{
    for (size_t i = threadIdx.x; i < n; i += blockDim.x)
        p[i] = (unsigned char)i;
}

// The stream of pair i's kernel (0: the legacy default stream).
static inline cudaStream_t launch_stream(long i)
{
    if (kernel_on == kOne && !alive.empty())
        return alive[0];
    if (kernel_on == kRoundRobin)
        return alive[(size_t)i % alive.size()];
    return (cudaStream_t)0;
}

static inline void launch_touch(void *p, size_t size, long i)
{
    touch<<<1, kTouchThreads, 0, launch_stream(i)>>>((unsigned char *)p,
                                                      std::min(size, (size_t)kTouchBytes));
}

// fn(n) does n pairs; returns ns per pair of each timed run. With --kernel, each run (the
// warm-up too) ends with one cudaDeviceSynchronize, timed, and a check of the launches.
static void bench(const char *name, const std::function<void(long)> &fn)
{
    auto one_run = [&](long n) {
        fn(n);
        if (kernel_on != kNone) {
            CK(cudaDeviceSynchronize());
            CK(cudaGetLastError());
        }
    };
    one_run(std::max(100L, pairs / 10)); // warm-up
    std::vector<double> ns;
    for (long r = 0; r < runs; r++) {
        auto t0 = std::chrono::steady_clock::now();
        one_run(pairs);
        auto t1 = std::chrono::steady_clock::now();
        ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / (double)pairs);
    }
    std::sort(ns.begin(), ns.end());
    printf("bench %s median_ns=%.1f min_ns=%.1f max_ns=%.1f runs=%ld pairs=%ld streams=%zu "
           "kernel=%s\n",
           name, ns[ns.size() / 2], ns.front(), ns.back(), runs, pairs, alive.size(),
           kKernelName[kernel_on]);
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
    printf("bench %s size=%zu threads=%d median_ns=%.1f pairs_per_s=%.0f runs=%ld pairs=%ld "
           "streams=%zu kernel=none\n",
           name, size, threads, lat[lat.size() / 2], rate[rate.size() / 2], runs, p,
           alive.size());
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
    bool runs_set = false, pairs_set = false, bad_args = false;
    long nstreams = 0;
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
        else if (!strcmp(argv[i], "--streams") && i + 1 < argc) {
            char *end;
            const char *v = argv[++i];
            nstreams = strtol(v, &end, 10);
            bad_args |= !*v || *end || nstreams < 0 || nstreams > 4096;
        } else if (!strcmp(argv[i], "--kernel"))
            kernel_on = kernel_on == kNone ? kOne : kernel_on;
        else if (!strcmp(argv[i], "--kernel-on") && i + 1 < argc) {
            const char *k = argv[++i];
            if (!strcmp(k, "one"))
                kernel_on = kOne;
            else if (!strcmp(k, "rr"))
                kernel_on = kRoundRobin;
            else if (!strcmp(k, "legacy"))
                kernel_on = kLegacy;
            else
                bad_args = true;
        } else
            bad_args = true;
    }
    bool sweeping = sizes_arg || threads_arg;
    std::vector<size_t> sizes, threads;
    if (sweeping) {
        sizes = sizes_arg ? parse_list(sizes_arg, true) : std::vector<size_t>{size};
        threads = threads_arg ? parse_list(threads_arg, false) : std::vector<size_t>{1};
        if (!runs_set) runs = 11;
        if (!pairs_set) pairs = 200;
    }
    if (bad_args || runs <= 0 || pairs <= 0 || size == 0 ||
        (sweeping && (sizes.empty() || threads.empty() || kernel_on != kNone)) ||
        (kernel_on == kRoundRobin && nstreams == 0)) {
        printf("usage: bench_pairs [--runs N] [--pairs N] [--size BYTES] [--streams N]\n"
               "                   [--kernel [--kernel-on one|rr|legacy]] [--require-shim]\n"
               "       bench_pairs --sizes LIST [--threads LIST] [--runs N] [--pairs N] "
               "[--streams N] [--require-shim]\n"
               "(--kernel-on rr needs --streams N > 0; --kernel is not for the sweep)\n");
        return 2;
    }
    CK(cudaFree(0));
    alive.resize((size_t)nstreams);
    for (auto &st : alive)
        CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    if (sweeping)
        printf("bench_pairs: sweep sizes=%s threads=%s runs=%ld pairs=%ld streams=%zu\n",
               sizes_arg ? sizes_arg : "(--size)", threads_arg ? threads_arg : "1", runs, pairs,
               alive.size());
    else
        printf("bench_pairs: size=%zu runs=%ld pairs=%ld streams=%zu (non-blocking, alive) "
               "kernel=%s\n",
               size, runs, pairs, alive.size(), kKernelName[kernel_on]);

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
        for (auto &st : alive)
            CK(cudaStreamDestroy(st));
        if (shim_require("bench_pairs", require_shim))
            return 1;
        printf("PASS bench_pairs\n");
        return 0;
    }
    bench("cuMemAlloc", [&](long n) {
        for (long i = 0; i < n; i++) {
            CUdeviceptr p;
            CKD(d_alloc(&p, size));
            if (kernel_on != kNone)
                launch_touch((void *)p, size, i);
            CKD(d_free(p));
        }
    });

    // (b) runtime API
    bench("cudaMalloc", [&](long n) {
        for (long i = 0; i < n; i++) {
            void *p;
            CK(cudaMalloc(&p, size));
            if (kernel_on != kNone)
                launch_touch(p, size, i);
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
        if (kernel_on != kNone) { // on the kernel's stream; bench() synchronizes at the end
            for (long i = 0; i < n; i++) {
                void *p;
                cudaStream_t ks = launch_stream(i);
                CK(cudaMallocAsync(&p, size, ks));
                launch_touch(p, size, i);
                CK(cudaFreeAsync(p, ks));
            }
            return;
        }
        for (long i = 0; i < n; i++) {
            void *p;
            CK(cudaMallocAsync(&p, size, s));
            CK(cudaFreeAsync(p, s));
        }
        CK(cudaStreamSynchronize(s));
    });
    CK(cudaStreamDestroy(s));
    for (auto &st : alive)
        CK(cudaStreamDestroy(st));

    if (shim_require("bench_pairs", require_shim))
        return 1;
    printf("PASS bench_pairs\n");
    return 0;
}
