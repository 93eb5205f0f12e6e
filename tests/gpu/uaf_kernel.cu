// CACHESHIM_DEBUG=uaf on a real GPU: a kernel that writes into a freed block, launched after the
// cudaFree without any synchronization, must be caught, with the call sites of the allocation
// and the free (scripts/gpu-check-debug runs each mode and judges stderr and the exit).
//
//     uaf_kernel stray [legacy|stream]   the planted bug: exits 0 if nothing stopped it
//     uaf_kernel valid                   the same work without the stray kernel
//     uaf_kernel check                   the planted bug, then cacheshim_debug_check():
//                                        prints "check found N" (run with uaf-report)
//
// Build with -rdynamic (-Xcompiler -rdynamic) so that the reports name the functions below.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cacheshim.h"

#define CHECK(call)                                                                      \
    do {                                                                                 \
        cudaError_t e_ = (call);                                                         \
        if (e_ != cudaSuccess) {                                                         \
            printf("FAIL uaf_kernel %s: %s\n", #call, cudaGetErrorString(e_));           \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

#define SITE extern "C" __attribute__((noinline, visibility("default")))

__global__ void write_bytes(unsigned char *p, size_t n, unsigned char v)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = v;
}

// A kernel that runs for a while, so that the free below happens while the GPU is busy.
__global__ void spin_then_write(unsigned char *p, size_t n, long long cycles)
{
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = 0x11;
}

SITE unsigned char *uaf_alloc(size_t n)
{
    void *p = NULL;
    CHECK(cudaMalloc(&p, n));
    return (unsigned char *)p;
}

SITE void uaf_free(unsigned char *p)
{
    CHECK(cudaFree(p));
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "stray";
    bool on_stream = argc > 2 && !strcmp(argv[2], "stream");
    cudaStream_t s = 0;
    if (on_stream)
        CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const size_t n = 1 << 20;
    // Valid use first: blocks allocated, written on the GPU, freed, allocated again.
    for (int i = 0; i < 100; i++) {
        unsigned char *q = uaf_alloc(n);
        spin_then_write<<<64, 256, 0, s>>>(q, n, 20000);
        uaf_free(q);
    }
    CHECK(cudaDeviceSynchronize());
    unsigned char *p = uaf_alloc(n);
    spin_then_write<<<64, 256, 0, s>>>(p, n, 2000000);  // about 1 ms: still running at the free
    uaf_free(p);
    if (strcmp(mode, "valid") != 0)
        write_bytes<<<1, 256, 0, s>>>(p + 4096, 256, 0x42);  // the bug: after the free, no sync
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    if (!strcmp(mode, "check")) {
        int found = cacheshim_debug_check_if_loaded();
        printf("check found %d\n", found);
    }
    printf("uaf_kernel %s %s: the program reached its end\n", mode, on_stream ? "stream" : "legacy");
    return 0;
}
