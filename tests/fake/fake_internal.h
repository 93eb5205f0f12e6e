/* Internals shared by the fake driver's source files. Nothing here is exported: the
 * library's only exports are the cu* entry points and the fake_* control API. */
#ifndef FAKE_INTERNAL_H
#define FAKE_INTERNAL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
/* Lets cuda.h declare the versioned names (cuMemAlloc_v2, v1 cuMemAlloc, *_ptsz) so that we
 * can define each of them, as the real libcuda does. */
#ifndef __CUDA_API_VERSION_INTERNAL
#define __CUDA_API_VERSION_INTERNAL
#endif
#include <cuda.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fake_control.h"

/* The project builds with -fvisibility=hidden; the entry points and control API must leave
 * the library whatever the flags, so each definition says so itself. */
#define FAKE_API __attribute__((visibility("default")))
#define FAKE_HIDDEN __attribute__((visibility("hidden")))

/* Every entry point the fake exports, by exact exported name. NOINIT marks the ones the
 * real driver answers before cuInit. The list gives each name a small integer id so the
 * per-call bookkeeping is an array index, not a string lookup. */
#define FAKE_ENTRIES(X)                                                                        \
    X(cuInit, NOINIT)                                                                          \
    X(cuDriverGetVersion, NOINIT)                                                              \
    X(cuGetErrorName, NOINIT)                                                                  \
    X(cuGetErrorString, NOINIT)                                                                \
    X(cuGetProcAddress, NOINIT)                                                                \
    X(cuGetProcAddress_v2, NOINIT)                                                             \
    X(cuDeviceGet, INIT)                                                                       \
    X(cuDeviceGetCount, INIT)                                                                  \
    X(cuDeviceGetName, INIT)                                                                   \
    X(cuDeviceGetUuid, INIT)                                                                   \
    X(cuDeviceGetUuid_v2, INIT)                                                                \
    X(cuDeviceTotalMem, INIT)                                                                  \
    X(cuDeviceTotalMem_v2, INIT)                                                               \
    X(cuDeviceGetAttribute, INIT)                                                              \
    X(cuDeviceCanAccessPeer, INIT)                                                             \
    X(cuDevicePrimaryCtxRetain, INIT)                                                          \
    X(cuDevicePrimaryCtxRelease, INIT)                                                         \
    X(cuDevicePrimaryCtxRelease_v2, INIT)                                                      \
    X(cuDevicePrimaryCtxReset, INIT)                                                           \
    X(cuDevicePrimaryCtxReset_v2, INIT)                                                        \
    X(cuDevicePrimaryCtxGetState, INIT)                                                        \
    X(cuCtxCreate_v4, INIT)                                                                    \
    X(cuCtxDestroy, INIT)                                                                      \
    X(cuCtxDestroy_v2, INIT)                                                                   \
    X(cuCtxSetCurrent, INIT)                                                                   \
    X(cuCtxGetCurrent, INIT)                                                                   \
    X(cuCtxPushCurrent, INIT)                                                                  \
    X(cuCtxPushCurrent_v2, INIT)                                                               \
    X(cuCtxPopCurrent, INIT)                                                                   \
    X(cuCtxPopCurrent_v2, INIT)                                                                \
    X(cuCtxGetDevice, INIT)                                                                    \
    X(cuCtxSynchronize, INIT)                                                                  \
    X(cuCtxGetApiVersion, INIT)                                                                \
    X(cuCtxEnablePeerAccess, INIT)                                                             \
    X(cuCtxDisablePeerAccess, INIT)                                                            \
    X(cuMemAlloc, INIT)                                                                        \
    X(cuMemAlloc_v2, INIT)                                                                     \
    X(cuMemFree, INIT)                                                                         \
    X(cuMemFree_v2, INIT)                                                                      \
    X(cuMemGetInfo, INIT)                                                                      \
    X(cuMemGetInfo_v2, INIT)                                                                   \
    X(cuMemGetAddressRange, INIT)                                                              \
    X(cuMemGetAddressRange_v2, INIT)                                                           \
    X(cuMemsetD8, INIT)                                                                        \
    X(cuMemsetD8_v2, INIT)                                                                     \
    X(cuMemsetD8_v2_ptds, INIT)                                                                \
    X(cuMemcpyHtoD, INIT)                                                                      \
    X(cuMemcpyHtoD_v2, INIT)                                                                   \
    X(cuMemcpyHtoD_v2_ptds, INIT)                                                              \
    X(cuMemcpyDtoH, INIT)                                                                      \
    X(cuMemcpyDtoH_v2, INIT)                                                                   \
    X(cuMemcpyDtoH_v2_ptds, INIT)                                                              \
    X(cuMemcpyDtoD, INIT)                                                                      \
    X(cuMemcpyDtoD_v2, INIT)                                                                   \
    X(cuMemcpyDtoD_v2_ptds, INIT)                                                              \
    X(cuStreamCreate, INIT)                                                                    \
    X(cuStreamCreateWithPriority, INIT)                                                        \
    X(cuStreamDestroy, INIT)                                                                   \
    X(cuStreamDestroy_v2, INIT)                                                                \
    X(cuStreamQuery, INIT)                                                                     \
    X(cuStreamQuery_ptsz, INIT)                                                                \
    X(cuStreamSynchronize, INIT)                                                               \
    X(cuStreamSynchronize_ptsz, INIT)                                                          \
    X(cuStreamGetFlags, INIT)                                                                  \
    X(cuStreamGetFlags_ptsz, INIT)                                                             \
    X(cuStreamGetCtx, INIT)                                                                    \
    X(cuStreamGetCtx_ptsz, INIT)                                                               \
    X(cuEventCreate, INIT)                                                                     \
    X(cuEventRecord, INIT)                                                                     \
    X(cuEventRecord_ptsz, INIT)                                                                \
    X(cuEventQuery, INIT)                                                                      \
    X(cuEventSynchronize, INIT)                                                                \
    X(cuEventDestroy, INIT)                                                                    \
    X(cuEventDestroy_v2, INIT)                                                                 \
    X(cuStreamBeginCapture, INIT)                                                              \
    X(cuStreamBeginCapture_ptsz, INIT)                                                         \
    X(cuStreamBeginCapture_v2, INIT)                                                           \
    X(cuStreamBeginCapture_v2_ptsz, INIT)                                                      \
    X(cuStreamBeginCaptureToGraph, INIT)                                                       \
    X(cuStreamBeginCaptureToGraph_ptsz, INIT)                                                  \
    X(cuStreamEndCapture, INIT)                                                                \
    X(cuStreamEndCapture_ptsz, INIT)                                                           \
    X(cuStreamIsCapturing, INIT)                                                               \
    X(cuStreamIsCapturing_ptsz, INIT)                                                          \
    X(cuThreadExchangeStreamCaptureMode, INIT)                                                 \
    X(cuStreamWaitEvent, INIT)                                                                 \
    X(cuStreamWaitEvent_ptsz, INIT)                                                            \
    X(cuLaunchKernel, INIT)                                                                    \
    X(cuLaunchKernel_ptsz, INIT)                                                               \
    X(cuLaunchKernelEx, INIT)                                                                  \
    X(cuLaunchKernelEx_ptsz, INIT)                                                             \
    X(cuLaunchHostFunc, INIT)                                                                  \
    X(cuLaunchHostFunc_ptsz, INIT)                                                             \
    X(cuGraphLaunch, INIT)                                                                     \
    X(cuGraphLaunch_ptsz, INIT)                                                                \
    X(cuMemsetD8Async, INIT)                                                                   \
    X(cuMemsetD8Async_ptsz, INIT)                                                              \
    X(cuMemcpyHtoDAsync_v2, INIT)                                                              \
    X(cuMemcpyHtoDAsync_v2_ptsz, INIT)                                                         \
    X(cuMemcpyDtoHAsync_v2, INIT)                                                              \
    X(cuMemcpyDtoHAsync_v2_ptsz, INIT)                                                         \
    X(cuMemcpyDtoDAsync_v2, INIT)                                                              \
    X(cuMemcpyDtoDAsync_v2_ptsz, INIT)                                                         \
    X(cuMemGetAllocationGranularity, INIT)                                                     \
    X(cuMemCreate, INIT)                                                                       \
    X(cuMemRelease, INIT)                                                                      \
    X(cuMemGetAllocationPropertiesFromHandle, INIT)                                            \
    X(cuMemRetainAllocationHandle, INIT)                                                       \
    X(cuMemExportToShareableHandle, INIT)                                                      \
    X(cuMemImportFromShareableHandle, INIT)                                                    \
    X(cuMemAddressReserve, INIT)                                                               \
    X(cuMemAddressFree, INIT)                                                                  \
    X(cuMemMap, INIT)                                                                          \
    X(cuMemUnmap, INIT)                                                                        \
    X(cuMemSetAccess, INIT)                                                                    \
    X(cuMemGetAccess, INIT)                                                                    \
    X(cuPointerGetAttribute, INIT)                                                             \
    X(cuPointerGetAttributes, INIT)                                                            \
    X(cuIpcGetMemHandle, INIT)                                                                 \
    X(cuIpcOpenMemHandle, INIT)                                                                \
    X(cuIpcOpenMemHandle_v2, INIT)                                                             \
    X(cuIpcCloseMemHandle, INIT)                                                               \
    X(cuMemAllocHost_v2, INIT)                                                                 \
    X(cuMemHostAlloc, INIT)                                                                    \
    X(cuMemFreeHost, INIT)                                                                     \
    X(cuMemAllocPitch_v2, INIT)                                                                \
    X(cuMemAllocManaged, INIT)                                                                 \
    X(cuMemAllocAsync, INIT)                                                                   \
    X(cuMemAllocAsync_ptsz, INIT)                                                              \
    X(cuMemAllocFromPoolAsync, INIT)                                                           \
    X(cuMemAllocFromPoolAsync_ptsz, INIT)                                                      \
    X(cuMemPoolCreate, INIT)                                                                   \
    X(cuMemPoolDestroy, INIT)                                                                  \
    X(cuDeviceGetDefaultMemPool, INIT)                                                         \
    X(cuMemFreeAsync, INIT)                                                                    \
    X(cuMemFreeAsync_ptsz, INIT)

