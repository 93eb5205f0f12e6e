// deep_lib: a shared library built by nvcc with static cudart (nvcc -cudart static -shared
// -Xcompiler -fPIC), for deep_host.c, which loads it with RTLD_DEEPBIND. The static cudart
// inside finds the driver with dlopen + dlsym(cuGetProcAddress_v2), resolved in the library's
// own dependencies first: LD_PRELOAD=libcacheshim.so never sees these calls, the shim as an
// audit module (LD_AUDIT=libcacheshim.so) does.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <vector>

__global__ void touch(unsigned char *p, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] = (unsigned char)i;
}

// runs x pairs of cudaMalloc(bytes)/cudaFree, each pair with one tiny kernel on the block
// between the two when kernel != 0, nothing waiting on the host inside a run (one
// cudaDeviceSynchronize after the last run). *median_ns: the median over runs of the mean ns
// per pair. Returns 0, or a code saying which call failed (1 start, 2 cudaMalloc, 3 kernel,
// 4 cudaFree, 5 the final synchronize).
extern "C" __attribute__((visibility("default"))) int deep_run(int runs, int pairs,
                                                              size_t bytes, int kernel,
                                                              double *median_ns)
{
    if (cudaFree(0) != cudaSuccess)
        return 1;
    std::vector<double> per_pair;
    for (int r = 0; r < runs; r++) {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < pairs; i++) {
            void *p = nullptr;
            if (cudaMalloc(&p, bytes) != cudaSuccess)
                return 2;
            if (kernel) {
                touch<<<16, 256>>>((unsigned char *)p, 4096);
                if (cudaGetLastError() != cudaSuccess)
                    return 3;
            }
            if (cudaFree(p) != cudaSuccess)
                return 4;
        }
        auto t1 = std::chrono::steady_clock::now();
        per_pair.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / pairs);
    }
    if (cudaDeviceSynchronize() != cudaSuccess)
        return 5;
    std::sort(per_pair.begin(), per_pair.end());
    *median_ns = per_pair.empty() ? 0 : per_pair[per_pair.size() / 2];
    return 0;
}
