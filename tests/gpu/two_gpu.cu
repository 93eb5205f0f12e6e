// two_gpu: the cache with two GPUs (issue 15). Run under the shim (LD_PRELOAD=libcacheshim.so).
//   two_gpu threads   4 threads switching devices (cudaSetDevice) while allocating, writing,
//                     checking and freeing on both, no host sync in the loop: every block is on
//                     the device it was asked on, and its bytes are what was written there
//   two_gpu peer      peer access: a cached block of GPU 0 (freed and taken again, so the
//                     cache's, pooled by default) read by a kernel on GPU 1, then copied back
//                     with cudaMemcpyPeer; also a block of GPU 0 made after peer access was
//                     enabled.
//   two_gpu cap       under CACHESHIM_CAP: 64 MiB blocks on GPU 0 until refused, then on GPU 1
//                     while GPU 0's are held: each device stops at its own cap.
// Prints PASS/FAIL lines.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(x)                                                                        \
    do {                                                                                \
        cudaError_t e_ = (x);                                                           \
        if (e_ != cudaSuccess) {                                                        \
            printf("FAIL %s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

__global__ void fill(uint32_t *p, size_t n, uint32_t v)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = v ^ (uint32_t)i;
}

__global__ void check(const uint32_t *p, size_t n, uint32_t v, unsigned long long *bad)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        if (p[i] != (v ^ (uint32_t)i))
            atomicAdd(bad, 1ull);
}

__global__ void copy_plus(const uint32_t *src, uint32_t *dst, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i] + 1;
}

static unsigned long long *bad_dev[2];
static int wrong_device;

static void *worker(void *arg)
{
    int t = (int)(intptr_t)arg;
    unsigned seed = 7u + (unsigned)t;
    cudaStream_t s[2];
    for (int d = 0; d < 2; d++) {
        CHECK(cudaSetDevice(d));
        CHECK(cudaStreamCreateWithFlags(&s[d], cudaStreamNonBlocking));
    }
    for (int i = 0; i < 3000; i++) {
        int d = (i + t) & 1;
        CHECK(cudaSetDevice(d));
        seed = seed * 1103515245u + 12345u;
        size_t bytes = ((size_t)1 << 20) * (1 + (seed >> 16) % 8) + (seed % 4096);
        uint32_t *p;
        CHECK(cudaMalloc(&p, bytes));
        cudaPointerAttributes at;
        CHECK(cudaPointerGetAttributes(&at, p));
        if (at.device != d)
            __atomic_add_fetch(&wrong_device, 1, __ATOMIC_RELAXED);
        size_t n = bytes / 4;
        uint32_t v = seed;
        fill<<<64, 256, 0, s[d]>>>(p, n, v);
        check<<<64, 256, 0, s[d]>>>(p, n, v, bad_dev[d]);
        CHECK(cudaFree(p));  // no sync: the cache orders the next use of the block
    }
    for (int d = 0; d < 2; d++) {
        CHECK(cudaSetDevice(d));
        CHECK(cudaStreamSynchronize(s[d]));
        CHECK(cudaStreamDestroy(s[d]));
    }
    return NULL;
}

typedef struct { uint64_t v[32]; } stats_buf;

static int threads_case(void)
{
    for (int d = 0; d < 2; d++) {
        CHECK(cudaSetDevice(d));
        CHECK(cudaMalloc(&bad_dev[d], sizeof(unsigned long long)));
        CHECK(cudaMemset(bad_dev[d], 0, sizeof(unsigned long long)));
    }
    pthread_t th[4];
    for (int t = 0; t < 4; t++)
        pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t);
    for (int t = 0; t < 4; t++)
        pthread_join(th[t], NULL);
    unsigned long long bad[2];
    for (int d = 0; d < 2; d++) {
        CHECK(cudaSetDevice(d));
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaMemcpy(&bad[d], bad_dev[d], sizeof bad[d], cudaMemcpyDeviceToHost));
    }
    // The shim's statistics per device (cacheshim.h: requests, hits first).
    int (*get)(int, void *, size_t) = (int (*)(int, void *, size_t))dlsym(RTLD_DEFAULT, "cacheshim_get_stats");
    for (int d = 0; d < 2 && get; d++) {
        stats_buf b;
        memset(&b, 0, sizeof b);
        if (get(d, &b, sizeof b) == 0)
            printf("device %d: shim requests=%llu hits=%llu\n", d, (unsigned long long)b.v[0],
                   (unsigned long long)b.v[1]);
    }
    int ok = bad[0] == 0 && bad[1] == 0 && wrong_device == 0;
    printf("%s two_gpu_threads allocations=12000 bad_words=%llu,%llu wrong_device=%d shim=%s\n",
           ok ? "PASS" : "FAIL", bad[0], bad[1], wrong_device, get ? "loaded" : "absent");
    return ok ? 0 : 1;
}

