/* One JSON Lines record of libcacheaudit.so (docs/tracing.md) into an event. A strict JSON
 * parser for one object on one line, small because the record is flat: top-level scalars,
 * and "args"/"out" objects of scalars. Anything else valid JSON is skipped; anything invalid
 * is an error with its column. Which calls allocate and free, and which of their arguments
 * say the address and the size, follows the tracer's own counter (audit/ca_mem.c). */
#include "report.h"

#include <stdlib.h>
#include <string.h>

enum { J_STR, J_INT, J_NUM, J_NULL, J_BOOL, J_OBJECT, J_ARRAY };

typedef struct {
    int type;
    const char *s; /* J_STR: unescaped, NUL-terminated in place */
    size_t n;
    bool neg, big; /* J_INT: sign; magnitude beyond 64 bits */
    uint64_t u;    /* J_INT: magnitude */
} jval;

#define MAX_MEMBERS 64 /* cuda.h 13.0: at most 16 parameters, and a few NAME_decoded */
#define MAX_DEPTH 32   /* nesting accepted in skipped values */

typedef struct {
    const char *key;
    jval v;
} member;

typedef struct {
    char *start, *p;
    const char *why;
} parser;

static int fail(parser *ps, const char *why)
{
    if (!ps->why)
        ps->why = why;
    return -1;
}

