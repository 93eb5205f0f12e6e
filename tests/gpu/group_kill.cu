// group_kill: two members of one CACHESHIM_GROUP, one killed with kill -9 while it holds
// memory (scripts/gpu-check-group runs them).
//
//     group_kill hold BYTES           allocates BYTES, writes them, prints "HELD BYTES",
//                                     then waits to be killed
//     group_kill take TRY CAP FIFO    asks for TRY bytes, which the group's cap must refuse
//                                     while the other member holds its share ("REFUSED"),
//                                     then waits for a line on FIFO (the other is dead by
//                                     then) and asks for the rest: what cudaMemGetInfo shows
//                                     free, in whole 2 MiB, which must be at least CAP less
//                                     64 MiB (the other's share back) and must fit
//
// take's last line is "PASS group_kill ..." or "FAIL group_kill ..." with the bytes, the
// free memory cudaMemGetInfo showed before and after, and how long the allocation took after
// the kill (exit status 1 on FAIL). Without the shim (no group) TRY fits, and take fails.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

static size_t parse(const char *s)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end || v == 0) {
        fprintf(stderr, "group_kill: '%s' is not a number of bytes\n", s);
        exit(2);
    }
    return (size_t)v;
}

static int fail(const char *what, cudaError_t e)
{
    printf("FAIL group_kill %s: %s (%s)\n", what, cudaGetErrorName(e), cudaGetErrorString(e));
    return 1;
}

static int hold(size_t bytes)
{
    void *p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess)
        return fail("hold: cudaMalloc", e);
    if ((e = cudaMemset(p, 0x5a, bytes)) != cudaSuccess || (e = cudaDeviceSynchronize()))
        return fail("hold: cudaMemset", e);
    printf("HELD %zu\n", bytes);
    fflush(stdout);
    for (;;)
        pause();  // killed here, holding the memory
}

static int take(size_t try_bytes, size_t cap, const char *fifo)
{
    size_t free0 = 0, total0 = 0, free1 = 0, total1 = 0;
    cudaError_t e = cudaMemGetInfo(&free0, &total0);
    if (e != cudaSuccess)
        return fail("take: cudaMemGetInfo", e);
    void *p = nullptr;
    e = cudaMalloc(&p, try_bytes);
    if (e == cudaSuccess) {
        printf("FAIL group_kill: %zu bytes allocated while the other member holds its share "
               "(free shown %zu of %zu)\n", try_bytes, free0, total0);
        return 1;
    }
    if (e != cudaErrorMemoryAllocation)
        return fail("take: first cudaMalloc", e);
    cudaGetLastError();  // clear the allocation error
    printf("REFUSED %zu (cudaMemGetInfo: free %zu of %zu)\n", try_bytes, free0, total0);
    fflush(stdout);
    FILE *f = fopen(fifo, "r");
    char line[16];
    if (!f || !fgets(line, sizeof line, f)) {
        printf("FAIL group_kill: no word on %s\n", fifo);
        return 1;
    }
    fclose(f);
    size_t freek = 0, totalk = 0;
    if ((e = cudaMemGetInfo(&freek, &totalk)) != cudaSuccess)
        return fail("take: cudaMemGetInfo after the kill", e);
    size_t rest = freek / (2u << 20) * (2u << 20);
    printf("AFTER KILL cudaMemGetInfo: free %zu of %zu\n", freek, totalk);
    if (rest + (64u << 20) < cap) {
        printf("FAIL group_kill: after the kill only %zu bytes free of the cap %zu\n", freek, cap);
        return 1;
    }
    auto t0 = std::chrono::steady_clock::now();
    e = cudaMalloc(&p, rest);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count();
    if (e != cudaSuccess) {
        printf("FAIL group_kill: %zu bytes refused after the other member was killed: %s "
               "(%.1f ms)\n", rest, cudaGetErrorName(e), ms);
        return 1;
    }
    if ((e = cudaMemset(p, 0x17, rest)) != cudaSuccess || (e = cudaDeviceSynchronize()))
        return fail("take: cudaMemset", e);
    if ((e = cudaMemGetInfo(&free1, &total1)) != cudaSuccess)
        return fail("take: cudaMemGetInfo", e);
    printf("PASS group_kill refused=%zu took=%zu cap=%zu alloc_ms=%.1f free_before=%zu "
           "free_after=%zu total=%zu\n", try_bytes, rest, cap, ms, free0, free1, total1);
    fflush(stdout);
    if (const char *status = getenv("GROUP_KILL_STATUS"))  // cacheshim status while it holds
        if (system(status) != 0)
            printf("(cacheshim status failed)\n");
    cudaFree(p);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "hold"))
        return hold(parse(argv[2]));
    if (argc == 5 && !strcmp(argv[1], "take"))
        return take(parse(argv[2]), parse(argv[3]), argv[4]);
    fprintf(stderr, "usage: group_kill hold BYTES | take TRY CAP FIFO\n");
    return 2;
}