static int peer_case(void)
{
    int can = 0;
    CHECK(cudaDeviceCanAccessPeer(&can, 1, 0));
    if (!can) {
        printf("SKIP two_gpu_peer: GPU 1 cannot access GPU 0\n");
        return 0;
    }
    const size_t n = (64u << 20) / 4;
    uint32_t *a, *b, *c, *h = (uint32_t *)malloc(n * 4);
    CHECK(cudaSetDevice(0));
    CHECK(cudaMalloc(&a, n * 4));
    CHECK(cudaFree(a));
    CHECK(cudaMalloc(&a, n * 4));  // the cache's block
    fill<<<128, 256>>>(a, n, 0xabcd1234u);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaSetDevice(1));
    CHECK(cudaDeviceEnablePeerAccess(0, 0));
    CHECK(cudaMalloc(&b, n * 4));
    copy_plus<<<128, 256>>>(a, b, n);  // GPU 1 reads GPU 0's cached block
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaSetDevice(0));
    CHECK(cudaMalloc(&c, n * 4));      // made after peer access: granted too
    CHECK(cudaMemcpyPeer(c, 0, b, 1, n * 4));
    CHECK(cudaMemcpy(h, c, n * 4, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += h[i] != ((0xabcd1234u ^ (uint32_t)i) + 1);
    // GPU 1 writes into the block made after peer access was enabled.
    CHECK(cudaSetDevice(1));
    fill<<<128, 256>>>(c, n, 0x5555aaaau);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(h, c, n * 4, cudaMemcpyDeviceToHost));
    size_t bad2 = 0;
    for (size_t i = 0; i < n; i++)
        bad2 += h[i] != (0x5555aaaau ^ (uint32_t)i);
    int ok = bad == 0 && bad2 == 0;
    printf("%s two_gpu_peer bytes=%zu read_by_gpu1_bad=%zu written_by_gpu1_bad=%zu\n",
           ok ? "PASS" : "FAIL", n * 4, bad, bad2);
    return ok ? 0 : 1;
}

/* Under CACHESHIM_CAP: 64 MiB blocks on GPU 0 until refused, then on GPU 1 until refused; each
 * device's cap is its own (GPU 1 gets as many as GPU 0 while GPU 0's blocks are still held). */
static int cap_case(void)
{
    int got[2] = {0, 0};
    void *p[2][256];
    for (int d = 0; d < 2; d++) {
        CHECK(cudaSetDevice(d));
        while (got[d] < 256 && cudaMalloc(&p[d][got[d]], 64u << 20) == cudaSuccess)
            got[d]++;
        (void)cudaGetLastError();  /* the refusal */
    }
    for (int d = 0; d < 2; d++) {
        CHECK(cudaSetDevice(d));
        for (int i = 0; i < got[d]; i++)
            CHECK(cudaFree(p[d][i]));
    }
    int ok = got[0] > 0 && got[0] < 256 && got[0] == got[1];
    printf("%s two_gpu_cap blocks_of_64MiB=%d,%d (each device stopped at its own cap)\n",
           ok ? "PASS" : "FAIL", got[0], got[1]);
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    if (count < 2) {
        printf("SKIP two_gpu: %d GPU(s)\n", count);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "peer") == 0)
        return peer_case();
    if (argc > 1 && strcmp(argv[1], "cap") == 0)
        return cap_case();
    return threads_case();
}
