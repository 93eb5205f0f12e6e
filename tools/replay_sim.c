/* The simulated device and the replay loop. The cache under test is the real one
 * (shim/cs_cache.c); only the device below it is simulated:
 *
 * - memory: a device of cfg->device_size bytes; an allocation (or a physical chunk of the
 *   pooled backend) that does not fit fails as out of memory (no fragmentation: the driver's
 *   own placement is not what is studied here); virtual ranges and mappings always succeed;
 * - time: the trace's own clock. A fence recorded at trace time t completes at t + gpu_lag,
 *   which stands for the GPU running behind the host; waiting on a fence moves the clock to
 *   its completion (the host would block that long);
 * - every driver call is counted, so its cost can be estimated afterwards. */
#include "replay.h"

#include <stdlib.h>
#include <string.h>

#include "cs_cache.h"

/* ---------------------------------------------------------------- the simulated device */

typedef struct {
    uint64_t size, used, next_addr;
    uint64_t now, lag;  /* trace time, fence lag (ns) */
    uint64_t queries, fences;
    uint64_t creates, releases, maps, unmaps;
    uint64_t next_va;   /* the pooled backend's virtual ranges */
    uint64_t *done;     /* completion time of each epoch */
    size_t nepochs, cap_epochs;
    replay_map blocks;  /* addr -> size, to know what a free gives back */
} sim_device;

static int sim_alloc(void *d, uint64_t size, uint64_t *addr, int *raw)
{
    sim_device *s = d;
    if (size > s->size - s->used) {
        *raw = 2;  /* CUDA_ERROR_OUT_OF_MEMORY */
        return CS_BE_OOM;
    }
    if (!replay_map_put(&s->blocks, (replay_slot){.key = s->next_addr, .size = size})) {
        *raw = 2;
        return CS_BE_OOM;
    }
    s->used += size;
    *addr = s->next_addr;
    /* Round up to 1 MiB and leave a 1 MiB gap: distinct, aligned, never 0. */
    s->next_addr += (size + 0xfffff) & ~(uint64_t)0xfffff;
    s->next_addr += 0x100000;
    return CS_BE_OK;
}

static int sim_free(void *d, uint64_t addr, int *raw)
{
    sim_device *s = d;
    replay_slot b;
    if (!replay_map_take(&s->blocks, addr, &b)) {
        *raw = 1;  /* CUDA_ERROR_INVALID_VALUE */
        return CS_BE_ERROR;
    }
    s->used -= b.size;
    return CS_BE_OK;
}

/* A fence is an epoch; epoch e completes at trace time done[e] = its record time + lag.
 * Every free is taken to follow work on the trace's one stream, so every fence records; with
 * a constant lag later epochs complete later, the order the cache relies on. Ordered reuse
 * costs nothing on one stream: the stream already runs after its own earlier work. */
static uint64_t sim_fence(void *d)
{
    sim_device *s = d;
    if (s->nepochs == s->cap_epochs) {
        size_t cap = s->cap_epochs ? 2 * s->cap_epochs : 1024;
        uint64_t *done = realloc(s->done, cap * sizeof *done);
        if (!done)
            return s->nepochs;  /* the last epoch covers it, later: still safe */
        s->done = done;
        s->cap_epochs = cap;
    }
    s->done[s->nepochs++] = s->now + s->lag;
    s->fences++;
    return s->nepochs;  /* epochs are 1-based: epoch e completes at done[e - 1] */
}

static int sim_reached(void *d, uint64_t epoch)
{
    sim_device *s = d;
    s->queries++;
    return epoch == 0 || s->now >= s->done[epoch - 1] ? 1 : 0;
}

static int sim_wait(void *d, uint64_t epoch)
{
    sim_device *s = d;
    if (epoch > 0 && s->now < s->done[epoch - 1])
        s->now = s->done[epoch - 1];
    return 0;
}

static int sim_order_after(void *d, uint64_t epoch)
{
    (void)d;
    (void)epoch;
    return 0;
}

/* The pooled backend's calls. The pool (shim/cs_pool.c) is the real one; below it, chunks
 * are device memory and the rest is counted. */
