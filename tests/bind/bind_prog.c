/* Libraries the preload cannot reach, served from the cache through the binding-time hooks
 * (LD_AUDIT=libcacheshim.so, cs_bind.c). check_bind.py runs it in each mode.
 *
 *     bind_prog plain|deepbind|dlmopen|fork|keys|exit direct|procaddr LIBRARY PAIRS
 *
 * loads LIBRARY (bind_lib.c) with a plain dlopen, with RTLD_DEEPBIND, or with dlmopen into a
 * new namespace (where it gets its own copy of libcuda), has it make PAIRS 1 MiB
 * allocation/free pairs, and prints what the process's driver (this program's libcuda, the
 * fake) saw (fork: a plain dlopen, then a child makes one more pair and prints
 * "child driver allocations N": a child's cache starts empty, so N is one more than its
 * parent's; keys: as deepbind, with thread-specific keys of the program's own, as cudart and
 * Python keep, set before the library runs in the main thread and in a second one, and
 * checked after, and at that thread's exit by their destructor):
 *
 *     ns per pair X            the library's run, context setup included, over PAIRS
 *     driver allocations N     cuMemAlloc_v2 + cuMemCreate calls
 *     driver frees N           cuMemFree_v2 calls
 *     stats: requests N hits N     (when cacheshim.h's API answers) or stats: not loaded
 *     preloaded copy: not entered | ENTERED    (when a libcacheshim.so is preloaded)
 *     program keys: N intact, N overwritten, N destructors right, N wrong     (keys)
 *     synchronizes before the program's exit handler: N    (exit: as plain, with an exit
 *         handler registered before the first allocation, as cudart's is; it prints how many
 *         cuCtxSynchronize calls were made after main returned and before it ran: the
 *         cache's exit check under CACHESHIM_DEBUG=uaf makes one, and must run first)
 */
#include <cuda.h>
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cacheshim.h"
#include "fake_control.h"

