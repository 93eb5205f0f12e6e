/* The three output formats, one record at a time: a text line, a JSON line, a Chrome-trace
 * ("X" complete event, and a "C" counter event after allocations and frees; a scope's
 * begin and end as a "B" and an "E" event, a duration slice on its thread). Runs on the
 * calling thread when a traced call returns, so it is built for speed: what a function's
 * records share (its name, each parameter's key with its separator, how its value is printed
 * and decoded) is worked out once per function (a plan), and a record is then a run of
 * copies and number conversions. In a real program most of a record's cost is reading this
 * code again from memory at each call (the program's own work between calls pushes it out of
 * the nearest caches), so the rare cases are kept out of line. Numbers are printed with
 * integer arithmetic, so the program's locale cannot change the output; floating point
 * (rare) through snprintf in the auditor's own C locale. */
#include "ca_format.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "cs_options.h"

/* ---- writing: each record is checked once against the buffer (plan_max), then written
 * without further checks ------------------------------------------------------------------ */

/* Longer copies: the C library's memcpy (the compiler would inline a rep movs, slow to
 * start, for a copy of unknown length). */
__attribute__((noinline)) static void copy_long(char *o, const char *s, size_t n)
{
    memcpy(o, s, n);
}

/* Keys and names are short: two overlapping moves copy 4 to 32 bytes. */
static inline char *w_mem(char *o, const char *s, size_t n)
{
    uint64_t a, b, c, d;
    uint32_t x, y;
    if (n >= 8 && n <= 16) {
        memcpy(&a, s, 8);
        memcpy(&b, s + n - 8, 8);
        memcpy(o, &a, 8);
        memcpy(o + n - 8, &b, 8);
    } else if (n > 16 && n <= 32) {
        memcpy(&a, s, 8);
        memcpy(&b, s + 8, 8);
        memcpy(&c, s + n - 16, 8);
        memcpy(&d, s + n - 8, 8);
        memcpy(o, &a, 8);
        memcpy(o + 8, &b, 8);
        memcpy(o + n - 16, &c, 8);
        memcpy(o + n - 8, &d, 8);
    } else if (n >= 4 && n < 8) {
        memcpy(&x, s, 4);
        memcpy(&y, s + n - 4, 4);
        memcpy(o, &x, 4);
        memcpy(o + n - 4, &y, 4);
    } else if (n < 4) {
        for (size_t i = 0; i < n; i++)
            o[i] = s[i];
    } else {
        copy_long(o, s, n);
    }
    return o + n;
}

/* A literal: its length is known, so the copy is a few moves. */
#define W_LIT(o, s) w_mem((o), (s), sizeof(s) - 1)

/* Any other length: out of line, so that each caller stays small (the code of a traced
 * call's record is read from memory at each call of a program that does much else). */
__attribute__((noinline)) static char *w_var(char *o, const char *s, size_t n)
{
    return w_mem(o, s, n);
}

/* The slack a record's buffer keeps past its longest text (plan_max), and the padding
 * after the pieces of a plan: w_piece copies PIECE_PAD bytes whatever the length. */
#define PIECE_PAD 64

/* A piece of a plan, or another text followed by at least PIECE_PAD readable bytes: short
 * ones (nearly all) in a few 16-byte moves without a test of their length; the bytes past
 * n land in the buffer's slack and are written over next. */
static inline char *w_piece(char *o, const char *s, size_t n)
{
    if (__builtin_expect(n > PIECE_PAD, 0))
        return w_var(o, s, n);
    memcpy(o, s, PIECE_PAD);
    return o + n;
}

static char *w_str(char *o, const char *s) { return w_var(o, s, strlen(s)); }

static const char pairs[] = "00010203040506070809101112131415161718192021222324252627282930313233"
                            "34353637383940414243444546474849505152535455565758596061626364656667"
                            "6869707172737475767778798081828384858687888990919293949596979899";

