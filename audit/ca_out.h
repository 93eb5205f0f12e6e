/* The trace file (the bottom of layer 3, see ca_desc.h): whole records appended by any
 * thread, written where they survive the process at once. */
#ifndef CA_OUT_H
#define CA_OUT_H

#include <stddef.h>
#include <stdint.h>

/* Prepares the output. tmpl: the file name (%p = the pid), or "" for stderr. format:
 * CS_TRACE_TEXT, _JSONL or _PERFETTO (the Chrome trace, whose records each end in ",\n" and
 * whose file starts with "[" and ends in "]"). The file is created now, or at the
 * first record when the name is taken (a program started by the traced one finds its
 * ancestor's file there). */
void ca_out_open(const char *tmpl, int format);
/* For tests: records go to fd, mapped when it is a regular file. */
void ca_out_open_fd(int fd, int format);
/* One or more whole records (how many: records). Any thread, no lock on a file (a shared
 * mapping of it). After a write error, records are counted instead (one line on stderr,
 * the count in the file). */
void ca_out_append(const char *p, size_t n, size_t records);
/* The file's name when records go to a mapping of it (the formatter then writes alone,
 * ca_drain.c), else NULL (stderr, a pipe). Opens a pending file (a child's) first. */
const char *ca_out_mapped_path(void);
/* From now on one thread at a time appends (the formatter, ca_drain.c): no helper thread
 * grows the file ahead; the appending thread grows it. (A thread that the program did not
 * create must not create threads: ld.so allocates a new thread's TLS with the program's
 * malloc, which a sanitizer's runtime serves only on threads it knows.) */
void ca_out_single_writer(void);
/* Bytes of text appended so far (a mapping), or SIZE_MAX once the file is finished (what
 * was appended since may not be in it); calls lost to write errors so far, and the error
 * (*error: "" while none). */
size_t ca_out_end(void);
uint64_t ca_out_lost(const char **error);
/* The end: the file trimmed to what was written and completed (Chrome trace: "]"), the
 * count of lost records in it. Async-signal-safe; once; nothing may be appended after. */
void ca_out_finish(void);
/* fork: the child starts its own file (at its first record); the parent keeps its own. */
void ca_out_fork_prepare(void);
void ca_out_fork_parent(void);
void ca_out_fork_child(void);
/* One line on stderr (a '\n' is added). */
void ca_out_say(const char *line);

#endif
