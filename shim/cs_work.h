/* Work on streams: every driver entry point that puts work on a stream calls these
 * around the real call (cs_work_wrappers.c, generated from cuda.h by
 * scripts/gen-work-wrappers). */
#ifndef CS_WORK_H
#define CS_WORK_H
#include <cuda.h>
typedef struct cs_stream cs_stream;
/* Before the real call. `stream` as the caller passed it; per_thread: a NULL stream means
 * the calling thread's per-thread default stream (the _ptsz/_ptds entry points). Makes the
 * stream wait for memory the cache handed out before its fence completed. Returns the
 * stream's record, or NULL when the shim does not track it. */
cs_stream *cs_work_begin(CUstream stream, int per_thread);
/* After the real call: on success, the stream has had work since its last fence. */
void cs_work_end(cs_stream *st, CUresult result);
#endif