static const uint64_t pow10[20] = {
    1u, 10u, 100u, 1000u, 10000u, 100000u, 1000000u, 10000000u, 100000000u, 1000000000u,
    10000000000u, 100000000000u, 1000000000000u, 10000000000000u, 100000000000000u,
    1000000000000000u, 10000000000000000u, 100000000000000000u, 1000000000000000000u,
    10000000000000000000u};

/* The n (1..8) low decimal digits of v < 10^8, ending at end, two at a time in 32 bits. */
static inline void w_digits(char *end, uint32_t v, int n)
{
    for (; n >= 2; n -= 2) {
        end -= 2;
        memcpy(end, pairs + 2 * (v % 100), 2);
        v /= 100;
    }
    if (n)
        end[-1] = (char)('0' + v);
}

static char *w_u64(char *o, uint64_t v)
{
    if (v < 100) {
        if (v < 10) {
            *o = (char)('0' + v);
            return o + 1;
        }
        memcpy(o, pairs + 2 * v, 2);
        return o + 2;
    }
    /* digits: about log10 from the bit length (1233 / 4096 ~ log10(2)), one compare to
     * correct it */
    int t = ((64 - __builtin_clzll(v)) * 1233) >> 12;
    int n = t + 1 - (v < pow10[t]);
    char *end = o + n;
    if (n > 8) { /* the low 8 digits, then the rest (at most 12: again 8, then 4) */
        w_digits(end, (uint32_t)(v % 100000000u), 8);
        v /= 100000000u;
        if (n > 16) {
            w_digits(end - 8, (uint32_t)(v % 100000000u), 8);
            v /= 100000000u;
        }
        n = n > 16 ? n - 16 : n - 8;
        w_digits(o + n, (uint32_t)v, n);
        return end;
    }
    w_digits(end, (uint32_t)v, n);
    return end;
}

static char *w_i64(char *o, int64_t v)
{
    if (v < 0) {
        *o++ = '-';
        return w_u64(o, (uint64_t)0 - (uint64_t)v);
    }
    return w_u64(o, (uint64_t)v);
}

/* The 8 hex digits of x as ASCII, the most significant in the lowest byte: each nibble
 * spread to a byte, then '0'-'9' or 'a'-'f' added, without a branch. */
static inline uint64_t hex8(uint32_t x)
{
    uint64_t v = x;
    v = (v | v << 16) & 0x0000ffff0000ffffu;
    v = (v | v << 8) & 0x00ff00ff00ff00ffu;
    v = (v | v << 4) & 0x0f0f0f0f0f0f0f0fu; /* byte i: nibble i */
    uint64_t letter = ((v + 0x0606060606060606u) >> 4) & 0x0101010101010101u; /* nibble > 9 */
    return __builtin_bswap64(v + 0x3030303030303030u + letter * ('a' - '0' - 10));
}

static char *w_hex(char *o, uint64_t v)
{
    if (v < 16) { /* 0 (NULL), flags */
        memcpy(o, "0x", 2);
        o[2] = "0123456789abcdef"[v];
        return o + 3;
    }
    char d[32]; /* 16 digits, then what the copy below may read past them */
    uint64_t hi = hex8((uint32_t)(v >> 32)), lo = hex8((uint32_t)v);
    memcpy(d, &hi, 8);
    memcpy(d + 8, &lo, 8);
    memset(d + 16, 0, 16);
    int n = (67 - __builtin_clzll(v)) / 4; /* digits */
    o[0] = '0';
    o[1] = 'x';
    memcpy(o + 2, d + 16 - n, 16); /* the n digits (and slack) */
    return o + 2 + n;
}

/* ns as "U.FFF" (digits = 3, for µs from ns) or "S.FFFFFFFFF" (digits = 9, s from ns). */
static char *w_fixed(char *o, uint64_t ns, int digits)
{
    uint64_t div = digits == 3 ? 1000u : 1000000000u;
    o = w_u64(o, ns / div);
    *o = '.';
    uint32_t f = (uint32_t)(ns % div);
    for (int i = digits; i >= 1; i--, f /= 10)
        o[i] = (char)('0' + f % 10);
    return o + digits + 1;
}

