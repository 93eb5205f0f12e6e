/* A simulated device for the pooled backend's virtual memory calls (cs_vmm_ops, cs_pool.h),
 * for the unit tests of the pool (test_pool.c) and of the cache over it (test_pooled.c).
 *
 * It keeps what a driver would: physical handles and their sizes (within a capacity), virtual
 * reservations, mappings (a handle mapped whole, inside a reservation, end to end), and
 * access grants. Every call is counted, failed ones too; the Nth call of an op can be made to
 * fail (vmm_sim_fail_in); a hook can run inside any call (to act while a driver call is under
 * way, without the pool's lock). Misuse (mapping a dead handle, unmapping what is not mapped,
 * releasing a mapped handle, unreserving a range still mapped) is counted in `misuse`, never
 * fatal, so that a test can assert it stayed 0.
 *
 * The GPU's work, for the "never unmapped before its work is done" checks: vmm_sim_work(va,
 * epoch) says that work of that fence epoch touches va; an unmap of a range holding such an
 * address while its epoch has not completed (vmm_sim.completed, or a sync) counts in
 * `unsafe_unmaps`. The tests move `completed` (and a sync completes every epoch known).
 *
 * Thread-safe: one mutex around everything (the hook runs without it). */
#ifndef VMM_SIM_H
#define VMM_SIM_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cs_pool.h"

enum { SIM_CREATE, SIM_RELEASE, SIM_RESERVE, SIM_UNRESERVE, SIM_MAP, SIM_ACCESS, SIM_UNMAP,
       SIM_SYNC, SIM_OPS };

typedef struct {
    uint64_t a, b, c;  /* handle/size, va/size/..., by kind */
    bool used;
} sim_rec;

typedef struct {
    sim_rec *r;
    size_t n, cap;
} sim_set;

typedef struct vmm_sim {
    pthread_mutex_t lock;
    uint64_t capacity, used, peak_used;
    uint64_t next_handle, next_va;
    int calls[SIM_OPS];      /* every call, failed ones too */
    int fail_at[SIM_OPS];    /* this call number (1-based, of calls[]) fails; 0: none */
    int fail_rc[SIM_OPS];    /* ... with this CS_BE_* code */
    int misuse, unsafe_unmaps;
    uint64_t completed;      /* every work epoch up to this one is done */
    uint64_t work_epoch_max; /* the newest epoch of any work recorded */
    uint64_t issued;         /* the newest fence epoch the test's backend handed out */
    sim_set handles;         /* a = handle, b = size, c = how many mappings it has (a driver
                                maps one handle at several addresses) */
    sim_set reserves;        /* a = va, b = size, c = mappings in it */
    sim_set maps;            /* a = va, b = size, c = handle */
    sim_set work;            /* a = address, b = epoch */
    char log[4096];          /* one letter per call: C R V v M A U S (reserve V, unreserve v) */
    size_t nlog;
    uint64_t access_va[256], access_size[256];  /* the last accesses granted, in order */
    int naccess;
    void (*hook)(struct vmm_sim *s, int op, void *arg);  /* runs first in every call */
    void *hook_arg;
} vmm_sim;

static inline void sim_init(vmm_sim *s, uint64_t capacity)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->lock, NULL);
    s->capacity = capacity;
    s->next_handle = 0x1000;
    s->next_va = 0x7f0000000000ull;
}

static inline void sim_destroy(vmm_sim *s)
{
    free(s->handles.r);
    free(s->reserves.r);
    free(s->maps.r);
    free(s->work.r);
    pthread_mutex_destroy(&s->lock);
}

static inline sim_rec *set_add(sim_set *t, uint64_t a, uint64_t b, uint64_t c)
{
    for (size_t i = 0; i < t->n; i++)
        if (!t->r[i].used) {
            t->r[i] = (sim_rec){a, b, c, true};
            return &t->r[i];
        }
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 64;
        t->r = realloc(t->r, t->cap * sizeof *t->r);
    }
    t->r[t->n] = (sim_rec){a, b, c, true};
    return &t->r[t->n++];
}

static inline sim_rec *set_find(sim_set *t, uint64_t a)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->r[i].used && t->r[i].a == a)
            return &t->r[i];
    return NULL;
}

/* The reservation holding [va, va + size). */
static inline sim_rec *reserve_of(vmm_sim *s, uint64_t va, uint64_t size)
{
    for (size_t i = 0; i < s->reserves.n; i++) {
        sim_rec *r = &s->reserves.r[i];
        if (r->used && va >= r->a && va + size <= r->a + r->b)
            return r;
    }
    return NULL;
}

static inline size_t set_count(const sim_set *t)
{
    size_t n = 0;
    for (size_t i = 0; i < t->n; i++)
        n += t->r[i].used;
    return n;
}

