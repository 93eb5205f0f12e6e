/* The three output formats, one record at a time: a text line, a JSON line, a Chrome-trace
 * ("X" complete event, plus a "C" counter event after allocations and frees). Runs at flush
 * time, never inside the traced call. Numbers are printed with integer arithmetic or in the
 * auditor's own C locale, so the program's locale cannot change the output. */
#include "ca_format.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include "cs_options.h"

/* ---- a bounded string builder ------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t n, cap; /* cap includes room for the final '\n' */
} sb;

__attribute__((format(printf, 2, 3))) static void put(sb *b, const char *fmt, ...)
{
    if (b->n + 1 >= b->cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->p + b->n, b->cap - 1 - b->n, fmt, ap);
    va_end(ap);
    if (k > 0)
        b->n += (size_t)k < b->cap - 1 - b->n ? (size_t)k : b->cap - 2 - b->n;
}

/* Fast appenders for what every record has (names, integers, hex): formatting runs once
 * per traced call, and vsnprintf was most of the tracer's cost. */
static void put_str(sb *b, const char *str)
{
    size_t n = strlen(str);
    if (n > b->cap - 1 - b->n)
        n = b->cap - 1 - b->n;
    memcpy(b->p + b->n, str, n);
    b->n += n;
}

static void put_u64(sb *b, uint64_t v)
{
    char tmp[24];
    int i = sizeof tmp;
    while (v > UINT32_MAX) { /* 64-bit division only for the high digits */
        tmp[--i] = (char)('0' + v % 10);
        v /= 10;
    }
    uint32_t w = (uint32_t)v;
    do {
        tmp[--i] = (char)('0' + w % 10);
        w /= 10;
    } while (w);
    if ((size_t)(sizeof tmp - (size_t)i) > b->cap - 1 - b->n)
        return;
    memcpy(b->p + b->n, tmp + i, sizeof tmp - (size_t)i);
    b->n += sizeof tmp - (size_t)i;
}

static void put_i64(sb *b, int64_t v)
{
    if (v < 0) {
        put_str(b, "-");
        put_u64(b, (uint64_t)0 - (uint64_t)v);
    } else {
        put_u64(b, (uint64_t)v);
    }
}

static void put_hex(sb *b, uint64_t v)
{
    static const char digits[] = "0123456789abcdef";
    char tmp[20];
    int i = sizeof tmp;
    do {
        tmp[--i] = digits[v & 15];
        v >>= 4;
    } while (v);
    tmp[--i] = 'x';
    tmp[--i] = '0';
    if ((size_t)(sizeof tmp - (size_t)i) > b->cap - 1 - b->n)
        return;
    memcpy(b->p + b->n, tmp + i, sizeof tmp - (size_t)i);
    b->n += sizeof tmp - (size_t)i;
}

/* ns as "U.FFF" (digits = 3, for µs from ns) or "S.FFFFFFFFF" (digits = 9, s from ns). */
static void put_fixed(sb *b, uint64_t ns, int digits)
{
    uint64_t div = digits == 3 ? 1000u : 1000000000u;
    put_u64(b, ns / div);
    char frac[10];
    uint64_t f = ns % div;
    for (int i = digits - 1; i >= 0; i--, f /= 10)
        frac[i] = (char)('0' + f % 10);
    frac[digits] = '\0';
    put_str(b, ".");
    put_str(b, frac);
}

/* ---- names ---------------------------------------------------------------------------------- */

static const char *lib_name(int lib)
{
    static const char *const names[] = {"driver", "shim", "runtime"};
    return lib >= 0 && lib < 3 ? names[lib] : "?";
}

static const char *from_name(int from)
{
    static const char *const names[] = {"app", "shim", "cudart"};
    return from >= 0 && from < 3 ? names[from] : "?";
}

