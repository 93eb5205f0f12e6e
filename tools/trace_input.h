/* Reading a trace file line by line: plain or gzipped (zlib, by the content), or a buffer in
 * memory (the fuzzers). Shared by cacheshim-report and cacheshim-replay: their one reading
 * of the trace of a program that died (docs/report.md, "Input").
 *
 * The tracer grows its file ahead of the records and each thread copies its record into the
 * space it took, so a program that dies leaves zero bytes at the end of the file, and, where
 * a thread was killed in the middle of its copy, a record cut off followed by zero bytes
 * (then the records of other threads, on the same line). So zero bytes belong to no line:
 * they end the piece of a line before them, which the caller gets as cut (like a last line
 * without a newline: it may be a record cut off), and what follows them is read on, also as
 * cut: a tool reading the trace of a program still running reads zero bytes where a thread
 * had not copied its record yet, and the rest of that record, copied by the time it reads
 * on, comes after them. The caller counts the cut pieces it cannot read (tr_cut); one record
 * read in two pieces is counted once; tr_done says it once. */
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
    bool new_line;            /* the next piece starts a new line */
    bool after_zeros;         /* the next piece starts after zero bytes */
    bool counted;             /* the caller counted the current piece cut (tr_cut) */
    bool tail;                /* the current piece is the rest of one counted before it */
    unsigned long lineno;     /* the line the current piece is on, from 1 */
    unsigned long ncut;       /* pieces cut off the caller could not read (tr_cut) */
} tr_input;

/* 0, or -1 after "TOOL: PATH: why" on stderr. */
int tr_open(tr_input *in, const char *path, const char *tool);
/* Reads len bytes at data (kept by the caller until tr_close). */
void tr_open_mem(tr_input *in, const void *data, size_t len, const char *path, const char *tool);
/* The next line without '\n' or "\r\n", or the piece of it before zero bytes, NUL-terminated
 * in *line, its length in *len; its line number in in->lineno. Empty pieces and zero bytes
 * are skipped. *cut: not ended by a newline (zero bytes or the end of the input came after
 * it), or started after zero bytes. 1 for a line, 0 at the end, -1 after a message (read error, a damaged gzip stream; -2
 * out of memory). */
int tr_next(tr_input *in, char **line, size_t *len, bool *cut);
/* The caller could not read the cut piece it got: a record cut off where the program died,
 * left out and counted (not again where it is the rest of a piece counted just before). */
void tr_cut(tr_input *in);
/* The whole input was read: one line on stderr for the records cut off, if any ("TOOL: PATH:
 * N records cut off where the traced program died, NREAD read"), and one for a gzip stream
 * that ended early. */
void tr_done(const tr_input *in, size_t nread);
void tr_close(tr_input *in);

#endif
