// alloc_paths: the allocation paths past cudaMalloc on a real GPU (issue 12).
//
//     alloc_paths host_pairs SIZE RUNS PAIRS   cudaMallocHost + cudaFreeHost pairs of SIZE
//                                              bytes: "bench host size=B median_ns=X ..."
//                                              (median over RUNS of the mean per pair)
//     alloc_paths host_copy                    a pinned buffer freed while an async copy
//                                              still reads it must not be handed out (and
//                                              written) before the copy is done
//     alloc_paths cap_pitch CAP                cudaMallocPitch  ) 64 MiB each until the
//     alloc_paths cap_managed CAP              cudaMallocManaged) allocation fails: it fails
//     alloc_paths cap_async CAP                cudaMallocAsync  ) with cudaErrorMemoryAllocation
//                                              at the cap (CAP like 2G), then all is freed
//                                              and the same amount fits again
//
// No device code: a host function (cudaLaunchHostFunc) that sleeps holds the stream, so this
// builds with nvcc or a plain C++ compiler. Each check prints "PASS alloc_paths MODE ..." or
// "FAIL alloc_paths MODE ..." with its numbers; exit status 1 on a failure.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "shim_probe.h"

static const char *mode = "?";

#define CK(call)                                                                              \
    do {                                                                                      \
        cudaError_t err_ = (call);                                                            \
        if (err_ != cudaSuccess) {                                                            \
            printf("FAIL alloc_paths %s: %s:%d: %s -> %s\n", mode, __FILE__, __LINE__, #call, \
                   cudaGetErrorName(err_));                                                   \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static const size_t MiB = 1u << 20;

static size_t parse_bytes(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'K': case 'k': v *= 1024.0; break;
    case 'M': case 'm': v *= 1024.0 * 1024; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return (size_t)v;
}

static double now_ns()
{
    return (double)std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// ---------------------------------------------------------------- pinned pairs

static int host_pairs(size_t size, int runs, int pairs)
{
    void *p = nullptr;
    CK(cudaMallocHost(&p, size));  // warm-up: the first one pins, and fills the cache
    CK(cudaFreeHost(p));
    std::vector<double> per_pair;
    for (int r = 0; r < runs; r++) {
        double t0 = now_ns();
        for (int i = 0; i < pairs; i++) {
            CK(cudaMallocHost(&p, size));
            CK(cudaFreeHost(p));
        }
        per_pair.push_back((now_ns() - t0) / pairs);
    }
    std::sort(per_pair.begin(), per_pair.end());
    printf("bench host size=%zu median_ns=%.0f min_ns=%.0f max_ns=%.0f runs=%d pairs=%d "
           "shim=%d\n",
           size, per_pair[per_pair.size() / 2], per_pair.front(), per_pair.back(), runs, pairs,
           shim_probe() != nullptr);
    return 0;
}

// ---------------------------------------------------------------- stream safety

static void CUDART_CB hold_stream(void *ms)
{
    std::this_thread::sleep_for(std::chrono::milliseconds((intptr_t)ms));
}

static int host_copy()
{
    const size_t n = 8 * MiB;
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    unsigned char *dev = nullptr, *h = nullptr, *h2 = nullptr;
    CK(cudaMalloc(&dev, n));
    CK(cudaMemset(dev, 0, n));
    int bad = 0;
    for (int round = 0; round < 5; round++) {
        CK(cudaMallocHost(&h, n));
        memset(h, 0x5a, n);
        CK(cudaLaunchHostFunc(s, hold_stream, (void *)(intptr_t)200));  // the copy waits
        CK(cudaMemcpyAsync(dev, h, n, cudaMemcpyHostToDevice, s));
        CK(cudaFreeHost(h));  // the copy has not run yet
        CK(cudaMallocHost(&h2, n));
        bool same = h2 == h;
        memset(h2, 0xee, n);  // what a program does with a fresh buffer
        CK(cudaStreamSynchronize(s));
        std::vector<unsigned char> back(n);
        CK(cudaMemcpy(back.data(), dev, n, cudaMemcpyDeviceToHost));
        size_t wrong = 0;
        for (size_t i = 0; i < n; i++)
            wrong += back[i] != 0x5a;
        printf("%s alloc_paths host_copy: round %d: new buffer %s the old one; %zu of %zu "
               "bytes copied wrong\n",
               wrong ? "FAIL" : "PASS", round, same ? "is" : "is not", wrong, n);
        bad += wrong != 0;
        CK(cudaFreeHost(h2));
    }
    CK(cudaFree(dev));
    CK(cudaStreamDestroy(s));
    return bad ? 1 : 0;
}

// ---------------------------------------------------------------- the cap

enum path { PITCH, MANAGED, ASYNC };

static cudaError_t take(path p, void **out, cudaStream_t s)
{
    size_t pitch = 0;
    switch (p) {
    case PITCH:  // 16 Ki rows of 4 KiB: 64 MiB
        return cudaMallocPitch(out, &pitch, 4096, 16384);
    case MANAGED:
        return cudaMallocManaged(out, 64 * MiB);
    case ASYNC:
        return cudaMallocAsync(out, 64 * MiB, s);
    }
    return cudaErrorInvalidValue;
}

static void give(path p, void *ptr, cudaStream_t s)
{
    if (p == ASYNC)
        CK(cudaFreeAsync(ptr, s));
    else
        CK(cudaFree(ptr));
}

// Allocates until a failure; returns how many, the failure in *err.
static size_t fill(path p, std::vector<void *> &held, cudaStream_t s, cudaError_t *err)
{
    for (;;) {
        void *ptr = nullptr;
        cudaError_t e = take(p, &ptr, s);
        if (e != cudaSuccess) {
            *err = e;
            (void)cudaGetLastError();  // clear it: the runtime keeps the last error
            return held.size();
        }
        held.push_back(ptr);
        if (held.size() > 100000)
            return held.size();
    }
}

static int cap_path(path p, size_t cap)
{
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    std::vector<void *> held;
    cudaError_t err = cudaSuccess;
    size_t n = fill(p, held, s, &err);
    size_t bytes = n * 64 * MiB;
    cacheshim_stats st;
    bool shim = shim_probe() != nullptr;
    uint64_t outside = shim_stats(&st) == 0 ? st.bytes_outside : 0;
    size_t free_b = 0, total_b = 0;
    CK(cudaMemGetInfo(&free_b, &total_b));
    bool ok = err == cudaErrorMemoryAllocation && bytes <= cap && bytes + 64 * MiB > cap / 2 &&
              (!shim || outside >= bytes) && free_b < 64 * MiB;
    printf("%s alloc_paths %s: stopped after %zu blocks of 64 MiB (%zu MiB, cap %zu MiB) with "
           "%s; shim %s, other paths now %llu MiB; cudaMemGetInfo free %zu MiB of %zu MiB\n",
           ok ? "PASS" : "FAIL", mode, n, bytes / MiB, cap / MiB, cudaGetErrorName(err),
           shim ? "loaded" : "not loaded", (unsigned long long)(outside / MiB), free_b / MiB,
           total_b / MiB);
    for (void *ptr : held)
        give(p, ptr, s);
    CK(cudaStreamSynchronize(s));
    std::vector<void *> again;
    size_t m = fill(p, again, s, &err);
    bool same = m == n;
    printf("%s alloc_paths %s: after freeing all, %zu blocks fit again (%zu before)\n",
           same ? "PASS" : "FAIL", mode, m, n);
    for (void *ptr : again)
        give(p, ptr, s);
    CK(cudaStreamSynchronize(s));
    CK(cudaStreamDestroy(s));
    return ok && same ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: alloc_paths host_pairs SIZE RUNS PAIRS | host_copy | "
                        "cap_pitch|cap_managed|cap_async CAP\n");
        return 2;
    }
    mode = argv[1];
    CK(cudaFree(nullptr));  // the runtime and its context, before any timing
    if (!strcmp(mode, "host_pairs") && argc == 5)
        return host_pairs(parse_bytes(argv[2]), atoi(argv[3]), atoi(argv[4]));
    if (!strcmp(mode, "host_copy"))
        return host_copy();
    if (argc == 3 && !strcmp(mode, "cap_pitch"))
        return cap_path(PITCH, parse_bytes(argv[2]));
    if (argc == 3 && !strcmp(mode, "cap_managed"))
        return cap_path(MANAGED, parse_bytes(argv[2]));
    if (argc == 3 && !strcmp(mode, "cap_async"))
        return cap_path(ASYNC, parse_bytes(argv[2]));
    fprintf(stderr, "alloc_paths: unknown mode or arguments\n");
    return 2;
}
