/* The tracer (libcacheaudit.so): what its layers share.
 *
 *   ca_audit.c    the rtld-audit entry points (la_*): which objects are watched, which
 *                 bindings get a wrapper, the address -> wrapper map for cuGetProcAddress
 *   ca_wrappers.c (generated from cuda.h by scripts/gen-audit-wrappers) one typed wrapper
 *                 per driver function and library, and the descriptor table
 *   ca_runtime.c  the hand-written wrappers of cudart's memory entry points, and fork
 *   ca_trace.c    per-thread record buffers, the output file, flushing (full, fork, exit)
 *   ca_format.c   one record -> text line, JSON line or Chrome-trace event
 *
 * A wrapper fills one record (ca_rec) of its thread's buffer with raw values; all
 * formatting happens at flush time, outside the traced call. */
#ifndef CA_INTERNAL_H
#define CA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ca_generated.h"

/* Which library the call went into. */
enum { CA_LIB_DRIVER = 0, CA_LIB_SHIM = 1, CA_LIB_RUNTIME = 2 };
/* Which object made the call (by return address). */
enum { CA_FROM_APP = 0, CA_FROM_SHIM = 1, CA_FROM_CUDART = 2 };

/* GCC/Clang __builtin_classify_type classes (typeclass.h). */
enum {
    CA_K_INT = 1, CA_K_CHAR = 2, CA_K_ENUM = 3, CA_K_BOOL = 4, CA_K_PTR = 5, CA_K_REAL = 8,
    CA_K_RECORD = 12, CA_K_UNION = 13
};

/* What the compiler says about a parameter type; usable in static initialisers. */
#define CA_KIND_OF(x) __builtin_classify_type(x)
#define CA_SIGNED_OF(x) \
    _Generic((x), signed char: 1, short: 1, int: 1, long: 1, long long: 1, default: 0)

typedef struct {
    const char *name;
    unsigned char kind;
    unsigned short size;
    unsigned char is_signed;
    unsigned char hex; /* a device address: printed in hex although an integer */
    unsigned char out_kind; /* a T * whose *value is recorded after a successful call: T's
                             * kind (0: not recorded) */
    unsigned short out_size; /* sizeof(T) */
} ca_param;

typedef struct {
    const char *name;
    unsigned char nparams;
    const ca_param *params;
} ca_fn_desc;

/* The seven runtime entry points (and their _ptsz forms) follow the generated ones. */
enum {
    CA_RT_FIRST = CA_GEN_COUNT,
    CA_RT_cudaMalloc = CA_RT_FIRST, CA_RT_cudaFree, CA_RT_cudaMallocAsync,
    CA_RT_cudaMallocAsync_ptsz, CA_RT_cudaFreeAsync, CA_RT_cudaFreeAsync_ptsz,
    CA_RT_cudaMallocHost, CA_RT_cudaFreeHost, CA_RT_cudaMemGetInfo,
    CA_FN_COUNT
};

#define CA_MAX_OUTS 4
/* Most frames recorded per call site (CACHESHIM_TRACE_STACK, ca_stack.c). */
#define CA_STACK_MAX 16

/* One traced call. Raw values only; ca_format.c gives them meaning through ca_desc(fn). */
typedef struct {
    uint16_t fn;
    uint8_t lib, from;
    uint8_t nout;
    uint8_t out_idx[CA_MAX_OUTS]; /* parameter index of each recorded out-value */
    int32_t result;
    uint64_t t0, t1;              /* CLOCK_MONOTONIC ns */
    int64_t bytes;                /* device bytes after the call (Perfetto counter), or -1 */
    uint64_t out[CA_MAX_OUTS];
    uint64_t arg[CA_MAX_PARAMS];
    uint8_t nstack;               /* call site: return addresses recorded in stack */
    uint64_t stack[CA_STACK_MAX];
} ca_rec;

extern const ca_fn_desc ca_gen_desc[CA_GEN_COUNT];
extern void *const ca_gen_wrappers[2][CA_GEN_COUNT];
/* The real function behind each wrapper, per library (driver, shim). */
extern void *ca_real[2][CA_GEN_COUNT];

const ca_fn_desc *ca_desc(unsigned fn);
/* "CUDA_SUCCESS" ... ; NULL for a code cuda.h does not name. */
const char *ca_result_name(int code);

