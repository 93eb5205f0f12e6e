/* Fake CUDA driver: the core. Per-call bookkeeping (counters, injected failures and delays,
 * init and teardown checks), the control API, the handle registry, devices and contexts.
 *
 * cuMemAlloc memory lives in fake_mem.c, virtual memory management in fake_vmm.c, who may
 * touch which bytes (and peer access) in fake_access.c, pointer queries and IPC handles in
 * fake_ptr.c, copies and memsets in fake_copy.c, streams/events/capture in fake_stream.c,
 * the units of work, their order, completion and race check in fake_timeline.c, kernel
 * launches, host functions and graph launches in fake_launch.c, the discovery paths
 * (cuGetProcAddress) and error strings in fake_proc.c. */
#include "fake_internal.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- per-entry-point bookkeeping ------------------------------------------------------- */

struct entry_state {
    const char *name;
    bool noinit;
    atomic_long calls;
    /* Fast path: calls of an entry with nothing injected never take the lock. */
    atomic_bool armed;
    /* Under the lock: */
    long countdown;
    CUresult nth_err, always_err;
    uint64_t delay_ns;
};

#define NOINIT true
#define INIT false
static struct entry_state g_entries[ID_COUNT] = {
#define FAKE_ROW(fn, init) [ID_##fn] = {.name = #fn, .noinit = init},
    FAKE_ENTRIES(FAKE_ROW)
#undef FAKE_ROW
};

static pthread_mutex_t g_mutex = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool g_initialized;
static atomic_bool g_torn_down;
static atomic_long g_after_teardown;
atomic_long fake_violations;

void fake_lock(void)
{
    pthread_mutex_lock(&g_mutex);
    fake_timeline_advance();
}

/* Host functions run outside the lock, so one that calls the driver does not deadlock. */
void fake_unlock(void)
{
    bool callbacks = fake_callbacks_waiting();
    pthread_mutex_unlock(&g_mutex);
    if (callbacks)
        fake_run_callbacks();
}

/* A test that uses a control call wrongly (an entry point the fake does not have, a value out
 * of range) is broken: say so loudly rather than let, say, an injection silently never
 * fire. */
_Noreturn void fake_die(const char *what, const char *name)
{
    fprintf(stderr, "fake cuda: %s: %s\n", what, name ? name : "(null)");
    abort();
}

static struct entry_state *find_entry(const char *name)
{
    if (!name)
        return NULL;
    for (int i = 0; i < ID_COUNT; i++)
        if (strcmp(g_entries[i].name, name) == 0)
            return &g_entries[i];
    return NULL;
}

static void spin_ns(uint64_t ns)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do
        clock_gettime(CLOCK_MONOTONIC, &t);
    while ((uint64_t)(t.tv_sec - t0.tv_sec) * 1000000000u + (uint64_t)t.tv_nsec -
               (uint64_t)t0.tv_nsec <
           ns);
}

static void rearm(struct entry_state *e)
{
    atomic_store(&e->armed, e->countdown > 0 || e->always_err != CUDA_SUCCESS || e->delay_ns);
}

static CUresult injected(struct entry_state *e)
{
    fake_lock();
    uint64_t delay = e->delay_ns;
    CUresult rc = e->always_err;
    if (e->countdown > 0 && --e->countdown == 0)
        rc = e->nth_err;
    rearm(e);
    fake_unlock();
    /* Outside the lock: a slow entry point must not stall the other threads' calls. */
    if (delay)
        spin_ns(delay);
    return rc;
}

const char *fake_entry_name(enum fake_entry_id id) { return g_entries[id].name; }

CUresult fake_enter(enum fake_entry_id id)
{
    struct entry_state *e = &g_entries[id];
    fake_self()->entry = id;
    fake_tick();
    atomic_fetch_add_explicit(&e->calls, 1, memory_order_relaxed);
    if (atomic_load_explicit(&g_torn_down, memory_order_acquire)) {
        atomic_fetch_add(&g_after_teardown, 1);
        fprintf(stderr, "fake cuda: %s called after driver teardown\n", e->name);
        return CUDA_ERROR_DEINITIALIZED;
    }
    if (atomic_load_explicit(&e->armed, memory_order_acquire)) {
        CUresult rc = injected(e);
        if (rc != CUDA_SUCCESS)
            return rc;
    }
    if (!e->noinit && !atomic_load_explicit(&g_initialized, memory_order_acquire))
        return CUDA_ERROR_NOT_INITIALIZED;
    return CUDA_SUCCESS;
}

/* The real libcuda is unusable once its own destructors have run; a shim that calls it from a
 * later destructor or atexit handler is buggy, and this is how the tests see it. */
