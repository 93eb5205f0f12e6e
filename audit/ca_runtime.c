/* Hand-written wrappers (layer 2, see ca_desc.h): cudart's memory entry points (when a
 * program binds a shared libcudart), the shim's scope functions (the name recorded as text),
 * libc's fork (so the trace follows the program's fork), _exit, _Exit and quick_exit (so the
 * file is finished), and the shim's dlsym. The runtime types are spelled
 * as their ABI (cudaError_t is an int-sized enum, cudaStream_t a pointer), so this file
 * needs no cuda_runtime_api.h. */
#include "ca_symbols.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

typedef int rt_err; /* cudaError_t */
typedef void *rt_stream; /* cudaStream_t */

static void *rt_real[CA_FN_COUNT - CA_RT_FIRST];

#define REAL(fn, type) ((type)rt_real[(fn) - CA_RT_FIRST])

/* void ** / size_t * out-values, read after success. */
static void out_ptr(ca_rec *r, int k, void **p)
{
    if (p)
        ca_set_out(r, k, (uint64_t)(uintptr_t)*p);
}

static void out_size(ca_rec *r, int k, size_t *p)
{
    if (p)
        ca_set_out(r, k, *p);
}

/* The pattern of every hand-written wrapper of a call returning an int: begin, arguments,
 * call, out-values, end. */
#define HAND_CALL(FN, LIB, TYPE, ARGS, RECORD_ARGS, OUTS)            \
    do {                                                             \
        ca_rec *r = ca_begin(FN, ca_desc(FN)->nparams, LIB,         \
                             __builtin_return_address(0));          \
        if (!r)                                                      \
            return REAL(FN, TYPE) ARGS;                              \
        RECORD_ARGS;                                                 \
        ca_started(r);                                               \
        rt_err e = REAL(FN, TYPE) ARGS;                              \
        ca_stopped(r);                                               \
        if (e == 0) {                                                \
            OUTS;                                                    \
        }                                                            \
        ca_end(r, e);                                                \
        return e;                                                    \
    } while (0)
#define RT_CALL(FN, ...) HAND_CALL(FN, CA_LIB_RUNTIME, __VA_ARGS__)

#define A(k, v) r->arg[k] = (uint64_t)(uintptr_t)(v)

typedef rt_err (*malloc_fn)(void **, size_t);
typedef rt_err (*free_fn)(void *);
typedef rt_err (*malloc_async_fn)(void **, size_t, rt_stream);
typedef rt_err (*free_async_fn)(void *, rt_stream);
typedef rt_err (*info_fn)(size_t *, size_t *);

static rt_err w_cudaMalloc(void **p, size_t n)
{
    RT_CALL(CA_RT_cudaMalloc, malloc_fn, (p, n), (A(0, p), A(1, n)), out_ptr(r, 0, p));
}

static rt_err w_cudaFree(void *p)
{
    RT_CALL(CA_RT_cudaFree, free_fn, (p), A(0, p), (void)0);
}

static rt_err w_cudaMallocAsync(void **p, size_t n, rt_stream s)
{
    RT_CALL(CA_RT_cudaMallocAsync, malloc_async_fn, (p, n, s), (A(0, p), A(1, n), A(2, s)),
            out_ptr(r, 0, p));
}

static rt_err w_cudaMallocAsync_ptsz(void **p, size_t n, rt_stream s)
{
    RT_CALL(CA_RT_cudaMallocAsync_ptsz, malloc_async_fn, (p, n, s),
            (A(0, p), A(1, n), A(2, s)), out_ptr(r, 0, p));
}

static rt_err w_cudaFreeAsync(void *p, rt_stream s)
{
    RT_CALL(CA_RT_cudaFreeAsync, free_async_fn, (p, s), (A(0, p), A(1, s)), (void)0);
}

static rt_err w_cudaFreeAsync_ptsz(void *p, rt_stream s)
{
    RT_CALL(CA_RT_cudaFreeAsync_ptsz, free_async_fn, (p, s), (A(0, p), A(1, s)), (void)0);
}

static rt_err w_cudaMallocHost(void **p, size_t n)
{
    RT_CALL(CA_RT_cudaMallocHost, malloc_fn, (p, n), (A(0, p), A(1, n)), out_ptr(r, 0, p));
}