/* ---- recording (ca_trace.c): the wrappers' side ------------------------------------------ */

/* A record to fill for a call of fn into lib, or NULL when this call is not traced (filtered
 * out, tracing closed, out of memory). ret: the caller's return address. */
ca_rec *ca_begin(unsigned fn, int lib, void *ret);
void ca_started(ca_rec *r);
void ca_stopped(ca_rec *r);
void ca_end(ca_rec *r, int result);

static inline uint64_t ca_raw(const void *v, size_t n, int kind)
{
    uint64_t u = 0;
    if (kind != CA_K_RECORD && kind != CA_K_UNION && n <= sizeof u)
        memcpy(&u, v, n); /* little-endian: the low bytes */
    return u;
}

/* Any argument as 64 raw bits (structures passed by value: 0; they are printed as {...}). */
#define CA_RAW(x) \
    __extension__({ \
        __typeof__(x) ca_v_ = (x); \
        ca_raw(&ca_v_, sizeof ca_v_, CA_KIND_OF(ca_v_)); \
    })

static inline void ca_set_out(ca_rec *r, int k, uint64_t v)
{
    if (r->nout < CA_MAX_OUTS) {
        r->out_idx[r->nout] = (uint8_t)k;
        r->out[r->nout++] = v;
    }
}

/* *p after the call, for scalar pointees (the generator passes only non-const T *). */
#define CA_OUT(r, k, p) \
    do { \
        if ((p) != NULL && CA_KIND_OF(*(p)) != CA_K_RECORD && CA_KIND_OF(*(p)) != CA_K_UNION && \
            sizeof *(p) <= 8) \
            ca_set_out((r), (k), ca_raw((p), sizeof *(p), CA_KIND_OF(*(p)))); \
    } while (0)

/* ---- the audit layer (ca_audit.c) --------------------------------------------------------- */

/* cuGetProcAddress(_v2) found *pfn: swap in our wrapper for a watched function. */
void ca_after_proc_address(int result, void **pfn);
/* The wrapper of the function at address p (libcuda's or the shim's export), else p. */
void *ca_wrap_address(void *p);
/* Which object holds the code at ret. */
int ca_from_of(const void *ret);
/* Is fn traced (filter)? Filled by ca_trace_init. */
extern unsigned char ca_traced[CA_FN_COUNT];
int ca_lookup_gen(const char *name);

/* ---- runtime wrappers (ca_runtime.c) -------------------------------------------------------- */

/* The wrapper for a cudart symbol, or NULL; remembers real. */
void *ca_runtime_bind(const char *name, void *real);
/* The wrapper for libc's fork; remembers real. */
void *ca_fork_bind(void *real);
/* The wrapper for libcacheshim.so's dlsym; remembers real. */
void *ca_dlsym_bind(void *real);

/* ---- output (ca_trace.c) ------------------------------------------------------------------ */

/* Reads the options (once), opens the output, computes ca_traced. */
void ca_trace_init(void);
/* For tests: trace to fd with the given format and filter instead of the options. */
void ca_trace_init_fd(int fd, int format, const char *filter);
/* Write every thread's records; with last, finish the file (exit). */
void ca_flush_all(int last);
/* fork: before (flush and hold the locks), after in the parent and in the child. */
void ca_fork_prepare(void);
void ca_fork_parent(void);
void ca_fork_child(void);

/* ---- formats (ca_format.c) ---------------------------------------------------------------- */

typedef struct {
    int format;     /* CS_TRACE_TEXT, _JSONL, _PERFETTO */
    int pid;
    uint64_t t_origin; /* ns: times are printed relative to it */
} ca_fmt_ctx;

/* One record as text into buf (at most cap bytes, always ends in '\n' for text/jsonl);
 * returns the length. */
size_t ca_format_rec(const ca_fmt_ctx *c, const ca_rec *r, long tid, char *buf, size_t cap);
/* Perfetto: the counter event after r, or 0 bytes when r changed no counter. */
size_t ca_format_counter(const ca_fmt_ctx *c, const ca_rec *r, char *buf, size_t cap);
/* The name of a library / caller for the output. */
const char *ca_lib_name(int lib);
const char *ca_from_name(int from);
/* Longest text of one record. */
#define CA_REC_TEXT_MAX 4096

#endif
