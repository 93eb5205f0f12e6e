/* The shim's state: options, the cache, the heap of each context, fork and exit. */
#include "cs_shim.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cs_backend.h"
#include "cs_debug.h"
#include "cs_host.h"
#include "cs_ipc.h"
#include "cs_outside.h"
#include "cs_group.h"
#include "cs_report.h"
#include "cs_streams.h"

static cs_shim shim;
/* CACHESHIM_GROUP's segment, joined at start; NULL without a group. */
static cs_group *group;
static uint64_t group_devices;  /* atomic: ordinals told to the group (bit = ordinal) */
static pthread_once_t shim_once = PTHREAD_ONCE_INIT;
static bool shim_ready;

/* Heaps are found per thread without the cache lock: a thread's last (context, heap) pair,
 * valid while no heap has been forgotten since (heap_generation). */
static uint64_t heap_generation;
static _Thread_local struct {
    CUcontext ctx;
    cs_heap *heap;
    uint64_t generation;
} last;

/* ---------------------------------------------------------------- options and limits */

/* A line of the options parser or of the statistics, through cs_log. */
static void log_line(const char *line, void *arg)
{
    (void)arg;
    static const char prefix[] = "cacheshim: ";
    if (strncmp(line, prefix, sizeof prefix - 1) == 0)
        line += sizeof prefix - 1;
    cs_log("%s", line);
}

static const char *env(const char *name)
{
    return secure_getenv(name);
}

static uint64_t cap_for(void *arg, uint64_t total)
{
    (void)arg;
    return cs_cap_resolve(&shim.opts.cap, total, CS_MIN_CAP);
}

static uint64_t threshold_for(void *arg, uint64_t total)
{
    (void)arg;
    return cs_size_resolve(&shim.opts.release_threshold, total);
}

static const char *reason_name(cs_release_reason why)
{
    switch (why) {
    case CS_RELEASE_THRESHOLD: return "above CACHESHIM_RELEASE_THRESHOLD";
    case CS_RELEASE_CAP: return "to stay under CACHESHIM_CAP";
    case CS_RELEASE_OOM: return "out-of-memory recovery";
    case CS_RELEASE_TRIM: return "cacheshim_trim";
    case CS_RELEASE_MOVE: return "moved to a new block";
    }
    return "?";
}

static void on_release(void *arg, int device, uint64_t addr, uint64_t size, cs_release_reason why)
{
    (void)arg;
    if (shim.opts.verbose < 2)
        return;
    char sz[32];
    cs_bytes_format(size, sz, sizeof sz);
    if (addr == 0)
        cs_log("released %s of pooled free memory on device %d (%s)", sz, device,
               reason_name(why));
    else
        cs_log("released %s at 0x%llx on device %d (%s)", sz, (unsigned long long)addr, device,
               reason_name(why));
}

static const char *host_reason_name(cs_release_reason why)
{
    switch (why) {
    case CS_RELEASE_THRESHOLD: return "above CACHESHIM_HOST_RELEASE_THRESHOLD";
    case CS_RELEASE_CAP: return "to stay under CACHESHIM_HOST_CAP";
    default: return reason_name(why);
    }
}

static void on_host_release(void *arg, int device, uint64_t addr, uint64_t size,
                            cs_release_reason why)
{
    (void)arg;
    (void)device;
    if (shim.opts.verbose < 2)
        return;
    char sz[32];
    cs_bytes_format(size, sz, sizeof sz);
    cs_log("released %s of pinned host memory at 0x%llx (%s)", sz, (unsigned long long)addr,
           host_reason_name(why));
}

/* A release threshold above the cap does nothing, and a cap in percent may come to less than
 * one allocation: said once per device (or once for pinned host memory), when its sizes are
 * known. */
