/* What a traced process that was killed left unformatted (TRACE.pending, ca_ring.h), made
 * into its trace: for the tools (cacheshim report, replay, finish), never loaded into a
 * traced program. */
#ifndef CA_RECOVER_H
#define CA_RECOVER_H

#include <stddef.h>

enum {
    CA_RECOVER_NONE = 0,  /* no pending file: the trace is as its process left it */
    CA_RECOVER_DONE = 1,  /* its calls formatted into the trace, the file finished */
    CA_RECOVER_BUSY = 2,  /* its process is alive and still writes: nothing touched */
    CA_RECOVER_ERROR = -1 /* the pending file is not one this version reads, or I/O failed */
};

/* For the trace file trace: formats the calls in trace.pending into it where its process
 * stopped, finishes the file as the process would have (the blank tail cut, a Chrome trace
 * closed, the note of calls lost to write errors), and removes the pending file. msg: one
 * line for the user on DONE, BUSY and ERROR (without the tool's name). */
int ca_recover(const char *trace, char *msg, size_t cap);

#endif
