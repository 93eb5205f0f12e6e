/* The backend: allocation and fences on one real driver context.
 *
 * A fence is a set of events: one on the legacy default stream (which waits for every
 * blocking stream of the context, per-thread default streams included) and one on each live
 * non-blocking stream. Work of a non-blocking stream that was destroyed while busy still runs:
 * such a stream leaves a "zombie" event, and a fence completes only once the zombies older
 * than it have. So a completed fence means all work issued before it has finished, and a
 * later fence implies every earlier one, which the cache relies on. */
#include "cs_backend.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "cs_driver.h"

#define EVENT_POOL 64

typedef struct {
    CUevent event;
    uint64_t seq;
} zombie;

struct cs_ctx_dev {
    CUcontext ctx;
    bool dead;  /* the context was destroyed: its handles must not reach the driver */
    cs_ctx_dev *next;
    CUstream *streams;  /* live non-blocking streams */
    int nstreams, cap_streams;
    zombie *zombies;    /* oldest first */
    int nzombies, cap_zombies;
    uint64_t zombie_seq;
    CUevent pool[EVENT_POOL];
    int npool;
};

typedef struct {
    uint64_t zombie_seq;  /* zombies up to this one must complete too */
    int n, done;          /* events[0..done) already seen complete */
    CUevent events[];
} fence;

/* Guards the context list and each context's streams, zombies and event pool. Taken inside
 * the cache lock (fence calls) and on its own (stream calls), never the other way round. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static cs_ctx_dev *live;
static cs_ctx_dev *dead;  /* kept so late fence_destroy calls find valid memory */

/* ---------------------------------------------------------------- helpers */

static const cs_driver *drv(void)
{
    return cs_driver_get();
}

/* Make ctx current for a driver call that depends on it; *pushed says to pop after. */
static bool enter(CUcontext ctx, bool *pushed)
{
    CUcontext cur = NULL;
    *pushed = false;
    if (drv()->cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == ctx)
        return true;
    if (drv()->cuCtxPushCurrent_v2(ctx) != CUDA_SUCCESS)
        return false;
    *pushed = true;
    return true;
}

static void leave(bool pushed)
{
    CUcontext popped;
    if (pushed)
        drv()->cuCtxPopCurrent_v2(&popped);
}

/* Fence calls run in relaxed capture mode, as PyTorch's allocator does: a capture that
 * another thread begins meanwhile must not see them as unsafe calls. */
static CUstreamCaptureMode relax(void)
{
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (drv()->cuThreadExchangeStreamCaptureMode)
        drv()->cuThreadExchangeStreamCaptureMode(&mode);
    return mode;
}

static void unrelax(CUstreamCaptureMode mode)
{
    if (drv()->cuThreadExchangeStreamCaptureMode)
        drv()->cuThreadExchangeStreamCaptureMode(&mode);
}

static bool grow(void **array, int *cap, int need, size_t elem)
{
    if (need <= *cap)
        return true;
    int n = *cap ? *cap * 2 : 8;
    while (n < need)
        n *= 2;
    void *p = realloc(*array, (size_t)n * elem);
    if (!p)
        return false;
    *array = p;
    *cap = n;
    return true;
}

