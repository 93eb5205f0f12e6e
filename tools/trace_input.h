/* Reading a trace file line by line: plain or gzipped (zlib, by the content), or a buffer in
 * memory (the fuzzers). Shared by cacheshim-report and cacheshim-replay.
 *
 * A program that dies while tracing can leave its file cut anywhere, or, where the file was
 * extended before it was written, ending in zero bytes. So: NUL bytes at the start of a line
 * or at the end of the input belong to no line, and the caller is told when the last line
 * has no newline (it may be a record cut short), and when a gzip stream ends early. */
#ifndef TRACE_INPUT_H
#define TRACE_INPUT_H

#include <stdbool.h>
#include <stddef.h>
#include <zlib.h>

typedef struct {
    gzFile gz;                /* the file, or NULL for a buffer */
    const char *mem;          /* the buffer */
    size_t memlen, mempos;
    const char *path, *tool;  /* for messages */
    char *line;               /* the current line */
    size_t cap;
    char *raw;                /* what was read and not yet taken */
    size_t rpos, rlen;
    bool eof;
    bool gz_cut;              /* the gzip stream ended early */
} tr_input;

/* 0, or -1 after "TOOL: PATH: why" on stderr. */
int tr_open(tr_input *in, const char *path, const char *tool);
/* Reads len bytes at data (kept by the caller until tr_close). */
void tr_open_mem(tr_input *in, const void *data, size_t len, const char *path, const char *tool);
/* The next line without '\n' or "\r\n", NUL-terminated in *line, its length in *len (NUL
 * bytes inside count). *cut: the input ended without a newline after it. 1 for a line, 0 at
 * the end, -1 after a message (read error, a damaged gzip stream; -2 out of memory). */
int tr_next(tr_input *in, char **line, size_t *len, bool *cut);
void tr_close(tr_input *in);

#endif
