/* Control API of the fake CUDA driver (tests/fake/libcuda.so.1).
 *
 * The fake driver implements the driver entry points the shim and the test programs use, on
 * host memory. These extra functions let a test shape the "device" and read what happened.
 * They are exported from the fake libcuda.so.1 itself, so a test links against it (-lcuda
 * from the build dir) or finds them with dlsym on the libcuda handle. All are thread-safe.
 */
#ifndef FAKE_CONTROL_H
#define FAKE_CONTROL_H

#include <cuda.h>
#include <stdint.h>

/* --- the device ------------------------------------------------------------------------ */
/* Number of devices (default 1, or FAKE_CUDA_DEVICES) and each one's memory size (default
 * 16 GiB, or FAKE_CUDA_DEVICE_BYTES, which takes plain bytes). Set before cuInit. (Fake:
 * count 0..16, device 0..15, else abort; both also take effect when set later; the
 * environment, read at cuInit, never overrides a value set here; count 0 makes cuInit fail
 * with CUDA_ERROR_NO_DEVICE.) */
void fake_set_device_count(int count);
void fake_set_device_bytes(int device, uint64_t bytes);
/* Peers: cuDeviceCanAccessPeer answers 1 for any two distinct devices, and
 * cuCtxEnablePeerAccess / cuCtxDisablePeerAccess keep per-context peer lists that the access
 * check of kernels reads (fake_access_faults). (Fake: at most 8 peer contexts per context,
 * then CUDA_ERROR_TOO_MANY_PEERS; a destroyed peer context counts as not enabled.) */
/* Bytes currently allocated on a device through cuMemAlloc* and cuMemCreate, and the count of
 * live cuMemAlloc* allocations (fake_vmm_allocations counts the others). */
uint64_t fake_device_used(int device);
long fake_live_allocations(void);

/* --- pinned host memory ------------------------------------------------------------------- */
/* cuMemAllocHost and cuMemHostAlloc (flags PORTABLE, DEVICEMAP, WRITECOMBINED; others are
 * CUDA_ERROR_INVALID_VALUE) make a host mapping of their own, in the current context, freed
 * by cuMemFreeHost (after the context's work, as the real one waits) or with its context.
 * Bytes and count of live ones; the flags one was allocated with (~0u for none); the host
 * budget, past which they answer CUDA_ERROR_OUT_OF_MEMORY (unlimited by default; takes
 * effect for later calls). (Additions to the original API.) */
uint64_t fake_host_used(void);
long fake_host_allocations(void);
unsigned fake_host_flags(const void *p);
void fake_set_host_bytes(uint64_t bytes);
/* cuMemAllocPitch (rows padded to 512 bytes, or fake_set_pitch_alignment's power of two;
 * element size 4, 8 or 16), cuMemAllocManaged and
 * the stream-ordered cuMemAllocAsync / cuMemAllocFromPoolAsync make
 * cuMemAlloc allocations, counted in fake_device_used and fake_live_allocations and freed by
 * cuMemFree; cuMemFreeAsync frees one once its stream's earlier work completed. A pool
 * (cuMemPoolCreate of pinned memory on a device or the host, or cuDeviceGetDefaultMemPool)
 * keeps its allocations on its own device, whatever the stream's, a host pool's on no device;
 * cuMemAllocFromPoolAsync refuses a pool it did not make with CUDA_ERROR_INVALID_VALUE.
 * (Fake: a pool holds nothing between allocations; cuMemPoolDestroy of a default pool answers
 * CUDA_ERROR_INVALID_VALUE.) */
void fake_set_pitch_alignment(uint64_t bytes);

/* --- virtual memory management -------------------------------------------------------------- */
/* cuMemCreate, cuMemAddressReserve, cuMemMap, cuMemSetAccess and the rest work on host memory:
 * a physical allocation is a memfd of its size, counted against its device like cuMemAlloc
 * memory; a reservation is PROT_NONE address space; a mapping is a shared view of the memfd,
 * usable by copies, memsets and kernels only once cuMemSetAccess gave the device access.
 * See the top of fake_vmm.c; how cuMemGetAddressRange, cuPointerGetAttribute(s) and the IPC
 * handles answer for both kinds of memory: the top of fake_ptr.c. (Fake: one open file
 * descriptor per live physical allocation; cuMemAddressFree of a reservation that still holds
 * mappings fails with CUDA_ERROR_INVALID_VALUE.) */