static rt_err w_cudaFreeHost(void *p)
{
    RT_CALL(CA_RT_cudaFreeHost, free_fn, (p), A(0, p), (void)0);
}

static rt_err w_cudaMemGetInfo(size_t *f, size_t *t)
{
    RT_CALL(CA_RT_cudaMemGetInfo, info_fn, (f, t), (A(0, f), A(1, t)),
            (out_size(r, 0, f), out_size(r, 1, t)));
}

#define FNPTR(f) ((void *)(uintptr_t)(f))

static const struct {
    int fn;
    void *wrapper;
} rt_wrappers[] = {
    {CA_RT_cudaMalloc, FNPTR(w_cudaMalloc)},
    {CA_RT_cudaFree, FNPTR(w_cudaFree)},
    {CA_RT_cudaMallocAsync, FNPTR(w_cudaMallocAsync)},
    {CA_RT_cudaMallocAsync_ptsz, FNPTR(w_cudaMallocAsync_ptsz)},
    {CA_RT_cudaFreeAsync, FNPTR(w_cudaFreeAsync)},
    {CA_RT_cudaFreeAsync_ptsz, FNPTR(w_cudaFreeAsync_ptsz)},
    {CA_RT_cudaMallocHost, FNPTR(w_cudaMallocHost)},
    {CA_RT_cudaFreeHost, FNPTR(w_cudaFreeHost)},
    {CA_RT_cudaMemGetInfo, FNPTR(w_cudaMemGetInfo)},
};

void *ca_runtime_bind(const char *name, void *real)
{
    int fn = ca_lookup_runtime(name);
    if (fn < 0)
        return NULL;
    for (size_t i = 0; i < sizeof rt_wrappers / sizeof rt_wrappers[0]; i++) {
        if (rt_wrappers[i].fn != fn)
            continue;
        rt_real[fn - CA_RT_FIRST] = real;
        return __atomic_load_n(&ca_traced[fn], __ATOMIC_RELAXED) ? rt_wrappers[i].wrapper : NULL;
    }
    return NULL;
}

/* ---- the shim's scopes (cacheshim.h): the program's begin and end, with the name ------------------ */

typedef int (*scope_begin_fn)(const char *, unsigned);
typedef int (*scope_end_fn)(void *, size_t);

/* The name's text is recorded (its first CA_STR_MAX bytes), not only its address. */
static void record_name(ca_rec *r, const char *name)
{
    A(0, name);
    r->str[0] = '\0';
    if (name)
        strncat(r->str, name, CA_STR_MAX);
    r->nstr = (uint8_t)strlen(r->str);
}

static int w_scope_begin(const char *name, unsigned flags)
{
    HAND_CALL(CA_SCOPE_begin, CA_LIB_SHIM, scope_begin_fn, (name, flags),
              (record_name(r, name), A(1, flags)), (void)0);
}

static int w_scope_end(void *out, size_t size)
{
    HAND_CALL(CA_SCOPE_end, CA_LIB_SHIM, scope_end_fn, (out, size), (A(0, out), A(1, size)),
              (void)0);
}

void *ca_scope_bind(const char *name, void *real)
{
    int fn = ca_lookup_scope(name);
    if (fn < 0)
        return NULL;
    rt_real[fn - CA_RT_FIRST] = real;
    if (!__atomic_load_n(&ca_traced[fn], __ATOMIC_RELAXED))
        return NULL;
    return fn == CA_SCOPE_begin ? FNPTR(w_scope_begin) : FNPTR(w_scope_end);
}

/* ---- fork ---------------------------------------------------------------------------------------- */

typedef pid_t (*fork_fn)(void);
static fork_fn real_fork;

static pid_t w_fork(void)
{
    ca_fork_prepare();
    pid_t pid = real_fork();
    if (pid == 0)
        ca_fork_child();
    else
        ca_fork_parent();
    return pid;
}

/* ---- _exit and _Exit: the process ends without exit()'s destructors ----------------------------- */

typedef void (*exit_fn)(int);
static exit_fn real_exit, real_Exit;

static void w_exit(int status)
{
    ca_trace_exit();
    real_exit(status);
    __builtin_unreachable();
}

