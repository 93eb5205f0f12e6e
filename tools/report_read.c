/* Reading a trace: the file (plain or gzipped, through replay_trace.c's opener), its format
 * told from the content, every line into an event, the events in time order. The whole
 * trace is read before anything is printed, so a malformed file gives no partial report. */
#include "report.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "replay.h"

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
                    .result_name = RP_NO_STRING, .lib = RP_LIB_TRACE, .from = RP_FROM_NONE};
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

int rp_trace_load(rp_trace *t, const char *path)
{
    *t = (rp_trace){.path = path, .format = UNKNOWN};
    bool is_pipe;
    FILE *f = replay_trace_open(path, REPORT_NAME, &is_pipe);
    if (!f)
        return 2;
    int rc = 0;
    char *buf = NULL, copy[256], other[256] = "";
    size_t bufcap = 0;
    ssize_t len;
    uint64_t lineno = 0, first_other = 0, cut = 0;
    while (rc == 0 && (len = getline(&buf, &bufcap, f)) != -1) {
        lineno++;
        bool last = len == 0 || buf[len - 1] != '\n'; /* the file ends in this line */
        while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r'))
            buf[--len] = '\0';
        if ((size_t)len != strlen(buf)) {
            /* Zero bytes: the end of a file whose program died (the tracer grows its file
             * ahead of the records), or a record it was writing then. What comes before the
             * zeros is such a record, cut off (or whole, but for its newline); what comes
             * after them is read on. */
            if (buf[strspn(buf, " \t")] != '\0') {
                rp_event e;
                const char *why;
                size_t col = 0;
                int got = t->format == RP_FORMAT_JSONL ? rp_json_record(buf, t, &e, &why, &col)
                                                       : -1;
                if (got >= 0 || got == -2) {
                    e.line = lineno;
                    if (got == -2 || !push(t, &e)) {
                        fprintf(stderr, REPORT_NAME ": out of memory\n");
                        rc = 1;
                        break;
                    }
                } else {
                    cut++;
                }
            }
            const char *z = memrchr(buf, '\0', (size_t)len);
            len -= z + 1 - buf;
            memmove(buf, z + 1, (size_t)len + 1);
            last = false;
        }
        snprintf(copy, sizeof copy, "%s", buf);
        if (!strncmp(buf, "{\"cacheshim_lost\":", 18)) { /* the tracer's note of a write error */
            fprintf(stderr, REPORT_NAME ": %s:%" PRIu64 ": %s calls were not written "
                    "(the tracer's note: %.200s)\n", path, lineno, buf + 18 + strspn(buf + 18, " "),
                    buf);
            continue;
        }
        if (t->format == UNKNOWN) {
            const char *s = buf + strspn(buf, " \t");
            if (!*s || *s == '#')
                continue;
            if (*s == '{' && (strstr(s, "\"traceEvents\"") || strstr(s, "\"displayTimeUnit\"")))
                rc = unsupported(path, "a Perfetto (Chrome trace event) file");
            else if (!strncmp(s, "[Intercepted] ", 14))
                rc = unsupported(path, "a text trace ([Intercepted] lines)");
            else if (*s == '{')
                t->format = RP_FORMAT_JSONL;
            else if (starts_alloc_line(s))
                t->format = RP_FORMAT_ALLOC;
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
        int got;
        const char *why = "expected a SIZE PTR NS, f PTR NS or e SIZE ERR NS";
        size_t col = 0;
        if (t->format == RP_FORMAT_ALLOC) {
            got = alloc_event(t, buf, lineno, &e);
        } else if (buf[strspn(buf, " \t")] != '{') {
            t->other_lines += !blank(buf);
            continue;
        } else {
            got = rp_json_record(buf, t, &e, &why, &col);
            got = got == 0 ? 1 : got;
            e.line = lineno;
        }
        if (got == -1 && t->format == RP_FORMAT_JSONL && last) {
            cut++; /* the last record, cut off where the traced program died */
        } else if (got == -1) {
            if (col)
                fprintf(stderr, REPORT_NAME ": %s:%" PRIu64 ": malformed line (%s at column %zu): "
                        "%.200s\n", path, lineno, why, col, copy);
            else
                fprintf(stderr, REPORT_NAME ": %s:%" PRIu64 ": malformed line (%s): %.200s\n",
                        path, lineno, why, copy);
            rc = 2;
        } else if (got == -2 || (got == 1 && !push(t, &e))) {
            fprintf(stderr, REPORT_NAME ": out of memory\n");
            rc = 1;
        }
    }
    if (rc == 0 && ferror(f)) {
        fprintf(stderr, REPORT_NAME ": %s: read error\n", path);
        rc = 2;
    }
    free(buf);
    if (replay_trace_close(f, is_pipe, rc == 0, path, REPORT_NAME) && rc == 0)
        rc = 2;
    if (rc == 0 && cut)
        fprintf(stderr, REPORT_NAME ": %s: %" PRIu64 " record%s cut off where the traced program "
                "died, %zu read\n", path, cut, cut == 1 ? "" : "s", t->nev);
    if (rc == 0 && t->nev == 0) {
        fprintf(stderr, REPORT_NAME ": %s: no events (expected JSON Lines of libcacheaudit.so, "
                "CACHESHIM_TRACE_FORMAT=jsonl, or an allocation trace: a SIZE PTR NS, f PTR NS, "
                "e SIZE ERR NS)\n", path);
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

void rp_trace_free(rp_trace *t)
{
    for (size_t i = 0; i < t->nstr; i++)
        free(t->str[i]);
    free(t->str);
    free(t->hash);
    free(t->ev);
    t->str = NULL;
    t->hash = NULL;
    t->ev = NULL;
    t->nstr = t->strcap = t->hashcap = t->nev = t->evcap = 0;
}