static int sim_create(void *d, uint64_t size, uint64_t *handle, int *raw)
{
    int rc = sim_alloc(d, size, handle, raw);  /* a chunk is device memory like a block */
    if (rc == CS_BE_OK)
        ((sim_device *)d)->creates++;
    return rc;
}

static int sim_release(void *d, uint64_t handle, int *raw)
{
    sim_device *s = d;
    s->releases++;
    return sim_free(d, handle, raw);
}

static int sim_reserve(void *d, uint64_t size, uint64_t *va, int *raw)
{
    sim_device *s = d;
    (void)raw;
    *va = s->next_va;
    s->next_va += (size + (1ull << 21) - 1) / (1ull << 21) * (1ull << 21) + (1ull << 21);
    return CS_BE_OK;
}

static int sim_unreserve(void *d, uint64_t va, uint64_t size, int *raw)
{
    (void)d, (void)va, (void)size, (void)raw;
    return CS_BE_OK;
}

static int sim_map(void *d, uint64_t va, uint64_t size, uint64_t handle, int *raw)
{
    (void)va, (void)size, (void)handle, (void)raw;
    ((sim_device *)d)->maps++;
    return CS_BE_OK;
}

static int sim_access(void *d, uint64_t va, uint64_t size, int *raw)
{
    (void)d, (void)va, (void)size, (void)raw;
    return CS_BE_OK;  /* its cost is counted per chunk mapped (map_us) */
}

static int sim_unmap(void *d, uint64_t va, uint64_t size, int *raw)
{
    (void)va, (void)size, (void)raw;
    ((sim_device *)d)->unmaps++;
    return CS_BE_OK;
}

/* Waiting for the device: the clock moves to the last fence's completion. */
static int sim_sync(void *d, int *raw)
{
    sim_device *s = d;
    (void)raw;
    if (s->nepochs && s->now < s->done[s->nepochs - 1])
        s->now = s->done[s->nepochs - 1];
    return CS_BE_OK;
}

static const cs_vmm_ops sim_vmm = {sim_create, sim_release, sim_reserve, sim_unreserve,
                                   sim_map, sim_access, sim_unmap, sim_sync};

/* The trace is one stream: busy_streams NULL counts as one. */
static const cs_backend_ops sim_classic = {sim_alloc, sim_free, sim_fence, sim_reached, sim_wait,
                                           sim_order_after, NULL, NULL};
static const cs_backend_ops sim_pooled = {sim_alloc, sim_free, sim_fence, sim_reached, sim_wait,
                                          sim_order_after, NULL, &sim_vmm};

/* ---------------------------------------------------------------- the replay */

static uint64_t cap_for(void *arg, uint64_t total)
{
    (void)total;
    return ((const replay_config *)arg)->cap;
}

static uint64_t threshold_for(void *arg, uint64_t total)
{
    (void)total;
    return ((const replay_config *)arg)->threshold;
}

static void replay_event_one(const replay_event *e, cs_cache *c, cs_heap *h,
                             replay_map *live, uint64_t *live_bytes, replay_result *r)
{
    replay_slot old;
    switch (e->kind) {
    case 'a': {
        r->allocs++;
        uint64_t addr = 0;
        int raw = 0;
        bool ok = cs_cache_alloc(c, h, e->size, &addr, &raw, NULL) == CS_OK;
        /* A PTR still live here was freed by an unrecorded path: its block stays in use (as
         * in tests/trace_player.c) and its bytes stay counted as live. */
        replay_map_take(live, e->ptr, &old);
        if (!replay_map_put(live, (replay_slot){.key = e->ptr, .addr = addr, .size = e->size,
                                                .failed = !ok}))
            ok = false;
        if (!ok) {
            r->replay_failures++;
            break;
        }
        *live_bytes += e->size;
        if (*live_bytes > r->peak_live)
            r->peak_live = *live_bytes;
        break;
    }
    case 'f':
        if (!e->ptr || !replay_map_take(live, e->ptr, &old)) {
            r->skipped_frees++;  /* allocated before recording began, or never */
            break;
        }
        r->frees++;
        if (old.failed) {
            r->dropped_frees++;
            break;
        }
        cs_cache_free(c, old.addr);
        *live_bytes -= old.size;
        break;
    default: /* 'e': failed on the recording device; says nothing about this one */
        r->failed_allocs++;
        break;
    }
}