static void w_Exit(int status)
{
    ca_trace_exit();
    real_Exit(status);
    __builtin_unreachable();
}

/* ---- quick_exit: the at_quick_exit handlers, then libc's own _exit ----------------------------
 *
 * C11's quick_exit runs the handlers registered with at_quick_exit, the last registered first,
 * then ends the process with _exit called inside libc, which no binding shows (and runs no
 * destructor: ca_fini neither). The handlers may make traced calls, as atexit handlers may
 * before exit() ends the trace, so the end is registered as a handler too, at the first
 * registration made through a binding (at_quick_exit is each object's own function, from
 * libc_nonshared, that calls libc's __cxa_at_quick_exit) and ahead of it: the end then runs
 * after every handler of the program's. A quick_exit with no handler registered ends the
 * trace before it. (One real quick_exit: a process whose objects bind both of glibc's,
 * GLIBC_2.10's and 2.24's, which differ in whether thread_local destructors run, calls the
 * one bound last.) */

typedef int (*at_quick_exit_fn)(void (*)(void *), void *);
static exit_fn real_quick_exit;
static at_quick_exit_fn real_at_quick_exit;
static pthread_once_t g_quick_once = PTHREAD_ONCE_INIT;
static int g_quick_end; /* atomic: the end is registered, to run after the program's handlers */

static void quick_end(void *arg)
{
    (void)arg;
    ca_trace_exit();
}

static void register_quick_end(void)
{
    if (real_at_quick_exit(quick_end, NULL) == 0)
        __atomic_store_n(&g_quick_end, 1, __ATOMIC_RELEASE);
}

static int w_cxa_at_quick_exit(void (*fn)(void *), void *d)
{
    /* Once, and before any handler of the program's (another thread's first registration
     * waits for it here). */
    pthread_once(&g_quick_once, register_quick_end);
    return real_at_quick_exit(fn, d);
}

static void w_quick_exit(int status)
{
    if (!__atomic_load_n(&g_quick_end, __ATOMIC_ACQUIRE))
        ca_trace_exit();
    real_quick_exit(status);
    __builtin_unreachable();
}

void *ca_libc_bind(const char *name, void *real)
{
    if (strcmp(name, "fork") == 0) {
        real_fork = (fork_fn)(uintptr_t)real;
        return FNPTR(w_fork);
    }
    if (strcmp(name, "_exit") == 0) {
        real_exit = (exit_fn)(uintptr_t)real;
        return FNPTR(w_exit);
    }
    if (strcmp(name, "_Exit") == 0) {
        real_Exit = (exit_fn)(uintptr_t)real;
        return FNPTR(w_Exit);
    }
    if (strcmp(name, "quick_exit") == 0) {
        real_quick_exit = (exit_fn)(uintptr_t)real;
        return FNPTR(w_quick_exit);
    }
    if (strcmp(name, "__cxa_at_quick_exit") == 0) {
        real_at_quick_exit = (at_quick_exit_fn)(uintptr_t)real;
        return FNPTR(w_cxa_at_quick_exit);
    }
    return NULL;
}

/* ---- the shim's dlsym ------------------------------------------------------------------------------
 *
 * With libcacheshim.so preloaded, a program's dlsym(libcuda, "cuGetProcAddress_v2") reaches
 * the shim's dlsym, which answers with the shim's own function: no binding for ld.so to
 * report. This wrapper maps what the shim answers by address (the shim's exported cu*
 * functions are in the table, see ca_symbols.c), so the program's calls into the shim are
 * traced as lib "shim". RTLD_DEFAULT and RTLD_NEXT depend on who calls dlsym (glibc looks
 * at the return address): those go to the shim by a tail call, as if the program had
 * called it, and are not mapped. */
typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn shim_dlsym;

__attribute__((optimize("O2", "optimize-sibling-calls"))) static void *w_dlsym(void *handle,
                                                                            const char *name)
{
    if (handle == RTLD_DEFAULT || handle == RTLD_NEXT)
        return shim_dlsym(handle, name);
    return ca_wrap_address(shim_dlsym(handle, name));
}

void *ca_dlsym_bind(void *real)
{
    shim_dlsym = (dlsym_fn)(uintptr_t)real;
    return FNPTR(w_dlsym);
}
