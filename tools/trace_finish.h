/* A trace whose process was killed: the calls it left in TRACE.pending formatted into it
 * first (audit/ca_recover.c), with one line on stderr. */
#ifndef TRACE_FINISH_H
#define TRACE_FINISH_H

/* Before a tool reads path: 0, or 1 after a message when the pending file could not be
 * used (the trace is then read as it is). */
int trace_finish(const char *path, const char *tool);

#endif
