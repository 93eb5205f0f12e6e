/* Trace files line by line through zlib (docs/report.md, "Input"). */
#include "trace_input.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RAW_SIZE (256 * 1024)

int tr_open(tr_input *in, const char *path, const char *tool)
{
    *in = (tr_input){.path = path, .tool = tool};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "%s: %s: %s\n", tool, path, strerror(errno));
        return -1;
    }
    in->raw = malloc(RAW_SIZE);
    /* gzdopen reads a file that is not gzip as it is. */
    if (!in->raw || !(in->gz = gzdopen(fd, "rb"))) {
        fprintf(stderr, "%s: out of memory\n", tool);
        close(fd);
        free(in->raw);
        return -1;
    }
    gzbuffer(in->gz, RAW_SIZE);
    return 0;
}

void tr_open_mem(tr_input *in, const void *data, size_t len, const char *path, const char *tool)
{
    *in = (tr_input){.mem = data, .memlen = len, .path = path, .tool = tool};
}

/* More raw bytes after the ones not taken yet; false at the end or after a message
 * (in->eof and *err set). */
static bool fill(tr_input *in, int *err)
{
    if (in->eof)
        return false;
    if (in->mem) {
        in->eof = true; /* the whole buffer at once */
        return false;
    }
    memmove(in->raw, in->raw + in->rpos, in->rlen - in->rpos);
    in->rlen -= in->rpos;
    in->rpos = 0;
    int n = gzread(in->gz, in->raw + in->rlen, (unsigned)(RAW_SIZE - in->rlen));
    if (n > 0) {
        in->rlen += (size_t)n;
        return true;
    }
    in->eof = true;
    if (n < 0) {
        int code;
        const char *msg = gzerror(in->gz, &code);
        if (code == Z_BUF_ERROR) {
            in->gz_cut = true; /* cut short: what came before is kept */
        } else {
            const char *colon = strstr(msg, ">: "); /* zlib's "<fd:3>: " before its words */
            fprintf(stderr, "%s: %s: %s\n", in->tool, in->path,
                    code == Z_ERRNO ? strerror(errno) : colon ? colon + 3 : msg);
            *err = -1;
        }
    } else if (!gzeof(in->gz)) {
        in->gz_cut = true;
    }
    return false;
}

static bool append(tr_input *in, size_t *n, const char *p, size_t k)
{
    if (*n + k + 1 > in->cap) {
        size_t cap = in->cap ? in->cap : 4096;
        while (cap < *n + k + 1)
            cap *= 2;
        char *q = realloc(in->line, cap);
        if (!q)
            return false;
        in->line = q;
        in->cap = cap;
    }
    memcpy(in->line + *n, p, k);
    *n += k;
    return true;
}

int tr_next(tr_input *in, char **line, size_t *len, bool *cut)
{
    size_t n = 0;
    bool any = false;
    int err = 0;
    for (;;) {
        const char *buf = in->mem ? in->mem + in->mempos : in->raw + in->rpos;
        size_t avail = in->mem ? in->memlen - in->mempos : in->rlen - in->rpos;
        const char *nl = memchr(buf, '\n', avail);
        size_t take = nl ? (size_t)(nl - buf) : avail;
        if (!append(in, &n, buf, take)) {
            fprintf(stderr, "%s: out of memory\n", in->tool);
            return -2;
        }
        any |= take > 0;
        if (in->mem)
            in->mempos += take + (nl != NULL);
        else
            in->rpos += take + (nl != NULL);
        if (nl) {
            *cut = false;
            break;
        }
        if (!fill(in, &err)) {
            if (err)
                return -1;
            if (!any)
                return 0;
            *cut = true;
            break;
        }
    }
    char *s = in->line;
    size_t skip = 0;
    while (skip < n && s[skip] == '\0') /* zero bytes a crash left before the line */
        skip++;
    if (*cut)
        while (n > skip && s[n - 1] == '\0') /* the zero-filled end of the file */
            n--;
    if (*cut && n == skip)
        return 0;
    n -= skip;
    memmove(s, s + skip, n);
    if (n > 0 && s[n - 1] == '\r' && !*cut)
        n--;
    s[n] = '\0';
    *line = s;
    *len = n;
    return 1;
}

void tr_close(tr_input *in)
{
    if (in->gz)
        gzclose(in->gz);
    free(in->raw);
    free(in->line);
    *in = (tr_input){0};
}
