/* The quarantine of CACHESHIM_DEBUG=uaf (cs_debug.h): a freed block is filled with a pattern
 * and held back from the cache, oldest out first once more than CACHESHIM_QUARANTINE bytes
 * are held. When a block leaves, at exit and on cacheshim_debug_check, the pattern is read
 * back: a changed byte is a write after the free, reported with the block's call sites.
 *
 * Ordering, with driver calls alone (so the fake driver tests it as the GPU runs it): at the
 * free, the stream layer fences the context's streams and makes every stream's next work wait
 * for that fence (as ordered reuse does); the fill is then a cuMemsetD8Async on the legacy
 * stream through the shim's own wrapper, which waits first, and is fenced in turn, every
 * stream's next work made to wait for it. The fill thus runs after all work issued before the
 * free, and before all work issued after it: a later write lands on the pattern. The read-back is a
 * cuMemcpyDtoH, ordered after the fill the same way; at exit and on an explicit check the
 * context is synchronized first, so that a kernel still queued has written by then. */
#include "cs_debug.h"

#include <cuda.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cs_driver.h"
#include "cs_shim.h"
#include "cs_streams.h"

#define PATTERN 0xdb               /* "dead block": what a quarantined byte holds */
#define READ_CHUNK (1u << 20)      /* bytes read back at a time */
#define RANGES_SHOWN 8             /* changed ranges named in a report */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static cs_cache *cache;
static uint64_t limit;
static bool abort_on_change;
static cs_quarantined *head, *tail;  /* oldest first */
/* Blocks taken off the list to be checked, until they are back on it or freed into the cache:
 * still quarantined to a second free of theirs (cs_quarantine_holds), which would otherwise
 * reach the cache while the block is still in use there, and free it into it twice. */
static cs_quarantined *leaving;
static uint64_t held_bytes;
static bool closed;                   /* the exit check ran: nothing is held after it */
static bool said_fill, said_read;
static unsigned char pattern[READ_CHUNK];  /* READ_CHUNK bytes of PATTERN, to memcmp against */

/* ---------------------------------------------------------------- list */

static void push(cs_quarantined *q)
{
    q->next = NULL;
    if (tail)
        tail->next = q;
    else
        head = q;
    tail = q;
    held_bytes += q->size;
}

/* With the lock held: q is being checked, off the list / no longer. */
static void leaving_add(cs_quarantined *q)
{
    q->leaving_prev = NULL;
    q->leaving_next = leaving;
    if (leaving)
        leaving->leaving_prev = q;
    leaving = q;
}

static void leaving_remove(cs_quarantined *q)
{
    if (q->leaving_prev)
        q->leaving_prev->leaving_next = q->leaving_next;
    else
        leaving = q->leaving_next;
    if (q->leaving_next)
        q->leaving_next->leaving_prev = q->leaving_prev;
    q->leaving_prev = q->leaving_next = NULL;
}

/* With the lock held: the oldest blocks past the limit (the newest one always stays), on the
 * leaving list. */
static cs_quarantined *take_over_limit(void)
{
    cs_quarantined *out = NULL, **end = &out;
    while (head && head != tail && held_bytes > limit) {
        cs_quarantined *q = head;
        head = q->next;
        held_bytes -= q->size;
        q->next = NULL;
        leaving_add(q);
        *end = q;
        end = &q->next;
    }
    return out;
}

static cs_quarantined *take_all(void)
{
    cs_quarantined *out = head;
    head = tail = NULL;
    held_bytes = 0;
    return out;
}

/* With the lock held: all of them, to be checked, on the leaving list. */
static cs_quarantined *take_all_leaving(void)
{
    cs_quarantined *out = take_all();
    for (cs_quarantined *q = out; q; q = q->next)
        leaving_add(q);
    return out;
}

/* ---------------------------------------------------------------- check */

/* "0x0-0xf, 0x40, ..." */
static void ranges_append(char *buf, size_t len, size_t *o, uint64_t from, uint64_t to)
{
    if (*o >= len)
        return;
    const char *sep = *o ? ", " : "";
    int n = from == to ? snprintf(buf + *o, len - *o, "%s0x%" PRIx64, sep, from)
                       : snprintf(buf + *o, len - *o, "%s0x%" PRIx64 "-0x%" PRIx64, sep, from, to);
    *o += n > 0 ? (size_t)n : 0;
}

/* Reads the block back: 0 unchanged, 1 changed (reported), -1 unreadable, or not read because
 * a stream capture runs (the read-back, a copy on the legacy stream, would invalidate it, as
 * the synchronize would). sync: wait for all the context's work first. */