/* The granularity cuMemGetAllocationGranularity answers, MINIMUM and RECOMMENDED alike, and
 * that cuMemCreate sizes and cuMemMap addresses and sizes must be multiples of: 2 MiB by
 * default, as on an H100. A smaller one (64 KiB) makes tests fast. Takes effect for later
 * calls. (Fake: a power of two from the page size to 1 TiB, else abort.) (Addition to the
 * original API.) */
void fake_set_vmm_granularity(uint64_t bytes);
/* Whether devices offer VMM: on by default, off when FAKE_CUDA_NO_VMM=1 at cuInit; a value
 * set here wins over the environment. While off, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_
 * MANAGEMENT_SUPPORTED is 0 and every VMM entry point returns CUDA_ERROR_NOT_SUPPORTED, the
 * ones that would free something included, so turn it off before using VMM. (Addition to
 * the original API.) */
void fake_set_vmm_supported(int on);
/* Physical allocations not yet freed (freed once released and unmapped everywhere), and
 * reservations not yet freed. (Addition to the original API.) */
long fake_vmm_allocations(void);
long fake_vmm_reservations(void);

/* --- work on streams --------------------------------------------------------------------- */
/* Work on a stream is a sequence of units: this call's, and those of the driver calls that
 * enqueue work (kernel launches, host functions, graph launches, asynchronous copies and
 * memsets; the synchronous copies and memsets are units on the legacy stream that complete
 * before they return). Units complete in order, each only after everything it is ordered
 * after: its stream's earlier units, the legacy stream's rules with blocking streams, and
 * the events its stream waited for (cuStreamWaitEvent). See the top of fake_stream.c. (Fake:
 * a cuLaunchHostFunc function runs when its unit completes, outside the driver lock, before
 * the driver or control call that completed it returns; one at a time, in completion
 * order.) */
/* Enqueue one unit of pending "kernel" work, touching no memory, on a stream (NULL,
 * CU_STREAM_LEGACY, CU_STREAM_PER_THREAD or a created stream), as a launch would. It
 * completes only when the test says so (or as fake_set_work_ticks says). Returns 0, or -1
 * for an unknown stream. (Fake: NULL is the legacy stream; a destroyed stream is unknown; a
 * launch into a capturing stream is captured, not run: it returns 0 and adds no pending
 * work.) */
int fake_stream_launch(CUstream stream);
/* Complete the oldest n pending units of that stream (n < 0: all), and first everything
 * they are ordered after, on any stream. Works on a stream that was already destroyed (its
 * work outlives it, as on a real GPU). */
void fake_stream_retire(CUstream stream, int n);
/* Complete all pending work on every stream. */
void fake_retire_all(void);
/* Pending units on a stream. */
int fake_stream_pending(CUstream stream);
/* The one kernel the fake runs: cuLaunchKernel/cuLaunchKernelEx of this function make a unit
 * that reads and writes [p, p + n), where p = *(CUdeviceptr *)kernelParams[0] and
 * n = *(size_t *)kernelParams[1] (bytes; unless n is 0 they must lie in one live allocation
 * or one VMM reservation, else CUDA_ERROR_INVALID_VALUE; bytes the launching context's device
 * may not access count in fake_access_faults). Any other CUfunction is
 * CUDA_ERROR_INVALID_HANDLE. (Addition to the original API.) */
CUfunction fake_touch_kernel(void);
/* Units submitted after this call complete by themselves `ticks` ticks after they could
 * start (once their stream's previous unit and everything they are ordered after have
 * completed); a tick is one call of any driver entry point (control calls are none). 0, the
 * default, means only a retire or a synchronizing call completes them. Lets a test run a loop where the "GPU" lags
 * behind the host. (Addition to the original API.) */
void fake_set_work_ticks(uint64_t ticks);

/* --- the race check ----------------------------------------------------------------------- */
/* Races so far: each pending unit that touches bytes a newly submitted unit touches without
 * being ordered before it, and each pending unit that touches device bytes a synchronous
 * copy or memset touches from the host. Each is also reported on stderr as "fake cuda: race:
 * ...", naming both entry points and streams. Reset by fake_reset_counters. (Addition to the
 * original API.) */
long fake_races(void);
/* Unsafe, to prove the race check can fail: while on, cuStreamWaitEvent returns
 * CUDA_SUCCESS and orders nothing. (Addition to the original API.) */
