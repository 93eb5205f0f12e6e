/* The physical pool (see cs_pool.h). The pool's lock guards its bookkeeping only: the spare
 * chunks, the ranges (sorted by address) and the slabs' free slots. Driver calls run without
 * it: a range is built from chunks taken out of the spare under the lock, then mapped outside
 * it, then registered; a range leaves the registry under the lock before it is unmapped. */
#include "cs_pool.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MAX_EXP 48        /* chunks of granularity << 0 .. 47 */
#define PAGES 32          /* a small range (one granule) is cut into this many pages */
#define INVALID_VALUE 1   /* CUDA_ERROR_INVALID_VALUE, for a free of an unknown address */

typedef struct {
    uint64_t handle, size;
} chunk;

struct slab;

/* A virtual range with chunks mapped end to end: one large block, or (small) one granule
 * cut into pages that slabs take in runs. */
typedef struct range {
    uint64_t va, size;
    bool small;
    uint32_t free_pages;            /* small: bit i set when page i belongs to no slab */
    struct slab *page_slab[PAGES];  /* small: the slab of each page */
    struct range *prev, *next;      /* small ranges with free pages */
    chunk *chunks;
    int nchunks;
} range;

/* A run of pages of a small range cut into equal slots: the small blocks. */
typedef struct slab {
    range *r;
    uint32_t first, npages;
    uint64_t slot;
    uint32_t nslots, nfree;
    uint32_t *free_slots;           /* stack of free slot indices */
    struct slab *prev, *next;       /* slabs of its slot size with free slots */
} slab;

typedef struct {
    uint64_t slot;
    slab *head;
} slab_class;

typedef struct {
    uint64_t *h;
    size_t n, cap;
} handle_stack;

struct cs_pool {
    pthread_mutex_t lock;
    const cs_vmm_ops *ops;
    void *dev;
    uint64_t gran, page;
    int max_exp;               /* chunk sizes gran << 0 .. max_exp - 1 fit in 64 bits */
    handle_stack spare[MAX_EXP];
    range **ranges;            /* sorted by va */
    size_t nranges, cap_ranges;
    range *small_free;         /* small ranges with free pages */
    slab_class *classes;       /* slot sizes met so far */
    size_t nclasses, cap_classes;
    uint64_t access_gen;       /* bumped when the allowed devices change */
    bool dead;                 /* its context is gone (cs_pool_release_all): what a thread
                                  builds or frees meanwhile goes straight back */
    cs_pool_counts counts;
};

uint64_t cs_pool_slab_max(uint64_t granularity)
{
    return granularity / 2;
}

static uint64_t round_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

/* Pages of a slab of `slot`-byte slots: the shortest run whose unused tail is at most an
 * eighth of it (one page for slots up to an eighth of a page). */
static uint32_t slab_pages(const cs_pool *p, uint64_t slot)
{
    for (uint32_t n = (uint32_t)((slot + p->page - 1) / p->page); n < PAGES; n++)
        if ((n * p->page) % slot * 8 <= n * p->page)
            return n;
    return PAGES;
}

static int exp_of(const cs_pool *p, uint64_t size)
{
    return __builtin_ctzll(size / p->gran);
}

/* ---------------------------------------------------------------- lifetime */

cs_pool *cs_pool_create(const cs_vmm_ops *ops, void *dev, uint64_t granularity)
{
    if (granularity < 1024 || (granularity & (granularity - 1)))
        return NULL;
    cs_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    pthread_mutex_init(&p->lock, NULL);
    p->ops = ops;
    p->dev = dev;
    p->gran = granularity;
    p->page = granularity / PAGES;
    p->max_exp = 63 - __builtin_ctzll(granularity);
    if (p->max_exp > MAX_EXP)
        p->max_exp = MAX_EXP;
    return p;
}

static void slab_free(slab *sl)
{
    free(sl->free_slots);
    free(sl);
}

static void range_free(range *r)
{
    /* A slab covers pages [first, first + npages): freed at its first, its pages skipped. */
    for (uint32_t i = 0; r->small && i < PAGES; i++) {
        slab *sl = r->page_slab[i];
        if (sl && sl->first == i) {
            i += sl->npages - 1;
            slab_free(sl);
        }
    }
    free(r->chunks);
    free(r);
}

