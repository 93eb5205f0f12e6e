// stream_torture: is a freed block ever handed out while the GPU may still touch it?
//
//     stream_torture [CYCLES] [--in-flight] [--unsafe-reuse] [--require-shim]
//                    [--spin-us MIN:MAX] [--min-same-block N] [--one-stream] [--shift]
//
// Four non-blocking streams (cudaStreamNonBlocking), one blocking stream, and the legacy
// default stream. Each cycle c:
//   1. B = cudaMalloc(size_c)                                    (sizes rotate 4 KiB ... 4 MiB)
//   2. on stream s_c (rotating over the 5 streams) launch spin_check: write pattern_c into all
//      of B, spin 100-500 us (globaltimer + __nanosleep), re-read B (volatile: from L2, not a
//      stale L1 line) and add the number of words that changed to results[c].spin_changed
//   3. cudaFree(B) right away, without synchronizing
//   4. B2 = cudaMalloc(size_c) (a cache may hand back B's memory) and overwrite all of B2 at
//      once, rotating over: cudaMemset on the legacy stream; a kernel on a non-blocking stream
//      other than s_c; cudaMemsetAsync on such a stream
//   5. B2 joins a ring of 8; when the ring is full its oldest member is verified on the stream
//      that overwrote it (every word still holds what that stream wrote: catches the other
//      direction, a late kernel clobbering the new owner) and freed at once, without syncing
// results lives in one block allocated before the loop and freed after it. At the end: one
// synchronize, then the sum of changed words over all cycles must be 0, and every kernel must
// have run (its blocks counted).
//
//   PASS stream_torture cycles=N corruptions=0
//
// Without the shim cudaFree synchronizes the device, so this passes trivially; with the shim,
// only its fences keep it at 0.
//
// --unsafe-reuse is the negative control: the program overwrites B itself (no free/malloc in
// between), which is what an allocator that ignored pending work would do. It must see the race:
//
//   CONTROL corruptions=N         (N > 0)
//   PASS stream_torture_control cycles=N corruptions=N
//
// and fails (exit 1) if it saw none: then the test could not have caught a bad allocator.
//
// --one-stream: every spin_check runs on the first non-blocking stream (the overwrites still
// on the others): one stream busy most of the time, the case where a pooled cache hands out
// memory freed while that stream still works on it, every other stream made to wait for it.
// --shift: B2 is of a size of its own, 1 to 5 MiB in 4 KiB steps (rarely the same twice), so
// that it is built from the free memory B and others left, not a block reused whole: a pooled
// cache carves it out of memory still in use.
//
// --in-flight: blocks are reused while kernels on other streams still run, the case a shim
// with stream-ordered reuse (a freed block handed out before its fence completed, the next
// stream made to wait on the fence) must get right. 16 non-blocking streams, no blocking
// stream and no legacy-stream work. Each cycle c: the long kernel on stream c % 16 writes,
// spins and re-checks B; B is freed at once; the same size is allocated again (such a shim
// hands back B) and overwritten at once on another of the 16 streams, by a kernel (even
// cycles) or cudaMemsetAsync (odd cycles). The ring holds 32 blocks, so up to 32 cycles are in
// flight, and its oldest is verified on its stream and freed at once, as above. Both
// directions are counted as above; same_block_reuse says how often B itself came back.
//
//   PASS stream_torture_inflight cycles=N corruptions=0 same_block_reuse=R
//
// With --unsafe-reuse too, the control of this mode (stream_torture_inflight_control) must
// print CONTROL corruptions=N with N > 0, as above. --min-same-block N fails a run in which B
// itself came back fewer than N times: with a shim that reuses only completed blocks the mode
// passes without ever reusing a block in flight, so this is what shows the in-flight reuse
// was exercised at all.
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
            printf("FAIL stream_torture: %s:%d: %s -> %s (%s)\n", __FILE__, __LINE__, #call,  \
                   cudaGetErrorName(err_), cudaGetErrorString(err_));                         \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

enum { kBlocks = 16, kThreads = 256, kRing = 8, kNonBlocking = 4, kInFlightStreams = 16,
       kInFlightRing = 32 };

// Per-cycle result slots (in one long-lived device buffer).
struct Slot {
    unsigned spin_changed; // words of B that changed while spin_check spun
    unsigned spin_ran;     // blocks of spin_check that finished
    unsigned b2_bad;       // words of B2 that no longer held the overwrite value
    unsigned b2_ran;       // blocks of the B2 verification that finished
};

__device__ static inline uint64_t globaltimer()
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void spin_check(uint32_t *buf, size_t words, uint32_t pat, uint64_t spin_ns, Slot *slot)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (size_t i = first; i < words; i += stride)
        buf[i] = pat;
    uint64_t t0 = globaltimer();
    while (globaltimer() - t0 < spin_ns)
        __nanosleep(2000);
    const volatile uint32_t *vbuf = buf;
    unsigned changed = 0;
    for (size_t i = first; i < words; i += stride)
        changed += vbuf[i] != pat;
    if (changed)
        atomicAdd(&slot->spin_changed, changed);
    __syncthreads();
    if (threadIdx.x == 0)
        atomicAdd(&slot->spin_ran, 1u);
}

