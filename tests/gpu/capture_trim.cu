// capture_trim: a trim while a stream capture runs must not break the capture.
//
//     capture_trim [--require-shim]
//
// Under the shim (pooled, ordered: its defaults), a 16 MiB block is freed while a 200 ms
// kernel on stream D still writes it, then an 8 MiB block is asked for: the shim carves it out
// of the freed memory, ordered after that kernel, and the other 8 MiB stay free in its pool
// with the kernel's fence pending. Then, on stream C (non-blocking, global capture mode):
// cudaStreamBeginCapture; a kernel; cacheshim_trim() (giving that busy free memory back would
// need a wait for the whole device, which a capture forbids: cuCtxSynchronize would invalidate
// it); cudaStreamEndCapture must answer cudaSuccess. The graph is then launched, and its
// kernel's mark and the 8 MiB block (written on C after D's kernel) checked.
//
//   capture_trim: shim: ...
//   PASS capture_trim end_rc=0 trimmed=T ordered_hits=H mark_ok=1 corruptions=0
//
// FAIL lines and exit status 1 otherwise (under the shim, also when the 8 MiB block was not
// an ordered hit: then the case did not happen); without the shim, cacheshim_trim is not
// called (trimmed=- ordered_hits=-) and the capture must still end well.
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
            printf("FAIL capture_trim: %s:%d: %s -> %s (%s)\n", __FILE__, __LINE__, #call,    \
                   cudaGetErrorName(err_), cudaGetErrorString(err_));                         \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

enum { kThreads = 256, kBlocks = 64 };
static const size_t kPendingBytes = 16u << 20, kBlockBytes = 8u << 20;

__device__ static inline uint64_t globaltimer()
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ static void fill_words(uint32_t *buf, size_t words, uint32_t val)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride)
        buf[i] = val;
}

__global__ void fill(uint32_t *buf, size_t words, uint32_t val) { fill_words(buf, words, val); }

// Spins, then writes val into all of buf: a block freed meanwhile is written at the end.
__global__ void spin_fill(uint32_t *buf, size_t words, uint32_t val, uint64_t spin_ns)
{
    for (uint64_t t0 = globaltimer(); globaltimer() - t0 < spin_ns;)
        __nanosleep(2000);
    fill_words(buf, words, val);
}

__global__ void count_not(const uint32_t *buf, size_t words, uint32_t val,
                          unsigned long long *bad)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    unsigned long long n = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride)
        n += buf[i] != val;
    if (n)
        atomicAdd(bad, n);
}

__global__ void mark(uint32_t *slot, uint32_t val)
{
    if (threadIdx.x == 0 && blockIdx.x == 0)
        *slot = val;
}

int main(int argc, char **argv)
{
    int require_shim = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--require-shim")) {
            require_shim = 1;
        } else {
            printf("usage: capture_trim [--require-shim]\n");
            return 2;
        }
    }
    if (shim_require("capture_trim", require_shim))
        return 1;
    cacheshim_stats before, after;
    bool shim = shim_probe() != nullptr;

    cudaStream_t c, d;
    CK(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&d, cudaStreamNonBlocking));
    uint32_t *slot;
    unsigned long long *bad;
    CK(cudaMalloc(&slot, sizeof *slot));
    CK(cudaMalloc(&bad, sizeof *bad));
    // On D, as all work before the trim: one busy stream, so the shim hands the busy block's
    // memory to its pool at the next miss (with work on a second stream it would take new
    // memory while within its headroom and two blocks per busy stream).
    CK(cudaMemsetAsync(slot, 0, sizeof *slot, d));
    CK(cudaMemsetAsync(bad, 0, sizeof *bad, d));
    CK(cudaStreamSynchronize(d));
    shim_stats(&before);

    // Busy free memory in the shim's pool: D's kernel still writes x when it is freed.
    uint32_t *x, *y;
    CK(cudaMalloc(&x, kPendingBytes));
    spin_fill<<<kBlocks, kThreads, 0, d>>>(x, kPendingBytes / 4, 0x77777777u, 200000000ull);
    CK(cudaGetLastError());
    CK(cudaFree(x));
    CK(cudaMalloc(&y, kBlockBytes));  // carved out of x's memory, ordered after D's kernel

    cudaGraph_t graph = nullptr;
    CK(cudaStreamBeginCapture(c, cudaStreamCaptureModeGlobal));
    mark<<<1, 32, 0, c>>>(slot, 0x5eedu);
    CK(cudaGetLastError());
    uint64_t trimmed = 0;
    int trim_rc = shim ? cacheshim_trim_if_loaded(&trimmed) : CACHESHIM_NOT_LOADED;
    cudaError_t end_rc = cudaStreamEndCapture(c, &graph);
    cudaGetLastError();
    if (end_rc == cudaSuccess && graph) {
        cudaGraphExec_t exec;
        CK(cudaGraphInstantiate(&exec, graph, 0));
        CK(cudaGraphLaunch(exec, c));
        CK(cudaStreamSynchronize(c));
        CK(cudaGraphExecDestroy(exec));
        CK(cudaGraphDestroy(graph));
    }
    // y on C: after D's kernel on the GPU (the shim ordered it), never overwritten by it.
    fill<<<kBlocks, kThreads, 0, c>>>(y, kBlockBytes / 4, 0x12345678u);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    count_not<<<kBlocks, kThreads>>>(y, kBlockBytes / 4, 0x12345678u, bad);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    uint32_t got = 0;
    unsigned long long corruptions = 0;
    CK(cudaMemcpy(&got, slot, sizeof got, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&corruptions, bad, sizeof corruptions, cudaMemcpyDeviceToHost));
    shim_stats(&after);
    CK(cudaFree(y));
    CK(cudaFree(slot));
    CK(cudaFree(bad));

    char trimmed_s[32] = "-", hits_s[32] = "-";
    if (trim_rc == 0)
        snprintf(trimmed_s, sizeof trimmed_s, "%llu", (unsigned long long)trimmed);
    if (shim)
        snprintf(hits_s, sizeof hits_s, "%llu",
                 (unsigned long long)(after.ordered_hits - before.ordered_hits));
    int failed = 0;
    if (end_rc != cudaSuccess) {
        printf("FAIL capture_trim: cudaStreamEndCapture answered %d (%s): the trim broke the "
               "capture\n", (int)end_rc, cudaGetErrorName(end_rc));
        failed = 1;
    }
    if (end_rc == cudaSuccess && got != 0x5eedu) {
        printf("FAIL capture_trim: the captured kernel's mark is %#x, not 0x5eed\n", got);
        failed = 1;
    }
    if (corruptions) {
        printf("FAIL capture_trim: %llu words of the block carved out of busy memory were "
               "overwritten by the kernel that last used that memory\n", corruptions);
        failed = 1;
    }
    if (shim && after.ordered_hits == before.ordered_hits) {
        printf("FAIL capture_trim: the 8 MiB block was not carved out of the busy memory "
               "(no ordered hit): the case did not happen\n");
        failed = 1;
    }
    if (failed)
        return 1;
    printf("PASS capture_trim end_rc=%d trimmed=%s ordered_hits=%s mark_ok=1 corruptions=0\n",
           (int)end_rc, trimmed_s, hits_s);
    return 0;
}