int replay_run(const replay_trace *t, const replay_config *cfg, replay_result *r)
{
    memset(r, 0, sizeof *r);
    sim_device dev = {.size = cfg->device_size, .next_addr = 0x700000000000ull,
                      .next_va = 0x7f0000000000ull, .lag = cfg->gpu_lag_ns};
    replay_map live;
    if (!replay_map_init(&dev.blocks, 1024) || !replay_map_init(&live, 1024)) {
        replay_map_free(&dev.blocks);
        return -1;
    }
    cs_cache_config cc = {.cap_for = cap_for, .threshold_for = threshold_for,
                          .limit_arg = (void *)cfg,
                          .reuse = cfg->reuse_completed ? CS_REUSE_COMPLETED : CS_REUSE_ORDERED,
                          .pool_headroom_permille = cfg->headroom_pct * 10};
    cs_cache *c = cs_cache_create(&cc);
    cs_heap *h = c ? cs_cache_add_heap(c, (void *)1, 0, cfg->device_size, cfg->classic ? &sim_classic : &sim_pooled,
                                        &dev, cfg->granularity)
                  : NULL;
    if (!h) {
        cs_cache_destroy(c);
        replay_map_free(&dev.blocks);
        replay_map_free(&live);
        return -1;
    }

    uint64_t live_bytes = 0;
    for (size_t i = 0; i < t->nev; i++) {
        const replay_event *e = &t->ev[i];
        if (e->ns > dev.now)  /* a fence wait may have moved the clock past the trace */
            dev.now = e->ns;
        r->events++;
        replay_event_one(e, c, h, &live, &live_bytes, r);
    }

    cacheshim_stats st;
    cs_cache_stats(c, 0, &st);
    r->hits = st.hits;
    r->misses = st.misses;
    r->driver_allocs = st.driver_allocs;
    r->driver_frees = st.driver_frees;
    r->peak_reserved = st.peak_reserved;
    r->releases = st.releases;
    r->oom_recoveries = st.oom_recoveries;
    r->oom_failures = st.oom_failures;
    r->cap_refusals = st.cap_refusals;
    r->fences = dev.fences;
    r->fence_waits = st.fence_waits;
    r->fence_queries = dev.queries;
    r->moves = st.moves;
    r->creates = dev.creates;
    r->chunk_releases = dev.releases;
    r->maps = dev.maps;
    r->unmaps = dev.unmaps;
    r->hit_rate = st.hits + st.misses ? (double)st.hits / (double)(st.hits + st.misses) : 0;
    r->reserved_over_live = r->peak_live ? (double)r->peak_reserved / (double)r->peak_live : 0;

    /* Without the cache every allocation and free of the trace is a driver call; with it,
     * the driver calls it made plus its fences. Frees of blocks still held at the end are
     * left out on both sides (a program exits without them). */
    const replay_costs *k = &cfg->costs;
    r->baseline_us = (double)r->allocs * k->alloc_us + (double)r->frees * k->free_us;
    r->cached_us = (double)r->fences * k->fence_record_us +
                   (double)r->fence_queries * k->fence_query_us;
    if (cfg->classic)
        r->cached_us += (double)r->driver_allocs * k->alloc_us +
                        (double)r->driver_frees * k->free_us;
    else
        r->cached_us += (double)r->creates * k->create_us +
                        (double)r->chunk_releases * k->release_us +
                        (double)r->maps * k->map_us + (double)r->unmaps * k->unmap_us;
    r->saved_us = r->baseline_us - r->cached_us;

    /* Only the cache's bookkeeping and the fences left in it: the device is simulated. */
    cs_cache_forget_heap(c, (void *)1);
    cs_cache_destroy(c);
    replay_map_free(&dev.blocks);
    free(dev.done);
    replay_map_free(&live);
    return 0;
}
