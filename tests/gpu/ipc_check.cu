// ipc_check: device memory exported with cuIpcGetMemHandle and opened in another process
// (the same program, re-executed, so it runs under the shim too when this one does), while
// the exporter keeps its GPU busy and its cache moving.
//
//     ipc_check [--rounds N] [--require-shim]
//
// The exporter keeps kernels spinning on 6 streams for the whole run, and each round:
//   - frees and allocates blocks of shifting sizes (700 B to 300 MiB) without a host sync, so
//     that a pooled cache carves the exported blocks out of memory the GPU still works on;
//   - fills 5 blocks (700 B, 100 KiB, 3 MiB + 5, 64 MiB + 1, 300 MiB; sizes shift by round)
//     with a pattern of the round on two streams of their own, waits for those two streams
//     only, and exports each;
//   - while the importer works: more blocks allocated, touched and freed on other streams;
//   - the importer opens each handle, counts the bytes that differ from the pattern (a
//     kernel), writes the reply pattern, synchronizes and closes; the exporter then counts
//     the bytes that differ from the reply.
// Then, once: a block exported and opened, freed by the exporter and the cache trimmed
// (cacheshim_trim, under the shim) while the importer holds it: the importer must still read
// the pattern ("hold"); and a handle of a block freed before the open (under the shim's
// pooled backend it must fail with CUDA_ERROR_INVALID_VALUE; "stale").
//
// The importer also asks cuMemGetAddressRange at the block's last byte: under the pooled
// backend the range must start at the pointer it was given and hold the block (printed as a
// failure only there: the driver's own answer for memory it imported is its own business).
//
// Output: "IPC round R: mismatches=M reply_mismatches=K" per round, "IPC hold ..." and
// "IPC stale ...", then "IPC ok rounds=N blocks=B" (exit 0) or "IPC FAIL ..." (exit 1).
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/wait.h>
#include <unistd.h>

#include "shim_probe.h"

#define NSPIN 6
#define NBLOCKS 5

static int g_failed;

