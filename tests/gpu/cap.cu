// cap: the hard ceiling of CACHESHIM_CAP, seen from a program.
//
//     CACHESHIM_CAP=2G LD_PRELOAD=libcacheshim.so cap --expect-cap 2G [--require-shim]
//
// BYTES takes plain bytes or K/M/G/T suffixes (binary: 2G = 2 GiB; "KiB", "MiB", "GiB" too).
// Checks:
//   - cudaMemGetInfo: total <= cap, free <= total
//   - one cudaMalloc larger than the cap fails with cudaErrorMemoryAllocation
//   - 64 MiB blocks until cudaMalloc fails: the failure is cudaErrorMemoryAllocation, and the
//     bytes allocated are <= cap and >= cap - 64 MiB
//   - cudaMemGetInfo while full: free < 64 MiB (the program can see the next block won't fit)
//   - after freeing everything, the same number of blocks can be allocated again
// Each check prints PASS/FAIL; the last line is "PASS cap ..." or "FAIL cap ..." (exit 1).
#include <cuda_runtime.h>

#include <cctype>
#include <cerrno>
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
            printf("FAIL cap: %s:%d: %s -> %s (%s)\n", __FILE__, __LINE__, #call,             \
                   cudaGetErrorName(err_), cudaGetErrorString(err_));                         \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static const size_t MiB = 1u << 20;
static int failed, checks;

static void check(bool ok, const char *what, const char *detail)
{
    checks++;
    if (ok) {
        printf("PASS cap: %s (%s)\n", what, detail);
    } else {
        failed++;
        printf("FAIL cap: %s (%s)\n", what, detail);
    }
    fflush(stdout);
}

static bool parse_bytes(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || v < 0)
        return false;
    double mul = 1;
    switch (toupper((unsigned char)*end)) {
    case 'K': mul = 1024.0; end++; break;
    case 'M': mul = 1024.0 * 1024; end++; break;
    case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (mul > 1 && (*end == 'i' || *end == 'I'))
        end++;
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end)
        return false;
    *out = (size_t)(v * mul);
    return *out > 0;
}

int main(int argc, char **argv)
{
    size_t cap = 0;
    int require_shim = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--expect-cap") && i + 1 < argc) {
            if (!parse_bytes(argv[++i], &cap)) {
                printf("cap: bad --expect-cap value '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--require-shim")) {
            require_shim = 1;
        } else {
            printf("usage: cap --expect-cap BYTES [--require-shim]\n");
            return 2;
        }
    }
    if (!cap) {
        printf("usage: cap --expect-cap BYTES [--require-shim]\n");
        return 2;
    }
    char d[256];
    const size_t block = 64 * MiB;

    CK(cudaFree(0));
    size_t free0, total0;
    CK(cudaMemGetInfo(&free0, &total0));
    snprintf(d, sizeof d, "free=%zu total=%zu cap=%zu", free0, total0, cap);
    check(total0 <= cap, "cudaMemGetInfo total <= cap", d);
    check(free0 <= total0, "cudaMemGetInfo free <= total", d);

    void *p = nullptr;
    cudaError_t e = cudaMalloc(&p, cap + block);
    snprintf(d, sizeof d, "cudaMalloc(cap + 64 MiB) -> %s", cudaGetErrorName(e));
    check(e == cudaErrorMemoryAllocation, "allocation larger than the cap refused", d);
    if (e == cudaSuccess)
        CK(cudaFree(p));
    (void)cudaGetLastError();

    std::vector<void *> blocks;
    size_t limit = cap / block + 4; // never run far past the cap if it is not enforced
    e = cudaSuccess;
    while (blocks.size() < limit) {
        e = cudaMalloc(&p, block);
        if (e != cudaSuccess)
            break;
        blocks.push_back(p);
    }
    (void)cudaGetLastError();
    size_t bytes = blocks.size() * block;
    snprintf(d, sizeof d, "after %zu blocks: %s", blocks.size(), cudaGetErrorName(e));
    check(e == cudaErrorMemoryAllocation, "64 MiB blocks end in cudaErrorMemoryAllocation", d);
    snprintf(d, sizeof d, "allocated=%zu cap=%zu", bytes, cap);
    check(bytes <= cap && bytes + block >= cap, "allocated bytes in [cap - 64 MiB, cap]", d);

    size_t free1, total1;
    CK(cudaMemGetInfo(&free1, &total1));
    snprintf(d, sizeof d, "free=%zu total=%zu", free1, total1);
    check(free1 < block && free1 <= total1, "cudaMemGetInfo while full: free < 64 MiB", d);

    for (void *q : blocks)
        CK(cudaFree(q));
    size_t n = blocks.size(), again = 0;
    blocks.clear();
    for (size_t i = 0; i < n; i++) {
        e = cudaMalloc(&p, block);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            break;
        }
        blocks.push_back(p);
        again++;
    }
    snprintf(d, sizeof d, "%zu of %zu blocks; last %s", again, n, cudaGetErrorName(e));
    check(again == n, "after freeing everything, the blocks can be allocated again", d);
    for (void *q : blocks)
        CK(cudaFree(q));

    if (shim_require("cap", require_shim))
        failed++;
    if (failed) {
        printf("FAIL cap failed=%d checks=%d cap=%zu allocated=%zu\n", failed, checks, cap, bytes);
        return 1;
    }
    printf("PASS cap checks=%d cap=%zu allocated=%zu\n", checks, cap, bytes);
    return 0;
}
