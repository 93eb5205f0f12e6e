/* A program for the tracer's integration tests: it reaches the (fake) driver the ways real
 * programs do, with exactly known call counts. check_trace.py runs it under
 * LD_AUDIT=libcacheaudit.so and compares the trace with what each scenario does.
 *
 *     audit_prog SCENARIO
 *
 * Every scenario checks its own results too, so a wrapper that changed what the program
 * sees makes the program fail (exit 1), not only the trace. */
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cacheshim.h"

#define MiB (1024u * 1024u)

/* The fake cudart (tests/audit/fake_cudart.c): cudaError_t is an int. */
int cudaMalloc(void **p, size_t n);
int cudaFree(void *p);
int cudaMallocAsync(void **p, size_t n, void *stream);
int cudaFreeAsync(void *p, void *stream);
int cudaMallocHost(void **p, size_t n);
int cudaFreeHost(void *p);
int cudaMemGetInfo(size_t *free_bytes, size_t *total);

#define CHECK(x)                                                              \
    do {                                                                      \
        if (!(x)) {                                                           \
            fprintf(stderr, "audit_prog: %s:%d: %s failed\n", __FILE__, __LINE__, #x); \
            exit(1);                                                          \
        }                                                                     \
    } while (0)

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*gpa2_fn)(const char *, void **, int, cuuint64_t,
                            CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa1_fn)(const char *, void **, int, cuuint64_t);

static CUcontext ctx;

