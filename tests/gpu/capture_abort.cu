// capture_abort: a stream capture that ends badly must leave the cache working.
//
//     capture_abort [--iters N] [--parts abc] [--require-shim]
//                   (default 1000 iterations, all three parts; --parts c, ac or bc leaves out
//                   a part, to tell which one left the cache broken)
//
// All streams are non-blocking. Before each capture, a block is freed while a 2 ms kernel on
// stream D still uses it, so a shim with stream-ordered reuse has a fence pending that the
// next stream to get work would be made to wait on: during the capture, that is a captured
// stream.
//   (a) cudaStreamBeginCapture(A, global mode); a kernel on A; an event recorded in A;
//       cudaStreamWaitEvent(B, event) forks B into the capture; a kernel on B; no join back;
//       cudaStreamEndCapture(A) must answer cudaErrorStreamCaptureUnjoined (904 on an H100
//       with CUDA 13; a shim that changed it, for instance by making a captured stream wait
//       on an event recorded outside the capture, fails here). The error is then cleared
//       (cudaGetLastError) and the capture status of A and B printed.
//   (b) cudaStreamBeginCapture(C, global mode); a kernel on C; cudaStreamDestroy(C) while it
//       captures. The result codes are printed, not judged; if C still captures afterwards,
//       the capture is ended and C destroyed again.
//   After both: a kernel each on A, B and the legacy stream must run (values checked).
//   (c) A fence is left pending once more (so that --parts c differs from the others only by
//       the captures), then N times, on D without any host synchronization:
//       cudaMalloc(1 MiB), a kernel writes
//       the iteration's pattern into all of it and re-reads it (mismatches counted on the
//       device), cudaFree. One synchronize after the loop.
// With the shim loaded, its statistics are read before and after (c): the loop must have
// made at least N requests, and hits must be at least 90 % of them.
//
//   capture_abort: (a) ... (b) ...                      (result codes, names and statuses)
//   PASS capture_abort end_rc=904 hits=H requests=R iters=N destroy_rc=X corruptions=0
//
// (hits and requests "-" without the shim). FAIL lines and exit status 1 otherwise.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "shim_probe.h"

#define CK(call)                                                                              \
    do {                                                                                      \
        cudaError_t err_ = (call);                                                            \
        if (err_ != cudaSuccess) {                                                            \
            printf("FAIL capture_abort: %s:%d: %s -> %s (%s)\n", __FILE__, __LINE__, #call,   \
                   cudaGetErrorName(err_), cudaGetErrorString(err_));                         \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

enum { kThreads = 256, kBlocks = 64 };
static const size_t kLoopBytes = 1u << 20, kPendingBytes = 16u << 20;

struct Counters {
    unsigned long long bad; // loop words that did not hold their pattern
    unsigned long long ran; // loop thread blocks that finished
};

__device__ static inline uint64_t globaltimer()
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void fill_spin(uint32_t *buf, size_t words, uint32_t val, uint64_t spin_ns)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride)
        buf[i] = val;
    uint64_t t0 = globaltimer();
    while (globaltimer() - t0 < spin_ns)
        __nanosleep(2000);
}

__global__ void mark(uint32_t *slot, uint32_t val)
{
    if (threadIdx.x == 0 && blockIdx.x == 0)
        *slot = val;
}

__global__ void fill_check(uint32_t *buf, size_t words, uint32_t seed, Counters *cnt)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (size_t i = first; i < words; i += stride)
        buf[i] = seed ^ ((uint32_t)i * 0x9E3779B1u);
    __syncthreads();
    const volatile uint32_t *vbuf = buf;
    unsigned long long bad = 0;
    for (size_t i = first; i < words; i += stride)
        bad += vbuf[i] != (seed ^ ((uint32_t)i * 0x9E3779B1u));
    if (bad)
        atomicAdd(&cnt->bad, bad);
    __syncthreads();
    if (threadIdx.x == 0)
        atomicAdd(&cnt->ran, 1ull);
}

static const char *capture_status(cudaStream_t s)
{
    cudaStreamCaptureStatus st;
    cudaError_t e = cudaStreamIsCapturing(s, &st);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return cudaGetErrorName(e);
    }
    return st == cudaStreamCaptureStatusNone     ? "none"
           : st == cudaStreamCaptureStatusActive ? "active"
                                                 : "invalidated";
}