static int verify(const cs_quarantined *q, bool sync)
{
    bool pushed;
    if (cs_streams_capturing() || !cs_ctx_enter((CUcontext)q->ctx, &pushed))
        return -1;
    unsigned char *buf = malloc(q->size < READ_CHUNK ? q->size : READ_CHUNK);
    CUresult r = buf ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS && sync)
        r = cs_driver_get()->cuCtxSynchronize();
    uint64_t changed = 0;
    int nranges = 0;
    uint64_t start = 0, last = 0;
    bool open = false;
    char shown[512] = "";
    size_t o = 0;
    for (uint64_t off = 0; r == CUDA_SUCCESS && off < q->size; off += READ_CHUNK) {
        size_t n = q->size - off < READ_CHUNK ? (size_t)(q->size - off) : READ_CHUNK;
        /* The shim's own wrapper: ordered after the fill like any program's copy. */
        r = cuMemcpyDtoH_v2(buf, (CUdeviceptr)(q->addr + off), n);
        if (r == CUDA_SUCCESS && !memcmp(buf, pattern, n))
            continue;  /* the usual case, at memcmp's speed */
        for (size_t i = 0; r == CUDA_SUCCESS && i < n; i++) {
            if (buf[i] == PATTERN)
                continue;
            uint64_t at = off + i;
            changed++;
            if (open && at == last + 1) {
                last = at;
                continue;
            }
            if (open && ++nranges <= RANGES_SHOWN)
                ranges_append(shown, sizeof shown, &o, start, last);
            start = last = at;
            open = true;
        }
    }
    if (open && ++nranges <= RANGES_SHOWN)
        ranges_append(shown, sizeof shown, &o, start, last);
    cs_ctx_leave(pushed);
    free(buf);
    if (r != CUDA_SUCCESS) {
        if (!__atomic_exchange_n(&said_read, true, __ATOMIC_RELAXED))
            cs_log("use-after-free check: reading back the block at 0x%" PRIx64 " failed "
                   "(error %d); blocks that cannot be read are not checked (said once)",
                   q->addr, (int)r);
        return -1;
    }
    if (!changed)
        return 0;
    cs_log("use after free: the block at 0x%" PRIx64 " of %" PRIu64 " bytes (device %d) was "
           "written after its free: %" PRIu64 " bytes changed, at offsets %s%s",
           q->addr, q->size, q->device, changed, shown, nranges > RANGES_SHOWN ? ", ..." : "");
    cs_site_print(q->alloc_site, "  allocated at:");
    cs_site_print(q->free_site, "  freed at:");
    return 1;
}

static void found(int changed)
{
    if (changed && abort_on_change) {
        cs_log("aborting: CACHESHIM_DEBUG=uaf found a use after free (uaf-report reports and "
               "goes on)");
        abort();
    }
}

/* Checks each block of the list (leaving) and frees it into the cache. */
static void release(cs_quarantined *list)
{
    int changed = 0;
    while (list) {
        cs_quarantined *next = list->next;
        changed += verify(list, false) == 1;
        found(changed);
        cs_cache_free(cache, list->addr);
        /* Off the leaving list only after the free: a second free before it would otherwise
         * free the block into the cache twice. The price: a thread that gets the block from
         * the cache, uses it and frees it again in the few instructions until the lock below
         * is reported for a double free it did not make. */
        pthread_mutex_lock(&lock);
        leaving_remove(list);
        pthread_mutex_unlock(&lock);
        free(list);
        list = next;
    }
}

/* Held across fork; the child holds none of the parent's device memory (the cache forgot
 * it too). */
void cs_quarantine_before_fork(void)
{
    pthread_mutex_lock(&lock);
}

void cs_quarantine_after_fork_parent(void)
{
    pthread_mutex_unlock(&lock);
}

void cs_quarantine_after_fork_child(void)
{
    leaving = NULL;  /* the other threads' lists, which the child has not: their records stay */
    cs_quarantined *all = take_all();
    while (all) {
        cs_quarantined *next = all->next;
        free(all);
        all = next;
    }
    pthread_mutex_unlock(&lock);
}

/* ---------------------------------------------------------------- the interface */

void cs_quarantine_init(cs_cache *c, uint64_t bytes, bool abort_when_changed)
{
    cache = c;
    limit = bytes;
    abort_on_change = abort_when_changed;
    memset(pattern, PATTERN, sizeof pattern);
}