__attribute__((destructor)) static void fake_teardown(void)
{
    atomic_store_explicit(&g_torn_down, true, memory_order_release);
}

/* ---- control API: counters and injections ---------------------------------------------- */

FAKE_API long fake_calls(const char *name)
{
    struct entry_state *e = find_entry(name);
    /* -1 rather than 0, so that a misspelt name cannot pass an "is never called" check. */
    return e ? atomic_load(&e->calls) : -1;
}

FAKE_API const char *fake_entry_at(int i)
{
    return i >= 0 && i < ID_COUNT ? g_entries[i].name : NULL;
}

FAKE_API void fake_reset_counters(void)
{
    for (int i = 0; i < ID_COUNT; i++)
        atomic_store(&g_entries[i].calls, 0);
    atomic_store(&g_after_teardown, 0);
    atomic_store(&fake_violations, 0);
    atomic_store(&fake_race_count, 0);
    atomic_store(&fake_unmap_fault_count, 0);
    atomic_store(&fake_access_fault_count, 0);
}

FAKE_API long fake_calls_after_teardown(void) { return atomic_load(&g_after_teardown); }

FAKE_API long fake_capture_violations(void) { return atomic_load(&fake_violations); }

FAKE_API void fake_fail_nth(const char *name, long nth, CUresult err)
{
    struct entry_state *e = find_entry(name);
    if (!e)
        fake_die("fake_fail_nth: unknown entry point", name);
    fake_lock();
    e->countdown = nth > 0 ? nth : 0;
    e->nth_err = err;
    rearm(e);
    fake_unlock();
}

FAKE_API void fake_fail_always(const char *name, CUresult err)
{
    struct entry_state *e = find_entry(name);
    if (!e)
        fake_die("fake_fail_always: unknown entry point", name);
    fake_lock();
    e->always_err = err;
    rearm(e);
    fake_unlock();
}

FAKE_API void fake_set_delay_ns(const char *name, uint64_t ns)
{
    struct entry_state *e = find_entry(name);
    if (!e)
        fake_die("fake_set_delay_ns: unknown entry point", name);
    fake_lock();
    e->delay_ns = ns;
    rearm(e);
    fake_unlock();
}

/* ---- handle registry ------------------------------------------------------------------- */

/* A tree of object addresses: validating a handle never dereferences a pointer the fake did
 * not hand out, so garbage or stale handles get an error code, not a crash. */
static void *g_handles;

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y ? -1 : x > y;
}

bool fake_reg_add(void *obj) { return tsearch(obj, &g_handles, cmp_ptr) != NULL; }

void fake_reg_del(void *obj) { tdelete(obj, &g_handles, cmp_ptr); }

void *fake_reg_find(const void *handle, enum fake_kind kind)
{
    if (!handle)
        return NULL;
    void **node = tfind(handle, &g_handles, cmp_ptr);
    if (!node || *(const enum fake_kind *)*node != kind)
        return NULL;
    return *node;
}

/* ---- threads --------------------------------------------------------------------------- */

static __thread struct fake_thread t_self;
static atomic_ulong g_next_tid;
static pthread_key_t g_exit_key;
static pthread_once_t g_exit_once = PTHREAD_ONCE_INIT;

struct fake_thread *fake_self(void)
{
    if (!t_self.id)
        t_self.id = atomic_fetch_add(&g_next_tid, 1) + 1;
    return &t_self;
}

/* A per-thread default stream dies with its thread; its leftover work stays retirable. */
static void on_thread_exit(void *unused)
{
    (void)unused;
    fake_lock();
    fake_thread_exit_streams(&t_self);
    fake_unlock();
}

/* A program may have taken every key (test_streams.c keys-full): then none, and the program's
 * key 0 left alone. */
static bool g_exit_key_ok;

static void make_exit_key(void)
{
    g_exit_key_ok = pthread_key_create(&g_exit_key, on_thread_exit) == 0;
}

void fake_watch_thread_exit(void)
{
    pthread_once(&g_exit_once, make_exit_key);
    if (g_exit_key_ok)
        pthread_setspecific(g_exit_key, &t_self);
}

/* ---- devices --------------------------------------------------------------------------- */

#define DEFAULT_DEVICE_BYTES 17179869184ull

struct fake_device fake_devices[FAKE_MAX_DEVICES];
int fake_device_count = 1;
long fake_live_allocs;
fake_ctx *fake_all_ctxs;
static bool g_count_set;
static uint64_t g_default_bytes = DEFAULT_DEVICE_BYTES;

