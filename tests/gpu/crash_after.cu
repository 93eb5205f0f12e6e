// crash_after N HOW: N cudaMalloc of 1 MiB (kept), then the process ends as HOW says: segv (a
// write to a page mapped without access), kill (SIGKILL, which nothing can catch) or abort. Run under
// LD_AUDIT=libcacheaudit.so by scripts/gpu-check-crash: the trace must hold N cuMemAlloc_v2
// at the driver in each format. Static cudart (nvcc's default): cudart reaches the driver
// through dlopen + cuGetProcAddress, as most CUDA programs do.
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>
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
    if (strcmp(argv[2], "segv") == 0) { // a real fault: a page that may not be written
        void *page = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (page == MAP_FAILED) {
            printf("FAIL crash_after: mmap\n");
            return 1;
        }
        *static_cast<volatile char *>(page) = 1;
    }
    printf("FAIL crash_after: still alive after %s\n", argv[2]);
    return 1;
}