/* At most n characters of printf output (the rare cases: floating point, decoded flags). */
__attribute__((format(printf, 3, 4))) static char *w_fmt(char *o, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(o, n + 1, fmt, ap);
    va_end(ap);
    return k <= 0 ? o : o + ((size_t)k < n ? (size_t)k : n);
}

/* ---- names ---------------------------------------------------------------------------------- */

/* Padded for w_piece: CA_LIB_* and CA_FROM_* index them. */
static const char lib_names[3][PIECE_PAD] = {"driver", "shim", "runtime"};
static const uint8_t lib_lens[3] = {6, 4, 7};
static const char from_names[3][PIECE_PAD] = {"app", "shim", "cudart"};
static const uint8_t from_lens[3] = {3, 4, 6};

static char *w_lib(char *o, int lib)
{
    return lib >= 0 && lib < 3 ? w_piece(o, lib_names[lib], lib_lens[lib]) : W_LIT(o, "?");
}

static char *w_from(char *o, int from)
{
    return from >= 0 && from < 3 ? w_piece(o, from_names[from], from_lens[from]) : W_LIT(o, "?");
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

/* CUDA_SUCCESS: most calls, written without a look-up. */
static int is_success(const ca_rec *r)
{
    return r->result == 0 && r->lib != CA_LIB_RUNTIME && r->fn < CA_SCOPE_FIRST;
}

static const char *result_name(const ca_rec *r)
{
    if (r->fn >= CA_SCOPE_FIRST)
        return NULL; /* 0 or -1, printed as numbers */
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
    {"cacheshim_scope_begin", "0", {{1, "CACHESHIM_SCOPE_RELEASE"}}},
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

/* Is the parameter a stream (its special handles are decoded)? */
static int is_stream_param(const char *param)
{
    return strcmp(param, "hStream") == 0 || strcmp(param, "stream") == 0 ||
           strcmp(param, "hstream") == 0;
}

/* The special stream handles of cuda.h. */
static const char *stream_name(uint64_t v)
{
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

/* ---- a function's plan ----------------------------------------------------------------------- */

/* How a value is printed. */
enum { V_UNSIGNED, V_SIGNED, V_HEX, V_REAL, V_RECORD, V_STR };
/* What is decoded after it. */
enum { DEC_NONE, DEC_STREAM, DEC_FLAGS, DEC_SIZE };
/* The most a decoded value adds: ,"NAME_decoded":"TEXT" with TEXT cut to DEC_TEXT_MAX. */
#define DEC_TEXT_MAX 120
/* The most one printed value takes ("0x" and 16 digits, 20 digits and a sign, %.9g). */
#define VALUE_MAX 32
/* The most a call site takes: ,"stack":[ and "0x" with 16 digits, quoted, per frame. */
#define STACK_TEXT_MAX (16 + CA_STACK_MAX * 21)
/* The most a string value takes: quoted, each byte escaped as \u00XX at worst. */
#define STR_TEXT_MAX (2 + 6 * CA_STR_MAX)

typedef struct {
    const char *json_key;  /* ,"name": (an argument after the first; else "name":) */
    const char *text_key;  /* , name= (argument after the first), name= (first), , *name= (out) */
    const char *json_dec;  /* ,"name_decoded":" */
    uint64_t mask;         /* the value's bits (V_UNSIGNED, V_SIGNED: sign-extended) */
    uint8_t json_len, text_len, dec_len;
    uint8_t v, size, dec;
} vplan;

typedef struct {
    const ca_fn_desc *d;
    size_t max;            /* the longest record of this function, any format */
    vplan arg[CA_MAX_PARAMS], out[CA_MAX_PARAMS];
    const char *text_head; /* [Intercepted] NAME( */
    const char *json_name; /* NAME","args":{ */
    const char *pf_head;   /* {"name":"NAME","cat":" */
    size_t text_head_len, json_name_len, pf_head_len;
    char arena[];
} plan;

static plan *g_plans[CA_FN_COUNT]; /* atomic; built at a function's first record */

static vplan value_plan(const ca_fn_desc *d, const ca_param *p, int kind, int size, int is_signed,
                        int hex, const char *json_sep, const char *text_sep, char **arena)
{
    vplan v = {.size = (uint8_t)size, .dec = DEC_NONE};
    v.mask = size > 0 && size < 8 ? ((uint64_t)1 << (8 * size)) - 1 : ~(uint64_t)0;
    if (kind == CA_K_RECORD || kind == CA_K_UNION)
        v.v = V_RECORD;
    else if (kind == CA_K_STR)
        v.v = V_STR;
    else if (kind == CA_K_PTR || hex)
        v.v = V_HEX;
    else if (kind == CA_K_REAL)
        v.v = V_REAL;
    else
        v.v = is_signed ? V_SIGNED : V_UNSIGNED;
    char tmp[256];
    if (kind == CA_K_PTR && is_stream_param(p->name))
        v.dec = DEC_STREAM;
    else if (is_flags_param(p->name) && decode_flags(d->name, 0, tmp, sizeof tmp))
        v.dec = DEC_FLAGS;
    else if (kind == CA_K_INT && size == 8 && !hex && is_size_name(p->name))
        v.dec = DEC_SIZE;
    v.json_key = *arena;
    v.json_len = (uint8_t)sprintf(*arena, "%s\"%s\":", json_sep, p->name);
    *arena += v.json_len + 1;
    v.text_key = *arena;
    v.text_len = (uint8_t)sprintf(*arena, "%s%s=", text_sep, p->name);
    *arena += v.text_len + 1;
    v.json_dec = *arena;
    v.dec_len = (uint8_t)sprintf(*arena, ",\"%s_decoded\":\"", p->name);
    *arena += v.dec_len + 1;
    return v;
}

static plan *plan_new(unsigned fn)
{
    const ca_fn_desc *d = ca_desc(fn);
    size_t need = 3 * (strlen(d->name) + 32);
    for (int i = 0; i < d->nparams; i++)
        need += 2 * (3 * strlen(d->params[i].name) + 32);
    plan *pl = calloc(1, sizeof *pl + need + PIECE_PAD); /* the pieces, then w_piece's pad */
    if (!pl)
        return NULL;
    char *a = pl->arena;
    pl->d = d;
    /* all but the values: pid, times, names, result, call site */
    pl->max = 400 + 2 * strlen(d->name) + STACK_TEXT_MAX + PIECE_PAD;
    for (int i = 0; i < d->nparams && i < CA_MAX_PARAMS; i++) {
        const ca_param *p = &d->params[i];
        /* each value: a separator, its key, the value, what is decoded */
        size_t one = strlen(p->name) + 8 + VALUE_MAX, dec = strlen(p->name) + 16 + DEC_TEXT_MAX;
        pl->arg[i] = value_plan(d, p, p->kind, p->size, p->is_signed, p->hex, i ? "," : "",
                                i ? ", " : "", &a);
        pl->max += one + (pl->arg[i].dec ? dec : 0) + (p->kind == CA_K_STR ? STR_TEXT_MAX : 0);
        /* int * out-values (attributes, counts) are signed; the rest unsigned. */
        if (p->out_kind) {
            pl->out[i] = value_plan(d, p, p->out_kind, p->out_size,
                                    p->out_kind == CA_K_INT && p->out_size == 4 && !p->hex,
                                    p->hex, "", ", *", &a);
            pl->max += one + (pl->out[i].dec ? dec : 0);
        }
    }
    pl->text_head = a;
    pl->text_head_len = (size_t)sprintf(a, "[Intercepted] %s(", d->name);
    a += pl->text_head_len + 1;
    pl->json_name = a;
    pl->json_name_len = (size_t)sprintf(a, "%s\",\"args\":{", d->name);
    a += pl->json_name_len + 1;
    pl->pf_head = a;
    pl->pf_head_len = (size_t)sprintf(a, "{\"name\":\"%s\",\"cat\":\"", d->name);
    return pl;
}

static const plan *plan_of(unsigned fn)
{
    plan *pl = __atomic_load_n(&g_plans[fn], __ATOMIC_ACQUIRE);
    if (pl)
        return pl;
    plan *mine = plan_new(fn), *none = NULL;
    if (!mine)
        return NULL;
    if (__atomic_compare_exchange_n(&g_plans[fn], &none, mine, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
        return mine;
    free(mine); /* another thread's is there */
    return none;
}

/* ---- one value ------------------------------------------------------------------------------ */

/* A recorded string, quoted and escaped as JSON (in every format): valid UTF-8 is kept,
 * other bytes (a name cut in a character, Latin-1) become '?'. A null pointer: null. */
static char *w_quoted(char *o, const char *str, uint64_t ptr)
{
    static const char hex[] = "0123456789abcdef";
    if (!ptr)
        return W_LIT(o, "null");
    *o++ = '"';
    for (const unsigned char *s = (const unsigned char *)str; *s;) {
        if (*s == '"' || *s == '\\') {
            *o++ = '\\';
            *o++ = (char)*s++;
        } else if (*s < 0x20) {
            o = W_LIT(o, "\\u00");
            *o++ = hex[*s >> 4];
            *o++ = hex[*s++ & 15];
        } else if (*s < 0x80) {
            *o++ = (char)*s++;
        } else {
            int n = cs_utf8_len(s);
            if (n == 0) {
                *o++ = '?';
                s++;
            }
            for (; n > 0; n--)
                *o++ = (char)*s++;
        }
    }
    *o++ = '"';
    return o;
}

/* The value; JSON gets numbers bare and everything else as a string. str: the recorded text
 * of a string value. */
/* The rarer values, out of line: strings, floating point, structures. */
__attribute__((noinline, cold)) static char *w_value_rare(char *o, const vplan *v, uint64_t x,
                                                          int json, const char *str)
{
    switch (v->v) {
    case V_STR:
        return w_quoted(o, str, x);
    case V_REAL: {
        double d;
        if (v->size == 4) {
            float f;
            memcpy(&f, &x, sizeof f);
            d = f;
        } else {
            memcpy(&d, &x, sizeof d);
        }
        return isfinite(d) ? w_fmt(o, VALUE_MAX, "%.9g", d) : w_fmt(o, VALUE_MAX, "\"%g\"", d);
    }
    default:
        return json ? W_LIT(o, "\"{...}\"") : W_LIT(o, "{...}");
    }
}

static char *w_value(char *o, const vplan *v, uint64_t x, int json, const char *str)
{
    switch (v->v) {
    case V_HEX:
        if (json)
            *o++ = '"';
        o = w_hex(o, x);
        if (json)
            *o++ = '"';
        return o;
    case V_UNSIGNED:
        return w_u64(o, x & v->mask);
    case V_SIGNED: { /* sign-extended from the value's top bit */
        uint64_t sign = v->mask ^ v->mask >> 1;
        return w_i64(o, (int64_t)(((x & v->mask) ^ sign) - sign));
    }
    default:
        return w_value_rare(o, v, x, json, str);
    }
}

/* Decoded extras after a value: sizes, flags, stream handles. In text: " (...)". In JSON:
 * an extra key NAME_decoded. */
__attribute__((noinline)) static char *w_decoded(char *o, const ca_fn_desc *d, const vplan *v,
                                                 uint64_t x, int json)
{
    char text[256];
    const char *s = NULL;
    if (v->dec == DEC_STREAM)
        s = stream_name(x);
    else if (v->dec == DEC_FLAGS && decode_flags(d->name, x, text, sizeof text))
        s = text;
    else if (v->dec == DEC_SIZE && !json && x >= 1024) {
        cs_bytes_format(x, text, sizeof text);
        s = text;
    }
    if (!s)
        return o;
    size_t n = strlen(s);
    n = n < DEC_TEXT_MAX ? n : DEC_TEXT_MAX;
    if (json) {
        o = w_piece(o, v->json_dec, v->dec_len);
        o = w_mem(o, s, n);
        *o++ = '"';
    } else {
        o = W_LIT(o, " (");
        o = w_mem(o, s, n);
        *o++ = ')';
    }
    return o;
}

/* ---- the formats ------------------------------------------------------------------------------ */

/* One value after its key, and what is decoded of it. */
static char *w_keyed(char *o, const plan *pl, const vplan *v, uint64_t x, int json,
                     const char *str)
{
    o = json ? w_piece(o, v->json_key, v->json_len) : w_piece(o, v->text_key, v->text_len);
    o = w_value(o, v, x, json, str);
    return v->dec ? w_decoded(o, pl->d, v, x, json) : o;
}

static char *w_args(char *o, const plan *pl, const ca_rec *r, int json)
{
    for (int i = 0; i < pl->d->nparams; i++) /* each key begins with its separator */
        o = w_keyed(o, pl, &pl->arg[i], r->arg[i], json, r->str);
    return o;
}

static char *w_outs(char *o, const plan *pl, const ca_rec *r, int json)
{
    for (int i = 0; i < r->nout; i++) {
        if (json && i) /* text keys begin with ", *" */
            *o++ = ',';
        o = w_keyed(o, pl, &pl->out[r->out_idx[i]], r->out[i], json, NULL);
    }
    return o;
}

static char *w_result_json(char *o, const ca_rec *r)
{
    if (is_success(r))
        return W_LIT(o, "\"CUDA_SUCCESS\"");
    const char *rn = result_name(r);
    if (!rn)
        return W_LIT(o, "null");
    *o++ = '"';
    o = w_str(o, rn);
    *o++ = '"';
    return o;
}

static char *w_result_text(char *o, const ca_rec *r)
{
    if (is_success(r))
        return W_LIT(o, "CUDA_SUCCESS");
    const char *rn = result_name(r);
    return rn ? w_str(o, rn) : w_i64(o, r->result);
}

/* JSON Lines: ,"stack":["0x..",...] when the call site was recorded (ca_stack.c). */
static char *w_stack(char *o, const ca_rec *r)
{
    if (!r->nstack)
        return o;
    o = W_LIT(o, ",\"stack\":[");
    for (unsigned i = 0; i < r->nstack; i++) {
        if (i)
            *o++ = ',';
        *o++ = '"';
        o = w_hex(o, r->stack[i]);
        *o++ = '"';
    }
    *o++ = ']';
    return o;
}

/* The piece with the pid and tid, the same in every record of a thread: made again after a
 * fork (a new pid and tid). */
static void make_ids(const ca_fmt_ctx *c, long tid, ca_fmt_ids *ids)
{
    static const char *const pid[] = {[CS_TRACE_TEXT] = ", pid ", [CS_TRACE_JSONL] = "{\"pid\":",
                                      [CS_TRACE_PERFETTO] = ",\"pid\":"};
    static const char *const tid_[] = {[CS_TRACE_TEXT] = ", tid ", [CS_TRACE_JSONL] = ",\"tid\":",
                                       [CS_TRACE_PERFETTO] = ",\"tid\":"};
    static const char *const next[] = {[CS_TRACE_TEXT] = ", at ", [CS_TRACE_JSONL] = ",\"ts_ns\":",
                                       [CS_TRACE_PERFETTO] = ",\"args\":{\"from\":\""};
    char *o = w_str(ids->text, pid[c->format]);
    o = w_i64(o, c->pid);
    o = w_str(o, tid_[c->format]);
    o = w_i64(o, tid);
    o = w_str(o, next[c->format]);
    ids->len = (uint8_t)(o - ids->text);
    ids->pid = c->pid;
    ids->tid = tid;
}

/* Perfetto: a scope opened (a "B" event at the begin call, named as the scope) or closed
 * (an "E" event at the end call's return), a duration slice on its thread. */
static char *w_scope_event(char *o, const ca_fmt_ctx *c, const ca_rec *r, const ca_fmt_ids *ids)
{
    int begin = r->fn == CA_SCOPE_begin;
    uint64_t t = begin ? r->t0 : r->t1;
    t = t >= c->t_origin ? t - c->t_origin : 0;
    o = W_LIT(o, "{\"name\":");
    o = begin ? w_quoted(o, r->str, r->arg[0]) : W_LIT(o, "\"cacheshim_scope_end\"");
    o = begin ? W_LIT(o, ",\"cat\":\"scope\",\"ph\":\"B\",\"ts\":")
              : W_LIT(o, ",\"cat\":\"scope\",\"ph\":\"E\",\"ts\":");
    o = w_fixed(o, t, 3);
    o = w_piece(o, ids->text, ids->len);
    o = w_from(o, r->from);
    if (begin) {
        o = W_LIT(o, "\",\"flags\":");
        o = w_u64(o, (uint32_t)r->arg[1]);
    } else {
        o = W_LIT(o, "\",\"result\":");
        o = w_i64(o, r->result);
    }
    return W_LIT(o, "}}");
}

size_t ca_format_rec(const ca_fmt_ctx *c, const ca_rec *r, long tid, ca_fmt_ids *ids, char *buf,
                     size_t cap)
{
    if (ids->len == 0 || ids->pid != c->pid || ids->tid != tid)
        make_ids(c, tid, ids);
    const plan *pl = plan_of(r->fn);
    uint64_t t = r->t0 >= c->t_origin ? r->t0 - c->t_origin : 0;
    uint64_t dur = r->t1 >= r->t0 ? r->t1 - r->t0 : 0;
    if (!pl || pl->max > cap) /* out of memory for the plan; never too long in practice */
        return 0;
    char *o = buf;
    switch (c->format) {
    case CS_TRACE_JSONL:
        o = w_piece(o, ids->text, ids->len);
        o = w_u64(o, t);
        o = W_LIT(o, ",\"dur_ns\":");
        o = w_u64(o, dur);
        o = W_LIT(o, ",\"lib\":\"");
        o = w_lib(o, r->lib);
        o = W_LIT(o, "\",\"from\":\"");
        o = w_from(o, r->from);
        o = W_LIT(o, "\",\"name\":\"");
        o = w_piece(o, pl->json_name, pl->json_name_len);
        o = w_args(o, pl, r, 1);
        o = W_LIT(o, "},\"out\":{");
        o = w_outs(o, pl, r, 1);
        o = W_LIT(o, "},\"result\":");
        o = w_i64(o, r->result);
        o = W_LIT(o, ",\"result_name\":");
        o = w_result_json(o, r);
        o = w_stack(o, r);
        *o++ = '}';
        break;
    case CS_TRACE_PERFETTO:
        if (r->fn >= CA_SCOPE_FIRST && r->result == 0) /* a failed call stays an "X" */
            return (size_t)(w_scope_event(o, c, r, ids) - buf);
        o = w_piece(o, pl->pf_head, pl->pf_head_len);
        o = w_lib(o, r->lib);
        o = W_LIT(o, "\",\"ph\":\"X\",\"ts\":");
        o = w_fixed(o, t, 3);
        o = W_LIT(o, ",\"dur\":");
        o = w_fixed(o, dur, 3);
        o = w_piece(o, ids->text, ids->len);
        o = w_from(o, r->from);
        o = W_LIT(o, "\",\"result\":");
        o = w_result_json(o, r);
        o = W_LIT(o, ",\"args\":{");
        o = w_args(o, pl, r, 1);
        o = W_LIT(o, "},\"out\":{");
        o = w_outs(o, pl, r, 1);
        o = W_LIT(o, "}}}");
        return (size_t)(o - buf); /* the writer puts the separators between events */
    default:
        o = w_piece(o, pl->text_head, pl->text_head_len);
        o = w_args(o, pl, r, 0);
        o = W_LIT(o, ") = ");
        o = w_result_text(o, r);
        o = w_outs(o, pl, r, 0);
        o = W_LIT(o, " [");
        o = w_lib(o, r->lib);
        o = W_LIT(o, ", from ");
        o = w_from(o, r->from);
        o = w_piece(o, ids->text, ids->len);
        o = w_fixed(o, t, 9);
        o = W_LIT(o, " s, ");
        o = w_fixed(o, dur, 3);
        o = W_LIT(o, " us]");
        break;
    }
    *o++ = '\n';
    return (size_t)(o - buf);
}

size_t ca_format_entry(const ca_fmt_ctx *c, const ca_rec *r, long tid, ca_fmt_ids *ids, char *buf)
{
    size_t n = ca_format_rec(c, r, tid, ids, buf, CA_REC_TEXT_MAX);
    if (n > 0 && c->format == CS_TRACE_PERFETTO) {
        buf[n++] = ',';
        buf[n++] = '\n';
        if (r->bytes >= 0) {
            n += ca_format_counter(c, r, buf + n, 256);
            buf[n++] = ',';
            buf[n++] = '\n';
        }
    }
    return n;
}

size_t ca_format_note(int format, const uint64_t *lost, const char *error, char *buf, size_t cap,
                      size_t *count)
{
    static const char pf_pre[] = "{\"name\":\"cacheshim: calls not written\",\"ph\":\"i\","
                                 "\"s\":\"g\",\"ts\":0,\"pid\":0,\"tid\":0,\"args\":{\"lost\":";
    static const char *const pre[] = {
        [CS_TRACE_TEXT] = "[cacheshim] ",
        [CS_TRACE_JSONL] = "{\"cacheshim_lost\":",
        [CS_TRACE_PERFETTO] = pf_pre,
    };
    static const char *const post[] = {
        [CS_TRACE_TEXT] = " calls not written: %s\n",
        [CS_TRACE_JSONL] = ",\"error\":\"%s\"}\n",
        [CS_TRACE_PERFETTO] = ",\"error\":\"%s\"}},\n",
    };
    /* JSON strings: the messages of strerror have no quotes or backslashes. */
    char tail[256], num[24] = "";
    snprintf(tail, sizeof tail, post[format], error);
    if (lost)
        snprintf(num, sizeof num, "%20" PRIu64, *lost);
    int n = snprintf(buf, cap, "%s%20s%s", pre[format], num, tail);
    *count = strlen(pre[format]);
    return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

const char *ca_format_array_end(const char *last, int dict, size_t *back)
{
    int comma = last && last[0] == ',' && last[1] == '\n';
    *back = comma ? 2 : 0;
    if (dict)
        return comma ? "\n]}\n" : "]}\n";
    return comma ? "\n]\n" : "]\n";
}

int ca_format_ready(unsigned fn)
{
    return plan_of(fn) != NULL;
}

size_t ca_format_counter(const ca_fmt_ctx *c, const ca_rec *r, char *buf, size_t cap)
{
    (void)cap; /* at most about 120 bytes */
    uint64_t t = r->t1 >= c->t_origin ? r->t1 - c->t_origin : 0;
    char *o = W_LIT(buf, "{\"name\":\"device bytes\",\"ph\":\"C\",\"ts\":");
    o = w_fixed(o, t, 3);
    o = W_LIT(o, ",\"pid\":");
    o = w_i64(o, c->pid);
    o = W_LIT(o, ",\"args\":{\"");
    o = w_lib(o, r->lib);
    o = W_LIT(o, "\":");
    o = w_i64(o, r->bytes);
    o = W_LIT(o, "}}");
    return (size_t)(o - buf);
}