static void warn_limits(int device, uint64_t total)
{
    static uint64_t said;  /* atomic: bit per device, bit 63 for host memory */
    int bit = device < 0 ? 63 : device % 63;
    if (__atomic_fetch_or(&said, 1ull << bit, __ATOMIC_RELAXED) & (1ull << bit))
        return;
    bool host = device < 0;
    const cs_size_spec *cap = host ? &shim.opts.host_cap : &shim.opts.cap;
    const cs_size_spec *threshold =
        host ? &shim.opts.host_release_threshold : &shim.opts.release_threshold;
    const char *cap_name = host ? "CACHESHIM_HOST_CAP" : "CACHESHIM_CAP";
    uint64_t min = host ? CS_MIN_HOST_CAP : CS_MIN_CAP;
    char where[64], line[512];
    if (host)
        snprintf(where, sizeof where, "pinned host memory");
    else
        snprintf(where, sizeof where, "device %d", device);
    uint64_t bytes = cs_size_resolve(cap, total);
    if (bytes < min) {
        /* A percentage too small for one allocation here: no cap (cs_cap_resolve). */
        char spec[96], sz[32], least[32];
        cs_size_format(cap, spec, sizeof spec);
        char *dm = strstr(spec, " of device memory");
        if (host && dm)  /* a host cap's percentage is of the machine's memory */
            snprintf(dm, sizeof spec - (size_t)(dm - spec), " of the machine's memory");
        cs_bytes_format(bytes, sz, sizeof sz);
        cs_bytes_format(min, least, sizeof least);
        cs_log("%s (%s) is %s for %s, less than one allocation (%s): no cap there", cap_name,
               spec, sz, where, least);
    } else if (cs_threshold_above_cap(cap, threshold, cap_name,
                                      host ? "CACHESHIM_HOST_RELEASE_THRESHOLD"
                                           : "CACHESHIM_RELEASE_THRESHOLD",
                                      total, where, line, sizeof line)) {
        log_line(line, NULL);
    }
}

/* ---------------------------------------------------------------- the group */

static bool group_charge(void *arg, int device, uint64_t bytes, uint64_t cap, uint64_t *short_by)
{
    return cs_group_charge(arg, device, bytes, cap, short_by);  /* CS_UNLIMITED: none */
}

static void group_uncharge(void *arg, int device, uint64_t bytes)
{
    cs_group_uncharge(arg, device, bytes);
}

static uint64_t group_others(void *arg, int device)
{
    return cs_group_others(arg, device);
}

/* Joins CACHESHIM_GROUP; a segment that cannot be used is said in one line, and the process
 * runs with its own cap alone. */
static void group_join(cs_cache_config *config)
{
    cs_group_status st;
    group = cs_group_open(CS_GROUP_DIR, shim.opts.group, (unsigned)getuid(), &st);
    if (!group) {
        char why[160];
        cs_group_explain(&st, why, sizeof why);
        cs_log("CACHESHIM_GROUP=%s: %s: %s; running without the group, CACHESHIM_CAP "
               "applies to this process alone",
               shim.opts.group, st.path, why);
        return;
    }
    config->group_charge = group_charge;
    config->group_uncharge = group_uncharge;
    config->group_others = group_others;
    config->group_arg = group;
}

/* A device's first heap: the group learns its UUID and this process's cap there. */
static void group_device(const cs_driver *d, CUdevice dev, uint64_t total)
{
    if (!group || dev < 0 || dev >= CS_GROUP_DEVICES ||
        (__atomic_fetch_or(&group_devices, 1ull << dev, __ATOMIC_ACQ_REL) & (1ull << dev)))
        return;
    CUuuid uuid;
    CUresult r = d->cuDeviceGetUuid_v2 ? d->cuDeviceGetUuid_v2(&uuid, dev)
                                       : CUDA_ERROR_NOT_SUPPORTED;
    if (r != CUDA_SUCCESS) {
        cs_log("CACHESHIM_GROUP=%s: device %d cannot be identified (cuDeviceGetUuid failed "
               "with error %d): its memory is not counted in the group",
               shim.opts.group, (int)dev, (int)r);
        return;
    }
    uint64_t cap = cap_for(NULL, total);
    uint64_t other = cs_group_device(group, (int)dev, (const uint8_t *)uuid.bytes, cap);
    if (other) {
        char mine[32], theirs[32];
        cs_bytes_format(cap, mine, sizeof mine);
        cs_bytes_format(other, theirs, sizeof theirs);
        cs_log("CACHESHIM_GROUP=%s: CACHESHIM_CAP on device %d is %s here and %s in another "
               "member; each member's own cap bounds the group's total when it allocates",
               shim.opts.group, (int)dev, cap == CS_UNLIMITED ? "unlimited" : mine,
               other == CS_UNLIMITED ? "unlimited" : theirs);
    }
}

/* ---------------------------------------------------------------- fork and exit */

void cs_shim_before_fork(void)
{
    cs_outside_lock();  /* before the cache's lock: uncharging takes it under this one */
    if (shim.cache)
        cs_cache_lock(shim.cache);
    cs_host_lock();
    cs_streams_lock_all();
    cs_quarantine_before_fork();
    cs_debug_before_fork();
}

