/* Reading a trace: the file (plain or gzipped, trace_input.c), its format
 * told from the content, every line into an event, the events in time order. The whole
 * trace is read before anything is printed, so a malformed file gives no partial report. */
#include "report.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "replay.h"
#include "trace_input.h"

/* ---- interned strings ------------------------------------------------------------------------ */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603u; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211u;
    return h;
}

static bool grow_hash(rp_trace *t)
{
    size_t cap = t->hashcap ? t->hashcap * 2 : 256;
    uint32_t *h = calloc(cap, sizeof *h);
    if (!h)
        return false;
    for (size_t i = 0; i < t->nstr; i++) {
        size_t k = hash_bytes(t->str[i], strlen(t->str[i])) & (cap - 1);
        while (h[k])
            k = (k + 1) & (cap - 1);
        h[k] = (uint32_t)i + 1;
    }
    free(t->hash);
    t->hash = h;
    t->hashcap = cap;
    return true;
}

uint32_t rp_intern(rp_trace *t, const char *s, size_t n)
{
    if ((t->nstr + 1) * 2 > t->hashcap && !grow_hash(t))
        return RP_NO_STRING;
    size_t k = hash_bytes(s, n) & (t->hashcap - 1);
    for (; t->hash[k]; k = (k + 1) & (t->hashcap - 1)) {
        const char *c = t->str[t->hash[k] - 1];
        if (!strncmp(c, s, n) && c[n] == '\0')
            return t->hash[k] - 1;
    }
    if (t->nstr == t->strcap) {
        size_t cap = t->strcap ? t->strcap * 2 : 64;
        char **str = realloc(t->str, cap * sizeof *str);
        if (!str)
            return RP_NO_STRING;
        t->str = str;
        t->strcap = cap;
    }
    char *copy = malloc(n + 1);
    if (!copy)
        return RP_NO_STRING;
    memcpy(copy, s, n);
    copy[n] = '\0';
    t->str[t->nstr] = copy;
    t->hash[k] = (uint32_t)++t->nstr;
    return (uint32_t)(t->nstr - 1);
}

const char *rp_str(const rp_trace *t, uint32_t i) { return i < t->nstr ? t->str[i] : ""; }

const char *rp_lib_name(int lib)
{
    static const char *const names[] = {"driver", "shim", "runtime", "trace"};
    return lib >= 0 && lib < RP_NLIB ? names[lib] : "?";
}

const char *rp_from_name(int from)
{
    static const char *const names[] = {"app", "shim", "cudart", "-"};
    return from >= 0 && from < RP_NFROM ? names[from] : "?";
}

/* ---- lines ----------------------------------------------------------------------------------- */

static bool push(rp_trace *t, const rp_event *e)
{
    if (t->nev == t->evcap) {
        size_t cap = t->evcap ? t->evcap * 2 : 4096;
        rp_event *ev = realloc(t->ev, cap * sizeof *ev);
        if (!ev)
            return false;
        t->ev = ev;
        t->evcap = cap;
    }
    t->ev[t->nev++] = *e;
    return true;
}

enum { UNKNOWN = -1 };

static bool blank(const char *s)
{
    return s[strspn(s, " \t")] == '\0';
}

static bool starts_alloc_line(const char *s)
{
    return (s[0] == 'a' || s[0] == 'f' || s[0] == 'e') && (s[1] == ' ' || s[1] == '\t');
}

static int unsupported(const char *path, const char *what)
{
    fprintf(stderr, REPORT_NAME ": %s: %s; this tool reads JSON Lines: record again with "
                    "CACHESHIM_TRACE_FORMAT=jsonl\n", path, what);
    return 2;
}

