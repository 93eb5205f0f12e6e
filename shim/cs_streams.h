/* Where the GPU's work is. Per driver context: the streams the program put work on, which of
 * them had work since their last fence, the fence events (numbered by epochs, completing in
 * order), and the stream waits that let the cache reuse a block before its fence completed.
 *
 * Every entry point that puts work on a stream calls cs_work_begin/cs_work_end (cs_work.h);
 * the cache reaches the fences through the backend (cs_backend.c). */
#ifndef CS_STREAMS_H
#define CS_STREAMS_H

#include <cuda.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct cs_ctx_streams cs_ctx_streams;

/* The stream state of a context, made on first use (NULL if out of host memory). */
cs_ctx_streams *cs_streams_for(CUcontext ctx);
/* The context a state belongs to; whether that context was destroyed (its handles must not
 * reach the driver any more). */
CUcontext cs_streams_context(const cs_ctx_streams *cs);
bool cs_streams_dead(cs_ctx_streams *cs);
/* The context was destroyed with all its streams and events: drop its state without driver
 * calls. */
void cs_streams_forget(CUcontext ctx);
/* The stream states of the contexts alive now, up to max of them in out; returns how many
 * there are. A state is never freed: its pointer stays valid once its context went. */
int cs_streams_all(cs_ctx_streams **out, int max);

/* Fences, as cs_backend_ops describes them. fence, reached and order_after never block;
 * wait does, and is called without the cache's lock. */
uint64_t cs_streams_fence(cs_ctx_streams *cs);
int cs_streams_reached(cs_ctx_streams *cs, uint64_t epoch);
int cs_streams_wait(cs_ctx_streams *cs, uint64_t epoch);
int cs_streams_order_after(cs_ctx_streams *cs, uint64_t epoch);
/* Streams with a fence event not yet seen complete (at least 1). */
int cs_streams_busy(cs_ctx_streams *cs);

/* Before the real cuStreamDestroy: the stream's pending work outlives it. */
void cs_streams_destroying(CUstream stream);

/* Stream capture, per stream. Before the real begin (per_thread: NULL is the per-thread
 * stream): what the stream did before the capture is fenced now, since nothing can be
 * recorded into it while it captures; returns whether the stream was flagged capturing
 * already (a begin of its own before), for begun. After the real begin and end, whatever
 * they returned: the stream's capture state is learnt from the driver (a failed begin on a
 * stream not flagged before leaves it unflagged). */
bool cs_streams_capture_beginning(CUstream stream, int per_thread);
void cs_streams_capture_begun(CUstream stream, int per_thread, CUresult result, bool was);
void cs_streams_capture_ended(CUstream stream, int per_thread);

/* Driver calls that put work on a stream so far (cs_work_begin), for the statistics. */
uint64_t cs_streams_work_calls(void);
/* Does any stream capture now? (The cache gives nothing back while one does.) */
bool cs_streams_capturing(void);

/* Held across fork; in the child, forget everything (the parent's driver state is not ours)
 * and release. */
void cs_streams_lock_all(void);
void cs_streams_unlock_all(void);
void cs_streams_reset_after_fork(void);

#endif
