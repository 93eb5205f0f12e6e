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
    *in = (tr_input){.path = path, .tool = tool, .new_line = true};
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
    *in = (tr_input){.mem = data, .memlen = len, .path = path, .tool = tool, .new_line = true};
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

static const char *avail_bytes(const tr_input *in, size_t *avail)
{
    *avail = in->mem ? in->memlen - in->mempos : in->rlen - in->rpos;
    return in->mem ? in->mem + in->mempos : in->raw + in->rpos;
}

static void take_bytes(tr_input *in, size_t n)
{
    if (in->mem)
        in->mempos += n;
    else
        in->rpos += n;
}

/* How a piece of a line ends. */
enum { AT_NEWLINE = '\n', AT_ZEROS = 0, AT_END = -3 };

/* The bytes up to the next '\n' or zero byte appended to in->line (*n long), and how they
 * end, the stop taken too: AT_NEWLINE, AT_ZEROS (the whole run of zero bytes), AT_END (the
 * end of the input); -1 after a message, -2 out of memory. */
static int piece(tr_input *in, size_t *n)
{
    int err = 0;
    for (;;) {
        size_t avail;
        const char *buf = avail_bytes(in, &avail);
        const char *nl = memchr(buf, '\n', avail);
        const char *stop = memchr(buf, '\0', nl ? (size_t)(nl - buf) : avail);
        stop = stop ? stop : nl;
        size_t take = stop ? (size_t)(stop - buf) : avail;
        if (!append(in, n, buf, take)) {
            fprintf(stderr, "%s: out of memory\n", in->tool);
            return -2;
        }
        take_bytes(in, take);
        if (stop && *stop == '\n') {
            take_bytes(in, 1);
            return AT_NEWLINE;
        }
        if (stop) { /* the run of zero bytes, across refills */
            for (;;) {
                buf = avail_bytes(in, &avail);
                size_t z = 0;
                while (z < avail && buf[z] == '\0')
                    z++;
                take_bytes(in, z);
                if (z < avail || !fill(in, &err))
                    return err ? -1 : AT_ZEROS;
            }
        }
        if (!fill(in, &err))
            return err ? -1 : AT_END;
    }
}

int tr_next(tr_input *in, char **line, size_t *len, bool *cut)
{
    /* A piece right after the zero bytes that ended a piece the caller counted as cut: the
     * rest of that record (trace_input.h). */
    bool rest_of_counted = in->counted;
    in->counted = false;
    for (;;) {
        if (in->new_line) {
            in->lineno++;
            in->new_line = false;
        }
        size_t n = 0;
        bool after_zeros = in->after_zeros;
        int stop = piece(in, &n);
        if (stop == -1 || stop == -2)
            return stop;
        in->new_line = stop == AT_NEWLINE;
        in->after_zeros = stop == AT_ZEROS;
        char *s = in->line;
        if (stop == AT_NEWLINE && n > 0 && s[n - 1] == '\r')
            n--;
        if (n == 0) { /* an empty line, or zero bytes: nothing to read */
            if (stop == AT_END)
                return 0;
            rest_of_counted = false;
            continue;
        }
        s[n] = '\0';
        *line = s;
        *len = n;
        *cut = stop != AT_NEWLINE || after_zeros;
        in->tail = after_zeros && rest_of_counted;
        return 1;
    }
}

void tr_cut(tr_input *in)
{
    if (!in->tail)
        in->ncut++;
    in->counted = true;
}

void tr_done(const tr_input *in, size_t nread)
{
    if (in->ncut)
        fprintf(stderr, "%s: %s: %lu record%s cut off where the traced program died, %zu read\n",
                in->tool, in->path, in->ncut, in->ncut == 1 ? "" : "s", nread);
    if (in->gz_cut)
        fprintf(stderr, "%s: %s: the gzip stream ends early (cut short): read as far as it "
                "goes\n", in->tool, in->path);
}

void tr_close(tr_input *in)
{
    if (in->gz)
        gzclose(in->gz);
    free(in->raw);
    free(in->line);
    *in = (tr_input){0};
}