/* An allocation-trace line as an event: "alloc" (a, and e failed with ERR), "free" (f). */
static int alloc_event(rp_trace *t, char *buf, uint64_t line, rp_event *e)
{
    replay_event r;
    int got = replay_trace_parse_line(buf, &r);
    if (got <= 0)
        return got;
    *e = (rp_event){.t = r.ns, .ptr = r.ptr, .size = r.size, .line = line,
                    .result_name = RP_NO_STRING, .stack = RP_NO_STRING, .lib = RP_LIB_TRACE,
                    .from = RP_FROM_NONE};
    if (r.kind == 'f') {
        e->role = RP_ROLE_FREE;
        e->name = rp_intern(t, "free", 4);
    } else {
        e->role = RP_ROLE_ALLOC;
        e->result = r.kind == 'e' ? (r.err > INT64_MAX ? INT64_MAX : (int64_t)r.err) : 0;
        e->name = rp_intern(t, "alloc", 5);
    }
    return e->name == RP_NO_STRING ? -2 : 1;
}

static int by_time(const void *a, const void *b)
{
    const rp_event *x = a, *y = b;
    uint64_t ex = rp_when(x), ey = rp_when(y);
    if (ex != ey)
        return ex < ey ? -1 : 1;
    return x->line < y->line ? -1 : x->line > y->line;
}

bool rp_object_add(rp_trace *t, const rp_object *o)
{
    if (t->nobj == t->objcap) {
        size_t cap = t->objcap ? t->objcap * 2 : 16;
        rp_object *p = realloc(t->obj, cap * sizeof *p);
        if (!p)
            return false;
        t->obj = p;
        t->objcap = cap;
    }
    t->obj[t->nobj++] = *o;
    return true;
}

/* A line that could not be read as a record: a record cut off where the traced program died
 * when it was cut (followed by zero bytes or the end of the file: trace_input.h), left out
 * and counted; anywhere else a malformed line, which stops the run. */
static int bad_line(rp_trace *t, tr_input *in, bool cut, const char *why, size_t col,
                    const char *copy)
{
    if (cut) {
        tr_cut(in);
        return 0;
    }
    if (col)
        fprintf(stderr, REPORT_NAME ": %s:%lu: malformed line (%s at column %zu): %.200s\n",
                t->path, in->lineno, why, col, copy);
    else
        fprintf(stderr, REPORT_NAME ": %s:%lu: malformed line (%s): %.200s\n", t->path,
                in->lineno, why, copy);
    return 2;
}

/* A line of a Chrome trace (tracing.md): the object form's first line, or an event ("ph"),
 * or the array form's "[" as the first line of the file, where the tracer writes it (on
 * stderr too). A "[" line elsewhere, or a list without events ("[{'step': 1}]"), is the
 * program's own output before a trace's first record. */
static bool chrome_trace_line(const char *s, uint64_t lineno)
{
    if (*s == '{' || *s == '[')
        if (strstr(s, "\"traceEvents\"") || strstr(s, "\"displayTimeUnit\"") ||
            strstr(s, "\"ph\":"))
            return true;
    return lineno == 1 && *s == '[' && s[1 + strspn(s + 1, " \t")] == '\0';
}

