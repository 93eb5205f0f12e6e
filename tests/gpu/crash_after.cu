// crash_after N HOW: N cudaMalloc of 1 MiB (kept), then the process ends as HOW says: segv (a
// write through a null pointer), kill (SIGKILL, which nothing can catch) or abort. Run under
// LD_AUDIT=libcacheaudit.so by scripts/gpu-check-crash: the trace must hold N cuMemAlloc_v2
// at the driver in each format. Static cudart (nvcc's default): cudart reaches the driver
// through dlopen + cuGetProcAddress, as most CUDA programs do.
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: crash_after N segv|kill|abort\n");
        return 2;
    }
    int n = atoi(argv[1]);
    if (cudaFree(0) != cudaSuccess) { // the context
        printf("FAIL crash_after: no CUDA context\n");
        return 1;
    }
    for (int i = 0; i < n; i++) {
        void *p = nullptr;
        cudaError_t e = cudaMalloc(&p, 1 << 20);
        if (e != cudaSuccess) {
            printf("FAIL crash_after: cudaMalloc %d: %s\n", i, cudaGetErrorString(e));
            return 1;
        }
    }
    printf("crash_after: %d allocations, now %s\n", n, argv[2]);
    fflush(stdout);
    if (strcmp(argv[2], "kill") == 0)
        raise(SIGKILL);
    if (strcmp(argv[2], "abort") == 0)
        abort();
    if (strcmp(argv[2], "segv") == 0) {
        // A null pointer the compiler cannot see, so the write is a real one (no trap).
        volatile int *p = reinterpret_cast<volatile int *>(strtoull(argv[1], nullptr, 10) * 0);
        *p = 1;
    }
    printf("FAIL crash_after: still alive after %s\n", argv[2]);
    return 1;
}
