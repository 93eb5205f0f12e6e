/* One traced call as raw values (the record writer's unit, ca_trace.h), and the helpers the
 * wrappers fill it with. ca_format.c gives the values meaning through ca_desc(fn). */
#ifndef CA_REC_H
#define CA_REC_H

#include <stddef.h>
#include <string.h>

#include "ca_clock.h"
#include "ca_desc.h"

#define CA_MAX_OUTS 4
/* Most frames recorded per call site (CACHESHIM_TRACE_STACK, ca_stack.c). */
#define CA_STACK_MAX 16
/* Most bytes of a string argument recorded (a scope's name: the shim keeps 63 too). */
#define CA_STR_MAX 63

/* What a traced call fills and reads first is at the start, in one cache line. */
typedef struct {
    _Alignas(64) uint16_t fn;
    uint8_t lib, from;
    uint8_t nout;
    uint8_t out_idx[CA_MAX_OUTS]; /* parameter index of each recorded out-value */
    uint8_t nargs;                /* arg[] in use: the function's parameter count */
    uint8_t nstack;               /* call site: return addresses recorded in stack */
    uint8_t nstr;                 /* bytes of str in use, its 0 byte excluded */
    int32_t result;
    uint64_t t0, t1;              /* ca_clock_read: ticks until formatted, then ns */
    int64_t bytes;                /* device bytes after the call (Perfetto counter), or -1 */
    uint64_t out[CA_MAX_OUTS];
    uint64_t arg[CA_MAX_PARAMS];
    char str[CA_STR_MAX + 1];     /* a CA_K_STR argument's text (arg holds the pointer) */
    uint64_t stack[CA_STACK_MAX];
} ca_rec;

/* r's times, ticks of ca_clock_read, made CLOCK_MONOTONIC ns by the clock's state c. */
static inline void ca_rec_times_ns(ca_rec *r, const ca_clock_state *c)
{
    r->t0 = ca_clock_ns(c, r->t0);
    r->t1 = ca_clock_ns(c, r->t1);
}

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

_Static_assert(offsetof(ca_rec, bytes) + sizeof(int64_t) <= 64, "the first line");

#endif