__global__ void scribble(uint32_t *buf, size_t words, uint32_t val)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride)
        buf[i] = val;
}

__global__ void verify_fill(const uint32_t *buf, size_t words, uint32_t val, Slot *slot)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    unsigned bad = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride)
        bad += __ldcg(&buf[i]) != val;
    if (bad)
        atomicAdd(&slot->b2_bad, bad);
    __syncthreads();
    if (threadIdx.x == 0)
        atomicAdd(&slot->b2_ran, 1u);
}

struct Pending {
    uint32_t *ptr;
    size_t words;
    uint32_t expect;
    cudaStream_t stream; // the stream that overwrote it (0: legacy)
    long cycle;
};

static const size_t kSizes[] = {4096, 65536, 1u << 20, (4u << 20) + 256, 256u << 10};
static const int kNumSizes = sizeof kSizes / sizeof kSizes[0];
static const char *kMethod[] = {"legacy_memset", "kernel_other_stream", "memsetasync_other_stream"};

int main(int argc, char **argv)
{
    long cycles = 2000;
    bool unsafe = false, in_flight = false;
    int require_shim = 0;
    unsigned spin_min_us = 100, spin_max_us = 500;
    long min_same_block = 0;
    bool one_stream = false, shift = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--unsafe-reuse"))
            unsafe = true;
        else if (!strcmp(argv[i], "--one-stream"))
            one_stream = true;
        else if (!strcmp(argv[i], "--shift"))
            shift = true;
        else if (!strcmp(argv[i], "--in-flight"))
            in_flight = true;
        else if (!strcmp(argv[i], "--require-shim"))
            require_shim = 1;
        else if (!strcmp(argv[i], "--min-same-block") && i + 1 < argc) {
            char *end;
            min_same_block = strtol(argv[++i], &end, 10);
            if (*end || min_same_block < 0) {
                printf("stream_torture: --min-same-block wants a count\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--spin-us") && i + 1 < argc) {
            if (sscanf(argv[++i], "%u:%u", &spin_min_us, &spin_max_us) != 2 ||
                spin_max_us <= spin_min_us) {
                printf("stream_torture: --spin-us wants MIN:MAX with MIN < MAX\n");
                return 2;
            }
        } else if ((cycles = strtol(argv[i], NULL, 10)) <= 0) {
            printf("usage: stream_torture [CYCLES] [--in-flight] [--unsafe-reuse] "
                   "[--require-shim] [--spin-us MIN:MAX] [--min-same-block N] [--one-stream] "
                   "[--shift]\n");
            return 2;
        }
    }
    if (unsafe && shift) {
        printf("stream_torture: --unsafe-reuse overwrites B itself: no --shift\n");
        return 2;
    }
    const char *name = in_flight ? (unsafe ? "stream_torture_inflight_control"
                                           : "stream_torture_inflight")
                                 : (unsafe ? "stream_torture_control" : "stream_torture");
    // Default: 4 non-blocking streams, then one blocking stream (index kNonBlocking). In
    // flight: 16 non-blocking streams, none blocking.
    const int nonblocking = in_flight ? kInFlightStreams : kNonBlocking;
    const int nstreams = in_flight ? kInFlightStreams : kNonBlocking + 1;
    const int ring_size = in_flight ? kInFlightRing : kRing;

    CK(cudaFree(0));
    std::vector<cudaStream_t> streams(nstreams);
    for (int i = 0; i < nonblocking; i++)
        CK(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking));
    if (!in_flight)
        CK(cudaStreamCreate(&streams[kNonBlocking])); // blocking: ordered with the legacy stream

    Slot *results;
    CK(cudaMalloc(&results, sizeof(Slot) * cycles));
    CK(cudaMemset(results, 0, sizeof(Slot) * cycles));
    CK(cudaDeviceSynchronize());

    std::vector<int> method_of(cycles), stream_of(cycles);
    std::vector<Pending> ring;
    long same_block = 0;

    auto retire = [&](const Pending &p) {
        verify_fill<<<kBlocks, kThreads, 0, p.stream>>>(p.ptr, p.words, p.expect,
                                                        &results[p.cycle]);
        CK(cudaGetLastError());
        CK(cudaFree(p.ptr)); // no sync: the verification may still be reading it
    };

    auto t0 = std::chrono::steady_clock::now();
    for (long c = 0; c < cycles; c++) {
        size_t size = kSizes[c % kNumSizes], words = size / 4;
        size_t size2 = shift ? (1u << 20) + (size_t)((c * 7919) % 1024) * 4096 : size;
        size_t words2 = size2 / 4;
        int si = one_stream ? 0 : (int)(c % nstreams);
        cudaStream_t s = streams[si];
        // A non-blocking stream other than s for the overwrite.
        int oi;
        if (in_flight) {
            oi = (int)((si + 1 + (c / 3) % (kInFlightStreams - 1)) % kInFlightStreams);
        } else {
            oi = (int)((c + 1 + c / 7) % kNonBlocking);
            if (oi == si)
                oi = (oi + 1) % kNonBlocking;
        }
        cudaStream_t other = streams[oi];
        uint64_t spin_ns =
            1000ull * (spin_min_us + (unsigned)((c * 7919) % (spin_max_us - spin_min_us)));
        uint32_t pat = 0x10000000u + (uint32_t)c;

        uint32_t *b;
        CK(cudaMalloc(&b, size));
        spin_check<<<kBlocks, kThreads, 0, s>>>(b, words, pat, spin_ns, &results[c]);
        CK(cudaGetLastError());

        uint32_t *b2;
        if (unsafe) {
            b2 = b;
        } else {
            CK(cudaFree(b)); // no synchronization: spin_check is still running
            CK(cudaMalloc(&b2, size2));
            same_block += b2 == b;
        }

        Pending p = {b2, words2, 0, 0, c};
        int m = in_flight ? 1 + (int)(c % 2) : (int)(c % 3); // in flight: no legacy memset
        method_of[c] = m;
        stream_of[c] = si;
        switch (m) {
        case 0:
            CK(cudaMemset(b2, 0xAB, size2)); // legacy default stream
            p.expect = 0xABABABABu;
            p.stream = 0;
            break;
        case 1:
            p.expect = 0xDEAD0000u | (uint32_t)(c & 0xffff);
            scribble<<<kBlocks, kThreads, 0, other>>>(b2, words2, p.expect);
            CK(cudaGetLastError());
            p.stream = other;
            break;
        default:
            CK(cudaMemsetAsync(b2, 0xCD, size2, other));
            p.expect = 0xCDCDCDCDu;
            p.stream = other;
            break;
        }
        ring.push_back(p);
        if ((int)ring.size() > ring_size) {
            retire(ring.front());
            ring.erase(ring.begin());
        }
    }
    for (const Pending &p : ring)
        retire(p);
    ring.clear();
    CK(cudaDeviceSynchronize());
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count();

    std::vector<Slot> h(cycles);
    CK(cudaMemcpy(h.data(), results, sizeof(Slot) * cycles, cudaMemcpyDeviceToHost));
    CK(cudaFree(results));
    for (cudaStream_t st : streams)
        CK(cudaStreamDestroy(st));

    unsigned long long spin_bad = 0, b2_bad = 0;
    long not_ran = 0, bad_cycles = 0;
    long by_method[3] = {0, 0, 0}, on_blocking = 0;
    for (long c = 0; c < cycles; c++) {
        spin_bad += h[c].spin_changed;
        b2_bad += h[c].b2_bad;
        if (h[c].spin_ran != kBlocks || h[c].b2_ran != kBlocks)
            not_ran++;
        if (h[c].spin_changed || h[c].b2_bad) {
            bad_cycles++;
            by_method[method_of[c]]++;
            on_blocking += !in_flight && stream_of[c] == kNonBlocking;
        }
    }
    unsigned long long corruptions = spin_bad + b2_bad;

    printf("%s: cycles=%ld streams=%d non-blocking%s%s%s spin_us=%u-%u ring=%d wall_ms=%.1f "
           "same_block_reuse=%ld\n",
           name, cycles, nonblocking, in_flight ? "" : " + 1 blocking + legacy",
           one_stream ? " (spins on one)" : "", shift ? " shifted sizes" : "", spin_min_us,
           spin_max_us, ring_size, ms, same_block);
    printf("%s: corrupted words: while spinning=%llu in the new owner's block=%llu; corrupted "
           "cycles=%ld (%s=%ld %s=%ld %s=%ld; kernel on the blocking stream=%ld)\n",
           name, spin_bad, b2_bad, bad_cycles, kMethod[0], by_method[0], kMethod[1], by_method[1],
           kMethod[2], by_method[2], on_blocking);
    if (shim_require(name, require_shim))
        return 1;
    if (not_ran) {
        printf("FAIL %s: %ld cycles where a kernel did not run all its blocks\n", name, not_ran);
        return 1;
    }
    if (unsafe) {
        printf("CONTROL corruptions=%llu\n", corruptions);
        if (!corruptions) {
            printf("FAIL %s cycles=%ld corruptions=0: the unsafe reuse went unseen, so the test "
                   "could not catch an unsafe allocator\n", name, cycles);
            return 1;
        }
        printf("PASS %s cycles=%ld corruptions=%llu\n", name, cycles, corruptions);
        return 0;
    }
    if (corruptions) {
        printf("FAIL %s cycles=%ld corruptions=%llu\n", name, cycles, corruptions);
        return 1;
    }
    if (same_block < min_same_block) {
        printf("FAIL %s cycles=%ld corruptions=0 same_block_reuse=%ld: fewer than "
               "--min-same-block %ld, the freed block was not handed back while in flight\n",
               name, cycles, same_block, min_same_block);
        return 1;
    }
    if (in_flight)
        printf("PASS %s cycles=%ld corruptions=0 same_block_reuse=%ld\n", name, cycles,
               same_block);
    else
        printf("PASS %s cycles=%ld corruptions=0\n", name, cycles);
    return 0;
}