uint64_t fake_budget(int device)
{
    const struct fake_device *d = &fake_devices[device];
    return d->bytes_set ? d->bytes : g_default_bytes;
}

static bool valid_device(CUdevice dev) { return dev >= 0 && dev < fake_device_count; }

FAKE_API void fake_set_device_count(int count)
{
    if (count < 0 || count > FAKE_MAX_DEVICES)
        fake_die("fake_set_device_count: count out of range 0..16", NULL);
    fake_lock();
    fake_device_count = count;
    g_count_set = true;
    fake_unlock();
}

FAKE_API void fake_set_device_bytes(int device, uint64_t bytes)
{
    if (device < 0 || device >= FAKE_MAX_DEVICES)
        fake_die("fake_set_device_bytes: device out of range 0..15", NULL);
    fake_lock();
    fake_devices[device].bytes = bytes;
    fake_devices[device].bytes_set = true;
    fake_unlock();
}

FAKE_API uint64_t fake_device_used(int device)
{
    if (device < 0 || device >= FAKE_MAX_DEVICES)
        return 0;
    fake_lock();
    uint64_t used = fake_devices[device].used;
    fake_unlock();
    return used;
}

FAKE_API long fake_live_allocations(void)
{
    fake_lock();
    long n = fake_live_allocs;
    fake_unlock();
    return n;
}

/* Environment values that do not parse are reported and ignored, never half-used. */
static bool env_u64(const char *name, uint64_t max, uint64_t *out)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || s[0] == '-' || v > max) {
        fprintf(stderr, "fake cuda: ignoring %s=%s (want an integer 0..%llu)\n", name, s,
                (unsigned long long)max);
        return false;
    }
    *out = v;
    return true;
}

static void read_environment(void)
{
    uint64_t v;
    if (!g_count_set && env_u64("FAKE_CUDA_DEVICES", FAKE_MAX_DEVICES, &v))
        fake_device_count = (int)v;
    if (env_u64("FAKE_CUDA_DEVICE_BYTES", UINT64_MAX, &v))
        g_default_bytes = v;
    if (env_u64("FAKE_CUDA_NO_VMM", 1, &v))
        fake_vmm_environment(v == 0);
}

FAKE_API CUresult cuInit(unsigned int flags)
{
    ENTER(cuInit);
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    fake_lock();
    CUresult rc = CUDA_SUCCESS;
    if (!atomic_load(&g_initialized)) {
        read_environment();
        if (fake_device_count == 0)
            rc = CUDA_ERROR_NO_DEVICE;
        else
            atomic_store_explicit(&g_initialized, true, memory_order_release);
    }
    fake_unlock();
    return rc;
}

FAKE_API CUresult cuDriverGetVersion(int *version)
{
    ENTER(cuDriverGetVersion);
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    *version = 13000;
    return CUDA_SUCCESS;
}

static CUresult device_get(CUdevice *out, int ordinal)
{
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *out = ordinal;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    ENTER(cuDeviceGet);
    LOCKED(device_get(device, ordinal));
}

FAKE_API CUresult cuDeviceGetCount(int *count)
{
    ENTER(cuDeviceGetCount);
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    fake_lock();
    *count = fake_device_count;
    fake_unlock();
    return CUDA_SUCCESS;
}

static CUresult device_name(char *name, int len, CUdevice dev)
{
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "Fake CUDA Device %d", dev);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    ENTER(cuDeviceGetName);
    LOCKED(device_name(name, len, dev));
}

/* "fake-cuda-gpu-" and the ordinal in the last two bytes: the same device in every process. */
static CUresult device_uuid(CUuuid *uuid, CUdevice dev)
{
    static const char prefix[14] = {'f', 'a', 'k', 'e', '-', 'c', 'u', 'd', 'a', '-', 'g', 'p', 'u', '-'};
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    memcpy(uuid->bytes, prefix, sizeof prefix);
    uuid->bytes[14] = (char)(dev >> 8);
    uuid->bytes[15] = (char)dev;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    ENTER(cuDeviceGetUuid);
    LOCKED(device_uuid(uuid, dev));
}

FAKE_API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    ENTER(cuDeviceGetUuid_v2);
    LOCKED(device_uuid(uuid, dev));
}

static CUresult total_mem(uint64_t *bytes, CUdevice dev)
{
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = fake_budget(dev);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    ENTER(cuDeviceTotalMem_v2);
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t b = 0;
    fake_lock();
    CUresult rc = total_mem(&b, dev);
    fake_unlock();
    if (rc == CUDA_SUCCESS)
        *bytes = (size_t)b;
    return rc;
}