/* Orders the fill after all work issued before the free, and issues it. */
static bool fill(const cs_quarantined *q)
{
    cs_ctx_streams *cs = cs_streams_for((CUcontext)q->ctx);
    if (!cs || cs_streams_dead(cs) || cs_streams_capturing())
        return false;
    uint64_t epoch = cs_streams_fence(cs);
    if (cs_streams_order_after(cs, epoch) != 0 && cs_streams_wait(cs, epoch) != 0)
        return false;
    bool pushed;
    if (!cs_ctx_enter((CUcontext)q->ctx, &pushed))
        return false;
    /* The shim's own wrapper: the legacy stream waits for the fence before the fill. */
    CUresult r = cuMemsetD8Async((CUdeviceptr)q->addr, PATTERN, (size_t)q->size, NULL);
    cs_ctx_leave(pushed);
    /* And every stream's next work waits for the fill, so that a stray write issued after the
     * free on any stream lands on the pattern, not under it. */
    if (r == CUDA_SUCCESS) {
        uint64_t filled = cs_streams_fence(cs);
        if (cs_streams_order_after(cs, filled) != 0 && cs_streams_wait(cs, filled) != 0)
            r = CUDA_ERROR_UNKNOWN;
    }
    if (r != CUDA_SUCCESS && !__atomic_exchange_n(&said_fill, true, __ATOMIC_RELAXED))
        cs_log("use-after-free check: filling the freed block at 0x%" PRIx64 " failed (error "
               "%d); blocks that cannot be filled go back to the cache unchecked (said once)",
               q->addr, (int)r);
    return r == CUDA_SUCCESS;
}

bool cs_quarantine_add(const cs_quarantined *block)
{
    if (__atomic_load_n(&closed, __ATOMIC_ACQUIRE))
        return false;
    cs_quarantined *q = malloc(sizeof *q);
    if (!q)
        return false;
    *q = *block;
    if (!fill(q)) {
        free(q);
        return false;
    }
    pthread_mutex_lock(&lock);
    push(q);
    cs_quarantined *out = take_over_limit();
    pthread_mutex_unlock(&lock);
    release(out);
    return true;
}

bool cs_quarantine_holds(uint64_t addr, cs_site *alloc_site, cs_site *free_site, uint64_t *size)
{
    bool held = false;
    pthread_mutex_lock(&lock);
    for (int pass = 0; pass < 2 && !held; pass++)
        for (cs_quarantined *q = pass ? leaving : head; q && !held;
             q = pass ? q->leaving_next : q->next)
            if (q->addr == addr) {
                *alloc_site = q->alloc_site;
                *free_site = q->free_site;
                *size = q->size;
                held = true;
            }
    pthread_mutex_unlock(&lock);
    return held;
}

bool cs_quarantine_drain(void)
{
    pthread_mutex_lock(&lock);
    cs_quarantined *all = take_all_leaving();
    pthread_mutex_unlock(&lock);
    release(all);
    return all != NULL;
}

int cs_quarantine_check(bool final)
{
    pthread_mutex_lock(&lock);
    if (final)
        __atomic_store_n(&closed, true, __ATOMIC_RELEASE);
    cs_quarantined *all = take_all_leaving();
    pthread_mutex_unlock(&lock);
    /* Each context synchronized once: before its first block is read. */
    const void *synced[64];
    int nsynced = 0, changed = 0;
    for (cs_quarantined *q = all; q; q = q->next) {
        bool sync = true;
        for (int i = 0; i < nsynced; i++)
            sync &= synced[i] != q->ctx;
        if (sync && nsynced < 64)
            synced[nsynced++] = q->ctx;
        changed += verify(q, sync) == 1;
    }
    found(changed);
    if (final) {
        while (all) {  /* at exit: the memory stays as it is, the records go */
            cs_quarantined *next = all->next;
            pthread_mutex_lock(&lock);
            leaving_remove(all);
            pthread_mutex_unlock(&lock);
            free(all);
            all = next;
        }
        return changed;
    }
    /* Back in front of those added meanwhile, oldest first as they were. */
    pthread_mutex_lock(&lock);
    cs_quarantined *added = take_all();
    while (all) {
        cs_quarantined *next = all->next;
        leaving_remove(all);
        push(all);
        all = next;
    }
    while (added) {
        cs_quarantined *next = added->next;
        push(added);
        added = next;
    }
    cs_quarantined *out = take_over_limit();
    pthread_mutex_unlock(&lock);
    release(out);
    return changed;
}

void cs_quarantine_context_gone(const void *ctx)
{
    pthread_mutex_lock(&lock);
    cs_quarantined *all = take_all();
    while (all) {
        cs_quarantined *next = all->next;
        if (all->ctx == ctx)
            free(all);  /* its memory went with the context; the cache forgets the block */
        else
            push(all);
        all = next;
    }
    pthread_mutex_unlock(&lock);
}
