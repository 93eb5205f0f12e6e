// pipeline: the loop a training step is made of, with the host running ahead of the GPU.
//
//     pipeline [--iters N] [--spin-us US] [--mib M] [--streams K] [--async] [--require-shim]
//              [--max-blocks N]
//              (defaults: 4000 iterations, 50 us, 16 MiB, K = 0, no bound on blocks)
//
// Each iteration i:
//   1. B = cudaMalloc(M MiB)
//   2. one kernel on the launch stream writes an iteration-specific pattern into all of B,
//      spins US microseconds (globaltimer + __nanosleep), re-reads B (volatile: from L2) and
//      adds the words that no longer hold the pattern to a device-side counter
//   3. cudaFree(B) at once
// and nothing synchronizes the host inside the loop. The launch stream is the legacy default
// stream with K = 0; with K > 0, K non-blocking streams are created before the loop and the
// iterations go round-robin over them. --async uses cudaMallocAsync / cudaFreeAsync on the
// launch stream instead (the default mempool as it comes), the stream-ordered comparison.
//
// Without the shim cudaFree waits for the device, so the loop runs at the GPU's pace. With a
// caching shim the host runs ahead: a shim that reuses a block only once its fence completed
// needs about as many blocks as the GPU lags behind; one that hands the block out at once and
// makes the next stream wait on the fence needs one or two. Either way no kernel may see
// another iteration's pattern in its block.
//
// The driver's view: used memory is sampled every 256 iterations, without synchronizing,
// and the highest value is printed, with the value before the loop. It comes from NVML
// (libnvidia-ml.so.1, opened at run time; the whole GPU, every process) when it answers,
// since the shim answers cudaMemGetInfo itself and counts its cached blocks as free; else
// from cudaMemGetInfo (driver_view=nvml|cudaMemGetInfo says which). cudaMemGetInfo's own
// highest used value is printed too, as memgetinfo_peak_used_MiB: what the program is told.
// After the loop: one cudaDeviceSynchronize, then
//
//   PASS pipeline iters=N streams=K spin_us=US corruptions=0 it_per_s=X peak_reserved_MiB=R
//        blocks=B hit_rate=H driver_peak_used_MiB=D driver_base_used_MiB=D0 mib=M api=A
//        driver_view=V memgetinfo_peak_used_MiB=G
//
// (one line). R comes from the shim's statistics when it is loaded (the cudaMalloc loop: its
// peak reserved, the few bytes allocated before the loop included), from the default
// mempool's reserved-memory high mark with --async, else "-". B is the number of M MiB blocks
// the loop needed: ceil((peak reserved - reserved before the loop) / block size), "-" when R
// is. H is hits / requests over the loop, from the shim ("-" without it). it_per_s counts the
// whole loop and the final synchronize. A word that changed, a kernel that did not run all
// its blocks, B above --max-blocks (checked only when B is known: what proves that memory
// does not grow with the GPU's lag), or a CUDA error is a FAIL line and exit status 1.
#include <cuda_runtime.h>

#include <chrono>
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
            printf("FAIL pipeline: %s:%d: %s -> %s (%s)\n", __FILE__, __LINE__, #call,        \
                   cudaGetErrorName(err_), cudaGetErrorString(err_));                         \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

enum { kThreads = 256, kSampleEvery = 256 };

struct Counters {
    unsigned long long bad; // words that did not hold their iteration's pattern
    unsigned long long ran; // thread blocks that finished
};

__device__ static inline uint64_t globaltimer()
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Word i of iteration `seed`: distinct iterations give distinct words at every index.
__device__ static inline uint32_t pattern(uint32_t seed, size_t i)
{
    return seed ^ ((uint32_t)i * 0x9E3779B1u);
}

__global__ void fill_spin_check(uint32_t *buf, size_t words, uint32_t seed, uint64_t spin_ns,
                                Counters *cnt)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (size_t i = first; i < words; i += stride)
        buf[i] = pattern(seed, i);
    if (spin_ns) {
        uint64_t t0 = globaltimer();
        while (globaltimer() - t0 < spin_ns)
            __nanosleep(1000);
    }
    const volatile uint32_t *vbuf = buf;
    unsigned long long bad = 0;
    for (size_t i = first; i < words; i += stride)
        bad += vbuf[i] != pattern(seed, i);
    if (bad)
        atomicAdd(&cnt->bad, bad);
    __syncthreads();
    if (threadIdx.x == 0)
        atomicAdd(&cnt->ran, 1ull);
}

// NVML through dlopen, declared here: no header or link flag needed, and no NVML is fine.
struct NvmlMemory {
    unsigned long long total, free, used;
};
typedef int (*nvml_init_fn)(void);
typedef int (*nvml_by_pci_fn)(const char *, void **);
typedef int (*nvml_mem_fn)(void *, NvmlMemory *);