/* The 32-bit original: sizes clamp, as they would have on a device larger than 4 GiB. */
FAKE_API CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    ENTER(cuDeviceTotalMem);
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t b = 0;
    fake_lock();
    CUresult rc = total_mem(&b, dev);
    fake_unlock();
    if (rc == CUDA_SUCCESS)
        *bytes = b > UINT_MAX ? UINT_MAX : (unsigned int)b;
    return rc;
}

/* An H100-like device, except that it offers none of the optional memory APIs the fake does
 * not implement (pools, managed memory, host VMM locations, GPUDirect RDMA), so nobody takes a
 * path that cannot work. VMM is offered unless turned off (fake_set_vmm_supported). */
static int attribute_value(CUdevice_attribute attrib, CUdevice dev)
{
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return 9;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return 0;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return 132;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: return 1;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: return dev + 1;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
        return fake_vmm_supported();
    default: return 0;
    }
}

FAKE_API CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    ENTER(cuDeviceGetAttribute);
    if (!pi || (int)attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    fake_lock();
    bool ok = valid_device(dev);
    int value = ok ? attribute_value(attrib, dev) : 0;
    fake_unlock();
    if (!ok)
        return CUDA_ERROR_INVALID_DEVICE;
    *pi = value;
    return CUDA_SUCCESS;
}

/* ---- contexts -------------------------------------------------------------------------- */

/* Contexts are never freed: a handle is unique for the life of the process, so a stale one
 * can never be mistaken for a newer context. */
static fake_ctx *ctx_new(int device, bool primary)
{
    fake_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->kind = KIND_CTX;
    c->device = device;
    c->primary = primary;
    fake_stream_init(&c->legacy, c, 0, true);
    if (!fake_reg_add(c)) {
        free(c);
        return NULL;
    }
    c->next_all = fake_all_ctxs;
    fake_all_ctxs = c;
    return c;
}

/* Everything the context owned goes: work completes (as the driver's teardown waits for it),
 * memory is unmapped, events are freed, streams become invalid handles. */
static void ctx_destroy(fake_ctx *c)
{
    fake_streams_ctx_destroyed(c);
    fake_mem_ctx_destroyed(c);
    c->destroyed = true;
    struct fake_device *d = &fake_devices[c->device];
    if (c->primary && d->primary == c) {
        d->primary = NULL;
        d->primary_refs = 0;
    }
}