void cs_shim_after_fork_parent(void)
{
    cs_debug_after_fork_parent();
    cs_quarantine_after_fork_parent();
    cs_streams_unlock_all();
    cs_host_unlock();
    if (shim.cache)
        cs_cache_unlock(shim.cache);
    cs_outside_unlock();
}

void cs_shim_after_fork_child(void)
{
    /* The child cannot use the parent's device memory; it starts with an empty cache. */
    cs_debug_after_fork_child();
    cs_quarantine_after_fork_child();
    cs_host_reset_after_fork();
    if (shim.cache)
        cs_cache_reset_after_fork(shim.cache);
    cs_outside_reset_after_fork();
    cs_streams_reset_after_fork();
    cs_ipc_after_fork_child();
    __atomic_add_fetch(&heap_generation, 1, __ATOMIC_RELEASE);
    /* The parent's slot in the group is the parent's: the child takes its own when it first
     * allocates, and tells the group its devices again with its first heaps. */
    cs_group_after_fork(group);
    group_devices = 0;
}

__attribute__((destructor)) static void at_exit(void)
{
    /* No driver calls here: the driver may already be torn down. */
    if (shim_ready && shim.opts.stats && shim.cache) {
        cs_report_stats(shim.cache, shim.opts.verbose >= 1, log_line, NULL);
        if (cs_host_cache())
            cs_report_host_stats(cs_host_cache(), shim.opts.verbose >= 1, log_line, NULL);
        if (shim.opts.verbose >= 1)
            cs_log("work calls seen: %llu (driver calls that put work on a stream)",
                   (unsigned long long)cs_streams_work_calls());
    }
    if (shim_ready && shim.cache)
        cs_debug_exit_report(shim.opts.stats);
    /* Our share of the group is free for the others (the driver frees our memory as we
     * exit); a thread still allocating counts for nothing from here. */
    cs_group_leave(group);
}

/* ---------------------------------------------------------------- init */

static void init(void)
{
    cs_options_load(&shim.opts, env, log_line, NULL);
    shim.disabled = shim.opts.disable;
    if (shim.opts.verbose >= 1)
        cs_options_print(&shim.opts, log_line, NULL);
    if (!shim.disabled) {
        cs_cache_config config = {
            .cap_for = cap_for,
            .threshold_for = threshold_for,
            .on_release = on_release,
            .reuse = shim.opts.reuse == 1 ? CS_REUSE_COMPLETED : CS_REUSE_ORDERED,
            .capturing = cs_streams_capturing,
            .pool_headroom_permille = (unsigned)shim.opts.headroom * 10,
        };
        if (shim.opts.group[0])
            group_join(&config);
        shim.cache = cs_cache_create(&config);
        if (!shim.cache) {
            cs_log("out of host memory at start; passing every call to the driver");
            shim.disabled = true;
        } else if (!cs_host_init(&shim.opts, on_host_release)) {
            cs_log("out of host memory at start; passing pinned host memory calls to the "
                   "driver");
        } else {
            warn_limits(-1, cs_host_total());
        }
        cs_debug_init(shim.cache, &shim.opts);
    }
    pthread_atfork(cs_shim_before_fork, cs_shim_after_fork_parent, cs_shim_after_fork_child);
    shim_ready = true;
}

cs_shim *cs_shim_get(void)
{
    pthread_once(&shim_once, init);
    return &shim;
}

/* ---------------------------------------------------------------- heaps */

/* The heap of a context, made on first use with the backend the options and the device
 * allow: pooled where the device has virtual memory management, else classic. */
cs_heap *cs_shim_heap_of(const cs_driver *d, CUcontext ctx)
{
    cs_heap *h = cs_cache_heap(shim.cache, ctx);
    if (h)
        return h;
    CUdevice dev;
    size_t total = 0;
    bool pushed;
    if (!cs_ctx_enter(ctx, &pushed))
        return NULL;
    CUresult r = d->cuCtxGetDevice(&dev);
    cs_ctx_leave(pushed);
    if (r != CUDA_SUCCESS || d->cuDeviceTotalMem_v2(&total, dev) != CUDA_SUCCESS)
        return NULL;
    uint64_t gran = shim.opts.backend == 0 ? cs_backend_granularity(dev) : 0;
    if (shim.opts.backend == 0 && !gran && shim.opts.verbose >= 1)
        cs_log("device %d has no virtual memory management: classic backend there", (int)dev);
    void *be = cs_backend_for(ctx, dev);
    if (!be)
        return NULL;
    warn_limits((int)dev, total);
    group_device(d, dev, total);
    h = cs_cache_add_heap(shim.cache, ctx, (int)dev, total,
                          gran ? &cs_cuda_pooled_ops : &cs_cuda_ops, be, gran);
    /* Threads that meet a new context at once each make a backend state; one heap is made,
     * with the first one's. */
    if (!h || cs_cache_heap_dev(h) != be)
        cs_backend_drop(be);
    return h;
}