void cs_pool_destroy(cs_pool *p)
{
    if (!p)
        return;
    for (int e = 0; e < MAX_EXP; e++)
        free(p->spare[e].h);
    for (size_t i = 0; i < p->nranges; i++)
        range_free(p->ranges[i]);
    free(p->ranges);
    free(p->classes);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

/* ---------------------------------------------------------------- spare chunks (locked) */

static bool spare_push(cs_pool *p, chunk c)
{
    handle_stack *s = &p->spare[exp_of(p, c.size)];
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        uint64_t *h = realloc(s->h, cap * sizeof *h);
        if (!h)
            return false;
        s->h = h;
        s->cap = cap;
    }
    s->h[s->n++] = c.handle;
    p->counts.spare += c.size;
    return true;
}

static chunk spare_pop(cs_pool *p, int e)
{
    chunk c = {p->spare[e].h[--p->spare[e].n], p->gran << e};
    p->counts.spare -= c.size;
    return c;
}

/* The spare chunks a range of `size` takes, largest first: appended to out[*n] when out is
 * not NULL (else only counted). Returns the bytes left to create. */
static uint64_t spare_take(cs_pool *p, uint64_t size, chunk *out, int *n)
{
    uint64_t left = size;
    for (int e = p->max_exp - 1; e >= 0 && left; e--) {
        uint64_t sz = p->gran << e, k = left / sz;
        if (k > p->spare[e].n)
            k = p->spare[e].n;
        left -= k * sz;
        while (out && k--)
            out[(*n)++] = spare_pop(p, e);
    }
    return left;
}

/* Spare chunks, largest first, until they add up to `bytes` or `most` are taken: into out.
 * Returns how many. */
static int spare_pop_largest(cs_pool *p, uint64_t bytes, chunk *out, int most)
{
    int n = 0;
    uint64_t got = 0;
    for (int e = p->max_exp - 1; e >= 0 && got < bytes && n < most; e--)
        while (p->spare[e].n && got < bytes && n < most) {
            out[n] = spare_pop(p, e);
            got += out[n++].size;
        }
    return n;
}

/* Without the lock: chunks go back to the driver. Returns their bytes. */
static uint64_t release_chunks(cs_pool *p, const chunk *c, int n)
{
    uint64_t bytes = 0;
    for (int i = 0; i < n; i++) {
        int ignored;
        p->ops->release(p->dev, c[i].handle, &ignored);
        bytes += c[i].size;
    }
    return bytes;
}

/* ---------------------------------------------------------------- ranges (locked) */