/* Call with the lock held and the context current. */
static CUevent take_event(cs_ctx_dev *d)
{
    if (d->npool > 0)
        return d->pool[--d->npool];
    CUevent e = NULL;
    if (drv()->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
        return NULL;
    return e;
}

static void give_event(cs_ctx_dev *d, CUevent e)
{
    if (d->dead)
        return;
    if (d->npool < EVENT_POOL)
        d->pool[d->npool++] = e;
    else
        drv()->cuEventDestroy_v2(e);
}

static cs_ctx_dev *find(CUcontext ctx)
{
    for (cs_ctx_dev *d = live; d; d = d->next)
        if (d->ctx == ctx)
            return d;
    return NULL;
}

/* Drop zombies that completed, oldest first, up to seq; true if none up to seq remain. */
static bool zombies_done(cs_ctx_dev *d, uint64_t seq, bool wait)
{
    while (d->nzombies > 0 && d->zombies[0].seq <= seq) {
        CUevent e = d->zombies[0].event;
        CUresult r = wait ? drv()->cuEventSynchronize(e) : drv()->cuEventQuery(e);
        if (r == CUDA_ERROR_NOT_READY)
            return false;
        /* Any other error: the event cannot tell us more; waiting on it forever helps no one. */
        give_event(d, e);
        d->nzombies--;
        for (int i = 0; i < d->nzombies; i++)
            d->zombies[i] = d->zombies[i + 1];
    }
    return true;
}

/* ---------------------------------------------------------------- cache operations */

static int be_alloc(void *dev, uint64_t size, uint64_t *addr, int *raw)
{
    cs_ctx_dev *d = dev;
    bool pushed;
    if (!enter(d->ctx, &pushed)) {
        *raw = CUDA_ERROR_INVALID_CONTEXT;
        return CS_BE_ERROR;
    }
    CUdeviceptr p = 0;
    CUresult r = drv()->cuMemAlloc_v2(&p, (size_t)size);
    leave(pushed);
    *raw = r;
    if (r == CUDA_SUCCESS) {
        *addr = p;
        return CS_BE_OK;
    }
    return r == CUDA_ERROR_OUT_OF_MEMORY ? CS_BE_OOM : CS_BE_ERROR;
}

static int be_free(void *dev, uint64_t addr, int *raw)
{
    cs_ctx_dev *d = dev;
    bool pushed;
    if (d->dead || !enter(d->ctx, &pushed)) {
        *raw = CUDA_ERROR_INVALID_CONTEXT;
        return CS_BE_ERROR;
    }
    CUresult r = drv()->cuMemFree_v2((CUdeviceptr)addr);
    leave(pushed);
    *raw = r;
    return r == CUDA_SUCCESS ? CS_BE_OK : CS_BE_ERROR;
}

static int be_fence_record(void *dev, void **out)
{
    cs_ctx_dev *d = dev;
    bool pushed;
    if (d->dead || !enter(d->ctx, &pushed))
        return -1;
    CUstreamCaptureMode mode = relax();
    pthread_mutex_lock(&lock);
    int n = 1 + d->nstreams;
    fence *f = malloc(sizeof *f + (size_t)n * sizeof(CUevent));
    int made = 0;
    if (f) {
        f->zombie_seq = d->zombie_seq;
        f->n = n;
        f->done = 0;
        for (; made < n; made++) {
            CUstream s = made == 0 ? CU_STREAM_LEGACY : d->streams[made - 1];
            CUevent e = take_event(d);
            if (!e)
                break;
            if (drv()->cuEventRecord(e, s) != CUDA_SUCCESS) {
                give_event(d, e);
                break;
            }
            f->events[made] = e;
        }
    }
    if (f && made < n) {
        for (int i = 0; i < made; i++)
            give_event(d, f->events[i]);
        free(f);
        f = NULL;
    }
    pthread_mutex_unlock(&lock);
    unrelax(mode);
    leave(pushed);
    *out = f;
    return f ? 0 : -1;
}

static int fence_check(cs_ctx_dev *d, fence *f, bool wait)
{
    if (d->dead)
        return -1;
    int result = 1;
    CUstreamCaptureMode mode = relax();
    for (; f->done < f->n; f->done++) {
        CUevent e = f->events[f->done];
        CUresult r = wait ? drv()->cuEventSynchronize(e) : drv()->cuEventQuery(e);
        if (r != CUDA_SUCCESS) {
            result = r == CUDA_ERROR_NOT_READY ? 0 : -1;
            break;
        }
    }
    if (result == 1) {
        pthread_mutex_lock(&lock);
        result = zombies_done(d, f->zombie_seq, wait) ? 1 : 0;
        pthread_mutex_unlock(&lock);
    }
    unrelax(mode);
    return result;
}

static int be_fence_query(void *dev, void *f)
{
    return fence_check(dev, f, false);
}

static int be_fence_wait(void *dev, void *f)
{
    return fence_check(dev, f, true) == 1 ? 0 : -1;
}

static void be_fence_destroy(void *dev, void *fp)
{
    cs_ctx_dev *d = dev;
    fence *f = fp;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < f->n; i++)
        give_event(d, f->events[i]);
    pthread_mutex_unlock(&lock);
    free(f);
}