cs_heap *cs_shim_current_heap(const cs_driver *d, CUcontext *ctx_out)
{
    CUcontext ctx = NULL;
    if (d->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
        return NULL;
    *ctx_out = ctx;
    uint64_t gen = __atomic_load_n(&heap_generation, __ATOMIC_ACQUIRE);
    if (last.ctx == ctx && last.generation == gen && last.heap)
        return last.heap;
    cs_heap *h = cs_shim_heap_of(d, ctx);
    if (!h)
        return NULL;
    last.ctx = ctx;
    last.heap = h;
    last.generation = gen;
    return h;
}

void cs_shim_context_gone(CUcontext ctx)
{
    if (!shim.cache)
        return;
    /* Streams first: the context is marked dead, so the cache's cleanup calls no driver. */
    cs_streams_forget(ctx);
    cs_debug_context_gone(ctx);
    __atomic_add_fetch(&heap_generation, 1, __ATOMIC_RELEASE);
    cs_outside_context_gone(ctx);
    cs_host_context_gone(ctx);
    cs_cache_forget_heap(shim.cache, ctx);
}

/* ---------------------------------------------------------------- failures */

/* The sizes of a failure report, formatted. */
typedef struct {
    char req[32], use[32], cached[32], cap[32];
} failure_text;

static void failure_format(const cs_alloc_failure *f, failure_text *t)
{
    cs_bytes_format(f->requested, t->req, sizeof t->req);
    cs_bytes_format(f->in_use, t->use, sizeof t->use);
    cs_bytes_format(f->cached, t->cached, sizeof t->cached);
    if (f->cap == CS_UNLIMITED)
        snprintf(t->cap, sizeof t->cap, "none");
    else
        cs_bytes_format(f->cap, t->cap, sizeof t->cap);
}

void cs_shim_report_failure(const cs_driver *d, const cs_alloc_failure *f)
{
    if (shim.opts.verbose < 1)
        return;
    failure_text t;
    char dfree[32] = "unknown";
    size_t free_b = 0, total_b = 0;
    failure_format(f, &t);
    if (d->cuMemGetInfo_v2 && d->cuMemGetInfo_v2(&free_b, &total_b) == CUDA_SUCCESS)
        cs_bytes_format(free_b, dfree, sizeof dfree);
    /* Two formats, not one with the reason as %s: docs/troubleshooting.md must show both
     * (tests/check_messages_doc.py). */
    if (f->by_cap && group) {
        char others[32];
        cs_bytes_format(cs_group_others(group, f->device), others, sizeof others);
        cs_log("allocation of %s failed: it would exceed the CACHESHIM_CAP of group %s; in use "
               "%s, cached %s, other members %s, cap %s, device free %s",
               t.req, shim.opts.group, t.use, t.cached, others, t.cap, dfree);
    } else if (f->by_cap)
        cs_log("allocation of %s failed: it would exceed CACHESHIM_CAP; in use %s, cached %s, "
               "cap %s, device free %s",
               t.req, t.use, t.cached, t.cap, dfree);
    else
        cs_log("allocation of %s failed: the device is out of memory; in use %s, cached %s, "
               "cap %s, device free %s",
               t.req, t.use, t.cached, t.cap, dfree);
}

void cs_shim_report_host_failure(const cs_alloc_failure *f)
{
    if (shim.opts.verbose < 1)
        return;
    failure_text t;
    failure_format(f, &t);
    if (f->by_cap)
        cs_log("pinned host allocation of %s failed: it would exceed CACHESHIM_HOST_CAP; in use "
               "%s, cached %s, cap %s",
               t.req, t.use, t.cached, t.cap);
    else
        cs_log("pinned host allocation of %s failed: the driver is out of memory; in use %s, "
               "cached %s, cap %s",
               t.req, t.use, t.cached, t.cap);
}