static size_t range_index(const cs_pool *p, uint64_t addr)
{
    size_t lo = 0, hi = p->nranges;  /* first range with va > addr */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (p->ranges[mid]->va <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static range *range_at(const cs_pool *p, uint64_t addr)
{
    size_t i = range_index(p, addr);
    if (i == 0)
        return NULL;
    range *r = p->ranges[i - 1];
    return addr < r->va + r->size ? r : NULL;
}

static bool range_add(cs_pool *p, range *r)
{
    if (p->nranges == p->cap_ranges) {
        size_t cap = p->cap_ranges ? 2 * p->cap_ranges : 64;
        range **a = realloc(p->ranges, cap * sizeof *a);
        if (!a)
            return false;
        p->ranges = a;
        p->cap_ranges = cap;
    }
    size_t i = range_index(p, r->va);
    memmove(&p->ranges[i + 1], &p->ranges[i], (p->nranges - i) * sizeof *p->ranges);
    p->ranges[i] = r;
    p->nranges++;
    return true;
}

static void range_remove(cs_pool *p, range *r)
{
    size_t i = range_index(p, r->va) - 1;
    memmove(&p->ranges[i], &p->ranges[i + 1], (p->nranges - i - 1) * sizeof *p->ranges);
    p->nranges--;
}

static slab_class *class_for(cs_pool *p, uint64_t slot)
{
    for (size_t i = 0; i < p->nclasses; i++)
        if (p->classes[i].slot == slot)
            return &p->classes[i];
    if (p->nclasses == p->cap_classes) {
        size_t cap = p->cap_classes ? 2 * p->cap_classes : 32;
        slab_class *a = realloc(p->classes, cap * sizeof *a);
        if (!a)
            return NULL;
        p->classes = a;
        p->cap_classes = cap;
    }
    p->classes[p->nclasses] = (slab_class){slot, NULL};
    return &p->classes[p->nclasses++];
}

static void partial_add(slab_class *k, slab *sl)
{
    sl->prev = NULL;
    sl->next = k->head;
    if (k->head)
        k->head->prev = sl;
    k->head = sl;
}

static void partial_remove(slab_class *k, slab *sl)
{
    if (sl->prev)
        sl->prev->next = sl->next;
    else
        k->head = sl->next;
    if (sl->next)
        sl->next->prev = sl->prev;
    sl->prev = sl->next = NULL;
}

static void small_add(cs_pool *p, range *r)
{
    r->prev = NULL;
    r->next = p->small_free;
    if (p->small_free)
        p->small_free->prev = r;
    p->small_free = r;
}

static void small_remove(cs_pool *p, range *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        p->small_free = r->next;
    if (r->next)
        r->next->prev = r->prev;
    r->prev = r->next = NULL;
}

/* The first run of n free pages in a mask, or -1. */
static int free_run(uint32_t mask, uint32_t n)
{
    uint32_t want = n >= 32 ? UINT32_MAX : (1u << n) - 1;
    for (uint32_t i = 0; i + n <= PAGES; i++)
        if (((mask >> i) & want) == want)
            return (int)i;
    return -1;
}

/* A small range with a run of n free pages, and where it starts. */
static range *small_with_run(cs_pool *p, uint32_t n, int *first)
{
    for (range *r = p->small_free; r; r = r->next)
        if ((*first = free_run(r->free_pages, n)) >= 0)
            return r;
    return NULL;
}

/* A slab of `slot`-byte slots on pages [first, first + n) of r, all slots free. */
static slab *slab_make(cs_pool *p, range *r, int first, uint32_t n, uint64_t slot)
{
    slab *sl = calloc(1, sizeof *sl);
    uint32_t nslots = (uint32_t)(n * p->page / slot);
    if (sl)
        sl->free_slots = malloc(nslots * sizeof *sl->free_slots);
    if (!sl || !sl->free_slots) {
        free(sl);
        return NULL;
    }
    sl->r = r;
    sl->first = (uint32_t)first;
    sl->npages = n;
    sl->slot = slot;
    sl->nslots = nslots;
    for (uint32_t i = nslots; i > 0; i--)  /* lowest handed out first */
        sl->free_slots[sl->nfree++] = i - 1;
    for (uint32_t i = 0; i < n; i++)
        r->page_slab[first + (int)i] = sl;
    r->free_pages &= ~(n >= 32 ? UINT32_MAX : ((1u << n) - 1) << first);
    if (!r->free_pages)
        small_remove(p, r);
    return sl;
}

/* An empty slab gives its pages back to its range. True when the range is then all free. */
static bool slab_unmake(cs_pool *p, slab *sl)
{
    range *r = sl->r;
    bool had_free = r->free_pages != 0;
    for (uint32_t i = 0; i < sl->npages; i++)
        r->page_slab[sl->first + i] = NULL;
    r->free_pages |= sl->npages >= 32 ? UINT32_MAX : ((1u << sl->npages) - 1) << sl->first;
    if (!had_free)
        small_add(p, r);
    slab_free(sl);
    return r->free_pages == UINT32_MAX;
}

/* ---------------------------------------------------------------- building a range */

/* Without the lock: unmap the first n chunks of r and give its reservation back (when it
 * has one). Returns how many chunks were unmapped; *raw the last failure's code. */
static int unmap_range(cs_pool *p, const range *r, int n, int *raw)
{
    uint64_t va = r->va;
    int unmapped = 0;
    for (int i = 0; i < n; i++) {
        unmapped += p->ops->unmap(p->dev, va, r->chunks[i].size, raw) == CS_BE_OK;
        va += r->chunks[i].size;
    }
    int ignored;
    if (r->va)
        p->ops->unreserve(p->dev, r->va, r->size, &ignored);
    return unmapped;
}

/* Undo a range under construction: unmap what was mapped, give the reservation back, and
 * put the chunks where they came from (new ones back to the driver). Without the lock. */
static void unbuild(cs_pool *p, range *r, int mapped, int from_spare)
{
    int raw;
    unmap_range(p, r, mapped, &raw);
    pthread_mutex_lock(&p->lock);
    for (int i = 0; i < from_spare; i++)
        spare_push(p, r->chunks[i]);  /* room was there when they were taken */
    pthread_mutex_unlock(&p->lock);
    release_chunks(p, r->chunks + from_spare, r->nchunks - from_spare);
}

/* A range of `size` bytes mapped and accessible, registered. See cs_pool_alloc for the
 * out-parameters. */
static int build(cs_pool *p, uint64_t size, bool small, uint64_t max_new, uint64_t *va_out,
                 uint64_t *created, uint64_t *released, int *raw)
{
    *created = *released = 0;
    range *r = calloc(1, sizeof *r);
    chunk trade[MAX_EXP];
    int ntrade = 0;
    pthread_mutex_lock(&p->lock);
    uint64_t left = spare_take(p, size, NULL, NULL);
    /* Room for every spare chunk it can take (each at least a granule) and the new ones. */
    uint64_t nspare = 0;
    for (int e = 0; e < MAX_EXP; e++)
        nspare += p->spare[e].n;
    uint64_t most = size / p->gran < nspare ? size / p->gran : nspare;
    if (r)
        r->chunks = malloc((size_t)(most + MAX_EXP) * sizeof *r->chunks);
    if (!r || !r->chunks) {
        pthread_mutex_unlock(&p->lock);
        if (r)
            range_free(r);
        *raw = 2;  /* CUDA_ERROR_OUT_OF_MEMORY: the host's */
        return CS_BE_OOM;
    }
    if (left > max_new) {
        pthread_mutex_unlock(&p->lock);
        range_free(r);
        return CS_BE_SHORT;
    }
    spare_take(p, size, r->chunks, &r->nchunks);
    /* New memory is needed and spare chunks remain that this range could not use: give them
     * back first, so that memory held does not grow while some lies unused. */
    if (left)
        ntrade = spare_pop_largest(p, left, trade, MAX_EXP);
    uint64_t gen = p->access_gen;
    pthread_mutex_unlock(&p->lock);

    int from_spare = r->nchunks;
    *released = release_chunks(p, trade, ntrade);
    int rc = CS_BE_OK;
    for (int e = p->max_exp - 1; e >= 0 && rc == CS_BE_OK; e--) {
        uint64_t sz = p->gran << e;
        if (left & sz) {
            uint64_t h;
            rc = p->ops->create(p->dev, sz, &h, raw);
            if (rc == CS_BE_OK)
                r->chunks[r->nchunks++] = (chunk){h, sz};
        }
    }
    r->size = size;
    r->small = small;
    r->free_pages = small ? UINT32_MAX : 0;
    int mapped = 0;
    uint64_t va = 0;
    if (rc == CS_BE_OK)
        rc = p->ops->reserve(p->dev, size, &r->va, raw);
    if (rc == CS_BE_OK) {
        va = r->va;
        for (; mapped < r->nchunks; mapped++) {
            if ((rc = p->ops->map(p->dev, va, r->chunks[mapped].size, r->chunks[mapped].handle,
                                  raw)) != CS_BE_OK)
                break;
            va += r->chunks[mapped].size;
        }
        if (rc == CS_BE_OK)
            rc = p->ops->access(p->dev, r->va, size, raw);
    }
    uint64_t made = 0;
    for (int i = from_spare; i < r->nchunks; i++)
        made += r->chunks[i].size;
    pthread_mutex_lock(&p->lock);
    p->counts.creates += (uint64_t)(r->nchunks - from_spare);
    p->counts.releases += (uint64_t)ntrade;
    if (rc != CS_BE_OK) {
        p->counts.releases += (uint64_t)(r->nchunks - from_spare);  /* unbuild's */
        pthread_mutex_unlock(&p->lock);
        unbuild(p, r, mapped, from_spare);
        range_free(r);
        return rc;
    }
    p->counts.reserves++;
    p->counts.maps += (uint64_t)r->nchunks;
    /* Peer access granted while this range was being mapped: grant it here too. */
    while (gen != p->access_gen) {
        gen = p->access_gen;
        pthread_mutex_unlock(&p->lock);
        int ignored;
        p->ops->access(p->dev, r->va, size, &ignored);
        pthread_mutex_lock(&p->lock);
    }
    if (p->dead) {
        /* The context went while this range was built: all of it goes back at once (the
         * spare it came from is gone too). */
        p->counts.releases += (uint64_t)r->nchunks;
        p->counts.unmaps += (uint64_t)mapped;
        pthread_mutex_unlock(&p->lock);
        unbuild(p, r, mapped, 0);
        range_free(r);
        *raw = 709;  /* CUDA_ERROR_CONTEXT_IS_DESTROYED */
        return CS_BE_ERROR;
    }
    if (!range_add(p, r)) {
        p->counts.releases += (uint64_t)(r->nchunks - from_spare);  /* unbuild's */
        p->counts.unmaps += (uint64_t)mapped;
        pthread_mutex_unlock(&p->lock);
        unbuild(p, r, mapped, from_spare);
        range_free(r);
        *raw = 2;
        return CS_BE_OOM;
    }
    if (small) {
        p->counts.slab_free += p->gran;
        small_add(p, r);
    }
    /* Once the lock is dropped r may go (cs_pool_release_all): only its address leaves. */
    *va_out = r->va;
    pthread_mutex_unlock(&p->lock);
    *created = made;
    return CS_BE_OK;
}

/* ---------------------------------------------------------------- blocks */

/* A small block from a slab with a free slot; else a new slab on free pages of a small range;
 * else NULL (with the lock held throughout). */
static bool slot_take(cs_pool *p, uint64_t slot, uint64_t *addr, bool *no_host_memory)
{
    slab_class *k = class_for(p, slot);
    *no_host_memory = !k;
    if (!k)
        return false;
    slab *sl = k->head;
    if (!sl) {
        int first;
        uint32_t n = slab_pages(p, slot);
        range *r = small_with_run(p, n, &first);
        if (!r)
            return false;
        if (!(sl = slab_make(p, r, first, n, slot))) {
            *no_host_memory = true;
            return false;
        }
        partial_add(k, sl);
    }
    uint32_t i = sl->free_slots[--sl->nfree];
    if (sl->nfree == 0)
        partial_remove(k, sl);
    p->counts.slab_free -= slot;
    *addr = sl->r->va + (uint64_t)sl->first * p->page + (uint64_t)i * slot;
    return true;
}

int cs_pool_alloc(cs_pool *p, uint64_t bytes, uint64_t max_new, uint64_t *addr,
                  uint64_t *created, uint64_t *released, int *raw)
{
    *created = *released = 0;
    uint64_t va;
    if (bytes > cs_pool_slab_max(p->gran)) {
        int rc = build(p, round_up(bytes, p->gran), false, max_new, &va, created, released, raw);
        if (rc == CS_BE_OK)
            *addr = va;
        return rc;
    }
    /* A slot of a slab, else a new small range (one granule) for it. */
    bool no_mem;
    pthread_mutex_lock(&p->lock);
    bool ok = slot_take(p, bytes, addr, &no_mem);
    pthread_mutex_unlock(&p->lock);
    if (ok)
        return CS_BE_OK;
    if (no_mem) {
        *raw = 2;  /* CUDA_ERROR_OUT_OF_MEMORY: the host's */
        return CS_BE_OOM;
    }
    int rc = build(p, p->gran, true, max_new, &va, created, released, raw);
    if (rc != CS_BE_OK)
        return rc;
    pthread_mutex_lock(&p->lock);
    /* Another thread may have made room meanwhile: any slot will do. Unless the context went
     * meanwhile, and the new range with it. */
    ok = !p->dead && slot_take(p, bytes, addr, &no_mem);
    if (p->dead) {
        pthread_mutex_unlock(&p->lock);
        *raw = 709;  /* CUDA_ERROR_CONTEXT_IS_DESTROYED */
        return CS_BE_ERROR;
    }
    pthread_mutex_unlock(&p->lock);
    if (!ok) {
        *raw = 2;
        return CS_BE_OOM;  /* no host memory for a slab (the range stays, spare) */
    }
    return CS_BE_OK;
}

/* A range out of the registry: unmap it and keep or release its chunks. Without the lock. */
static int unbuild_range(cs_pool *p, range *r, bool keep, bool done, uint64_t *released,
                         int *raw)
{
    int rc = CS_BE_OK;
    if (!done && p->ops->sync(p->dev, raw) != CS_BE_OK)
        rc = CS_BE_ERROR;  /* unmapped all the same: nothing better to do */
    int unmapped = unmap_range(p, r, r->nchunks, raw);
    if (unmapped != r->nchunks)
        rc = CS_BE_ERROR;
    pthread_mutex_lock(&p->lock);
    p->counts.unmaps += (uint64_t)unmapped;
    bool kept = keep && !p->dead && unmapped == r->nchunks;
    for (int i = 0; kept && i < r->nchunks; i++)
        if (!spare_push(p, r->chunks[i])) {
            /* No host memory to remember it: the rest goes back. */
            memmove(r->chunks, r->chunks + i, (size_t)(r->nchunks - i) * sizeof *r->chunks);
            r->nchunks -= i;
            kept = false;
        }
    if (!kept)
        p->counts.releases += (uint64_t)r->nchunks;
    pthread_mutex_unlock(&p->lock);
    if (!kept)
        *released += release_chunks(p, r->chunks, r->nchunks);
    range_free(r);
    return rc;
}

int cs_pool_free(cs_pool *p, uint64_t addr, bool keep, bool done, uint64_t *released, int *raw)
{
    *released = 0;
    int rc = CS_BE_OK;
    pthread_mutex_lock(&p->lock);
    range *r = range_at(p, addr);
    bool small = r && r->small;
    pthread_mutex_unlock(&p->lock);
    if (!r) {
        *raw = INVALID_VALUE;
        return CS_BE_ERROR;
    }
    /* A slot whose work is not known to be done would be handed out again at once: wait
     * for the device first. */
    if (small && !done && p->ops->sync(p->dev, raw) != CS_BE_OK)
        rc = CS_BE_ERROR;
    pthread_mutex_lock(&p->lock);
    r = range_at(p, addr);
    if (!r || r->small != small || (!small && addr != r->va)) {
        pthread_mutex_unlock(&p->lock);
        *raw = INVALID_VALUE;
        return CS_BE_ERROR;
    }
    if (small) {
        slab *sl = r->page_slab[(addr - r->va) / p->page];
        uint64_t off = sl ? addr - r->va - (uint64_t)sl->first * p->page : 1;
        if (!sl || off % sl->slot || off / sl->slot >= sl->nslots) {
            pthread_mutex_unlock(&p->lock);
            *raw = INVALID_VALUE;
            return CS_BE_ERROR;
        }
        slab_class *k = class_for(p, sl->slot);  /* exists: the slab was made through it */
        sl->free_slots[sl->nfree++] = (uint32_t)(off / sl->slot);
        p->counts.slab_free += sl->slot;
        if (sl->nfree == 1)
            partial_add(k, sl);
        if (sl->nfree < sl->nslots) {
            pthread_mutex_unlock(&p->lock);
            return rc;
        }
        partial_remove(k, sl);
        if (!slab_unmake(p, sl)) {
            pthread_mutex_unlock(&p->lock);
            return rc;
        }
        /* The whole range is free: it goes, as a large block would. */
        small_remove(p, r);
        p->counts.slab_free -= r->size;
        done = true;  /* every slot was done (or waited for) when it came back */
    }
    range_remove(p, r);
    pthread_mutex_unlock(&p->lock);
    int urc = unbuild_range(p, r, keep, done, released, raw);
    return rc != CS_BE_OK ? rc : urc;
}

uint64_t cs_pool_most_new(const cs_pool *p, uint64_t bytes)
{
    return bytes <= cs_pool_slab_max(p->gran) ? p->gran : round_up(bytes, p->gran);
}

uint64_t cs_pool_need(cs_pool *p, uint64_t bytes)
{
    pthread_mutex_lock(&p->lock);
    uint64_t size = round_up(bytes, p->gran);
    if (bytes <= cs_pool_slab_max(p->gran)) {
        slab_class *k = NULL;
        for (size_t i = 0; i < p->nclasses && !k; i++)
            if (p->classes[i].slot == bytes)
                k = &p->classes[i];
        int first;
        if ((k && k->head) || small_with_run(p, slab_pages(p, bytes), &first))
            size = 0;
        else
            size = p->gran;
    }
    uint64_t need = size ? spare_take(p, size, NULL, NULL) : 0;
    pthread_mutex_unlock(&p->lock);
    return need;
}

uint64_t cs_pool_trim(cs_pool *p, uint64_t bytes)
{
    chunk out[64];
    uint64_t released = 0;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        int n = spare_pop_largest(p, bytes - released, out, 64);
        p->counts.releases += (uint64_t)n;
        pthread_mutex_unlock(&p->lock);
        released += release_chunks(p, out, n);
        if (n < 64 || released >= bytes)
            return released;
    }
}

uint64_t cs_pool_release_all(cs_pool *p)
{
    pthread_mutex_lock(&p->lock);
    p->dead = true;
    range **ranges = p->ranges;
    size_t nranges = p->nranges;
    handle_stack spare[MAX_EXP];
    memcpy(spare, p->spare, sizeof spare);
    memset(p->spare, 0, sizeof p->spare);
    p->ranges = NULL;
    p->nranges = p->cap_ranges = 0;
    p->small_free = NULL;
    for (size_t i = 0; i < p->nclasses; i++)
        p->classes[i].head = NULL;  /* the slabs go with their ranges */
    p->counts.spare = p->counts.slab_free = 0;
    pthread_mutex_unlock(&p->lock);
    uint64_t released = 0, unmaps = 0, releases = 0;
    int ignored;
    for (size_t i = 0; i < nranges; i++) {
        range *r = ranges[i];
        unmaps += (uint64_t)unmap_range(p, r, r->nchunks, &ignored);
        released += release_chunks(p, r->chunks, r->nchunks);
        releases += (uint64_t)r->nchunks;
        range_free(r);
    }
    for (int e = 0; e < MAX_EXP; e++) {
        for (size_t k = 0; k < spare[e].n; k++)
            p->ops->release(p->dev, spare[e].h[k], &ignored);
        released += (uint64_t)spare[e].n * (p->gran << e);
        releases += spare[e].n;
        free(spare[e].h);
    }
    free(ranges);
    pthread_mutex_lock(&p->lock);
    p->counts.unmaps += unmaps;
    p->counts.releases += releases;
    pthread_mutex_unlock(&p->lock);
    return released;
}

bool cs_pool_find(cs_pool *p, uint64_t addr, uint64_t *base, uint64_t *size)
{
    pthread_mutex_lock(&p->lock);
    range *r = range_at(p, addr);
    bool found = r != NULL;
    if (r && r->small) {
        slab *sl = r->page_slab[(addr - r->va) / p->page];
        uint64_t start = sl ? r->va + (uint64_t)sl->first * p->page : 0;
        if (sl && addr < start + (uint64_t)sl->nslots * sl->slot) {
            *base = start + (addr - start) / sl->slot * sl->slot;
            *size = sl->slot;
        } else {
            *base = addr;  /* mapped, in no slot */
            *size = 0;
        }
    } else if (r) {
        *base = r->va;
        *size = r->size;
    }
    pthread_mutex_unlock(&p->lock);
    return found;
}

int cs_pool_regrant(cs_pool *p, int *raw)
{
    int rc = CS_BE_OK;
    pthread_mutex_lock(&p->lock);
    p->access_gen++;
    /* Under the lock: no range leaves meanwhile (a rare call; the access op does not wait
     * for the GPU). */
    for (size_t i = 0; i < p->nranges; i++) {
        int r = p->ops->access(p->dev, p->ranges[i]->va, p->ranges[i]->size, raw);
        if (r != CS_BE_OK && rc == CS_BE_OK)
            rc = r;
    }
    pthread_mutex_unlock(&p->lock);
    return rc;
}

void cs_pool_counts_get(cs_pool *p, cs_pool_counts *out)
{
    pthread_mutex_lock(&p->lock);
    *out = p->counts;
    pthread_mutex_unlock(&p->lock);
}