/* The runtime's codes that memory calls return; others print as a number. */
static const char *runtime_result_name(int code)
{
    switch (code) {
    case 0: return "cudaSuccess";
    case 1: return "cudaErrorInvalidValue";
    case 2: return "cudaErrorMemoryAllocation";
    case 3: return "cudaErrorInitializationError";
    case 4: return "cudaErrorCudartUnloading";
    case 35: return "cudaErrorInsufficientDriver";
    case 100: return "cudaErrorNoDevice";
    case 101: return "cudaErrorInvalidDevice";
    case 400: return "cudaErrorInvalidResourceHandle";
    case 801: return "cudaErrorNotSupported";
    case 999: return "cudaErrorUnknown";
    default: return NULL;
    }
}

static const char *result_name(const ca_rec *r)
{
    return r->lib == CA_LIB_RUNTIME ? runtime_result_name(r->result) : ca_result_name(r->result);
}

/* ---- decoding memory-related values ----------------------------------------------------------- */

typedef struct {
    uint64_t bit;
    const char *name;
} flag_bit;

/* Flag words by function-name prefix (parameters named flags, any case). */
static const struct {
    const char *prefix;
    const char *zero;
    flag_bit bits[5];
} flag_sets[] = {
    {"cuStreamCreate", "CU_STREAM_DEFAULT", {{1, "CU_STREAM_NON_BLOCKING"}}},
    {"cuMemHostAlloc", "0",
     {{1, "CU_MEMHOSTALLOC_PORTABLE"}, {2, "CU_MEMHOSTALLOC_DEVICEMAP"},
      {4, "CU_MEMHOSTALLOC_WRITECOMBINED"}}},
    {"cuMemHostRegister", "0",
     {{1, "CU_MEMHOSTREGISTER_PORTABLE"}, {2, "CU_MEMHOSTREGISTER_DEVICEMAP"},
      {4, "CU_MEMHOSTREGISTER_IOMEMORY"}, {8, "CU_MEMHOSTREGISTER_READ_ONLY"}}},
    {"cuMemAllocManaged", "0",
     {{1, "CU_MEM_ATTACH_GLOBAL"}, {2, "CU_MEM_ATTACH_HOST"}, {4, "CU_MEM_ATTACH_SINGLE"}}},
    {"cuEventCreate", "CU_EVENT_DEFAULT",
     {{1, "CU_EVENT_BLOCKING_SYNC"}, {2, "CU_EVENT_DISABLE_TIMING"},
      {4, "CU_EVENT_INTERPROCESS"}}},
};

static int is_flags_param(const char *name)
{
    return strcmp(name, "flags") == 0 || strcmp(name, "Flags") == 0;
}

/* "A|B|0x40" into out; 0 when the function has no known flag word. */
static int decode_flags(const char *fn, uint64_t v, char *out, size_t cap)
{
    for (size_t i = 0; i < sizeof flag_sets / sizeof flag_sets[0]; i++) {
        if (strncmp(fn, flag_sets[i].prefix, strlen(flag_sets[i].prefix)) != 0)
            continue;
        if (v == 0) {
            snprintf(out, cap, "%s", flag_sets[i].zero);
            return 1;
        }
        size_t o = 0;
        for (int k = 0; k < 5 && flag_sets[i].bits[k].name; k++) {
            if (v & flag_sets[i].bits[k].bit) {
                int w = snprintf(out + o, cap - o, "%s%s", o ? "|" : "", flag_sets[i].bits[k].name);
                if (w > 0 && (size_t)w < cap - o)
                    o += (size_t)w;
                v &= ~flag_sets[i].bits[k].bit;
            }
        }
        if (v)
            snprintf(out + o, cap - o, "%s0x%" PRIx64, o ? "|" : "", v);
        return 1;
    }
    return 0;
}

/* The special stream handles of cuda.h. */
static const char *stream_name(const char *param, uint64_t v)
{
    if (strcmp(param, "hStream") != 0 && strcmp(param, "stream") != 0 &&
        strcmp(param, "hstream") != 0)
        return NULL;
    switch (v) {
    case 0: return "default stream (NULL)";
    case 1: return "CU_STREAM_LEGACY";
    case 2: return "CU_STREAM_PER_THREAD";
    default: return NULL;
    }
}

static int is_size_name(const char *name)
{
    return strstr(name, "size") || strstr(name, "Size") || strstr(name, "bytes") ||
           strstr(name, "Bytes") || strcmp(name, "free") == 0 || strcmp(name, "total") == 0 ||
           strstr(name, "itch");
}