static void skip_ws(parser *ps)
{
    while (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\r' || *ps->p == '\n')
        ps->p++;
}

static int hex4(const char *s, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

static char *put_utf8(char *o, unsigned c)
{
    if (c < 0x80) {
        *o++ = (char)c;
    } else if (c < 0x800) {
        *o++ = (char)(0xc0 | c >> 6);
        *o++ = (char)(0x80 | (c & 0x3f));
    } else if (c < 0x10000) {
        *o++ = (char)(0xe0 | c >> 12);
        *o++ = (char)(0x80 | (c >> 6 & 0x3f));
        *o++ = (char)(0x80 | (c & 0x3f));
    } else {
        *o++ = (char)(0xf0 | c >> 18);
        *o++ = (char)(0x80 | (c >> 12 & 0x3f));
        *o++ = (char)(0x80 | (c >> 6 & 0x3f));
        *o++ = (char)(0x80 | (c & 0x3f));
    }
    return o;
}

/* A string, unescaped in place: the output never outruns the input (an escape is at least
 * as long as what it stands for). */
static int parse_string(parser *ps, jval *v)
{
    if (*ps->p != '"')
        return fail(ps, "expected a string");
    char *in = ++ps->p, *out = in;
    v->type = J_STR;
    v->s = out;
    for (;;) {
        unsigned char c = (unsigned char)*in;
        if (c == '"')
            break;
        if (c == '\0') {
            ps->p = in;
            return fail(ps, "unterminated string");
        }
        if (c < 0x20) {
            ps->p = in;
            return fail(ps, "control character in a string");
        }
        if (c != '\\') {
            *out++ = (char)c;
            in++;
            continue;
        }
        ps->p = in;
        in++;
        switch (*in++) {
        case '"': *out++ = '"'; break;
        case '\\': *out++ = '\\'; break;
        case '/': *out++ = '/'; break;
        case 'b': *out++ = '\b'; break;
        case 'f': *out++ = '\f'; break;
        case 'n': *out++ = '\n'; break;
        case 'r': *out++ = '\r'; break;
        case 't': *out++ = '\t'; break;
        case 'u': {
            unsigned c1, c2;
            if (hex4(in, &c1))
                return fail(ps, "bad \\u escape");
            in += 4;
            if (c1 >= 0xd800 && c1 < 0xdc00 && in[0] == '\\' && in[1] == 'u' &&
                !hex4(in + 2, &c2) && c2 >= 0xdc00 && c2 < 0xe000) {
                c1 = 0x10000 + ((c1 - 0xd800) << 10) + (c2 - 0xdc00);
                in += 6;
            } else if (c1 >= 0xd800 && c1 < 0xe000) {
                c1 = 0xfffd; /* a lone surrogate: the replacement character */
            }
            if (c1 == 0)
                return fail(ps, "\\u0000 in a string");
            out = put_utf8(out, c1);
            break;
        }
        default:
            return fail(ps, "bad escape in a string");
        }
    }
    v->n = (size_t)(out - v->s);
    *out = '\0';
    ps->p = in + 1;
    return 0;
}

static int parse_key(parser *ps, jval *key)
{
    return *ps->p == '"' ? parse_string(ps, key) : fail(ps, "expected a member name");
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* JSON's number grammar exactly; integers keep their value, other numbers only their type. */
static int parse_number(parser *ps, jval *v)
{
    char *p = ps->p;
    *v = (jval){.type = J_INT};
    if (*p == '-') {
        v->neg = true;
        p++;
    }
    if (!is_digit(*p))
        return fail(ps, "bad number");
    if (*p == '0' && is_digit(p[1]))
        return fail(ps, "bad number (leading zero)");
    for (; is_digit(*p); p++) {
        uint64_t d = (uint64_t)(*p - '0');
        if (v->u > (UINT64_MAX - d) / 10)
            v->big = true;
        else
            v->u = v->u * 10 + d;
    }
    if (*p == '.') {
        v->type = J_NUM;
        if (!is_digit(*++p))
            return fail(ps, "bad number");
        while (is_digit(*p))
            p++;
    }
    if (*p == 'e' || *p == 'E') {
        v->type = J_NUM;
        p++;
        if (*p == '+' || *p == '-')
            p++;
        if (!is_digit(*p))
            return fail(ps, "bad number");
        while (is_digit(*p))
            p++;
    }
    ps->p = p;
    return 0;
}

static int parse_value(parser *ps, jval *v, int depth);

/* A member whose value, when an object, goes into arrays of its own (the record's "args" and
 * "out"). */
typedef struct {
    const char *key;
    member *m;
    size_t *n;
} sub_object;

/* An object; its members go into m (up to *n), or nowhere when m is NULL; the object values
 * of the members named in subs (ended by a NULL key; subs may be NULL) into theirs. */
static int parse_object(parser *ps, member *m, size_t *n, int depth, const sub_object *subs)
{
    size_t max = n ? *n : 0, k = 0;
    if (depth > MAX_DEPTH)
        return fail(ps, "nested too deeply");
    ps->p++; /* '{' */
    skip_ws(ps);
    if (*ps->p == '}') {
        ps->p++;
        if (n)
            *n = 0;
        return 0;
    }
    for (;;) {
        jval key, val;
        skip_ws(ps);
        if (parse_key(ps, &key))
            return -1;
        skip_ws(ps);
        if (*ps->p != ':')
            return fail(ps, "expected ':'");
        ps->p++;
        skip_ws(ps);
        const sub_object *sub = NULL;
        for (const sub_object *s = subs; s && s->key && !sub; s++)
            if (*ps->p == '{' && !strcmp(key.s, s->key))
                sub = s;
        if (sub) {
            *sub->n = MAX_MEMBERS;
            if (parse_object(ps, sub->m, sub->n, depth + 1, NULL))
                return -1;
        } else {
            if (parse_value(ps, &val, depth + 1))
                return -1;
            if (m) {
                if (k == max)
                    return fail(ps, "too many members in an object");
                m[k++] = (member){key.s, val};
            }
        }
        skip_ws(ps);
        if (*ps->p == ',') {
            ps->p++;
            continue;
        }
        if (*ps->p != '}')
            return fail(ps, "expected ',' or '}'");
        ps->p++;
        break;
    }
    if (n)
        *n = k;
    return 0;
}

static int parse_array(parser *ps, int depth)
{
    if (depth > MAX_DEPTH)
        return fail(ps, "nested too deeply");
    ps->p++; /* '[' */
    skip_ws(ps);
    if (*ps->p == ']') {
        ps->p++;
        return 0;
    }
    for (;;) {
        jval v;
        skip_ws(ps);
        if (parse_value(ps, &v, depth + 1))
            return -1;
        skip_ws(ps);
        if (*ps->p == ',') {
            ps->p++;
            continue;
        }
        if (*ps->p != ']')
            return fail(ps, "expected ',' or ']'");
        ps->p++;
        return 0;
    }
}

static int literal(parser *ps, const char *word, int type, jval *v)
{
    size_t n = strlen(word);
    if (strncmp(ps->p, word, n))
        return fail(ps, "expected a value");
    ps->p += n;
    *v = (jval){.type = type};
    return 0;
}

/* Any value; objects and arrays nested in members are checked and skipped. */
static int parse_value(parser *ps, jval *v, int depth)
{
    *v = (jval){.type = J_NULL};
    switch (*ps->p) {
    case '"': return parse_string(ps, v);
    case '{': v->type = J_OBJECT; return parse_object(ps, NULL, NULL, depth, NULL);
    case '[': v->type = J_ARRAY; return parse_array(ps, depth);
    case 't': return literal(ps, "true", J_BOOL, v);
    case 'f': return literal(ps, "false", J_BOOL, v);
    case 'n': return literal(ps, "null", J_NULL, v);
    default:
        if (*ps->p == '-' || is_digit(*ps->p))
            return parse_number(ps, v);
        return fail(ps, "expected a value");
    }
}

/* ---- the record ------------------------------------------------------------------------------ */

static const member *find(const member *m, size_t n, const char *key)
{
    for (size_t i = n; i-- > 0;) /* the last of duplicate keys, as most parsers do */
        if (!strcmp(m[i].key, key))
            return &m[i];
    return NULL;
}

/* An unsigned integer: a JSON number, or a "0x..." string (addresses and handles). */
static bool as_u64(const member *mb, uint64_t *out)
{
    if (!mb)
        return false;
    const jval *v = &mb->v;
    if (v->type == J_INT)
        return !v->big && (!v->neg || v->u == 0) && (*out = v->u, true);
    if (v->type != J_STR || v->s[0] != '0' || v->s[1] != 'x' || !v->s[2] || v->n > 18)
        return false;
    uint64_t u = 0;
    for (const char *c = v->s + 2; *c; c++) {
        int d = *c >= '0' && *c <= '9' ? *c - '0' : *c >= 'a' && *c <= 'f' ? *c - 'a' + 10
              : *c >= 'A' && *c <= 'F' ? *c - 'A' + 10 : -1;
        if (d < 0)
            return false;
        u = u << 4 | (uint64_t)d;
    }
    *out = u;
    return true;
}

static bool as_i64(const member *mb, int64_t *out)
{
    if (!mb || mb->v.type != J_INT || mb->v.big)
        return false;
    if (mb->v.neg) {
        if (mb->v.u > (uint64_t)INT64_MAX + 1)
            return false;
        *out = (int64_t)(0 - mb->v.u);
    } else {
        if (mb->v.u > (uint64_t)INT64_MAX)
            return false;
        *out = (int64_t)mb->v.u;
    }
    return true;
}

static int pick(const member *mb, const char *const *names, int n)
{
    if (!mb || mb->v.type != J_STR)
        return -1;
    for (int i = 0; i < n; i++)
        if (!strcmp(mb->v.s, names[i]))
            return i;
    return -1;
}

enum { ALLOC, PITCH, FREE };

/* ALLOC: out[ptr] received args[size] bytes. PITCH: out[ptr] received out.pPitch * args.Height
 * (asked: WidthInBytes * Height). FREE: args[ptr] is given back. */
static const struct {
    const char *name;
    int kind;
    const char *ptr, *size;
    bool handle;
} roles[] = {
    {"cuMemAlloc", ALLOC, "dptr", "bytesize", false},
    {"cuMemAlloc_v2", ALLOC, "dptr", "bytesize", false},
    {"cuMemAllocManaged", ALLOC, "dptr", "bytesize", false},
    {"cuMemAllocAsync", ALLOC, "dptr", "bytesize", false},
    {"cuMemAllocAsync_ptsz", ALLOC, "dptr", "bytesize", false},
    {"cuMemAllocFromPoolAsync", ALLOC, "dptr", "bytesize", false},
    {"cuMemAllocFromPoolAsync_ptsz", ALLOC, "dptr", "bytesize", false},
    {"cuMemCreate", ALLOC, "handle", "size", true},
    {"cuMemAllocPitch", PITCH, "dptr", NULL, false},
    {"cuMemAllocPitch_v2", PITCH, "dptr", NULL, false},
    {"cudaMalloc", ALLOC, "devPtr", "size", false},
    {"cudaMallocAsync", ALLOC, "devPtr", "size", false},
    {"cudaMallocAsync_ptsz", ALLOC, "devPtr", "size", false},
    {"cuMemFree", FREE, "dptr", NULL, false},
    {"cuMemFree_v2", FREE, "dptr", NULL, false},
    {"cuMemFreeAsync", FREE, "dptr", NULL, false},
    {"cuMemFreeAsync_ptsz", FREE, "dptr", NULL, false},
    {"cuMemRelease", FREE, "handle", NULL, true},
    {"cudaFree", FREE, "devPtr", NULL, false},
    {"cudaFreeAsync", FREE, "devPtr", NULL, false},
    {"cudaFreeAsync_ptsz", FREE, "devPtr", NULL, false},
};

static bool mul_ok(uint64_t a, uint64_t b, uint64_t *out)
{
    if (a && b > UINT64_MAX / a)
        return false;
    *out = a * b;
    return true;
}

/* The memory side of a call. Sizes and addresses are read only from the calls that change
 * device bytes, and must be there: a record without them is not the tracer's. */
static const char *memory_role(const char *name, const member *args, size_t nargs,
                               const member *out, size_t nout, rp_event *e)
{
    size_t i = 0, n = sizeof roles / sizeof roles[0];
    while (i < n && strcmp(roles[i].name, name))
        i++;
    if (i == n)
        return NULL;
    e->handle = roles[i].handle;
    if (roles[i].kind == FREE) {
        e->role = RP_ROLE_FREE;
        return as_u64(find(args, nargs, roles[i].ptr), &e->ptr)
                   ? NULL : "a free without its pointer in \"args\"";
    }
    e->role = RP_ROLE_ALLOC;
    if (e->result == 0 && !as_u64(find(out, nout, roles[i].ptr), &e->ptr))
        return "a successful allocation without its pointer in \"out\"";
    if (roles[i].kind == ALLOC)
        return as_u64(find(args, nargs, roles[i].size), &e->size)
                   ? NULL : "an allocation without its size in \"args\"";
    uint64_t width, height, pitch;
    if (!as_u64(find(args, nargs, "Height"), &height) ||
        !as_u64(find(args, nargs, "WidthInBytes"), &width))
        return "cuMemAllocPitch without WidthInBytes and Height in \"args\"";
    if (e->result != 0)
        return mul_ok(width, height, &e->size) ? NULL : "cuMemAllocPitch size overflows";
    if (!as_u64(find(out, nout, "pPitch"), &pitch))
        return "a successful cuMemAllocPitch without pPitch in \"out\"";
    return mul_ok(pitch, height, &e->size) ? NULL : "cuMemAllocPitch size overflows";
}

/* The top-level object: its scalar members into top, the members of "args" and "out" into
 * their own arrays (objects of any other member are checked and skipped). */
static int parse_record(parser *ps, member *top, size_t *ntop, member *args, size_t *nargs,
                        member *out, size_t *nout)
{
    skip_ws(ps);
    if (*ps->p != '{')
        return fail(ps, "expected '{'");
    const sub_object subs[] = {{"args", args, nargs}, {"out", out, nout}, {NULL, NULL, NULL}};
    *ntop = MAX_MEMBERS;
    if (parse_object(ps, top, ntop, 0, subs))
        return -1;
    skip_ws(ps);
    return *ps->p ? fail(ps, "text after the object") : 0;
}

int rp_json_record(char *line, rp_trace *t, rp_event *e, const char **why, size_t *col)
{
    static const char *const libs[] = {"driver", "shim", "runtime"};
    static const char *const froms[] = {"app", "shim", "cudart"};
    parser ps = {line, line, NULL};
    member top[MAX_MEMBERS], args[MAX_MEMBERS], out[MAX_MEMBERS];
    size_t ntop = 0, nargs = 0, nout = 0;
    *col = 0;
    if (parse_record(&ps, top, &ntop, args, &nargs, out, &nout)) {
        *why = ps.why;
        *col = (size_t)(ps.p - ps.start) + 1;
        return -1;
    }
    *e = (rp_event){.result_name = RP_NO_STRING};
    const member *name = find(top, ntop, "name"), *rn = find(top, ntop, "result_name");
    int lib = pick(find(top, ntop, "lib"), libs, 3);
    int from = pick(find(top, ntop, "from"), froms, 3);
    if (!as_i64(find(top, ntop, "pid"), &e->pid) || !as_i64(find(top, ntop, "tid"), &e->tid))
        *why = "\"pid\" and \"tid\" must be integers";
    else if (!as_u64(find(top, ntop, "ts_ns"), &e->t) ||
             !as_u64(find(top, ntop, "dur_ns"), &e->dur) || e->dur > UINT64_MAX - e->t)
        *why = "\"ts_ns\" and \"dur_ns\" must be integers >= 0";
    else if (lib < 0)
        *why = "\"lib\" must be \"driver\", \"shim\" or \"runtime\"";
    else if (from < 0)
        *why = "\"from\" must be \"app\", \"shim\" or \"cudart\"";
    else if (!name || name->v.type != J_STR || !name->v.n)
        *why = "\"name\" must be a non-empty string";
    else if (!as_i64(find(top, ntop, "result"), &e->result))
        *why = "\"result\" must be an integer";
    else if (rn && rn->v.type != J_STR && rn->v.type != J_NULL)
        *why = "\"result_name\" must be a string or null";
    else
        *why = memory_role(name->v.s, args, nargs, out, nout, e);
    if (*why)
        return -1;
    e->lib = (uint8_t)lib;
    e->from = (uint8_t)from;
    e->name = rp_intern(t, name->v.s, name->v.n);
    if (rn && rn->v.type == J_STR)
        e->result_name = rp_intern(t, rn->v.s, rn->v.n);
    if (e->name == RP_NO_STRING || (rn && rn->v.type == J_STR && e->result_name == RP_NO_STRING)) {
        *why = "out of memory";
        return -2;
    }
    return 0;
}