enum fake_entry_id {
#define FAKE_ID(name, init) ID_##name,
    FAKE_ENTRIES(FAKE_ID)
#undef FAKE_ID
        ID_COUNT
};

/* A control call used wrongly: print what (and the name, if any) and abort. */
FAKE_HIDDEN _Noreturn void fake_die(const char *what, const char *name);

/* Count the call, apply injected delays and failures, refuse calls before cuInit and after
 * teardown. Returns CUDA_SUCCESS when the entry point should go on. */
FAKE_HIDDEN CUresult fake_enter(enum fake_entry_id id);

#define ENTER(name)                                                                            \
    do {                                                                                       \
        CUresult enter_rc_ = fake_enter(ID_##name);                                            \
        if (enter_rc_ != CUDA_SUCCESS)                                                         \
            return enter_rc_;                                                                  \
    } while (0)

/* One mutex guards all driver state: simple, and plenty fast next to an mmap per alloc.
 * Taking it first brings the timeline up to the current tick (fake_timeline_advance), so
 * whatever a caller reads under it is up to date; releasing it runs the host functions of
 * the units that completed meanwhile (cuLaunchHostFunc), outside the lock. */
FAKE_HIDDEN void fake_lock(void);
FAKE_HIDDEN void fake_unlock(void);

#define LOCKED(expr)                                                                           \
    do {                                                                                       \
        fake_lock();                                                                           \
        CUresult locked_rc_ = (expr);                                                          \
        fake_unlock();                                                                         \
        return locked_rc_;                                                                     \
    } while (0)

/* ---- objects -------------------------------------------------------------------------- */

/* The first member of every handle object, checked after a registry lookup so a stream
 * handle passed as an event is refused instead of misread. */
enum fake_kind { KIND_CTX = 0x43547831, KIND_STREAM, KIND_EVENT, KIND_POOL };

typedef struct fake_ctx fake_ctx;
typedef struct fake_stream fake_stream;
typedef struct fake_event fake_event;
typedef struct fake_alloc fake_alloc;
typedef struct fake_unit fake_unit;

/* A vector clock: for each stream named, the units of it (numbered from 1 in submission
 * order) that something is ordered after, 1..seq. A stream not named contributes nothing.
 * Entries whose units have all completed may be dropped at any time: ordering against
 * completed work no longer matters to anyone. Streams are never freed, so the pointers
 * stay valid. */
struct fake_clock_entry {
    fake_stream *stream;
    uint64_t seq;
};

struct fake_clock {
    size_t n, cap;
    struct fake_clock_entry *v;
};

/* Device bytes [p, p + n), as a caller names them, and whether it writes them. */
struct fake_range {
    CUdeviceptr p;
    size_t n;
    bool write;
};

/* Device bytes a unit touches: [va, va + n) as its caller named them, and the memory behind
 * them, which is what the race check compares. For cuMemAlloc memory that is the address
 * itself (space 0, at = va); for memory mapped with cuMemMap it is the physical allocation
 * (space = its handle, at = the offset in it), so work through two mappings of the same
 * memory is compared, and `mapping` names the mapping it went through (0: none), which the
 * unmap check looks for. */
struct fake_touch {
    CUdeviceptr va;
    size_t n;
    uint64_t space, at, mapping;
};

/* The touches of one operation, built by fake_access.c, and the access faults found on the
 * way (a kernel touching bytes its device may not access): the first one's address. */
struct fake_touches {
    int n, cap;
    struct fake_touch *v;
    int faults;
    CUdeviceptr fault_at;
};

struct fake_stream {
    enum fake_kind kind;
    fake_ctx *ctx;
    unsigned flags;
    int priority;
    bool legacy;     /* the context's NULL / CU_STREAM_LEGACY stream */
    bool per_thread; /* some thread's CU_STREAM_PER_THREAD stream */
    bool destroyed;
    bool linked; /* on ctx->streams */
    /* Units numbered so far and completed so far: units complete in order, so the pending
     * ones are completed+1..submitted, kept in units (oldest first). */
    uint64_t submitted, completed;
    fake_unit *units, *units_tail;
    /* What the stream's next unit is ordered after by the stream itself: its latest unit
     * (and so all that one was after) and the events it waited for since. The legacy rules
     * for the next unit are added when it is submitted (fake_stream_snapshot). */
    struct fake_clock clock;
    bool busy; /* on the timeline's list of streams with pending units */
    fake_stream *busy_prev, *busy_next;
    /* Capture state; cap_status is a CUstreamCaptureStatus. A capture sequence is the
     * stream that began it (cap_origin) plus the streams that joined it by waiting on an
     * event recorded in it; all share cap_seq and copy the origin's mode, owner, graph. */
    int cap_status;
    CUstreamCaptureMode cap_mode;
    unsigned long cap_owner; /* fake thread id of the thread that began it */
    CUgraph cap_graph;       /* cuStreamBeginCaptureToGraph's graph, else NULL */
    uint64_t cap_seq;
    bool cap_origin;
    fake_stream *prev, *next;
};

#define FAKE_MAX_PEERS 8

struct fake_ctx {
    enum fake_kind kind;
    int device;
    bool primary;
    bool destroyed;
    fake_stream legacy;
    fake_stream *streams; /* created and per-thread streams, plus destroyed ones with work */
    fake_event *events;
    fake_alloc *allocs;
    /* Contexts whose cuMemAlloc memory this one's kernels may touch (cuCtxEnablePeerAccess);
     * destroyed ones count as not enabled. */
    fake_ctx *peers[FAKE_MAX_PEERS];
    int npeers;
    fake_ctx *next_all;
};

struct fake_event {
    enum fake_kind kind;
    fake_ctx *ctx;
    unsigned flags;
    bool in_graph;   /* last recorded into a capturing stream */
    uint64_t cap_seq; /* that capture sequence, when in_graph */
    /* What the last record captured outside a capture: the event is complete once every
     * unit named has completed. Empty when never recorded or in_graph. */
    struct fake_clock clock;
    fake_event *prev, *next;
};

struct fake_alloc {
    CUdeviceptr base;
    size_t size, maplen;
    uint64_t id; /* unique, never reused (the pointer attribute BUFFER_ID) */
    fake_ctx *ctx;
    int device;  /* whose memory it counts as: ctx's, a pool's (-1: a host pool's, none) */
    fake_alloc *prev, *next;
};

#define FAKE_MAX_DEVICES 16
#define FAKE_MAX_CTX_DEPTH 64
#define FAKE_MAX_PTDS 16

struct fake_device {
    uint64_t bytes, used;
    bool bytes_set; /* set by fake_set_device_bytes: the environment does not override it */
    fake_ctx *primary;
    int primary_refs;
    unsigned primary_flags;
};

/* Per-thread driver state: the context stack, capture interaction mode, per-thread default
 * streams (one per context this thread used CU_STREAM_PER_THREAD in). */
struct fake_thread {
    unsigned long id;
    enum fake_entry_id entry; /* the entry point this thread is in, for messages */
    fake_ctx *stack[FAKE_MAX_CTX_DEPTH];
    int depth;
    CUstreamCaptureMode mode;
    struct {
        fake_ctx *ctx;
        fake_stream *stream;
    } ptds[FAKE_MAX_PTDS];
    int nptds;
};

/* All of these are touched under fake_lock() only. */
extern FAKE_HIDDEN struct fake_device fake_devices[FAKE_MAX_DEVICES];
extern FAKE_HIDDEN int fake_device_count;
extern FAKE_HIDDEN long fake_live_allocs;
extern FAKE_HIDDEN fake_ctx *fake_all_ctxs;
/* Counters read and reset without the lock: capture violations, races, unmap faults and
 * access faults. */
extern FAKE_HIDDEN atomic_long fake_violations;
extern FAKE_HIDDEN atomic_long fake_race_count;
extern FAKE_HIDDEN atomic_long fake_unmap_fault_count;
extern FAKE_HIDDEN atomic_long fake_access_fault_count;

FAKE_HIDDEN struct fake_thread *fake_self(void);
FAKE_HIDDEN const char *fake_entry_name(enum fake_entry_id id);
/* Arrange for this thread's per-thread streams to be retired from use when it exits. */
FAKE_HIDDEN void fake_watch_thread_exit(void);
/* Memory size of a device: fake_set_device_bytes, else FAKE_CUDA_DEVICE_BYTES, else 16 GiB. */
FAKE_HIDDEN uint64_t fake_budget(int device);

/* Ids for allocations, mappings and physical allocations: unique for the life of the
 * process, never 0 (fake_mem.c; under the lock). */
FAKE_HIDDEN uint64_t fake_next_id(void);

/* Handle registry: contexts and streams stay in it forever (their handles are never reused),
 * events leave it when destroyed. */
FAKE_HIDDEN bool fake_reg_add(void *obj);
FAKE_HIDDEN void fake_reg_del(void *obj);
FAKE_HIDDEN void *fake_reg_find(const void *handle, enum fake_kind kind);

/* Current context, or INVALID_CONTEXT (none) / CONTEXT_IS_DESTROYED. */
FAKE_HIDDEN CUresult fake_current_ctx(fake_ctx **out);

/* ---- streams (fake_stream.c) ------------------------------------------------------------ */
FAKE_HIDDEN void fake_stream_init(fake_stream *s, fake_ctx *ctx, unsigned flags, bool legacy);
/* Resolve an API stream handle; ptsz: a NULL handle means the per-thread stream. Refuses
 * destroyed streams unless allow_destroyed. */
FAKE_HIDDEN CUresult fake_resolve_stream(CUstream h, bool ptsz, bool allow_destroyed,
                                         fake_stream **out);
/* A created or per-thread stream without CU_STREAM_NON_BLOCKING: the legacy stream and it
 * are ordered after each other's earlier work. */
FAKE_HIDDEN bool fake_blocking(const fake_stream *s);
/* Drop a destroyed stream from its context's list once it has no pending work. */
FAKE_HIDDEN void fake_stream_prune(fake_stream *s);
/* May an asynchronous operation go into s now? CUDA_SUCCESS with *captured set when s
 * captures (the operation becomes a graph node: no unit, no effect), or the error: use of
 * the legacy stream while a blocking stream of its context captures (a violation), or an
 * invalidated capture. */
FAKE_HIDDEN CUresult fake_async_admit(fake_stream *s, bool *captured);
/* The stream a synchronous copy or memset runs on (the legacy stream, or the per-thread one
 * for the _ptds forms), after the capture rules for a call that waits for it. */
FAKE_HIDDEN CUresult fake_sync_stream(bool ptds, fake_stream **out);
/* Tear down what a dying context owns in streams, events and captures. */
FAKE_HIDDEN void fake_streams_ctx_destroyed(fake_ctx *ctx);
/* Capture rules: CUDA_SUCCESS, or the error (counted as a violation) for an unsafe call. */
FAKE_HIDDEN CUresult fake_capture_guard_unsafe(void);
FAKE_HIDDEN CUresult fake_capture_guard_ctx_sync(const fake_ctx *ctx);
FAKE_HIDDEN void fake_thread_exit_streams(struct fake_thread *t);

/* ---- the timeline (fake_timeline.c) ----------------------------------------------------- */
/* One tick per entry point call; called by fake_enter, without the lock. */
FAKE_HIDDEN void fake_tick(void);
/* Complete the units whose ticks ran out by now (fake_set_work_ticks); under the lock. */
FAKE_HIDDEN void fake_timeline_advance(void);
/* Whether completed units left host functions to run (under the lock), and running them
 * (without it: fake_unlock does both). */
FAKE_HIDDEN bool fake_callbacks_waiting(void);
FAKE_HIDDEN void fake_run_callbacks(void);

/* Submit one unit of work on s for entry point `name`: it touches t (NULL: nothing) and calls
 * fn(data) when it completes (fn may be NULL). Reports the races it has with pending work.
 * CUDA_SUCCESS, or CUDA_ERROR_OUT_OF_MEMORY (nothing submitted). */
FAKE_HIDDEN CUresult fake_submit(fake_stream *s, const char *name, const struct fake_touches *t,
                                 CUhostFn fn, void *data);
/* A synchronous operation on s: one unit that completes, with all it is ordered after,
 * before the call returns; then the host touches t, a race with any unit that still touches
 * the same memory. */
FAKE_HIDDEN CUresult fake_submit_sync(fake_stream *s, const char *name,
                                      const struct fake_touches *t);
/* Pending units of s. */
FAKE_HIDDEN uint64_t fake_pending(const fake_stream *s);
/* Complete the oldest n pending units of s (n < 0: all), and all they are ordered after. */
FAKE_HIDDEN void fake_retire(fake_stream *s, int64_t n);
/* Complete every pending unit of the context's streams (and all they are ordered after),
 * or of every context. */
FAKE_HIDDEN void fake_complete_ctx(fake_ctx *ctx);
FAKE_HIDDEN void fake_complete_all(void);
/* What an operation submitted on s now would be ordered after: the stream's clock plus the
 * legacy rules. Replaces *out. CUDA_SUCCESS or CUDA_ERROR_OUT_OF_MEMORY. */
FAKE_HIDDEN CUresult fake_stream_snapshot(const fake_stream *s, struct fake_clock *out);
/* Whether everything enqueued on s (for the legacy stream: and on its context's blocking
 * streams) has completed; and making it so, as cuStreamSynchronize does. */
FAKE_HIDDEN bool fake_stream_idle(const fake_stream *s);
FAKE_HIDDEN void fake_stream_drain(const fake_stream *s);
/* A clock: all its units completed? Complete them (and all they are ordered after). Join
 * src into dst (CUDA_SUCCESS or CUDA_ERROR_OUT_OF_MEMORY). Empty it; free its memory. */
FAKE_HIDDEN bool fake_clock_done(const struct fake_clock *c);
FAKE_HIDDEN void fake_clock_complete(const struct fake_clock *c);
FAKE_HIDDEN CUresult fake_clock_join(struct fake_clock *dst, const struct fake_clock *src);
FAKE_HIDDEN void fake_clock_clear(struct fake_clock *c);
FAKE_HIDDEN void fake_clock_free(struct fake_clock *c);
/* fake_set_ignore_stream_waits: cuStreamWaitEvent orders nothing. */
FAKE_HIDDEN bool fake_ignore_waits(void);
/* cuMemUnmap of mapping `mapping`, [va, va + n): each pending unit that touches memory
 * through it is an unmap fault, counted (fake_unmap_faults) and reported on stderr. */
FAKE_HIDDEN void fake_unmap_check(uint64_t mapping, CUdeviceptr va, size_t n);

/* ---- memory (fake_mem.c) ---------------------------------------------------------------- */
FAKE_HIDDEN void fake_mem_ctx_destroyed(fake_ctx *ctx);
/* The live cuMemAlloc allocation containing p, or NULL. */
FAKE_HIDDEN fake_alloc *fake_mem_find(CUdeviceptr p);
/* A cuMemAlloc allocation in the current context, as cuMemAlloc makes it (capture_guard: it
 * refuses to run where a capture forbids it); the free of one, after its context's work, as
 * cuMemFree. The other allocation calls (fake_host.c) use them too. Driver lock held. */
FAKE_HIDDEN CUresult fake_mem_alloc_current(CUdeviceptr *dptr, size_t size, bool capture_guard);
/* One listed in context c (gone with it) but of `device`'s memory, or of none (-1: a host
 * pool's): a stream-ordered allocation from a pool (fake_host.c). Driver lock held. */
FAKE_HIDDEN CUresult fake_mem_alloc_in(fake_ctx *c, int device, CUdeviceptr *dptr, size_t size);
FAKE_HIDDEN CUresult fake_mem_free_at(CUdeviceptr p);
/* Pinned host memory of a destroyed context goes with it (fake_host.c). */
FAKE_HIDDEN void fake_host_ctx_destroyed(fake_ctx *ctx);

/* ---- virtual memory management (fake_vmm.c) ---------------------------------------------- */
/* What an address in a reservation is. */
struct fake_vmm_at {
    CUdeviceptr res_base; /* the reservation */
    size_t res_size;
    bool mapped; /* the rest only when mapped: */
    CUdeviceptr map_base;
    size_t map_size;
    uint64_t map_id;  /* unique, never reused */
    uint64_t handle;  /* the physical allocation's handle: unique, never reused */
    uint64_t offset;  /* of the address in the physical allocation */
    int device;       /* where the physical allocation lives */
    CUmemAllocationHandleType handle_types; /* as requested at cuMemCreate */
    unsigned char access[FAKE_MAX_DEVICES]; /* CUmemAccess_flags of each device */
};
/* false if p lies in no reservation. */
FAKE_HIDDEN bool fake_vmm_at(CUdeviceptr p, struct fake_vmm_at *out);
/* VMM offered (the device attribute), and the environment's say at cuInit (FAKE_CUDA_NO_VMM),
 * which a value set by fake_set_vmm_supported overrides. */
FAKE_HIDDEN bool fake_vmm_supported(void);
FAKE_HIDDEN void fake_vmm_environment(bool supported);

/* ---- who may touch which bytes (fake_access.c) ------------------------------------------- */
/* Add to t the touches of a copy or memset of r done by a context of device `dev`:
 * CUDA_SUCCESS; CUDA_ERROR_INVALID_VALUE unless the bytes lie inside one live allocation or
 * in mapped VMM memory that dev may access so; or CUDA_ERROR_OUT_OF_MEMORY. */
FAKE_HIDDEN CUresult fake_access_copy(struct fake_touches *t, const struct fake_range *r, int dev);
/* The same for the n > 0 bytes at p touched by a kernel launched in ctx: they must lie inside
 * one allocation or one reservation; bytes ctx may not read and write add an access fault to
 * t, which fake_access_faulted counts once the kernel is submitted. */
FAKE_HIDDEN CUresult fake_access_kernel(struct fake_touches *t, CUdeviceptr p, size_t n,
                                        const fake_ctx *ctx);
FAKE_HIDDEN void fake_access_faulted(const char *name, const fake_stream *s,
                                     const struct fake_touches *t);
/* Whether kernels of context `by` may touch cuMemAlloc memory of context `owner`: same
 * device, or peer access enabled from by to owner. */
FAKE_HIDDEN bool fake_ctx_reaches(const fake_ctx *by, const fake_ctx *owner);
FAKE_HIDDEN void fake_touches_free(struct fake_touches *t);

#endif