static void init(void)
{
    CUdevice dev;
    CHECK(cuInit(0) == CUDA_SUCCESS);
    CHECK(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
    CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
}

/* One allocation and its free through direct binding (cuMemAlloc is cuMemAlloc_v2). */
static void pair(size_t size)
{
    CUdeviceptr p = 0;
    CHECK(cuMemAlloc(&p, size) == CUDA_SUCCESS && p != 0);
    CHECK(cuMemFree(p) == CUDA_SUCCESS);
}

/* direct: 3 cuMemAlloc_v2 + 3 cuMemFree_v2 + 1 cuMemGetInfo_v2 + 1 failing cuMemFree_v2. */
static void direct(void)
{
    pair(1 * MiB);
    pair(4096);
    pair(70 * 1024);
    size_t f = 0, t = 0;
    CHECK(cuMemGetInfo(&f, &t) == CUDA_SUCCESS && t > 0);
    CHECK(cuMemFree((CUdeviceptr)0x1234) != CUDA_SUCCESS); /* not ours: an error */
}

/* chdir DIR: a pair, the working directory changed to DIR, a pair. */
static void pairs_around_chdir(const char *dir)
{
    pair(4096);
    CHECK(chdir(dir) == 0);
    pair(4096);
}

/* dlsym: 2 + 2 through dlsym on a dlopened libcuda. */
static void via_dlsym(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    CHECK(h != NULL);
    alloc_fn a = (alloc_fn)dlsym(h, "cuMemAlloc_v2");
    free_fn f = (free_fn)dlsym(h, "cuMemFree_v2");
    CHECK(a && f);
    for (int i = 0; i < 2; i++) {
        CUdeviceptr p = 0;
        CHECK(a(&p, 2 * MiB) == CUDA_SUCCESS && p);
        CHECK(f(p) == CUDA_SUCCESS);
    }
}

/* procaddr, as cudart does it: dlsym cuGetProcAddress_v2, ask it for "cuGetProcAddress",
 * and use that for the rest. cuMemAlloc at 12000 is cuMemAlloc_v2, at 3000 the v1
 * cuMemAlloc. Also cuGetProcAddress (v1) found by dlsym. */
static void via_procaddr(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    CHECK(h != NULL);
    gpa2_fn gpa = (gpa2_fn)dlsym(h, "cuGetProcAddress_v2");
    CHECK(gpa != NULL);
    CUdriverProcAddressQueryResult st;
    void *self = NULL;
    CHECK(gpa("cuGetProcAddress", &self, 12000, 0, &st) == CUDA_SUCCESS && self);
    gpa2_fn g = (gpa2_fn)self;
    void *a2 = NULL, *f2 = NULL, *a1 = NULL, *f1 = NULL;
    CHECK(g("cuMemAlloc", &a2, 12000, 0, &st) == CUDA_SUCCESS);
    CHECK(g("cuMemFree", &f2, 12000, 0, &st) == CUDA_SUCCESS);
    CHECK(g("cuMemAlloc", &a1, 3000, 0, &st) == CUDA_SUCCESS);
    gpa1_fn g1 = (gpa1_fn)dlsym(h, "cuGetProcAddress");
    CHECK(g1 != NULL);
    CHECK(g1("cuMemFree", &f1, 3000, 0) == CUDA_SUCCESS);
    CUdeviceptr p = 0;
    CHECK(((alloc_fn)a2)(&p, 3 * MiB) == CUDA_SUCCESS && p);
    CHECK(((free_fn)f2)(p) == CUDA_SUCCESS);
    CHECK(((alloc_fn)a2)(&p, 3 * MiB) == CUDA_SUCCESS && p);
    CHECK(((free_fn)f2)(p) == CUDA_SUCCESS);
    /* v1: 32-bit sizes and pointers in the old ABI; the fake keeps its pointers low enough
     * for the test not to care. */
    typedef CUresult (*alloc_v1)(unsigned int *, unsigned int);
    typedef CUresult (*free_v1)(unsigned int);
    unsigned int p1 = 0;
    if (((alloc_v1)a1)(&p1, 4096) == CUDA_SUCCESS)
        ((free_v1)f1)(p1);
}

/* runtime: each of the seven memory entry points once (async: twice), through the fake
 * shared cudart, which calls the driver. */
static void runtime(void)
{
    void *p = NULL, *h = NULL;
    size_t f = 0, t = 0;
    CHECK(cudaMalloc(&p, 1 * MiB) == 0 && p);
    CHECK(cudaFree(p) == 0);
    CHECK(cudaMallocAsync(&p, 2 * MiB, NULL) == 0 && p);
    CHECK(cudaFreeAsync(p, NULL) == 0);
    CHECK(cudaMallocHost(&h, 4096) == 0 && h);
    CHECK(cudaFreeHost(h) == 0);
    CHECK(cudaMemGetInfo(&f, &t) == 0 && t > 0);
}

/* all: a stream and an event, for the 'all' filter and the flag decoding. */
static void streams(void)
{
    CUstream s;
    CUevent e;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CHECK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
    CHECK(cuEventRecord(e, CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
    CHECK(cuEventRecord(e, s) == CUDA_SUCCESS);
    CHECK(cuEventSynchronize(e) == CUDA_SUCCESS);
    CHECK(cuEventDestroy(e) == CUDA_SUCCESS);
    CHECK(cuStreamDestroy(s) == CUDA_SUCCESS);
    pair(8192);
}

/* threads: THREADS threads, each PAIRS pairs: more than one buffer's worth each. */
#define THREADS 8
#define PAIRS 700

static void *worker(void *arg)
{
    (void)arg;
    CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    for (int i = 0; i < PAIRS; i++)
        pair(512 + (size_t)i);
    return NULL;
}

/* scopes (with the cache loaded): nested scopes with allocations inside, a free of a scope's
 * block by another thread, an allocation of another thread that no scope counts, an end with
 * no scope open, a name that must be escaped. The numbers the shim returns are checked here;
 * check_trace.py and test_report.py expect the same from the trace. */
static CUdeviceptr scoped_free_ptr;

static void *free_other_thread(void *arg)
{
    CUdeviceptr x = 0;
    CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    CHECK(cuMemAlloc(&x, 8 * MiB) == CUDA_SUCCESS); /* not this thread's scope */
    CHECK(cuMemFree(scoped_free_ptr) == CUDA_SUCCESS);
    *(CUdeviceptr *)arg = x;
    return NULL;
}

static void check_stats(const cacheshim_scope_stats *st, uint64_t allocs, uint64_t bytes,
                        uint64_t peak, uint64_t held)
{
    CHECK(st->allocs == allocs && st->bytes_allocated == bytes && st->peak == peak &&
          st->held_at_end == held);
}

static void scopes(void)
{
    CUdeviceptr a, b, c[2], d, x = 0;
    cacheshim_scope_stats st;
    CHECK(cacheshim_scope_begin_if_loaded("outer", 0) == 0);
    CHECK(cuMemAlloc(&a, 1 * MiB) == CUDA_SUCCESS);
    for (int i = 0; i < 2; i++) {
        CHECK(cacheshim_scope_begin_if_loaded("inner", CACHESHIM_SCOPE_RELEASE) == 0);
        CHECK(cuMemAlloc(&b, 4096) == CUDA_SUCCESS);
        CHECK(cuMemAlloc(&c[i], 64 * 1024) == CUDA_SUCCESS);
        CHECK(cuMemFree(b) == CUDA_SUCCESS);
        CHECK(cacheshim_scope_end_if_loaded(&st) == 0);
        check_stats(&st, 2, 4096 + 64 * 1024, 4096 + 64 * 1024, 64 * 1024);
    }
    /* A large stack: the tests reserve 16 MiB of static TLS (for TSan under LD_AUDIT, see
     * check_trace.py), which glibc places on each thread's stack; what the default 8 MiB
     * leaves is too little for the ASan-built shim's first allocation on a thread. */
    pthread_t th;
    pthread_attr_t attr;
    CHECK(pthread_attr_init(&attr) == 0 && pthread_attr_setstacksize(&attr, 64 * MiB) == 0);
    scoped_free_ptr = a;
    CHECK(pthread_create(&th, &attr, free_other_thread, &x) == 0);
    CHECK(pthread_attr_destroy(&attr) == 0);
    CHECK(pthread_join(th, NULL) == 0);
    CHECK(cuMemAlloc(&d, 512 * 1024) == CUDA_SUCCESS);
    CHECK(cacheshim_scope_end_if_loaded(&st) == 0);
    check_stats(&st, 6, MiB + 2 * (4096 + 64 * 1024) + 512 * 1024,
                MiB + 2 * 64 * 1024 + 4096, 2 * 64 * 1024 + 512 * 1024);
    CHECK(cacheshim_scope_end_if_loaded(NULL) == -1); /* none open */
    /* a quote, a tab, an e-acute, a surrogate's bytes (not UTF-8): escaped, kept, '?' x3 */
    CHECK(cacheshim_scope_begin_if_loaded("odd \"name\"\t\xc3\xa9\xed\xa0\x80", 0) == 0);
    CHECK(cacheshim_scope_end_if_loaded(NULL) == 0);
    CHECK(cuMemFree(c[0]) == CUDA_SUCCESS && cuMemFree(c[1]) == CUDA_SUCCESS);
    CHECK(cuMemFree(d) == CUDA_SUCCESS && cuMemFree(x) == CUDA_SUCCESS);
}

static void threads(void)
{
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        CHECK(pthread_create(&t[i], NULL, worker, NULL) == 0);
    for (int i = 0; i < THREADS; i++)
        CHECK(pthread_join(t[i], NULL) == 0);
}

/* fork: 1 pair in the parent before, 3 in the child, 2 in the parent after. */
static void forked(void)
{
    pair(1 * MiB);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        for (int i = 0; i < 3; i++)
            pair(2 * MiB);
        exit(0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    pair(4 * MiB);
    pair(4 * MiB);
    printf("child %d\n", (int)pid);
}

/* spawn: the program's own 8 calls (as direct), a shell that never calls the driver, then a
 * copy of this program run as "direct" in a new process (fork + exec, as subprocess does). */
static void spawn(const char *self)
{
    direct();
    fflush(NULL);
    CHECK(system("exit 0") == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        execl(self, self, "direct", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    printf("child %d\n", (int)pid);
}

/* exit-thread: a second thread makes 50 pairs and calls exit() while main waits. */
static void *exiter(void *arg)
{
    (void)arg;
    CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    for (int i = 0; i < 50; i++)
        pair(64 * 1024);
    exit(0);
}

static void exit_from_thread(void)
{
    pthread_t t;
    CHECK(pthread_create(&t, NULL, exiter, NULL) == 0);
    pthread_join(t, NULL);
    exit(1); /* not reached */
}

/* die HOW N: N allocations of 1 MiB, kept, then the end HOW: abort, _exit (status 3), kill
 * (SIGKILL, which nothing can catch), segv (a write to a page mapped without access),
 * quick_exit (status 4), at_quick_exit (the same, with a handler registered first that frees
 * the last allocation: a traced call made while the program ends). */
static CUdeviceptr die_last;

static void free_last(void)
{
    if (cuMemFree(die_last) != CUDA_SUCCESS)
        _Exit(1); /* not exit(): the program is ending by quick_exit */
}

static void die(const char *how, int n)
{
    if (strcmp(how, "at_quick_exit") == 0)
        CHECK(at_quick_exit(free_last) == 0);
    for (int i = 0; i < n; i++) {
        CUdeviceptr p = 0;
        CHECK(cuMemAlloc(&p, MiB) == CUDA_SUCCESS && p);
        die_last = p;
    }
    if (strcmp(how, "abort") == 0)
        abort();
    if (strcmp(how, "_exit") == 0)
        _exit(3);
    if (strcmp(how, "quick_exit") == 0 || strcmp(how, "at_quick_exit") == 0)
        quick_exit(4);
    if (strcmp(how, "kill") == 0)
        raise(SIGKILL);
    if (strcmp(how, "segv") == 0) { /* a real fault: a page that may not be written */
        volatile char *page = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(page != MAP_FAILED);
        *page = 1;
    }
    exit(2); /* unknown HOW */
}

/* end-race: 10 pairs traced (to stderr, a pipe check_trace.py reads only later), the pipe
 * filled with spaces (blanks between a Chrome trace's events), then exit(), whose end waits
 * in its last write, "]", while a second thread crashes (SIGSEGV) 300 ms later. */
static void *crasher(void *arg)
{
    (void)arg;
    usleep(300000);
    volatile char *page = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(page != MAP_FAILED);
    *page = 1;
    return NULL;
}

static void end_race(void)
{
    static char spaces[4096];
    for (int i = 0; i < 10; i++)
        pair(MiB);
    memset(spaces, ' ', sizeof spaces);
    int fl = fcntl(2, F_GETFL);
    CHECK(fl >= 0 && fcntl(2, F_SETFL, fl | O_NONBLOCK) == 0);
    for (size_t n = sizeof spaces; n > 0;)
        if (write(2, spaces, n) < 0) {
            CHECK(errno == EAGAIN);
            n /= 2;
        }
    CHECK(fcntl(2, F_SETFL, fl) == 0);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, crasher, NULL) == 0);
    exit(0);
}

/* vfork: 3 pairs, a child of vfork whose exec fails and that calls _exit(127) (in the
 * parent's memory), then 3 more pairs. */
static void vforked(void)
{
    for (int i = 0; i < 3; i++)
        pair(MiB);
    pid_t pid = vfork();
    if (pid == 0) {
        execl("/nonexistent/cacheshim-test", "x", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 127);
    for (int i = 0; i < 3; i++)
        pair(MiB);
}

/* clock N HOW: N allocations 5 ms apart, each between two reads of CLOCK_MONOTONIC printed
 * as "a b" (ns), then ends as HOW says ("exit", or "kill": the records not yet formatted stay
 * in TRACE.pending, whose clock the tools use). check_trace.py compares the trace's times. */
static void clock_pairs(int n, const char *how)
{
    for (int i = 0; i < n; i++) {
        struct timespec a, b;
        CUdeviceptr p = 0;
        clock_gettime(CLOCK_MONOTONIC, &a);
        CHECK(cuMemAlloc(&p, MiB) == CUDA_SUCCESS && p);
        clock_gettime(CLOCK_MONOTONIC, &b);
        printf("%lld %lld\n", (long long)a.tv_sec * 1000000000LL + a.tv_nsec,
               (long long)b.tv_sec * 1000000000LL + b.tv_nsec);
        if (i + 1 < n)
            usleep(5000);
    }
    fflush(stdout);
    if (strcmp(how, "kill") == 0)
        raise(SIGKILL);
}

/* die-busy HOW: THREADS threads allocate and free without end; once each has made 200
 * pairs, the main thread ends the process as die does, in the middle of their calls. */
static int started_pairs[THREADS];

static void *busy_worker(void *arg)
{
    int k = (int)(intptr_t)arg;
    CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    for (;;) {
        pair(4096);
        __atomic_add_fetch(&started_pairs[k], 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

static void die_busy(const char *how)
{
    pthread_t t;
    for (int i = 0; i < THREADS; i++)
        CHECK(pthread_create(&t, NULL, busy_worker, (void *)(intptr_t)i) == 0);
    for (int i = 0; i < THREADS; i++)
        while (__atomic_load_n(&started_pairs[i], __ATOMIC_RELAXED) < 200)
            usleep(100);
    die(how, 0);
}

/* bench KIND N [WORK]: N driver calls of one kind, the cheap ones a framework makes around
 * each kernel, each followed by WORK, standing in for the program's own work between driver
 * calls; prints ns per call. KIND: launch (cuLaunchKernel's 11 arguments, of no kernel: the
 * fake driver answers CUDA_ERROR_INVALID_HANDLE at once), ctx (cuCtxGetCurrent), record
 * (cuEventRecord), query (cuStreamQuery), alloc (cuMemAlloc_v2 and cuMemFree_v2 in turn),
 * getinfo (cuMemGetInfo_v2), mix (of each 8 calls: 3 launch, ctx, record, query, alloc,
 * free). WORK: a number of iterations of an empty loop (0: back to back), or cold: code and
 * data enough that the tracer's code, tables and branch history are no longer in the
 * nearest caches at the next call, as between a real framework's calls. Prints ns per call
 * of wall time, then of the calling thread's CPU time (what other processes on the machine
 * take is not in it; the tracer's helper thread is not either). */
static unsigned char bench_junk[8u << 20];

#define JUNK_FN(n) \
    static unsigned junk_##n(unsigned x) \
    { \
        return (x & (1u << ((n) % 29))) ? x * (2u * (n) + 1u) + (n) : x ^ (x >> ((n) % 13 + 1)); \
    }
#define JUNK_FN8(n) JUNK_FN(n##0) JUNK_FN(n##1) JUNK_FN(n##2) JUNK_FN(n##3) JUNK_FN(n##4) \
    JUNK_FN(n##5) JUNK_FN(n##6) JUNK_FN(n##7)
#define JUNK_FN64(n) JUNK_FN8(n##0) JUNK_FN8(n##1) JUNK_FN8(n##2) JUNK_FN8(n##3) JUNK_FN8(n##4) \
    JUNK_FN8(n##5) JUNK_FN8(n##6) JUNK_FN8(n##7)
#define JUNK_FN512(n) JUNK_FN64(n##0) JUNK_FN64(n##1) JUNK_FN64(n##2) JUNK_FN64(n##3) \
    JUNK_FN64(n##4) JUNK_FN64(n##5) JUNK_FN64(n##6) JUNK_FN64(n##7)
JUNK_FN512(1)
JUNK_FN512(2)
#define JUNK_CALL(n) x = junk_##n(x);
#define JUNK_CALL8(n) JUNK_CALL(n##0) JUNK_CALL(n##1) JUNK_CALL(n##2) JUNK_CALL(n##3) \
    JUNK_CALL(n##4) JUNK_CALL(n##5) JUNK_CALL(n##6) JUNK_CALL(n##7)
#define JUNK_CALL64(n) JUNK_CALL8(n##0) JUNK_CALL8(n##1) JUNK_CALL8(n##2) JUNK_CALL8(n##3) \
    JUNK_CALL8(n##4) JUNK_CALL8(n##5) JUNK_CALL8(n##6) JUNK_CALL8(n##7)

#define JUNK_CALL512(n) JUNK_CALL64(n##0) JUNK_CALL64(n##1) JUNK_CALL64(n##2) \
    JUNK_CALL64(n##3) JUNK_CALL64(n##4) JUNK_CALL64(n##5) JUNK_CALL64(n##6) JUNK_CALL64(n##7)

/* 1,024 distinct branchy functions (some 40 KiB of code), and 512 cache lines scattered over
 * 8 MiB read and written: a few microseconds, like a framework's dispatch between calls. */
__attribute__((noinline)) static unsigned cold_work(unsigned x)
{
    JUNK_CALL512(1) JUNK_CALL512(2)
    for (unsigned k = 0; k < 512; k++) {
        x = x * 1664525u + 1013904223u;
        bench_junk[(x >> 4) % sizeof bench_junk] += (unsigned char)k;
    }
    return x;
}

static void bench(const char *kind, long n, const char *work)
{
    static const char *const kinds[] = {"launch", "ctx", "record", "query", "alloc", "getinfo"};
    static const int mix[8] = {0, 1, 0, 2, 0, 3, 4, 4};
    int k = -1;
    for (int i = 0; i < 6; i++)
        if (strcmp(kind, kinds[i]) == 0)
            k = i;
    CHECK(k >= 0 || strcmp(kind, "mix") == 0);
    int cold = strcmp(work, "cold") == 0;
    long spin = cold ? 0 : atol(work);
    CUstream s;
    CUevent e;
    CUcontext c;
    CUdeviceptr p = 0;
    size_t f, t;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CHECK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
    unsigned x = 1;
    struct timespec a, b, ca, cb;
    clock_gettime(CLOCK_MONOTONIC, &a);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ca);
    for (long i = 0; i < n; i++) {
        switch (k >= 0 ? k : mix[i % 8]) {
        case 0:
            cuLaunchKernel(NULL, 1024, 1, 1, 128, 1, 1, 0, s, NULL, NULL);
            break;
        case 1:
            cuCtxGetCurrent(&c);
            break;
        case 2:
            cuEventRecord(e, s);
            break;
        case 3:
            cuStreamQuery(s);
            break;
        case 4: /* in turn: an allocation, its free */
            if (p == 0)
                CHECK(cuMemAlloc(&p, 1 * MiB) == CUDA_SUCCESS);
            else if (cuMemFree(p) == CUDA_SUCCESS)
                p = 0;
            break;
        default:
            cuMemGetInfo(&f, &t);
        }
        if (cold)
            x = cold_work(x);
        for (volatile long w = 0; w < spin; w++)
            ;
    }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cb);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
    double cpu = (double)(cb.tv_sec - ca.tv_sec) * 1e9 + (double)(cb.tv_nsec - ca.tv_nsec);
    printf("%.1f %.1f %u\n", ns / (double)n, cpu / (double)n, x & 1);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    const char *s = argv[1];
    init();
    if (strcmp(s, "direct") == 0 || strcmp(s, "shim") == 0)
        direct();
    else if (strcmp(s, "dlsym") == 0)
        via_dlsym();
    else if (strcmp(s, "chdir") == 0 && argc > 2)
        pairs_around_chdir(argv[2]);
    else if (strcmp(s, "procaddr") == 0)
        via_procaddr();
    else if (strcmp(s, "runtime") == 0)
        runtime();
    else if (strcmp(s, "streams") == 0)
        streams();
    else if (strcmp(s, "threads") == 0)
        threads();
    else if (strcmp(s, "scopes") == 0)
        scopes();
    else if (strcmp(s, "fork") == 0)
        forked();
    else if (strcmp(s, "spawn") == 0)
        spawn(argv[0]);
    else if (strcmp(s, "exit-thread") == 0)
        exit_from_thread();
    else if (strcmp(s, "die") == 0 && argc > 3)
        die(argv[2], atoi(argv[3]));
    else if (strcmp(s, "clock") == 0 && argc > 3)
        clock_pairs(atoi(argv[2]), argv[3]);
    else if (strcmp(s, "vfork") == 0)
        vforked();
    else if (strcmp(s, "end-race") == 0)
        end_race();
    else if (strcmp(s, "die-busy") == 0 && argc > 2)
        die_busy(argv[2]);
    else if (strcmp(s, "bench") == 0 && argc > 3)
        bench(argv[2], atol(argv[3]), argc > 4 ? argv[4] : "0");
    else
        return 2;
    return 0;
}