struct DriverView {
    nvml_mem_fn mem = nullptr;
    void *dev = nullptr;

    // Finds the GPU of CUDA device 0 by its PCI bus id; false when NVML is not there.
    bool open()
    {
        void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!lib)
            return false;
        nvml_init_fn init = (nvml_init_fn)dlsym(lib, "nvmlInit_v2");
        nvml_by_pci_fn by_pci = (nvml_by_pci_fn)dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
        mem = (nvml_mem_fn)dlsym(lib, "nvmlDeviceGetMemoryInfo");
        char bus[32];
        if (!init || !by_pci || !mem || init() != 0 ||
            cudaDeviceGetPCIBusId(bus, sizeof bus, 0) != cudaSuccess || by_pci(bus, &dev) != 0) {
            mem = nullptr;
            return false;
        }
        return used() != 0;
    }

    // Bytes in use on the whole GPU, 0 on failure.
    unsigned long long used()
    {
        NvmlMemory m;
        return mem && mem(dev, &m) == 0 ? m.used : 0;
    }
};

static long number(const char *s, long min, long max)
{
    char *end;
    long v = strtol(s, &end, 10);
    return (*s && !*end && v >= min && v <= max) ? v : -1;
}

int main(int argc, char **argv)
{
    long iters = 4000, spin_us = 50, mib = 16, nstreams = 0, max_blocks = -1;
    bool async = false;
    int require_shim = 0;
    bool bad_args = false;
    for (int i = 1; i < argc && !bad_args; i++) {
        const char *a = argv[i];
        bool has_value = i + 1 < argc;
        if (!strcmp(a, "--iters") && has_value)
            bad_args = (iters = number(argv[++i], 1, 100000000)) < 0;
        else if (!strcmp(a, "--spin-us") && has_value)
            bad_args = (spin_us = number(argv[++i], 0, 1000000)) < 0;
        else if (!strcmp(a, "--mib") && has_value)
            bad_args = (mib = number(argv[++i], 1, 65536)) < 0;
        else if (!strcmp(a, "--streams") && has_value)
            bad_args = (nstreams = number(argv[++i], 0, 1024)) < 0;
        else if (!strcmp(a, "--max-blocks") && has_value)
            bad_args = (max_blocks = number(argv[++i], 1, 100000000)) < 0;
        else if (!strcmp(a, "--async"))
            async = true;
        else if (!strcmp(a, "--require-shim"))
            require_shim = 1;
        else
            bad_args = true;
    }
    if (bad_args) {
        printf("usage: pipeline [--iters N] [--spin-us US] [--mib M] [--streams K] [--async] "
               "[--require-shim] [--max-blocks N]\n");
        return 2;
    }
    const size_t bytes = (size_t)mib << 20, words = bytes / 4;
    const uint64_t spin_ns = 1000ull * (uint64_t)spin_us;
    const char *api = async ? "cudaMallocAsync" : "cudaMalloc";

    CK(cudaFree(0));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int blocks = sms > 0 ? sms : 132; // one block an SM: every block spins at once
    std::vector<cudaStream_t> streams(nstreams);
    for (auto &s : streams)
        CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    Counters *cnt;
    CK(cudaMalloc(&cnt, sizeof *cnt));
    CK(cudaMemset(cnt, 0, sizeof *cnt));

    cudaMemPool_t pool = nullptr;
    if (async) {
        CK(cudaDeviceGetDefaultMemPool(&pool, 0));
        uint64_t zero = 0; // the only value the high mark may be set to: resets it
        CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero));
    }
    CK(cudaDeviceSynchronize());

    cacheshim_stats before, after;
    const bool shim = shim_stats(&before) == 0;
    size_t free_b = 0, total_b = 0;
    CK(cudaMemGetInfo(&free_b, &total_b));
    size_t mgi_peak = total_b - free_b;
    DriverView nvml;
    const bool have_nvml = nvml.open();
    const unsigned long long base_used = have_nvml ? nvml.used() : total_b - free_b;
    unsigned long long peak_used = base_used;

    auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < iters; i++) {
        cudaStream_t s = nstreams ? streams[i % nstreams] : (cudaStream_t)0;
        uint32_t *b;
        if (async)
            CK(cudaMallocAsync(&b, bytes, s));
        else
            CK(cudaMalloc(&b, bytes));
        uint32_t seed = 0x5A000000u ^ ((uint32_t)i * 2654435761u);
        fill_spin_check<<<blocks, kThreads, 0, s>>>(b, words, seed, spin_ns, cnt);
        CK(cudaGetLastError());
        if (async)
            CK(cudaFreeAsync(b, s));
        else
            CK(cudaFree(b));
        if (i % kSampleEvery == 0 || i == iters - 1) {
            CK(cudaMemGetInfo(&free_b, &total_b)); // neither waits for the device
            if (total_b - free_b > mgi_peak)
                mgi_peak = total_b - free_b;
            unsigned long long u = have_nvml ? nvml.used() : total_b - free_b;
            if (u > peak_used)
                peak_used = u;
        }
    }
    auto t1 = std::chrono::steady_clock::now();
    CK(cudaDeviceSynchronize());
    auto t2 = std::chrono::steady_clock::now();
    double host_s = std::chrono::duration<double>(t1 - t0).count();
    double total_s = std::chrono::duration<double>(t2 - t0).count();

    Counters h;
    CK(cudaMemcpy(&h, cnt, sizeof h, cudaMemcpyDeviceToHost));
    CK(cudaFree(cnt));

    char reserved[32] = "-", nblocks[32] = "-", hit_rate[32] = "-";
    const char *peak_from = "none";
    long long loop_blocks = -1; // blocks the loop needed, when known
    if (async) {
        uint64_t high = 0; // the pool holds only the loop's blocks: reset before it
        CK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &high));
        snprintf(reserved, sizeof reserved, "%.1f", (double)high / 1048576.0);
        loop_blocks = (long long)((high + bytes - 1) / bytes);
        peak_from = "mempool";
    }
    if (shim && shim_stats(&after) == 0) {
        if (!async) {
            uint64_t held = before.bytes_in_use + before.bytes_cached;
            uint64_t loop = after.peak_reserved > held ? after.peak_reserved - held : 0;
            snprintf(reserved, sizeof reserved, "%.1f", (double)after.peak_reserved / 1048576.0);
            loop_blocks = (long long)((loop + bytes - 1) / bytes);
            peak_from = "shim";
        }
        uint64_t req = after.requests - before.requests, hits = after.hits - before.hits;
        if (req)
            snprintf(hit_rate, sizeof hit_rate, "%.4f", (double)hits / (double)req);
        printf("pipeline: shim over the loop: requests=%llu hits=%llu misses=%llu fences=%llu "
               "fence_waits=%llu driver_allocs=%llu\n",
               (unsigned long long)req, (unsigned long long)hits,
               (unsigned long long)(after.misses - before.misses),
               (unsigned long long)(after.fences - before.fences),
               (unsigned long long)(after.fence_waits - before.fence_waits),
               (unsigned long long)(after.driver_allocs - before.driver_allocs));
    }
    if (loop_blocks >= 0)
        snprintf(nblocks, sizeof nblocks, "%lld", loop_blocks);
    for (auto &s : streams)
        CK(cudaStreamDestroy(s));

    const char *reuse = getenv("CACHESHIM_REUSE");
    printf("pipeline: api=%s streams=%ld (%s) spin_us=%ld mib=%ld blocks_per_kernel=%d "
           "host_loop_ms=%.1f total_ms=%.1f host_it_per_s=%.0f peak_from=%s "
           "CACHESHIM_REUSE=%s\n",
           api, nstreams, nstreams ? "non-blocking, round-robin" : "legacy default stream",
           spin_us, mib, blocks, host_s * 1e3, total_s * 1e3, (double)iters / host_s, peak_from,
           reuse ? reuse : "(unset)");
    if (shim_require("pipeline", require_shim))
        return 1;

    const unsigned long long want_ran = (unsigned long long)iters * (unsigned long long)blocks;
    char fields[640];
    snprintf(fields, sizeof fields,
             "iters=%ld streams=%ld spin_us=%ld corruptions=%llu it_per_s=%.1f "
             "peak_reserved_MiB=%s blocks=%s hit_rate=%s driver_peak_used_MiB=%.1f "
             "driver_base_used_MiB=%.1f mib=%ld api=%s driver_view=%s "
             "memgetinfo_peak_used_MiB=%.1f",
             iters, nstreams, spin_us, h.bad, (double)iters / total_s, reserved, nblocks,
             hit_rate, (double)peak_used / 1048576.0, (double)base_used / 1048576.0, mib, api,
             have_nvml ? "nvml" : "cudaMemGetInfo", (double)mgi_peak / 1048576.0);
    if (h.ran != want_ran) {
        printf("FAIL pipeline %s: %llu of %llu thread blocks ran\n", fields, h.ran, want_ran);
        return 1;
    }
    if (h.bad) {
        printf("FAIL pipeline %s\n", fields);
        return 1;
    }
    if (max_blocks > 0 && loop_blocks > max_blocks) {
        printf("FAIL pipeline %s: the loop needed %lld blocks, more than --max-blocks %ld: "
               "memory grew with the GPU's lag\n",
               fields, loop_blocks, max_blocks);
        return 1;
    }
    printf("PASS pipeline %s\n", fields);
    return 0;
}