void fake_set_ignore_stream_waits(int on);
/* For memory mapped with cuMemMap the check compares the physical memory (handle and offset),
 * not the address: work through a new mapping of a chunk races with work still pending
 * through an old mapping of it, wherever either was mapped. */

/* --- what crashes a real GPU -------------------------------------------------------------- */
/* Unmap faults so far: each pending unit (a launched kernel, an asynchronous copy or memset,
 * not yet completed) that touches memory through a mapping that cuMemUnmap removes, the
 * cuMemUnmap that frees a released allocation included. The real cuMemUnmap does not wait
 * for work, and the GPU faults; the fake counts, reports "fake cuda: unmap fault: ..." on
 * stderr, and carries on. Reset by fake_reset_counters. (Addition to the original API.) */
long fake_unmap_faults(void);
/* Access faults so far: each kernel launch (submitted, not captured) that touches bytes its
 * context's device may not read and write: VMM memory unmapped or without access for that
 * device (cuMemSetAccess), or cuMemAlloc memory of another device whose context the launching
 * context has not enabled peer access to (cuCtxEnablePeerAccess, which does not reach VMM
 * memory, as on the real driver). The launch succeeds, as on the GPU where the kernel faults
 * later; the fake reports "fake cuda: access fault: ..." on stderr. Reset by
 * fake_reset_counters. (Addition to the original API.) */
long fake_access_faults(void);

/* --- counters ----------------------------------------------------------------------------- */
/* Calls of one entry point by exact name ("cuMemAlloc_v2"), and reset of all counters.
 * (Fake: -1 for a name the fake does not export, so a typo cannot pass as "never called";
 * reset also zeroes the after-teardown, capture-violation, race, unmap-fault and
 * access-fault counters.) */
long fake_calls(const char *name);
void fake_reset_counters(void);
/* The name of the fake's entry point number i (0, 1, ...), NULL past the last: to read every
 * counter (tests/trace_player --calls). (Addition to the original API.) */
const char *fake_entry_at(int i);
/* Driver calls that arrived after the fake driver's destructor ran (must stay 0). */
long fake_calls_after_teardown(void);
/* Calls that broke the stream-capture rules: they failed with CUDA_ERROR_STREAM_CAPTURE_
 * UNSUPPORTED or _IMPLICIT and invalidated the conflicting captures, as on the real driver.
 * The rules: while a capture runs, a thread in GLOBAL mode (the default) may not call
 * cuMemAlloc_v2, cuMemFree_v2, cuEventQuery, cuEventSynchronize, cuStreamQuery,
 * cuStreamSynchronize or cuCtxSynchronize if any capture in the process is GLOBAL, and a
 * GLOBAL or THREAD_LOCAL thread may not make them during its own non-RELAXED capture; nobody
 * may use the legacy stream (cuEventRecord, query, synchronize) while a blocking stream of
 * its context captures. A RELAXED thread (cuThreadExchangeStreamCaptureMode) is exempt from
 * the first two. Reset by fake_reset_counters. (Addition to the original API.) */
long fake_capture_violations(void);

/* The fake's own function for an exported entry point name ("cuMemAlloc_v2"), or NULL: what
 * dlsym on libcuda.so.1 returns when nothing interposes on dlsym. A test under a shim that
 * wraps dlsym reaches the driver past it this way. (dlvsym(h, name, "ANY") does not work
 * for that: glibc's dlvsym rejects unversioned definitions in any library that has symbol
 * version data, which every glibc-linked library, the fake and the real libcuda included,
 * has.) (Addition to the original API.) */
void *fake_real_symbol(const char *name);

/* --- injected failures -------------------------------------------------------------------- */
/* The nth next call (1 = the very next) of entry point `name` returns `err` without doing
 * anything. One pending injection per name; a new one replaces it. (Fake: for all three
 * functions, a name the fake does not export aborts the test with a message; nth <= 0
 * clears.) */
void fake_fail_nth(const char *name, long nth, CUresult err);
/* Every call of `name` fails with err until cleared (err = CUDA_SUCCESS clears). */
void fake_fail_always(const char *name, CUresult err);
/* Busy-wait this many nanoseconds inside every call of `name` (0 clears): a slow driver. */
void fake_set_delay_ns(const char *name, uint64_t ns);

#endif