#define CHECK_CU(x)                                                                          \
    do {                                                                                     \
        CUresult r_ = (x);                                                                   \
        if (r_ != CUDA_SUCCESS) {                                                            \
            const char *n_ = "?";                                                            \
            cuGetErrorName(r_, &n_);                                                         \
            printf("IPC FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #x, n_);                  \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)
#define CHECK_RT(x)                                                                          \
    do {                                                                                     \
        cudaError_t e_ = (x);                                                                \
        if (e_ != cudaSuccess) {                                                             \
            printf("IPC FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorName(e_)); \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

__device__ __forceinline__ unsigned char pattern(uint32_t seed, size_t i)
{
    return (unsigned char)(seed * 2654435761u + (uint32_t)i * 131u + (uint32_t)(i >> 12));
}

__global__ void fill(unsigned char *p, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = pattern(seed, i);
}

__global__ void count_bad(const unsigned char *p, size_t n, uint32_t seed,
                          unsigned long long *bad)
{
    unsigned long long mine = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        mine += p[i] != pattern(seed, i);
    if (mine)
        atomicAdd(bad, mine);
}

__global__ void spin(long long cycles)
{
    long long start = clock64();
    while (clock64() - start < cycles)
        ;
}

static unsigned long long bad_bytes(const void *p, size_t n, uint32_t seed, cudaStream_t s)
{
    unsigned long long *bad, host = 0;
    CHECK_RT(cudaMalloc(&bad, sizeof *bad));
    CHECK_RT(cudaMemsetAsync(bad, 0, sizeof *bad, s));
    count_bad<<<256, 256, 0, s>>>((const unsigned char *)p, n, seed, bad);
    CHECK_RT(cudaMemcpyAsync(&host, bad, sizeof host, cudaMemcpyDeviceToHost, s));
    CHECK_RT(cudaStreamSynchronize(s));
    CHECK_RT(cudaFree(bad));
    return host;
}

// ---------------------------------------------------------------- the pipe between them

struct item {
    CUipcMemHandle h;
    uint64_t size;
    uint32_t seed, reply;   // the pattern to find, the one to write back
    int32_t op;             // 0: check and reply; 1: hold (check, wait, check again); 2: stale
};

struct result {
    int32_t open_rc;
    int32_t range_ok;   // cuMemGetAddressRange at the last byte answers (pointer, size)
    unsigned long long bad, bad_after;
};

static void put(int fd, const void *p, size_t n)
{
    for (const char *c = (const char *)p; n;) {
        ssize_t k = write(fd, c, n);
        if (k <= 0) {
            printf("IPC FAIL pipe write\n");
            exit(1);
        }
        c += k;
        n -= (size_t)k;
    }
}

static bool get(int fd, void *p, size_t n)
{
    for (char *c = (char *)p; n;) {
        ssize_t k = read(fd, c, n);
        if (k <= 0)
            return false;
        c += k;
        n -= (size_t)k;
    }
    return true;
}

// The importer: items in on fd 3, results out on fd 4, until the pipe closes.
static int importer(void)
{
    CHECK_RT(cudaSetDevice(0));
    CHECK_RT(cudaFree(0));
    cudaStream_t s;
    CHECK_RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    item it;
    while (get(3, &it, sizeof it)) {
        result res = {0, 0, 0, 0};
        CUdeviceptr p = 0;
        res.open_rc = cuIpcOpenMemHandle(&p, it.h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        if (res.open_rc == CUDA_SUCCESS && it.op != 2) {
            CUdeviceptr base = 0;
            size_t n = 0;
            res.range_ok = cuMemGetAddressRange(&base, &n, p + it.size - 1) == CUDA_SUCCESS &&
                           base == p && n >= it.size;
            res.bad = bad_bytes((void *)p, it.size, it.seed, s);
            if (it.op == 1) {
                char go;
                put(4, &res, sizeof res);  // opened and checked: the exporter frees it now
                if (!get(3, &go, 1))
                    return 1;
                res.bad_after = bad_bytes((void *)p, it.size, it.seed, s);
            } else {
                fill<<<256, 256, 0, s>>>((unsigned char *)p, it.size, it.reply);
                CHECK_RT(cudaStreamSynchronize(s));
            }
            CHECK_CU(cuIpcCloseMemHandle(p));
        } else if (res.open_rc == CUDA_SUCCESS) {
            CHECK_CU(cuIpcCloseMemHandle(p));  // a stale handle the driver still opened
        }
        put(4, &res, sizeof res);
    }
    return 0;
}

// ---------------------------------------------------------------- the exporter

static int to_child, from_child;

static void start_importer(const char *self)
{
    int in[2], out[2];
    if (pipe(in) || pipe(out)) {
        printf("IPC FAIL pipe\n");
        exit(1);
    }
    pid_t pid = fork();
    if (pid == 0) {
        dup2(in[0], 3);
        dup2(out[1], 4);
        for (int fd : {in[0], in[1], out[0], out[1]})  // only 3 and 4: EOF when we close ours
            if (fd != 3 && fd != 4)
                close(fd);
        execl("/proc/self/exe", self, "--importer", (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_child = in[1];
    from_child = out[0];
}

static result ask(const item &it)
{
    result r;
    put(to_child, &it, sizeof it);
    if (!get(from_child, &r, sizeof r)) {
        printf("IPC FAIL the importer died\n");
        exit(1);
    }
    return r;
}

int main(int argc, char **argv)
{
    int rounds = 12, require_shim = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--importer"))
            return importer();
        if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--require-shim"))
            require_shim = 1;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!shim_report("ipc_check") && require_shim) {
        printf("IPC FAIL the shim is not loaded\n");
        return 1;
    }
    // The shim's pooled backend makes its own handles: the checks of what it promises apply.
    const char *backend = getenv("CACHESHIM_BACKEND");
    bool pooled = shim_probe() && !(backend && !strcmp(backend, "classic"));
    CHECK_RT(cudaSetDevice(0));
    CHECK_RT(cudaFree(0));
    start_importer(argv[0]);
    cudaStream_t spinners[NSPIN], work[4];
    for (auto &s : spinners)
        CHECK_RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (auto &s : work)
        CHECK_RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const size_t base_sizes[NBLOCKS] = {700, 100 << 10, (3 << 20) + 5, (64 << 20) + 1,
                                        (size_t)300 << 20};
    unsigned long long total_bad = 0, total_reply_bad = 0;
    int blocks = 0;
    void *churn[8] = {};
    for (int r = 0; r < rounds; r++) {
        for (auto &s : spinners)
            spin<<<1, 1, 0, s>>>(20 * 1000 * 1000);  // ~10 ms each, far behind the host
        // Memory the GPU still works on, freed: the next blocks may be carved out of it.
        for (int k = 0; k < 8; k++) {
            if (churn[k])
                CHECK_RT(cudaFree(churn[k]));
            size_t n = ((size_t)(k + r % 5 + 1) << 20) + 4096 * (size_t)r;
            CHECK_RT(cudaMalloc(&churn[k], n));
            fill<<<64, 256, 0, spinners[k % NSPIN]>>>((unsigned char *)churn[k], n, 7);
        }
        for (int k = 0; k < 8; k += 2) {
            CHECK_RT(cudaFree(churn[k]));
            churn[k] = nullptr;
        }
        void *p[NBLOCKS];
        size_t n[NBLOCKS];
        for (int b = 0; b < NBLOCKS; b++) {
            n[b] = base_sizes[b] + (size_t)(r % 3) * 4096 * (b + 1);
            CHECK_RT(cudaMalloc(&p[b], n[b]));
            fill<<<256, 256, 0, work[b % 2]>>>((unsigned char *)p[b], n[b], 1000 * r + b);
        }
        CHECK_RT(cudaStreamSynchronize(work[0]));
        CHECK_RT(cudaStreamSynchronize(work[1]));
        unsigned long long bad = 0, reply_bad = 0;
        for (int b = 0; b < NBLOCKS; b++) {
            item it = {};
            CHECK_CU(cuIpcGetMemHandle(&it.h, (CUdeviceptr)p[b]));
            it.size = n[b];
            it.seed = 1000 * r + b;
            it.reply = 5000 * r + b;
            // The exporter's cache keeps moving while the importer works.
            void *t;
            CHECK_RT(cudaMalloc(&t, (size_t)(b + 1) << 20));
            fill<<<64, 256, 0, work[2 + b % 2]>>>((unsigned char *)t, (size_t)(b + 1) << 20, 9);
            result res = ask(it);
            CHECK_RT(cudaFree(t));
            if (res.open_rc != CUDA_SUCCESS) {
                printf("IPC FAIL round %d block %d (%zu B): open gave %d\n", r, b, n[b],
                       res.open_rc);
                g_failed++;
                continue;
            }
            bad += res.bad;
            if (!res.range_ok && pooled) {
                printf("IPC FAIL round %d block %d (%zu B): the importer's address range\n", r,
                       b, n[b]);
                g_failed++;
            }
            reply_bad += bad_bytes(p[b], n[b], it.reply, work[2]);
            blocks++;
        }
        for (int b = 0; b < NBLOCKS; b++)
            CHECK_RT(cudaFree(p[b]));
        printf("IPC round %d: mismatches=%llu reply_mismatches=%llu\n", r, bad, reply_bad);
        total_bad += bad;
        total_reply_bad += reply_bad;
    }
    for (auto &c : churn)
        if (c)
            CHECK_RT(cudaFree(c));

    // Hold: the importer keeps the block open while the exporter frees it and trims.
    {
        void *p;
        size_t n = (size_t)96 << 20;
        CHECK_RT(cudaMalloc(&p, n));
        fill<<<256, 256, 0, work[0]>>>((unsigned char *)p, n, 4242);
        CHECK_RT(cudaStreamSynchronize(work[0]));
        item it = {};
        CHECK_CU(cuIpcGetMemHandle(&it.h, (CUdeviceptr)p));
        it.size = n;
        it.seed = 4242;
        it.op = 1;
        result first = ask(it);
        CHECK_RT(cudaFree(p));
        uint64_t (*trim)(void);
        void *f = dlsym(RTLD_DEFAULT, "cacheshim_trim");
        memcpy(&trim, &f, sizeof trim);
        unsigned long long trimmed = trim ? trim() : 0;
        put(to_child, "g", 1);
        result after;
        if (!get(from_child, &after, sizeof after)) {
            printf("IPC FAIL the importer died\n");
            return 1;
        }
        bool ok = first.open_rc == CUDA_SUCCESS && first.bad == 0 && after.bad_after == 0;
        printf("IPC hold: open=%d mismatches=%llu after_free_and_trim=%llu trimmed=%llu %s\n",
               first.open_rc, first.bad, after.bad_after, trimmed, ok ? "ok" : "FAIL");
        g_failed += !ok;
    }
    // Stale: a handle of a block freed before it is opened.
    {
        void *p;
        CHECK_RT(cudaMalloc(&p, (size_t)5 << 20));
        item it = {};
        CHECK_CU(cuIpcGetMemHandle(&it.h, (CUdeviceptr)p));
        it.size = (size_t)5 << 20;
        it.op = 2;
        CHECK_RT(cudaFree(p));
        result res = ask(it);
        bool ok = !pooled || res.open_rc == CUDA_ERROR_INVALID_VALUE;
        printf("IPC stale: open=%d (%s) %s\n", res.open_rc,
               pooled ? "must be CUDA_ERROR_INVALID_VALUE" : "the driver's answer",
               ok ? "ok" : "FAIL");
        g_failed += !ok;
    }
    close(to_child);
    int status;
    wait(&status);
    for (auto &s : spinners)
        CHECK_RT(cudaStreamSynchronize(s));
    shim_report("ipc_check");
    if (total_bad || total_reply_bad || g_failed || !WIFEXITED(status) || WEXITSTATUS(status)) {
        printf("IPC FAIL rounds=%d blocks=%d mismatches=%llu reply_mismatches=%llu failed=%d "
               "importer_status=%d\n",
               rounds, blocks, total_bad, total_reply_bad, g_failed, status);
        return 1;
    }
    printf("IPC ok rounds=%d blocks=%d\n", rounds, blocks);
    return 0;
}
