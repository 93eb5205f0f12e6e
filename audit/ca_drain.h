/* The formatter (layer 3, under ca_trace.c; see ca_desc.h): raw records from the ring
 * (ca_ring.c) made into the trace's text (ca_format.c, ca_stack.c) and appended to the file
 * (ca_out.c), on a thread of its own, so that the program's threads only copy values. */
#ifndef CA_DRAIN_H
#define CA_DRAIN_H

#include "ca_format.h"

/* The ring is ready: the thread starts (signals blocked; formatting through c). */
void ca_drain_start(const ca_fmt_ctx *c);
/* A writer found the ring over a quarter full: the thread is woken. */
void ca_drain_kick(void);
/* A writer found no room for r (or for n bytes of text when text is not NULL): it formats
 * records itself until there is (order kept), for up to 200 ms; then r is dropped (said
 * once on stderr; a dropped call is counted in a note the formatter writes after the
 * records it formats next), and until a record fits again each call tries once, without
 * waiting. */
void ca_drain_full(const ca_rec *r, const char *text, size_t n, long tid);
/* The process ends (the writers are done): everything in the ring formatted, when the
 * formatter's lock can be had within 100 ms. 1 when nothing is left in the ring. The thread
 * formats nothing more. Async-signal-safe as far as the formatting is (no allocation). */
int ca_drain_finish(void);
/* fork: everything formatted and the lock held across; released in both. */
void ca_drain_fork_prepare(void);
void ca_drain_fork_parent(void);
void ca_drain_fork_child(void);

#endif