CUresult fake_current_ctx(fake_ctx **out)
{
    struct fake_thread *t = fake_self();
    if (t->depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    fake_ctx *c = t->stack[t->depth - 1];
    if (c->destroyed)
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *out = c;
    return CUDA_SUCCESS;
}

static CUresult primary_retain(CUcontext *pctx, CUdevice dev)
{
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    struct fake_device *d = &fake_devices[dev];
    if (!d->primary && !(d->primary = ctx_new(dev, true)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    d->primary_refs++;
    *pctx = (CUcontext)d->primary;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    ENTER(cuDevicePrimaryCtxRetain);
    LOCKED(primary_retain(pctx, dev));
}

static CUresult primary_release(CUdevice dev)
{
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    struct fake_device *d = &fake_devices[dev];
    if (d->primary_refs == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (--d->primary_refs == 0)
        ctx_destroy(d->primary);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    ENTER(cuDevicePrimaryCtxRelease_v2);
    LOCKED(primary_release(dev));
}

FAKE_API CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    ENTER(cuDevicePrimaryCtxRelease);
    LOCKED(primary_release(dev));
}

static CUresult primary_reset(CUdevice dev)
{
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (fake_devices[dev].primary)
        ctx_destroy(fake_devices[dev].primary);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    ENTER(cuDevicePrimaryCtxReset_v2);
    LOCKED(primary_reset(dev));
}

FAKE_API CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    ENTER(cuDevicePrimaryCtxReset);
    LOCKED(primary_reset(dev));
}

static CUresult primary_state(CUdevice dev, unsigned int *flags, int *active)
{
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *flags = fake_devices[dev].primary_flags;
    *active = fake_devices[dev].primary != NULL;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    ENTER(cuDevicePrimaryCtxGetState);
    LOCKED(primary_state(dev, flags, active));
}

static CUresult ctx_create(CUcontext *pctx, CUdevice dev)
{
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    struct fake_thread *t = fake_self();
    if (t->depth == FAKE_MAX_CTX_DEPTH)
        return CUDA_ERROR_OUT_OF_MEMORY;
    fake_ctx *c = ctx_new(dev, false);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    t->stack[t->depth++] = c;
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                                 CUdevice dev)
{
    ENTER(cuCtxCreate_v4);
    (void)params; /* execution affinity and CIG do not exist here */
    (void)flags;
    LOCKED(ctx_create(pctx, dev));
}

static CUresult ctx_destroy_api(CUcontext handle)
{
    fake_ctx *c = fake_reg_find(handle, KIND_CTX);
    /* The primary context belongs to the cuDevicePrimaryCtx* calls. */
    if (!c || c->destroyed || c->primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct fake_thread *t = fake_self();
    if (t->depth > 0 && t->stack[t->depth - 1] == c)
        t->depth--;
    ctx_destroy(c);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    ENTER(cuCtxDestroy_v2);
    LOCKED(ctx_destroy_api(ctx));
}

FAKE_API CUresult cuCtxDestroy(CUcontext ctx)
{
    ENTER(cuCtxDestroy);
    LOCKED(ctx_destroy_api(ctx));
}

static CUresult ctx_set_current(CUcontext handle)
{
    struct fake_thread *t = fake_self();
    if (!handle) {
        if (t->depth > 0)
            t->depth--;
        return CUDA_SUCCESS;
    }
    fake_ctx *c = fake_reg_find(handle, KIND_CTX);
    if (!c || c->destroyed)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (t->depth == 0)
        t->depth = 1;
    t->stack[t->depth - 1] = c;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxSetCurrent(CUcontext ctx)
{
    ENTER(cuCtxSetCurrent);
    LOCKED(ctx_set_current(ctx));
}

FAKE_API CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    ENTER(cuCtxGetCurrent);
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_thread *t = fake_self();
    /* Like the real driver, a context destroyed elsewhere stays current here (stale). */
    *pctx = t->depth ? (CUcontext)t->stack[t->depth - 1] : NULL;
    return CUDA_SUCCESS;
}

static CUresult ctx_push(CUcontext handle)
{
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    fake_ctx *c = fake_reg_find(handle, KIND_CTX);
    if (!c || c->destroyed)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct fake_thread *t = fake_self();
    if (t->depth == FAKE_MAX_CTX_DEPTH)
        return CUDA_ERROR_OUT_OF_MEMORY;
    t->stack[t->depth++] = c;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    ENTER(cuCtxPushCurrent_v2);
    LOCKED(ctx_push(ctx));
}

FAKE_API CUresult cuCtxPushCurrent(CUcontext ctx)
{
    ENTER(cuCtxPushCurrent);
    LOCKED(ctx_push(ctx));
}

static CUresult ctx_pop(CUcontext *pctx)
{
    struct fake_thread *t = fake_self();
    if (t->depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    fake_ctx *c = t->stack[--t->depth];
    if (pctx)
        *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    ENTER(cuCtxPopCurrent_v2);
    LOCKED(ctx_pop(pctx));
}

FAKE_API CUresult cuCtxPopCurrent(CUcontext *pctx)
{
    ENTER(cuCtxPopCurrent);
    LOCKED(ctx_pop(pctx));
}

static CUresult ctx_get_device(CUdevice *dev)
{
    if (!dev)
        return CUDA_ERROR_INVALID_VALUE;
    fake_ctx *c;
    CUresult rc = fake_current_ctx(&c);
    if (rc == CUDA_SUCCESS)
        *dev = c->device;
    return rc;
}

FAKE_API CUresult cuCtxGetDevice(CUdevice *device)
{
    ENTER(cuCtxGetDevice);
    LOCKED(ctx_get_device(device));
}

static CUresult ctx_synchronize(void)
{
    fake_ctx *c;
    CUresult rc = fake_current_ctx(&c);
    if (rc == CUDA_SUCCESS)
        rc = fake_capture_guard_ctx_sync(c);
    if (rc == CUDA_SUCCESS)
        fake_complete_ctx(c);
    return rc;
}

FAKE_API CUresult cuCtxSynchronize(void)
{
    ENTER(cuCtxSynchronize);
    LOCKED(ctx_synchronize());
}

static CUresult ctx_api_version(CUcontext handle, unsigned int *version)
{
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    fake_ctx *c;
    CUresult rc = CUDA_SUCCESS;
    if (handle) {
        c = fake_reg_find(handle, KIND_CTX);
        if (!c || c->destroyed)
            rc = CUDA_ERROR_INVALID_CONTEXT;
    } else {
        rc = fake_current_ctx(&c);
    }
    /* The value the real driver documents for every context made with the v2+ API. */
    if (rc == CUDA_SUCCESS)
        *version = 3020;
    return rc;
}

FAKE_API CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
    ENTER(cuCtxGetApiVersion);
    LOCKED(ctx_api_version(ctx, version));
}