/* ---- one value ------------------------------------------------------------------------------ */

typedef struct {
    int kind, size, is_signed, hex;
} vtype;

/* The value as text; JSON gets numbers bare and everything else as a string. */
static void put_value(sb *b, vtype t, uint64_t v, int json)
{
    const char *q = json ? "\"" : "";
    if (t.kind == CA_K_RECORD || t.kind == CA_K_UNION) {
        put(b, "%s{...}%s", q, q);
    } else if (t.kind == CA_K_PTR || t.hex) {
        put_str(b, q);
        put_hex(b, v);
        put_str(b, q);
    } else if (t.kind == CA_K_REAL) {
        double d;
        if (t.size == 4) {
            float f;
            memcpy(&f, &v, sizeof f);
            d = f;
        } else {
            memcpy(&d, &v, sizeof d);
        }
        if (isfinite(d))
            put(b, "%.9g", d);
        else
            put(b, "\"%g\"", d);
    } else if (t.is_signed || (t.size == 4 && t.kind == CA_K_INT && !t.hex && t.is_signed)) {
        int64_t s = t.size == 1 ? (int8_t)v : t.size == 2 ? (int16_t)v
                  : t.size == 4 ? (int32_t)v : (int64_t)v;
        put_i64(b, s);
    } else {
        put_u64(b, v);
    }
}

/* Decoded extras after a value: sizes, flags, stream handles. In text: " (...)". In JSON:
 * an extra key NAME_decoded. */
static void put_decoded(sb *b, const char *fn, const char *name, vtype t, uint64_t v, int json)
{
    char text[256];
    const char *s = NULL;
    if (t.kind == CA_K_PTR) {
        s = stream_name(name, v);
    } else if (is_flags_param(name) && decode_flags(fn, v, text, sizeof text)) {
        s = text;
    } else if (!json && t.kind == CA_K_INT && t.size == 8 && !t.hex && v >= 1024 &&
               is_size_name(name)) {
        cs_bytes_format(v, text, sizeof text);
        s = text;
    }
    if (!s)
        return;
    if (json)
        put(b, ",\"%s_decoded\":\"%s\"", name, s);
    else
        put(b, " (%s)", s);
}

static vtype arg_type(const ca_param *p)
{
    return (vtype){p->kind, p->size, p->is_signed, p->hex};
}

static vtype out_type(const ca_param *p)
{
    /* int * out-values (attributes, counts) are signed; the rest unsigned. */
    return (vtype){p->out_kind, p->out_size,
                   p->out_kind == CA_K_INT && p->out_size == 4 && !p->hex, p->hex};
}

/* ---- the formats ------------------------------------------------------------------------------ */

static void put_args(sb *b, const ca_fn_desc *d, const ca_rec *r, int json)
{
    for (int i = 0; i < d->nparams; i++) {
        const ca_param *p = &d->params[i];
        put_str(b, i ? (json ? ",\"" : ", ") : (json ? "\"" : ""));
        put_str(b, p->name);
        put_str(b, json ? "\":" : "=");
        put_value(b, arg_type(p), r->arg[i], json);
        put_decoded(b, d->name, p->name, arg_type(p), r->arg[i], json);
    }
}

static void put_outs(sb *b, const ca_fn_desc *d, const ca_rec *r, int json)
{
    for (int i = 0; i < r->nout; i++) {
        const ca_param *p = &d->params[r->out_idx[i]];
        put_str(b, json ? (i ? ",\"" : "\"") : ", *");
        put_str(b, p->name);
        put_str(b, json ? "\":" : "=");
        put_value(b, out_type(p), r->out[i], json);
        put_decoded(b, d->name, p->name, out_type(p), r->out[i], json);
    }
}

static void put_result_json(sb *b, const ca_rec *r, const char *key)
{
    const char *rn = result_name(r);
    put_str(b, "\"");
    put_str(b, key);
    put_str(b, rn ? "\":\"" : "\":null");
    if (rn) {
        put_str(b, rn);
        put_str(b, "\"");
    }
}