// A block freed while a 2 ms kernel on d still writes it: a fence left pending.
static void leave_fence_pending(cudaStream_t d)
{
    uint32_t *x;
    CK(cudaMalloc(&x, kPendingBytes));
    fill_spin<<<kBlocks, kThreads, 0, d>>>(x, kPendingBytes / 4, 0x77777777u, 2000000ull);
    CK(cudaGetLastError());
    CK(cudaFree(x));
}

int main(int argc, char **argv)
{
    long iters = 1000;
    int require_shim = 0;
    const char *parts = "abc";
    for (int i = 1; i < argc; i++) {
        char *end = nullptr;
        if (!strcmp(argv[i], "--iters") && i + 1 < argc &&
            (iters = strtol(argv[i + 1], &end, 10)) > 0 && !*end)
            i++;
        else if (!strcmp(argv[i], "--parts") && i + 1 < argc &&
                 strspn(argv[i + 1], "abc") == strlen(argv[i + 1]) && strchr(argv[i + 1], 'c'))
            parts = argv[++i];
        else if (!strcmp(argv[i], "--require-shim"))
            require_shim = 1;
        else {
            printf("usage: capture_abort [--iters N] [--parts abc|ac|bc|c] [--require-shim]\n");
            return 2;
        }
    }
    const bool part_a = strchr(parts, 'a') != nullptr, part_b = strchr(parts, 'b') != nullptr;

    CK(cudaFree(0));
    cudaStream_t a, b, c, d;
    CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&d, cudaStreamNonBlocking));
    cudaEvent_t fork;
    CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    uint32_t *slots; // [0..3]: written inside the captures (never run); [4..6]: after them
    CK(cudaMalloc(&slots, 8 * sizeof(uint32_t)));
    CK(cudaMemset(slots, 0, 8 * sizeof(uint32_t)));
    CK(cudaDeviceSynchronize());

    // (a) a fork that is never joined back
    cudaError_t end_rc = cudaErrorStreamCaptureUnjoined; // what (a) must answer, when it runs
    if (part_a) {
        leave_fence_pending(d);
        CK(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal));
        mark<<<1, 32, 0, a>>>(&slots[0], 0xA0u);
        cudaError_t launch_a = cudaGetLastError();
        cudaError_t rec = cudaEventRecord(fork, a);
        cudaError_t wait = cudaStreamWaitEvent(b, fork, 0);
        mark<<<1, 32, 0, b>>>(&slots[1], 0xB0u);
        cudaError_t launch_b = cudaGetLastError();
        cudaGraph_t graph = nullptr;
        end_rc = cudaStreamEndCapture(a, &graph);
        cudaError_t last_a = cudaGetLastError(); // clears the error state if anything set it
        printf("capture_abort: (a) launch_a=%d record=%d wait=%d launch_b=%d end_capture=%d (%s) "
               "graph=%s last_error=%d (%s) capturing: A=%s B=%s\n",
               (int)launch_a, (int)rec, (int)wait, (int)launch_b, (int)end_rc,
               cudaGetErrorName(end_rc), graph ? "returned" : "null", (int)last_a,
               cudaGetErrorName(last_a), capture_status(a), capture_status(b));
        if (graph)
            cudaGraphDestroy(graph);
    }

    // (b) a capturing stream destroyed
    cudaError_t destroy_rc = cudaSuccess;
    if (part_b) {
        leave_fence_pending(d);
        cudaError_t begin_c = cudaStreamBeginCapture(c, cudaStreamCaptureModeGlobal);
        mark<<<1, 32, 0, c>>>(&slots[2], 0xC0u);
        cudaError_t launch_c = cudaGetLastError();
        destroy_rc = cudaStreamDestroy(c);
        cudaError_t last_b = cudaGetLastError();
        printf("capture_abort: (b) begin_capture=%d launch=%d destroy_while_capturing=%d (%s) "
               "last_error=%d (%s)\n",
               (int)begin_c, (int)launch_c, (int)destroy_rc, cudaGetErrorName(destroy_rc),
               (int)last_b, cudaGetErrorName(last_b));
        if (destroy_rc != cudaSuccess) { // C lives on: end what it captures, destroy it again
            const char *st = capture_status(c);
            cudaGraph_t g2 = nullptr;
            cudaError_t end_c = cudaStreamEndCapture(c, &g2);
            if (g2)
                cudaGraphDestroy(g2);
            cudaError_t destroy2 = cudaStreamDestroy(c);
            cudaError_t last2 = cudaGetLastError();
            printf("capture_abort: (b) C still there: capturing=%s end_capture=%d (%s) "
                   "destroy_again=%d (%s) last_error=%d\n",
                   st, (int)end_c, cudaGetErrorName(end_c), (int)destroy2,
                   cudaGetErrorName(destroy2), (int)last2);
        }
    } else {
        CK(cudaStreamDestroy(c));
    }

    // A, B and the legacy stream still run work.
    mark<<<1, 32, 0, a>>>(&slots[4], 0xA1u);
    CK(cudaGetLastError());
    mark<<<1, 32, 0, b>>>(&slots[5], 0xB1u);
    CK(cudaGetLastError());
    mark<<<1, 32, 0, 0>>>(&slots[6], 0x11u);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    uint32_t h[8];
    CK(cudaMemcpy(h, slots, sizeof h, cudaMemcpyDeviceToHost));
    printf("capture_abort: after: A=%#x B=%#x legacy=%#x (want 0xa1 0xb1 0x11); captured "
           "kernels ran: %s\n",
           h[4], h[5], h[6], h[0] || h[1] || h[2] ? "yes (unexpected)" : "no");
    bool streams_ok = h[4] == 0xA1u && h[5] == 0xB1u && h[6] == 0x11u;

    // (c) the cache after it all: malloc / kernel / free on D, no host synchronization
    Counters *cnt;
    CK(cudaMalloc(&cnt, sizeof *cnt));
    CK(cudaMemset(cnt, 0, sizeof *cnt));
    CK(cudaDeviceSynchronize());
    leave_fence_pending(d);
    cacheshim_stats before, after;
    const bool shim = shim_stats(&before) == 0;
    for (long i = 0; i < iters; i++) {
        uint32_t *buf;
        CK(cudaMalloc(&buf, kLoopBytes));
        fill_check<<<kBlocks, kThreads, 0, d>>>(buf, kLoopBytes / 4,
                                                 0x3C000000u ^ ((uint32_t)i * 2654435761u), cnt);
        CK(cudaGetLastError());
        CK(cudaFree(buf));
    }
    CK(cudaDeviceSynchronize());
    const bool shim_after = shim && shim_stats(&after) == 0;
    Counters hc;
    CK(cudaMemcpy(&hc, cnt, sizeof hc, cudaMemcpyDeviceToHost));
    CK(cudaFree(cnt));
    CK(cudaFree(slots));
    CK(cudaEventDestroy(fork));
    CK(cudaStreamDestroy(a));
    CK(cudaStreamDestroy(b));
    CK(cudaStreamDestroy(d));

    char hits[32] = "-", requests[32] = "-";
    unsigned long long req = 0, hit = 0;
    if (shim_after) {
        req = after.requests - before.requests;
        hit = after.hits - before.hits;
        snprintf(hits, sizeof hits, "%llu", hit);
        snprintf(requests, sizeof requests, "%llu", req);
    }
    if (shim_require("capture_abort", require_shim))
        return 1;

    char fields[256];
    snprintf(fields, sizeof fields,
             "end_rc=%d hits=%s requests=%s iters=%ld destroy_rc=%d corruptions=%llu parts=%s",
             (int)end_rc, hits, requests, iters, (int)destroy_rc, hc.bad, parts);
    int failed = 0;
    if (end_rc != cudaErrorStreamCaptureUnjoined) {
        printf("FAIL capture_abort: (a) cudaStreamEndCapture answered %d (%s), not %d "
               "(cudaErrorStreamCaptureUnjoined)\n",
               (int)end_rc, cudaGetErrorName(end_rc), (int)cudaErrorStreamCaptureUnjoined);
        failed = 1;
    }
    if (!streams_ok) {
        printf("FAIL capture_abort: kernels on A, B or the legacy stream did not run after the "
               "captures\n");
        failed = 1;
    }
    if (hc.ran != (unsigned long long)iters * kBlocks || hc.bad) {
        printf("FAIL capture_abort: (c) %llu corrupted words, %llu of %llu thread blocks ran\n",
               hc.bad, hc.ran, (unsigned long long)iters * kBlocks);
        failed = 1;
    }
    if (shim && !shim_after) {
        printf("FAIL capture_abort: the shim stopped answering cacheshim_get_stats\n");
        failed = 1;
    }
    if (shim_after && (req < (unsigned long long)iters || hit * 10 < req * 9)) {
        printf("FAIL capture_abort: (c) the cache served %llu of %llu requests (want >= 90 %% "
               "of at least %ld)\n",
               hit, req, iters);
        failed = 1;
    }
    printf("%s capture_abort %s\n", failed ? "FAIL" : "PASS", fields);
    return failed;
}
