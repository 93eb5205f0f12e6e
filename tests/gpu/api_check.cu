// api_check: the C API of cacheshim.h on a real GPU, with or without the shim.
//
//     api_check EXIT_CODE
//
// Makes 100 cudaMalloc/cudaFree pairs of 1 MiB (writing each block), then asks the shim for
// its statistics and trims its cache through the *_if_loaded helpers, which find the shim at
// run time. Without the shim they must answer CACHESHIM_NOT_LOADED; with it, the statistics
// must show the 100 requests (hits + misses, one driver allocation a miss, never more than
// 1 MiB in use), and the trim must empty the cache. Prints
//     PASS api_check loaded=0|1 requests=N hits=N driver_allocs=N released=N
// and exits with EXIT_CODE (to check that the launcher passes it through), or 1 on failure.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

#include "cacheshim.h"

#define CHECK(x)                                                                           \
    do {                                                                                   \
        if (!(x)) {                                                                        \
            std::printf("FAIL api_check %s:%d: %s\n", __FILE__, __LINE__, #x);             \
            std::exit(1);                                                                  \
        }                                                                                  \
    } while (0)

int main(int argc, char **argv)
{
    int code = argc > 1 ? std::atoi(argv[1]) : 0;
    for (int i = 0; i < 100; i++) {
        void *p = nullptr;
        CHECK(cudaMalloc(&p, 1 << 20) == cudaSuccess);
        CHECK(cudaMemset(p, i, 1 << 20) == cudaSuccess);
        CHECK(cudaFree(p) == cudaSuccess);
    }
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    int loaded = cacheshim_loaded();
    cacheshim_stats s = {};
    int rc = cacheshim_get_stats_if_loaded(0, &s);
    uint64_t released = 0;
    int trc = cacheshim_trim_if_loaded(&released);
    if (!loaded) {
        CHECK(rc == CACHESHIM_NOT_LOADED && trc == CACHESHIM_NOT_LOADED && released == 0);
    } else {
        CHECK(rc == 0 && trc == 0);
        // Not "99 hits": a block freed while its cudaMemset may still run is not handed out
        // again until that work has finished, so some requests go to the driver.
        CHECK(s.requests == 100 && s.hits + s.misses == s.requests && s.misses >= 1);
        CHECK(s.driver_allocs == s.misses && s.peak_in_use == (1u << 20));
        CHECK(s.bytes_cached >= (1u << 20) && released == s.bytes_cached);
        cacheshim_stats after = {};
        CHECK(cacheshim_get_stats_if_loaded(0, &after) == 0 && after.bytes_cached == 0);
    }
    std::printf("PASS api_check loaded=%d requests=%llu hits=%llu driver_allocs=%llu "
                "released=%llu\n", loaded, (unsigned long long)s.requests,
                (unsigned long long)s.hits, (unsigned long long)s.driver_allocs,
                (unsigned long long)released);
    return code;
}
