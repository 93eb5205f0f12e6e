/* Reading traces (format: shared/traces/README.md), plain or gzipped (trace_input.c). The
 * whole trace is read before the replay starts, so a malformed file fails before any output
 * and sweeps parse it once. */
#include "replay.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int malformed(const tr_input *in, long line, const char *text)
{
    fprintf(stderr, "%s: %s:%ld: malformed line: %.200s\n", in->tool, in->path, line, text);
    return 2;
}

/* A whole token as an unsigned number in base 10 or 16 (optional 0x); false otherwise. */
static bool parse_u64(const char *tok, int base, uint64_t *out)
{
    if (!tok || !*tok || *tok == '-' || *tok == '+' || *tok == ' ')
        return false;
    if (base == 16 && tok[0] == '0' && (tok[1] == 'x' || tok[1] == 'X') && !tok[2])
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(tok, &end, base);
    if (errno || *end)
        return false;
    *out = (uint64_t)v;
    return true;
}

bool replay_trace_push(replay_trace *t, replay_event e)
{
    if (t->nev == t->cap) {
        size_t n = t->cap ? t->cap * 2 : 4096;
        replay_event *ev = realloc(t->ev, n * sizeof *ev);
        if (!ev)
            return false;
        t->ev = ev;
        t->cap = n;
    }
    t->ev[t->nev++] = e;
    return true;
}

int replay_trace_parse_line(char *buf, replay_event *e)
{
    char *tok[5];
    int ntok = 0;
    char *save = NULL;
    for (char *s = strtok_r(buf, " \t", &save); s && ntok < 5; s = strtok_r(NULL, " \t", &save))
        tok[ntok++] = s;
    if (ntok == 0 || tok[0][0] == '#')
        return 0;
    *e = (replay_event){.kind = tok[0][0]};
    if (!strcmp(tok[0], "a"))
        return ntok == 4 && parse_u64(tok[1], 10, &e->size) && parse_u64(tok[2], 16, &e->ptr) &&
                       parse_u64(tok[3], 10, &e->ns) && e->ptr != 0
                   ? 1
                   : -1;
    if (!strcmp(tok[0], "f"))
        return ntok == 3 && parse_u64(tok[1], 16, &e->ptr) && parse_u64(tok[2], 10, &e->ns) ? 1
                                                                                           : -1;
    if (!strcmp(tok[0], "e"))
        return ntok == 4 && parse_u64(tok[1], 10, &e->size) && parse_u64(tok[2], 10, &e->err) &&
                       parse_u64(tok[3], 10, &e->ns)
                   ? 1
                   : -1;
    return -1;
}

int replay_trace_read(replay_trace *t, tr_input *in)
{
    int rc = 0, got;
    char *buf;
    size_t len;
    bool cut;
    while (rc == 0 && (got = tr_next(in, &buf, &len, &cut)) == 1) {
        char copy[256];
        snprintf(copy, sizeof copy, "%s", buf);
        replay_event e;
        int r = replay_trace_parse_line(buf, &e);
        if (r < 0 && cut) { /* cut off where the program died (trace_input.h) */
            tr_cut(in);
        } else if (r < 0) {
            rc = malformed(in, (long)in->lineno, copy);
        } else if (r > 0 && !replay_trace_push(t, e)) {
            fprintf(stderr, "%s: out of memory\n", in->tool);
            rc = 2;
        }
    }
    if (rc == 0 && got < 0)
        rc = 2;
    if (rc == 0)
        tr_done(in, t->nev);
    return rc;
}

int replay_trace_load(replay_trace *t, const char *path)
{
    *t = (replay_trace){.path = path};
    tr_input in;
    if (tr_open(&in, path, REPLAY_NAME))
        return 2;
    int rc = replay_trace_read(t, &in);
    tr_close(&in);
    if (rc)
        replay_trace_free(t);
    return rc;
}

void replay_trace_free(replay_trace *t)
{
    free(t->ev);
    t->ev = NULL;
    t->nev = t->cap = 0;
}