/* Counts the call, runs the hook, and says whether it is the one to fail (rc set). Takes the
 * lock, which the caller releases. */
static inline bool sim_enter(vmm_sim *s, int op, const char *letter, int *rc, int *raw)
{
    if (s->hook)
        s->hook(s, op, s->hook_arg);
    pthread_mutex_lock(&s->lock);
    int n = ++s->calls[op];
    if (s->nlog + 1 < sizeof s->log)
        s->log[s->nlog++] = letter[0];
    if (s->fail_at[op] && n == s->fail_at[op]) {
        *rc = s->fail_rc[op] ? s->fail_rc[op] : CS_BE_ERROR;
        *raw = *rc == CS_BE_OOM ? 2 : 999;  /* CUDA_ERROR_OUT_OF_MEMORY, or a code of our own */
        return true;
    }
    return false;
}

/* The Nth call of op from now fails with rc (CS_BE_OOM or CS_BE_ERROR). */
static inline void sim_fail_in(vmm_sim *s, int op, int n, int rc)
{
    pthread_mutex_lock(&s->lock);
    s->fail_at[op] = s->calls[op] + n;
    s->fail_rc[op] = rc;
    pthread_mutex_unlock(&s->lock);
}

/* Work of this epoch touches addr. */
static inline void sim_work(vmm_sim *s, uint64_t addr, uint64_t epoch)
{
    pthread_mutex_lock(&s->lock);
    set_add(&s->work, addr, epoch, 0);
    if (epoch > s->work_epoch_max)
        s->work_epoch_max = epoch;
    pthread_mutex_unlock(&s->lock);
}

static inline void sim_complete(vmm_sim *s, uint64_t epoch)
{
    pthread_mutex_lock(&s->lock);
    if (epoch > s->completed)
        s->completed = epoch;
    pthread_mutex_unlock(&s->lock);
}

static inline uint64_t sim_completed(vmm_sim *s)
{
    pthread_mutex_lock(&s->lock);
    uint64_t e = s->completed;
    pthread_mutex_unlock(&s->lock);
    return e;
}

/* Work still under way on [addr, addr + size) of an epoch newer than `upto`: how many records
 * (a block handed out with epoch `upto` to order after must have none). */
static inline int sim_pending_beyond(vmm_sim *s, uint64_t addr, uint64_t size, uint64_t upto)
{
    int n = 0;
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < s->work.n; i++) {
        const sim_rec *w = &s->work.r[i];
        n += w->used && w->a >= addr && w->a < addr + size && w->b > s->completed && w->b > upto;
    }
    pthread_mutex_unlock(&s->lock);
    return n;
}

/* The test's backend handed out fence epoch e (a sync completes it). */
static inline void sim_issue(vmm_sim *s, uint64_t e)
{
    pthread_mutex_lock(&s->lock);
    if (e > s->issued)
        s->issued = e;
    pthread_mutex_unlock(&s->lock);
}