const cs_backend_ops cs_cuda_ops = {
    .alloc = be_alloc,
    .free = be_free,
    .fence_record = be_fence_record,
    .fence_query = be_fence_query,
    .fence_wait = be_fence_wait,
    .fence_destroy = be_fence_destroy,
};

/* ---------------------------------------------------------------- contexts and streams */

cs_ctx_dev *cs_backend_for(CUcontext ctx)
{
    pthread_mutex_lock(&lock);
    cs_ctx_dev *d = find(ctx);
    if (!d && (d = calloc(1, sizeof *d))) {
        d->ctx = ctx;
        d->next = live;
        live = d;
    }
    pthread_mutex_unlock(&lock);
    return d;
}

void cs_backend_forget(CUcontext ctx)
{
    pthread_mutex_lock(&lock);
    cs_ctx_dev **p = &live;
    while (*p && (*p)->ctx != ctx)
        p = &(*p)->next;
    cs_ctx_dev *d = *p;
    if (d) {
        *p = d->next;
        d->dead = true;
        d->npool = 0;
        d->nzombies = 0;
        d->nstreams = 0;
        d->next = dead;
        dead = d;
    }
    pthread_mutex_unlock(&lock);
}

void cs_backend_stream_created(CUstream stream, unsigned int flags)
{
    if (!(flags & CU_STREAM_NON_BLOCKING))
        return;  /* blocking streams are ordered by the legacy stream's event */
    /* A stream is created in the current context; ask the stream itself first. */
    CUcontext ctx = NULL;
    if ((!drv()->cuStreamGetCtx || drv()->cuStreamGetCtx(stream, &ctx) != CUDA_SUCCESS || !ctx) &&
        (drv()->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx))
        return;
    cs_ctx_dev *d = cs_backend_for(ctx);
    if (!d)
        return;
    pthread_mutex_lock(&lock);
    if (grow((void **)&d->streams, &d->cap_streams, d->nstreams + 1, sizeof(CUstream)))
        d->streams[d->nstreams++] = stream;
    pthread_mutex_unlock(&lock);
}

void cs_backend_stream_destroying(CUstream stream)
{
    pthread_mutex_lock(&lock);
    for (cs_ctx_dev *d = live; d; d = d->next) {
        for (int i = 0; i < d->nstreams; i++) {
            if (d->streams[i] != stream)
                continue;
            d->streams[i] = d->streams[--d->nstreams];
            bool pushed;
            if (enter(d->ctx, &pushed)) {
                CUevent e = take_event(d);
                if (e && drv()->cuEventRecord(e, stream) == CUDA_SUCCESS &&
                    grow((void **)&d->zombies, &d->cap_zombies, d->nzombies + 1,
                         sizeof(zombie))) {
                    d->zombies[d->nzombies++] = (zombie){e, ++d->zombie_seq};
                } else if (e) {
                    give_event(d, e);
                }
                leave(pushed);
            }
            pthread_mutex_unlock(&lock);
            return;
        }
    }
    pthread_mutex_unlock(&lock);
}

static void free_list(cs_ctx_dev *d)
{
    while (d) {
        cs_ctx_dev *next = d->next;
        free(d->streams);
        free(d->zombies);
        free(d);
        d = next;
    }
}

void cs_backend_lock(void)
{
    pthread_mutex_lock(&lock);
}

void cs_backend_unlock(void)
{
    pthread_mutex_unlock(&lock);
}

void cs_backend_reset_after_fork(void)
{
    /* The child holds the lock, taken by cs_backend_lock before fork. */
    free_list(live);
    free_list(dead);
    live = dead = NULL;
    pthread_mutex_unlock(&lock);
}
