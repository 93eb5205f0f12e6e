/* The record writer (layer 3, see ca_desc.h): what the wrappers and the audit entry points
 * call. Each call's record is formatted and appended to the trace file when the call
 * returns (ca_end), so a program that dies loses nothing it has recorded. */
#ifndef CA_TRACE_H
#define CA_TRACE_H

#include <stdint.h>

#include "ca_rec.h"

/* Is fn traced (the filter)? Filled by ca_trace_init; not 0 when it is (atomic: another bit
 * is set as the tracer goes). */
extern unsigned char ca_traced[CA_FN_COUNT];

/* A record to fill for a call of fn (nargs parameters: ca_desc(fn)->nparams, a constant in
 * each wrapper) into lib, made by the code at ret (the wrapper's return address: the
 * program, the shim or cudart, by ca_trace_caller_range), or NULL when this call is not
 * traced (filtered out, tracing finished, too deeply nested, out of memory). */
ca_rec *ca_begin(unsigned fn, unsigned nargs, int lib, const void *ret);
/* Calls from code in [lo, hi) are made by from (CA_FROM_SHIM, CA_FROM_CUDART). */
void ca_trace_caller_range(int from, uintptr_t lo, uintptr_t hi);
/* The call's start and end (ca_clock_read), inline in each wrapper: on the hot path a call
 * less each. */
static inline void ca_started(ca_rec *r) { r->t0 = ca_clock_read(); }
static inline void ca_stopped(ca_rec *r) { r->t1 = ca_clock_read(); }
/* The call returned result: the record is written. */
void ca_end(ca_rec *r, int result);

/* Reads the options (once), prepares the output, computes ca_traced, and catches the fatal
 * signals that end a program by default so that the file is finished first. */
void ca_trace_init(void);
/* For tests: trace to fd (mapped when it is a regular file) with the given format and filter
 * instead of the options (the clock: CACHESHIM_TRACE_CLOCK, else auto); ring: the file of
 * the ring of raw records (created at the first record), or NULL for none (each record
 * formatted on its calling thread). */
void ca_trace_init_fd(int fd, int format, const char *filter, const char *ring);
/* The process ends (exit, _exit, a fatal signal): record nothing more, let calls being
 * written finish (briefly), and finish the file. Async-signal-safe; runs once. */
void ca_trace_exit(void);
/* fork: before, after in the parent and in the child. */
void ca_fork_prepare(void);
void ca_fork_parent(void);
void ca_fork_child(void);

#endif
