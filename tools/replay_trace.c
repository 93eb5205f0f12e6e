/* Reading traces (format: shared/traces/README.md). The whole trace is read before the replay
 * starts, so a malformed file fails before any output and sweeps parse it once. */
#include "replay.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int malformed(const char *path, long line, const char *text)
{
    fprintf(stderr, REPLAY_NAME ": %s:%ld: malformed line: %.200s\n", path, line, text);
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

/* Gzipped files are recognised by their magic bytes, not their name, and read through
 * `gzip -dc`: no zlib dependency for one tool. */
FILE *replay_trace_open(const char *path, const char *tool, bool *is_pipe)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: %s: %s\n", tool, path, strerror(errno));
        return NULL;
    }
    unsigned char magic[2] = {0, 0};
    size_t got = fread(magic, 1, 2, f);
    *is_pipe = false;
    if (got != 2 || magic[0] != 0x1f || magic[1] != 0x8b) {
        rewind(f);
        return f;
    }
    fclose(f);
    /* Single-quote the path for the shell: ' becomes '\''. */
    size_t n = strlen(path);
    char *cmd = malloc(n * 4 + 32);
    if (!cmd)
        return NULL;
    char *p = cmd + sprintf(cmd, "gzip -dc -- '");
    for (const char *s = path; *s; s++) {
        if (*s == '\'') {
            memcpy(p, "'\\''", 4);
            p += 4;
        } else {
            *p++ = *s;
        }
    }
    strcpy(p, "'");
    FILE *pf = popen(cmd, "r");
    free(cmd);
    if (!pf)
        fprintf(stderr, "%s: %s: cannot run gzip -dc: %s\n", tool, path, strerror(errno));
    *is_pipe = pf != NULL;
    return pf;
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

int replay_trace_load(replay_trace *t, const char *path)
{
    *t = (replay_trace){.path = path};
    bool is_pipe;
    FILE *f = replay_trace_open(path, REPLAY_NAME, &is_pipe);
    if (!f)
        return 2;
    int rc = 0;
    char *buf = NULL;
    size_t bufcap = 0;
    ssize_t len;
    long lineno = 0;
    while (rc == 0 && (len = getline(&buf, &bufcap, f)) != -1) {
        lineno++;
        while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r'))
            buf[--len] = '\0';
        if ((size_t)len != strlen(buf)) {
            rc = malformed(path, lineno, "(line contains a NUL byte)");
            break;
        }
        char copy[256];
        snprintf(copy, sizeof copy, "%s", buf);
        replay_event e;
        int r = replay_trace_parse_line(buf, &e);
        if (r < 0)
            rc = malformed(path, lineno, copy);
        else if (r > 0 && !replay_trace_push(t, e)) {
            fprintf(stderr, REPLAY_NAME ": out of memory\n");
            rc = 2;
        }
    }
    if (rc == 0 && ferror(f)) {
        fprintf(stderr, REPLAY_NAME ": %s: read error\n", path);
        rc = 2;
    }
    free(buf);
    if (replay_trace_close(f, is_pipe, rc == 0, path, REPLAY_NAME) && rc == 0)
        rc = 2;
    if (rc)
        replay_trace_free(t);
    return rc;
}

int replay_trace_close(FILE *f, bool is_pipe, bool read_all, const char *path, const char *tool)
{
    if (!is_pipe) {
        fclose(f);
        return 0;
    }
    /* On an early stop gzip may die of SIGPIPE: only its status on a full read counts. */
    int st = pclose(f);
    if (read_all && st != 0) {
        fprintf(stderr, "%s: %s: gzip -dc failed (status %d)\n", tool, path, st);
        return -1;
    }
    return 0;
}

void replay_trace_free(replay_trace *t)
{
    free(t->ev);
    t->ev = NULL;
    t->nev = t->cap = 0;
}