static inline int sim_create(void *dev, uint64_t size, uint64_t *handle, int *raw)
{
    vmm_sim *s = dev;
    int rc = CS_BE_OK;
    if (!sim_enter(s, SIM_CREATE, "C", &rc, raw)) {
        if (size > s->capacity - s->used) {
            rc = CS_BE_OOM;
            *raw = 2;
        } else {
            *handle = s->next_handle;
            s->next_handle += 0x10;
            set_add(&s->handles, *handle, size, 0);
            s->used += size;
            if (s->used > s->peak_used)
                s->peak_used = s->used;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static inline int sim_release(void *dev, uint64_t handle, int *raw)
{
    vmm_sim *s = dev;
    int rc = CS_BE_OK;
    if (!sim_enter(s, SIM_RELEASE, "R", &rc, raw)) {
        sim_rec *h = set_find(&s->handles, handle);
        if (!h) {
            s->misuse++;
            rc = CS_BE_ERROR;
            *raw = 1;
        } else {
            s->misuse += h->c != 0;  /* still mapped: the pool unmaps first */
            s->used -= h->b;
            h->used = false;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static inline int sim_reserve(void *dev, uint64_t size, uint64_t *va, int *raw)
{
    vmm_sim *s = dev;
    int rc = CS_BE_OK;
    if (!sim_enter(s, SIM_RESERVE, "V", &rc, raw)) {
        *va = s->next_va;
        s->next_va += size + (1ull << 30);  /* a gap: no two ranges touch */
        set_add(&s->reserves, *va, size, 0);
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static inline int sim_unreserve(void *dev, uint64_t va, uint64_t size, int *raw)
{
    vmm_sim *s = dev;
    int rc = CS_BE_OK;
    if (!sim_enter(s, SIM_UNRESERVE, "v", &rc, raw)) {
        sim_rec *r = set_find(&s->reserves, va);
        if (!r || r->b != size || r->c) {
            s->misuse++;
            rc = CS_BE_ERROR;
            *raw = 1;
        }
        if (r && r->b == size)
            r->used = false;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static inline int sim_map(void *dev, uint64_t va, uint64_t size, uint64_t handle, int *raw)
{
    vmm_sim *s = dev;
    int rc = CS_BE_OK;
    if (!sim_enter(s, SIM_MAP, "M", &rc, raw)) {
        sim_rec *h = set_find(&s->handles, handle), *r = reserve_of(s, va, size);
        bool overlap = false;
        for (size_t i = 0; i < s->maps.n; i++)
            overlap |= s->maps.r[i].used && va < s->maps.r[i].a + s->maps.r[i].b &&
                       s->maps.r[i].a < va + size;
        if (!h || h->b != size || !r || overlap) {
            s->misuse++;
            rc = CS_BE_ERROR;
            *raw = 1;
        } else {
            h->c++;
            r->c++;
            set_add(&s->maps, va, size, handle);
        }
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static inline int sim_access(void *dev, uint64_t va, uint64_t size, int *raw)
{
    vmm_sim *s = dev;
    int rc = CS_BE_OK;
    if (!sim_enter(s, SIM_ACCESS, "A", &rc, raw)) {
        /* The whole range must be mapped. */
        uint64_t covered = 0;
        for (size_t i = 0; i < s->maps.n; i++)
            if (s->maps.r[i].used && s->maps.r[i].a >= va && s->maps.r[i].a < va + size)
                covered += s->maps.r[i].b;
        s->misuse += covered != size;
        int k = s->naccess++ % 256;
        s->access_va[k] = va;
        s->access_size[k] = size;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static inline int sim_unmap(void *dev, uint64_t va, uint64_t size, int *raw)
{
    vmm_sim *s = dev;
    int rc = CS_BE_OK;
    if (!sim_enter(s, SIM_UNMAP, "U", &rc, raw)) {
        sim_rec *m = set_find(&s->maps, va);
        if (!m || m->b != size) {
            s->misuse++;
            rc = CS_BE_ERROR;
            *raw = 1;
        } else {
            sim_rec *h = set_find(&s->handles, m->c), *r = reserve_of(s, va, size);
            if (h)
                h->c--;
            if (r)
                r->c--;
            m->used = false;
            for (size_t i = 0; i < s->work.n; i++) {
                sim_rec *w = &s->work.r[i];
                if (w->used && w->b <= s->completed)
                    w->used = false;  /* done: no unmap can be early for it any more */
                else if (w->used && w->a >= va && w->a < va + size)
                    s->unsafe_unmaps++;
            }
        }
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static inline int sim_sync(void *dev, int *raw)
{
    vmm_sim *s = dev;
    int rc = CS_BE_OK;
    if (!sim_enter(s, SIM_SYNC, "S", &rc, raw)) {
        uint64_t all = s->work_epoch_max > s->issued ? s->work_epoch_max : s->issued;
        if (all > s->completed)
            s->completed = all;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

__attribute__((unused)) static const cs_vmm_ops sim_vmm_ops = {
    sim_create, sim_release, sim_reserve, sim_unreserve, sim_map, sim_access, sim_unmap, sim_sync};

/* What the device holds now. */
static inline size_t sim_live_handles(vmm_sim *s)
{
    pthread_mutex_lock(&s->lock);
    size_t n = set_count(&s->handles);
    pthread_mutex_unlock(&s->lock);
    return n;
}

static inline size_t sim_live_reserves(vmm_sim *s)
{
    pthread_mutex_lock(&s->lock);
    size_t n = set_count(&s->reserves);
    pthread_mutex_unlock(&s->lock);
    return n;
}

static inline size_t sim_live_maps(vmm_sim *s)
{
    pthread_mutex_lock(&s->lock);
    size_t n = set_count(&s->maps);
    pthread_mutex_unlock(&s->lock);
    return n;
}

/* The handle mapped at va (0: none). */
static inline uint64_t sim_handle_at(vmm_sim *s, uint64_t va)
{
    pthread_mutex_lock(&s->lock);
    sim_rec *m = set_find(&s->maps, va);
    uint64_t h = m ? m->c : 0;
    pthread_mutex_unlock(&s->lock);
    return h;
}

/* The size of the handle mapped at va (0: none). */
static inline uint64_t sim_mapped_at(vmm_sim *s, uint64_t va)
{
    pthread_mutex_lock(&s->lock);
    sim_rec *m = set_find(&s->maps, va);
    uint64_t size = m ? m->b : 0;
    pthread_mutex_unlock(&s->lock);
    return size;
}

/* The log's letters from position `from` on, as a string (for order checks). */
static inline const char *sim_log_from(vmm_sim *s, size_t from)
{
    s->log[s->nlog] = '\0';
    return s->log + (from < s->nlog ? from : s->nlog);
}

#endif