size_t ca_format_rec(const ca_fmt_ctx *c, const ca_rec *r, long tid, char *buf, size_t cap)
{
    sb b = {buf, 0, cap};
    const ca_fn_desc *d = ca_desc(r->fn);
    uint64_t t = r->t0 >= c->t_origin ? r->t0 - c->t_origin : 0;
    uint64_t dur = r->t1 >= r->t0 ? r->t1 - r->t0 : 0;
    switch (c->format) {
    case CS_TRACE_JSONL:
        put_str(&b, "{\"pid\":");
        put_i64(&b, c->pid);
        put_str(&b, ",\"tid\":");
        put_i64(&b, tid);
        put_str(&b, ",\"ts_ns\":");
        put_u64(&b, t);
        put_str(&b, ",\"dur_ns\":");
        put_u64(&b, dur);
        put_str(&b, ",\"lib\":\"");
        put_str(&b, lib_name(r->lib));
        put_str(&b, "\",\"from\":\"");
        put_str(&b, from_name(r->from));
        put_str(&b, "\",\"name\":\"");
        put_str(&b, d->name);
        put_str(&b, "\",\"args\":{");
        put_args(&b, d, r, 1);
        put_str(&b, "},\"out\":{");
        put_outs(&b, d, r, 1);
        put_str(&b, "},\"result\":");
        put_i64(&b, r->result);
        put_str(&b, ",");
        put_result_json(&b, r, "result_name");
        put_str(&b, "}");
        break;
    case CS_TRACE_PERFETTO:
        put_str(&b, "{\"name\":\"");
        put_str(&b, d->name);
        put_str(&b, "\",\"cat\":\"");
        put_str(&b, lib_name(r->lib));
        put_str(&b, "\",\"ph\":\"X\",\"ts\":");
        put_fixed(&b, t, 3);
        put_str(&b, ",\"dur\":");
        put_fixed(&b, dur, 3);
        put_str(&b, ",\"pid\":");
        put_i64(&b, c->pid);
        put_str(&b, ",\"tid\":");
        put_i64(&b, tid);
        put_str(&b, ",\"args\":{\"from\":\"");
        put_str(&b, from_name(r->from));
        put_str(&b, "\",");
        put_result_json(&b, r, "result");
        put_str(&b, ",\"args\":{");
        put_args(&b, d, r, 1);
        put_str(&b, "},\"out\":{");
        put_outs(&b, d, r, 1);
        put_str(&b, "}}}");
        return b.n; /* the writer puts the separators between events */
    default: {
        put_str(&b, "[Intercepted] ");
        put_str(&b, d->name);
        put_str(&b, "(");
        put_args(&b, d, r, 0);
        put_str(&b, ") = ");
        const char *rn = result_name(r);
        if (rn)
            put_str(&b, rn);
        else
            put_i64(&b, r->result);
        put_outs(&b, d, r, 0);
        put_str(&b, " [");
        put_str(&b, lib_name(r->lib));
        put_str(&b, ", from ");
        put_str(&b, from_name(r->from));
        put_str(&b, ", pid ");
        put_i64(&b, c->pid);
        put_str(&b, ", tid ");
        put_i64(&b, tid);
        put_str(&b, ", at ");
        put_fixed(&b, t, 9);
        put_str(&b, " s, ");
        put_fixed(&b, dur, 3);
        put_str(&b, " us]");
        break;
    }
    }
    b.p[b.n++] = '\n'; /* put always leaves room for it */
    return b.n;
}

size_t ca_format_counter(const ca_fmt_ctx *c, const ca_rec *r, char *buf, size_t cap)
{
    sb b = {buf, 0, cap};
    uint64_t t = r->t1 >= c->t_origin ? r->t1 - c->t_origin : 0;
    put(&b, "{\"name\":\"device bytes\",\"ph\":\"C\",\"ts\":%" PRIu64 ".%03u,\"pid\":%d,"
            "\"args\":{\"%s\":%" PRId64 "}}",
        t / 1000, (unsigned)(t % 1000), c->pid, lib_name(r->lib), r->bytes);
    return b.n;
}