static int read_lines(rp_trace *t, tr_input *in)
{
    const char *path = t->path;
    int rc = 0, got;
    char *buf, copy[256], other[256] = "";
    size_t len;
    bool cut;
    uint64_t first_other = 0;
    while (rc == 0 && (got = tr_next(in, &buf, &len, &cut)) == 1) {
        uint64_t lineno = in->lineno;
        snprintf(copy, sizeof copy, "%s", buf);
        if (!strncmp(buf, "{\"cacheshim_lost\":", 18)) { /* the tracer's note of a write error */
            fprintf(stderr, REPORT_NAME ": %s:%" PRIu64 ": %llu calls were not written "
                    "(the tracer's note: %.200s)\n", path, lineno, strtoull(buf + 18, NULL, 10),
                    buf);
            continue;
        }
        if (t->format == UNKNOWN) {
            const char *s = buf + strspn(buf, " \t");
            if (!*s || *s == '#')
                continue;
            if (!strncmp(s, "[Intercepted] ", 14))
                rc = unsupported(path, "a text trace ([Intercepted] lines)");
            else if (chrome_trace_line(s, lineno))
                rc = unsupported(path, "a Perfetto (Chrome trace event) file");
            else if (*s == '{')
                t->format = RP_FORMAT_JSONL;
            else if (starts_alloc_line(s))
                t->format = RP_FORMAT_ALLOC;
            if (rc)
                break;
            /* Before the first record: perhaps the program's own output (JSON Lines on
             * stderr); an error if the trace turns out to be an allocation trace. */
            if (t->format == UNKNOWN) {
                if (!first_other) {
                    first_other = lineno;
                    snprintf(other, sizeof other, "%s", buf);
                }
                t->other_lines++;
                continue;
            }
            if (t->format == RP_FORMAT_ALLOC && first_other) {
                fprintf(stderr, REPORT_NAME ": %s:%" PRIu64 ": malformed line (expected "
                        "a SIZE PTR NS, f PTR NS or e SIZE ERR NS): %.200s\n", path,
                        first_other, other);
                rc = 2;
                break;
            }
        }
        rp_event e;
        const char *why = "expected a SIZE PTR NS, f PTR NS or e SIZE ERR NS";
        size_t col = 0;
        if (t->format == RP_FORMAT_ALLOC) {
            got = alloc_event(t, buf, lineno, &e);
        } else if (buf[strspn(buf, " \t")] != '{') {
            t->other_lines += !blank(buf);
            continue;
        } else {
            got = rp_json_record(buf, len, t, &e, &why, &col);
            got = got == 0 ? 1 : got == 1 ? 0 : got;
            e.line = lineno;
        }
        if (got == -1)
            rc = bad_line(t, in, cut, why, col, copy);
        else if (got == -2 || (got == 1 && !push(t, &e))) {
            fprintf(stderr, REPORT_NAME ": out of memory\n");
            rc = 1;
        }
    }
    if (rc == 0 && got < 0)
        rc = got == -2 ? 1 : 2;
    if (rc == 0)
        tr_done(in, t->nev);
    return rc;
}

static int finish(rp_trace *t, int rc)
{
    if (rc == 0 && t->nev == 0) {
        fprintf(stderr, REPORT_NAME ": %s: no events (expected JSON Lines of libcacheaudit.so, "
                "CACHESHIM_TRACE_FORMAT=jsonl, or an allocation trace: a SIZE PTR NS, f PTR NS, "
                "e SIZE ERR NS)\n", t->path);
        rc = 2;
    }
    if (rc) {
        rp_trace_free(t);
        return rc;
    }
    t->timed = t->format == RP_FORMAT_JSONL;
    qsort(t->ev, t->nev, sizeof *t->ev, by_time);
    return 0;
}

int rp_trace_load(rp_trace *t, const char *path)
{
    *t = (rp_trace){.path = path, .format = UNKNOWN};
    tr_input in;
    if (tr_open(&in, path, REPORT_NAME))
        return 2;
    int rc = read_lines(t, &in);
    tr_close(&in);
    return finish(t, rc);
}

int rp_trace_load_mem(rp_trace *t, const char *path, const void *data, size_t len)
{
    *t = (rp_trace){.path = path, .format = UNKNOWN};
    tr_input in;
    tr_open_mem(&in, data, len, path, REPORT_NAME);
    int rc = read_lines(t, &in);
    tr_close(&in);
    return finish(t, rc);
}

void rp_trace_free(rp_trace *t)
{
    for (size_t i = 0; i < t->nstr; i++)
        free(t->str[i]);
    free(t->str);
    free(t->hash);
    free(t->ev);
    free(t->obj);
    t->obj = NULL;
    t->nobj = t->objcap = 0;
    t->str = NULL;
    t->hash = NULL;
    t->ev = NULL;
    t->nstr = t->strcap = t->hashcap = t->nev = t->evcap = 0;
}