#define CHECK(x)                                                                       \
    do {                                                                               \
        if (!(x)) {                                                                    \
            fprintf(stderr, "bind_prog: %s:%d: %s failed (%s)\n", __FILE__, __LINE__, #x, \
                    dlerror());                                                        \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

/* The extent of the preloaded libcacheshim.so (the first LD_PRELOAD entry that names it). */
static int preloaded_shim(uintptr_t *lo, uintptr_t *hi)
{
    const char *pre = getenv("LD_PRELOAD");
    const char *at = pre ? strstr(pre, "libcacheshim.so") : NULL;
    if (!at)
        return 0;
    const char *start = at;
    while (start > pre && start[-1] != ':' && start[-1] != ' ')
        start--;
    char path[4096];
    size_t n = (size_t)(at - start) + strlen("libcacheshim.so");
    if (n >= sizeof path)
        return 0;
    memcpy(path, start, n);
    path[n] = '\0';
    void *h = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
    struct link_map *lm = NULL;
    CHECK(h && dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0);
    const ElfW(Ehdr) *eh = (const ElfW(Ehdr) *)lm->l_addr;
    const ElfW(Phdr) *ph = (const ElfW(Phdr) *)(lm->l_addr + eh->e_phoff);
    *lo = UINTPTR_MAX;
    *hi = 0;
    for (int i = 0; i < eh->e_phnum; i++) {
        if (ph[i].p_type != PT_LOAD)
            continue;
        uintptr_t a = lm->l_addr + ph[i].p_vaddr;
        if (a < *lo)
            *lo = a;
        if (a + ph[i].p_memsz > *hi)
            *hi = a + ph[i].p_memsz;
    }
    return 1;
}

/* keys: the program's thread-specific keys, and what their values and destructors saw. */
enum { PROGRAM_KEYS = 8 };
static pthread_key_t program_keys[PROGRAM_KEYS];
static char markers[2][PROGRAM_KEYS]; /* [0] the main thread's values, [1] the thread's */
static int keys_intact, keys_overwritten, destructors_right, destructors_wrong;
static pthread_mutex_t keys_lock = PTHREAD_MUTEX_INITIALIZER;

static void key_destructor(void *value)
{
    char *v = value;
    pthread_mutex_lock(&keys_lock);
    if (v >= markers[1] && v < markers[1] + PROGRAM_KEYS)
        destructors_right++;
    else
        destructors_wrong++;
    pthread_mutex_unlock(&keys_lock);
}

static void keys_set(int who)
{
    for (int k = 0; k < PROGRAM_KEYS; k++)
        CHECK(pthread_setspecific(program_keys[k], &markers[who][k]) == 0);
}

static void keys_check(int who)
{
    pthread_mutex_lock(&keys_lock);
    for (int k = 0; k < PROGRAM_KEYS; k++) {
        if (pthread_getspecific(program_keys[k]) == &markers[who][k])
            keys_intact++;
        else
            keys_overwritten++;
    }
    pthread_mutex_unlock(&keys_lock);
}

typedef struct {
    int (*run)(int, int);
    int pairs, procaddr, line;
} keys_thread_arg;

static void *keys_thread(void *p)
{
    keys_thread_arg *a = p;
    keys_set(1);
    a->line = a->run(a->pairs, a->procaddr);
    keys_check(1);
    return NULL;
}

/* exit: cuCtxSynchronize calls when main returned. */
static long syncs_at_return;

static void program_exit_handler(void)
{
    printf("synchronizes before the program's exit handler: %ld\n",
           fake_calls("cuCtxSynchronize") - syncs_at_return);
}

static int inside(const void *p, uintptr_t lo, uintptr_t hi)
{
    return (uintptr_t)p >= lo && (uintptr_t)p < hi;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr,
                "usage: bind_prog plain|deepbind|dlmopen|fork direct|procaddr LIBRARY PAIRS\n");
        return 2;
    }
    int procaddr = strcmp(argv[2], "procaddr") == 0;
    int pairs = atoi(argv[4]);
    int keys = strcmp(argv[1], "keys") == 0;
    int at_exit = strcmp(argv[1], "exit") == 0;
    if (at_exit)
        CHECK(atexit(program_exit_handler) == 0);
    if (keys) {
        for (int k = 0; k < PROGRAM_KEYS; k++)
            CHECK(pthread_key_create(&program_keys[k], key_destructor) == 0);
        keys_set(0);
    }
    CHECK(cuInit(0) == CUDA_SUCCESS); /* this program's libcuda is the process's driver */
    fake_reset_counters();

    void *lib = strcmp(argv[1], "dlmopen") == 0
                    ? dlmopen(LM_ID_NEWLM, argv[3], RTLD_NOW | RTLD_LOCAL)
                    : dlopen(argv[3], RTLD_NOW | RTLD_LOCAL |
                                          (strcmp(argv[1], "deepbind") == 0 || keys
                                               ? RTLD_DEEPBIND
                                               : 0));
    CHECK(lib != NULL);
    int (*run)(int, int);
    void *(*alloc_fn)(int);
    void *sym = dlsym(lib, "bind_lib_run");
    CHECK(sym != NULL);
    memcpy(&run, &sym, sizeof run);
    sym = dlsym(lib, "bind_lib_alloc_fn");
    CHECK(sym != NULL);
    memcpy(&alloc_fn, &sym, sizeof alloc_fn);

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int line = run(pairs, procaddr);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (keys && line == 0) {
        keys_thread_arg a = {run, pairs, procaddr, 0};
        pthread_t t;
        CHECK(pthread_create(&t, NULL, keys_thread, &a) == 0);
        CHECK(pthread_join(t, NULL) == 0);
        line = a.line;
        keys_check(0);
        printf("program keys: %d intact, %d overwritten, %d destructors right, %d wrong\n",
               keys_intact, keys_overwritten, destructors_right, destructors_wrong);
    }
    if (line != 0) {
        fprintf(stderr, "bind_prog: bind_lib.c:%d failed\n", line);
        return 1;
    }
    double ns = (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
    printf("ns per pair %.1f\n", pairs > 0 ? ns / pairs : 0.0);
    printf("driver allocations %ld\n", fake_calls("cuMemAlloc_v2") + fake_calls("cuMemCreate"));
    if (strcmp(argv[1], "fork") == 0) {
        fflush(stdout);
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            line = run(1, procaddr);
            printf("child driver allocations %ld\n",
                   fake_calls("cuMemAlloc_v2") + fake_calls("cuMemCreate"));
            fflush(stdout);
            _exit(line == 0 ? 0 : 1);
        }
        int status;
        CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    printf("driver frees %ld\n", fake_calls("cuMemFree_v2"));

    cacheshim_stats st;
    if (cacheshim_get_stats_if_loaded(-1, &st) == 0)
        printf("stats: requests %llu hits %llu\n", (unsigned long long)st.requests,
               (unsigned long long)st.hits);
    else
        printf("stats: not loaded\n");

    uintptr_t lo, hi;
    if (preloaded_shim(&lo, &hi)) {
        /* What the library calls, what this program's own lookups find: none may be the
         * preloaded copy's (it would wrap again, with a second cache). */
        void *mine = dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
        int entered = inside(alloc_fn(procaddr), lo, hi) || inside(mine, lo, hi);
        /* every function of cacheshim.h, as a program finds them */
        static const char *const api[] = {
            "cacheshim_get_stats", "cacheshim_get_host_stats", "cacheshim_trim",
            "cacheshim_scope_begin", "cacheshim_scope_end", "cacheshim_debug_check",
            "cacheshim_torch_alloc", "cacheshim_torch_free"};
        for (size_t i = 0; i < sizeof api / sizeof api[0]; i++) {
            void *f = dlsym(RTLD_DEFAULT, api[i]);
            if (!f || inside(f, lo, hi)) {
                printf("API function %s: %s\n", api[i], f ? "the preloaded copy's" : "missing");
                entered = 1;
            }
        }
        printf("preloaded copy: %s\n", entered ? "ENTERED" : "not entered");
    }
    fflush(stdout);
    syncs_at_return = fake_calls("cuCtxSynchronize");
    return 0;
}
