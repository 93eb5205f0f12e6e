/* Call sites (CACHESHIM_TRACE_STACK; layer 3, under ca_trace.c, see ca_desc.h): the return
 * addresses of the program's frames at each traced allocation, and the objects they fall in,
 * for cacheshim-report to symbolize. */
#ifndef CA_STACK_H
#define CA_STACK_H

#include <stddef.h>
#include <stdint.h>

#include "ca_rec.h"

/* From the options: frames to record (0 off, at most CA_STACK_MAX). */
void ca_stack_init(int depth);
/* Is fn an allocation whose call site is recorded? */
extern unsigned char ca_stack_fn[CA_FN_COUNT];
/* The calling thread's return addresses outside the tracer, innermost first; how many.
 * Called where the record is begun, on the calling thread. */
unsigned ca_stack_capture(uint64_t *pcs);
/* JSON Lines, written before r's record by the thread that writes it (any thread, no lock
 * held while the objects are looked up): one line for each object of r's frames not yet
 * described in this process's file:
 *   {"pid":P,"object":"/path/libx.so","base":"0x7f..","build_id":"ab12..."}
 * "base" is the load bias (the address minus the file's virtual address). Returns the
 * length, at most cap. */
size_t ca_stack_objects(int pid, const ca_rec *r, char *buf, size_t cap);
/* fork: the child's objects table is usable even if a thread was adding to it. */
void ca_stack_fork_child(void);

#endif
