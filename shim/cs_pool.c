/* The physical pool (see cs_pool.h). The pool's lock guards its bookkeeping only: the spare
 * chunks, the arenas' spans and mappings, the slabs' free slots. Driver calls run without it.
 * What a thread is working on outside the lock is a busy span nobody else touches: a window
 * being filled, a chunk being unmapped. Whoever takes a mapping out of an arena's list owns
 * its chunk until it puts it back, maps it elsewhere or releases it. */
#include "cs_pool.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MAX_EXP 48        /* chunks of granularity << 0 .. 47 */
#define PAGES 32          /* a small range (one granule) is cut into this many pages */
#define INVALID_VALUE 1   /* CUDA_ERROR_INVALID_VALUE, for a free of an unknown address */
#define HOST_OOM 2        /* CUDA_ERROR_OUT_OF_MEMORY: the host's */
#define DESTROYED 709     /* CUDA_ERROR_CONTEXT_IS_DESTROYED */
#define BIG_CHUNK 32      /* granules: new memory in larger chunks only from this size up */

typedef struct {
    uint64_t handle, size;
} chunk;

/* A chunk mapped in an arena. */
typedef struct {
    uint64_t va, size, handle;
} mapping;

/* Where a chunk was mapped before it moved while work on its memory was still under way: an
 * unmap does not wait for the GPU, so this mapping stays until that work completes at
 * `epoch` (reap_old), its span busy meanwhile. */
typedef struct {
    uint64_t va, size, handle, epoch;
} old_mapping;

enum { SPAN_HOLE, SPAN_FREE, SPAN_USED, SPAN_BUSY };

struct range;

typedef struct {
    uint64_t va, size;
    uint64_t epoch;       /* a free span: the work last done on its memory completes at this
                             epoch (0 or at most the pool's done: completed) */
    int kind;
    struct range *small;  /* a used span that is a small range: its slabs */
} span;

typedef struct arena {
    uint64_t va, size;
    span *spans;          /* cover [va, va + size) end to end, by address */
    size_t nspans, cap_spans;
    mapping *maps;        /* by address */
    size_t nmaps, cap_maps;
    old_mapping *olds;    /* chunks moved away while busy: unmapped once their work is done */
    size_t nolds, cap_olds;
    int busy;             /* threads with driver calls under way on it */
    bool dead, unmapped;  /* cs_pool_release_all: detached; its mappings are gone */
} arena;

struct slab;

/* A small range: a used span of one granule cut into pages that slabs take in runs. */
typedef struct range {
    uint64_t va;
    uint64_t epoch;                 /* the newest fence of a slot given back before its work
                                       completed (0: none): a block carved from the range is
                                       ordered after it, or takes another range */
    uint32_t free_pages;            /* bit i set when page i belongs to no slab */
    struct slab *page_slab[PAGES];  /* the slab of each page */
    struct range *prev, *next;      /* small ranges with free pages */
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
    pthread_mutex_t olds_lock;  /* held while old mappings are unmapped, and while chunks are
                                   released: a chunk never goes before its old mappings */
    const cs_vmm_ops *ops;
    void *dev;
    uint64_t gran, page, arena_bytes;
    int max_exp;               /* chunk sizes gran << 0 .. max_exp - 1 fit in 64 bits */
    handle_stack spare[MAX_EXP];
    arena **arenas;            /* by address */
    size_t narenas, cap_arenas;
    arena **gone;              /* detached by cs_pool_release_all, freed with the pool */
    size_t ngone, cap_gone;
    range *small_free;         /* small ranges with free pages */
    slab_class *classes;       /* slot sizes met so far */
    size_t nclasses, cap_classes;
    uint64_t access_gen;       /* bumped when the allowed devices change */
    cs_pool_ready_fn ready;    /* which epochs completed (NULL: none is left pending) */
    void *ready_arg;
    uint64_t done;             /* every epoch up to this one completed */
    uint64_t pending_max;      /* the newest epoch a free span was given */
    size_t nolds;              /* old mappings in all arenas, waiting for their work */
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

static int exp_of(const cs_pool *p, uint64_t size)
{
    return __builtin_ctzll(size / p->gran);
}

/* Room for n more elements of `size` bytes in an array: false without host memory. */
static bool grow(void **a, size_t *cap, size_t len, size_t n, size_t size)
{
    if (len + n <= *cap)
        return true;
    size_t c = *cap ? *cap : 16;
    while (c < len + n)
        c *= 2;
    void *b = realloc(*a, c * size);
    if (!b)
        return false;
    *a = b;
    *cap = c;
    return true;
}

/* ---------------------------------------------------------------- lifetime */

cs_pool *cs_pool_create(const cs_vmm_ops *ops, void *dev, uint64_t granularity,
                        uint64_t arena_bytes, cs_pool_ready_fn ready, void *ready_arg)
{
    if (granularity < 1024 || (granularity & (granularity - 1)))
        return NULL;
    cs_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    pthread_mutex_init(&p->lock, NULL);
    pthread_mutex_init(&p->olds_lock, NULL);
    p->ops = ops;
    p->dev = dev;
    p->ready = ready;
    p->ready_arg = ready_arg;
    p->gran = granularity;
    p->page = granularity / PAGES;
    p->max_exp = 63 - __builtin_ctzll(granularity);
    if (p->max_exp > MAX_EXP)
        p->max_exp = MAX_EXP;
    if (arena_bytes > UINT64_MAX / 4)
        arena_bytes = UINT64_MAX / 4;
    p->arena_bytes = round_up(arena_bytes > 64 * granularity ? arena_bytes : 64 * granularity,
                              granularity);
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
    for (uint32_t i = 0; r && i < PAGES; i++) {
        slab *sl = r->page_slab[i];
        if (sl && sl->first == i) {
            i += sl->npages - 1;
            slab_free(sl);
        }
    }
    free(r);
}

static void arena_free(arena *a)
{
    for (size_t i = 0; i < a->nspans; i++)
        range_free(a->spans[i].small);
    free(a->spans);
    free(a->maps);
    free(a->olds);
    free(a);
}

void cs_pool_destroy(cs_pool *p)
{
    if (!p)
        return;
    for (int e = 0; e < MAX_EXP; e++)
        free(p->spare[e].h);
    for (size_t i = 0; i < p->narenas; i++)
        arena_free(p->arenas[i]);
    for (size_t i = 0; i < p->ngone; i++)
        arena_free(p->gone[i]);
    free(p->arenas);
    free(p->gone);
    free(p->classes);
    pthread_mutex_destroy(&p->lock);
    pthread_mutex_destroy(&p->olds_lock);
    free(p);
}

/* ---------------------------------------------------------------- spare chunks (locked) */

static bool spare_push(cs_pool *p, chunk c)
{
    handle_stack *s = &p->spare[exp_of(p, c.size)];
    if (!grow((void **)&s->h, &s->cap, s->n, 1, sizeof *s->h))
        return false;
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

/* The largest spare chunk of at most `bytes`, or -1. */
static int spare_fit(const cs_pool *p, uint64_t bytes)
{
    for (int e = p->max_exp - 1; e >= 0; e--)
        if (p->spare[e].n && (p->gran << e) <= bytes)
            return e;
    return -1;
}

static int release_handle(cs_pool *p, uint64_t handle, int *raw);

/* Without the lock: chunks go back to the driver. Returns their bytes. */
static uint64_t release_chunks(cs_pool *p, const chunk *c, size_t n)
{
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        int ignored;
        release_handle(p, c[i].handle, &ignored);
        bytes += c[i].size;
    }
    return bytes;
}

/* Wait for all work on the device (without the lock): rc becomes CS_BE_ERROR if that fails. */
static void wait_device(cs_pool *p, int *rc, int *raw)
{
    if (p->ops->sync(p->dev, raw) != CS_BE_OK)
        *rc = CS_BE_ERROR;
}

/* ---------------------------------------------------------------- arenas and spans (locked) */

static size_t arena_index(const cs_pool *p, uint64_t addr)  /* first arena with va > addr */
{
    size_t lo = 0, hi = p->narenas;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (p->arenas[mid]->va <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static arena *arena_at(const cs_pool *p, uint64_t addr)
{
    size_t i = arena_index(p, addr);
    if (i == 0)
        return NULL;
    arena *a = p->arenas[i - 1];
    return addr - a->va < a->size ? a : NULL;
}

/* The span holding addr (inside the arena). */
static size_t span_at(const arena *a, uint64_t addr)
{
    size_t lo = 0, hi = a->nspans;  /* first span with va > addr */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (a->spans[mid].va <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo - 1;
}

static uint64_t span_end(const span *s)
{
    return s->va + s->size;
}

/* A span boundary at addr (room for one more span made beforehand). */
static void split_at(arena *a, uint64_t addr)
{
    size_t i = span_at(a, addr);
    span *s = &a->spans[i];
    if (s->va == addr)
        return;
    memmove(&a->spans[i + 2], &a->spans[i + 1], (a->nspans - i - 1) * sizeof *a->spans);
    a->nspans++;
    a->spans[i + 1] = (span){addr, span_end(s) - addr, s->epoch, s->kind, NULL};
    s->size = addr - s->va;
}

/* Spans [i, j) become one span of `kind` (no small range), with the newest of their epochs. */
static void join(arena *a, size_t i, size_t j, int kind)
{
    for (size_t k = i + 1; k < j; k++)
        if (a->spans[k].epoch > a->spans[i].epoch)
            a->spans[i].epoch = a->spans[k].epoch;
    a->spans[i].size = span_end(&a->spans[j - 1]) - a->spans[i].va;
    a->spans[i].kind = kind;
    a->spans[i].small = NULL;
    memmove(&a->spans[i + 1], &a->spans[j], (a->nspans - j) * sizeof *a->spans);
    a->nspans -= j - i - 1;
}

/* Span i took kind `kind`: join it with its neighbours of the same kind when that kind is
 * free or a hole (a hole has no epoch; free spans joined keep the newest). Returns its
 * index. */
static size_t settle(arena *a, size_t i, int kind)
{
    a->spans[i].kind = kind;
    a->spans[i].small = NULL;
    if (kind == SPAN_HOLE)
        a->spans[i].epoch = 0;
    if (kind != SPAN_FREE && kind != SPAN_HOLE)
        return i;
    size_t j = i + 1;
    if (j < a->nspans && a->spans[j].kind == kind)
        j++;
    if (i > 0 && a->spans[i - 1].kind == kind)
        i--;
    if (j - i > 1)
        join(a, i, j, kind);
    return i;
}

/* [va, va + size) as spans of their own, each keeping its kind: the index of the first (room
 * for two more spans made beforehand). */
static size_t cut(arena *a, uint64_t va, uint64_t size)
{
    split_at(a, va);
    if (va + size < a->va + a->size)
        split_at(a, va + size);
    return span_at(a, va);
}

static bool room_spans(arena *a, size_t n)
{
    return grow((void **)&a->spans, &a->cap_spans, a->nspans, n, sizeof *a->spans);
}

/* ---------------------------------------------------------------- epochs (locked) */

/* Has the work up to `epoch` completed? Asks the cache about an epoch not known complete yet
 * (never blocks); epochs complete in order. */
static bool epoch_done(cs_pool *p, uint64_t epoch)
{
    if (epoch <= p->done)
        return true;
    if (!p->ready || !p->ready(p->ready_arg, epoch))
        return false;
    p->done = epoch;
    return true;
}

/* The oldest epoch of free memory not known complete (0: none). */
static uint64_t oldest_pending(const cs_pool *p)
{
    uint64_t oldest = 0;
    for (size_t k = 0; k < p->narenas; k++)
        for (size_t i = 0; i < p->arenas[k]->nspans; i++) {
            const span *s = &p->arenas[k]->spans[i];
            if (s->kind == SPAN_FREE && s->epoch > p->done && (!oldest || s->epoch < oldest))
                oldest = s->epoch;
        }
    return oldest;
}

/* The newest epoch of the free memory a block may take: any when the caller orders the
 * block's work after the block's epoch, else only what completed. Most often all of it
 * completed, in one question; else as much as did, oldest first (epochs complete in order),
 * so that memory whose work is done serves while newer work runs elsewhere. */
static uint64_t usable_epoch(cs_pool *p, bool ordered)
{
    if (ordered)
        return UINT64_MAX;
    if (epoch_done(p, p->pending_max))
        return p->done;
    uint64_t e;
    while ((e = oldest_pending(p)) != 0 && epoch_done(p, e))
        continue;  /* p->done moved on to e */
    return p->done;
}

static bool span_usable(const span *s, uint64_t usable)
{
    return s->kind == SPAN_FREE && s->epoch <= usable;
}

/* A block's epoch for its caller: 0 when its memory's work is known complete. */
static uint64_t epoch_out(const cs_pool *p, uint64_t epoch)
{
    return epoch > p->done ? epoch : 0;
}

/* The first mapping at or after addr. */
static size_t map_index(const arena *a, uint64_t addr)
{
    size_t lo = 0, hi = a->nmaps;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (a->maps[mid].va < addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void map_insert(arena *a, mapping m)  /* room made beforehand */
{
    size_t i = map_index(a, m.va);
    memmove(&a->maps[i + 1], &a->maps[i], (a->nmaps - i) * sizeof *a->maps);
    a->maps[i] = m;
    a->nmaps++;
}

static void map_remove(arena *a, size_t i)
{
    memmove(&a->maps[i], &a->maps[i + 1], (a->nmaps - i - 1) * sizeof *a->maps);
    a->nmaps--;
}

/* The bytes of free spans, and of the chunks inside them (what trim can give back). */
static void free_bytes(const cs_pool *p, uint64_t *mapped_free, uint64_t *whole)
{
    *mapped_free = *whole = 0;
    for (size_t k = 0; k < p->narenas; k++) {
        const arena *a = p->arenas[k];
        for (size_t i = 0; i < a->nspans; i++) {
            const span *s = &a->spans[i];
            if (s->kind != SPAN_FREE)
                continue;
            *mapped_free += s->size;
            for (size_t m = map_index(a, s->va); m < a->nmaps && a->maps[m].va < span_end(s); m++)
                if (a->maps[m].va + a->maps[m].size <= span_end(s))
                    *whole += a->maps[m].size;
        }
    }
}

/* ---------------------------------------------------------------- slabs (locked) */

/* Pages of a slab of `slot`-byte slots: the shortest run whose unused tail is at most an
 * eighth of it (one page for slots up to an eighth of a page). */
static uint32_t slab_pages(const cs_pool *p, uint64_t slot)
{
    for (uint32_t n = (uint32_t)((slot + p->page - 1) / p->page); n < PAGES; n++)
        if ((n * p->page) % slot * 8 <= n * p->page)
            return n;
    return PAGES;
}

static slab_class *class_find(cs_pool *p, uint64_t slot)
{
    for (size_t i = 0; i < p->nclasses; i++)
        if (p->classes[i].slot == slot)
            return &p->classes[i];
    return NULL;
}

static slab_class *class_for(cs_pool *p, uint64_t slot)
{
    slab_class *k = class_find(p, slot);
    if (k || !grow((void **)&p->classes, &p->cap_classes, p->nclasses, 1, sizeof *p->classes))
        return k;
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

static uint32_t page_mask(uint32_t first, uint32_t n)
{
    return n >= 32 ? UINT32_MAX : ((1u << n) - 1) << first;
}

/* The first run of n free pages in a mask, or -1. */
static int free_run(uint32_t mask, uint32_t n)
{
    for (uint32_t i = 0; i + n <= PAGES; i++)
        if ((mask & page_mask(i, n)) == page_mask(i, n))
            return (int)i;
    return -1;
}

/* Which small ranges a block may be carved from: those whose busy slots' work completed, or,
 * when the caller orders the block after that work, any (the newest such epoch then in
 * `at`). Not ordered, the GPU is asked once at most (whether all of it completed). */
typedef struct {
    bool ordered, asked;
    uint64_t at;
} slot_rule;

static bool range_usable(cs_pool *p, const range *r, slot_rule *rule)
{
    if (r->epoch <= p->done)
        return true;
    if (rule->ordered) {
        if (r->epoch > rule->at)
            rule->at = r->epoch;
        return true;
    }
    if (rule->asked)
        return false;
    rule->asked = true;
    return epoch_done(p, p->pending_max) && r->epoch <= p->done;
}

/* A small range with a run of n free pages that rule allows, and where the run starts. */
static range *small_with_run(cs_pool *p, uint32_t n, slot_rule *rule, int *first)
{
    for (range *r = p->small_free; r; r = r->next)
        if ((*first = free_run(r->free_pages, n)) >= 0 && range_usable(p, r, rule))
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
    r->free_pages &= ~page_mask((uint32_t)first, n);
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
    r->free_pages |= page_mask(sl->first, sl->npages);
    if (!had_free)
        small_add(p, r);
    slab_free(sl);
    return r->free_pages == UINT32_MAX;
}

/* The first slab of class k with a free slot that rule allows. */
static slab *slab_usable(cs_pool *p, slab_class *k, slot_rule *rule)
{
    for (slab *sl = k->head; sl; sl = sl->next)
        if (range_usable(p, sl->r, rule))
            return sl;
    return NULL;
}

/* A small block from a slab with a free slot; else a new slab on free pages of a small range;
 * else false (with the lock held throughout). Ordered: it may come from a range with busy
 * slots, *at then the epoch to order it after. */
static bool slot_take(cs_pool *p, uint64_t slot, bool ordered, range *fresh, uint64_t *addr,
                      uint64_t *at, bool *no_host_memory)
{
    slab_class *k = class_for(p, slot);
    *no_host_memory = !k;
    if (!k)
        return false;
    slot_rule rule = {.ordered = ordered, .at = *at};
    int first = 0;
    uint32_t n = fresh ? slab_pages(p, slot) : 0;
    /* A range made for this block comes first, if it is still there with room: else, the
     * GPU's answer changed meanwhile, the block would take another slab and leave the new
     * range empty for good. */
    range *r = NULL;
    for (range *f = fresh ? p->small_free : NULL; f && !r; f = f->next)
        if (f == fresh && (first = free_run(f->free_pages, n)) >= 0 && range_usable(p, f, &rule))
            r = f;
    slab *sl = r ? NULL : slab_usable(p, k, &rule);
    if (!sl) {
        n = n ? n : slab_pages(p, slot);  /* a new slab's pages: only when one is made */
        if (!r)
            r = small_with_run(p, n, &rule, &first);
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
    *at = rule.at;
    return true;
}

/* ---------------------------------------------------------------- where a block goes
 *
 * Zones: an arena's lower half takes large blocks, its upper half small ranges, so slabs that
 * empty (and the ranges that go with them) never cut the free runs large blocks need, nor
 * large blocks the granules small ranges need. A block larger than a quarter of its arena
 * goes anywhere. The zones are a preference: a block takes a free span outside its zone
 * when it would otherwise need more new memory than it may take even after moving free chunks
 * into its zone (beyond the headroom: cs_pool_need with move), or the driver has no more
 * memory (alloc_span). On the recorded PyTorch traces: GPT-2 1.114 -> 1.099 reserved / live
 * (docs/performance.md). */
typedef enum { ZONE_LARGE, ZONE_SMALL, ZONE_ANY } zone;

/* Where arena a's upper half begins (a whole granule). */
static uint64_t zone_mid(const cs_pool *p, const arena *a)
{
    return a->va + a->size / 2 / p->gran * p->gran;
}

/* May [va, va + size) of arena a take a block of zone z? */
static bool in_zone(const cs_pool *p, const arena *a, uint64_t va, uint64_t size, zone z)
{
    if (z == ZONE_ANY || size > a->size / 4)
        return true;
    return z == ZONE_SMALL ? va >= zone_mid(p, a) : va + size <= zone_mid(p, a);
}

/* The smallest free span of at least `size` bytes whose epoch is at most `usable`, whose start
 * is in zone z (the lowest address among equals: arenas and spans are in address order, so
 * the first span of exactly `size` ends the search). One pass over the spans: a large block's
 * allocation costs time in proportion to the spans (free and used) of the pool. */
static bool best_fit(const cs_pool *p, uint64_t size, uint64_t usable, zone z, arena **out,
                     size_t *index)
{
    uint64_t best = UINT64_MAX;
    for (size_t k = 0; k < p->narenas && best != size; k++) {
        arena *a = p->arenas[k];
        for (size_t i = 0; i < a->nspans && best != size; i++)
            if (span_usable(&a->spans[i], usable) && a->spans[i].size >= size &&
                a->spans[i].size < best && in_zone(p, a, a->spans[i].va, size, z)) {
                best = a->spans[i].size;
                *out = a;
                *index = i;
            }
    }
    return best != UINT64_MAX;
}

/* Hole bytes in [va, va + size), which lies in free spans and holes from span i on. */
static uint64_t holes_in(const arena *a, size_t i, uint64_t va, uint64_t size)
{
    uint64_t n = 0, end = va + size;
    for (; i < a->nspans && a->spans[i].va < end; i++) {
        const span *s = &a->spans[i];
        if (s->kind != SPAN_HOLE || span_end(s) <= va)
            continue;
        uint64_t lo = s->va > va ? s->va : va, hi = span_end(s) < end ? span_end(s) : end;
        n += hi - lo;
    }
    return n;
}

/* Where a block of `size` bytes needs the least new mapping: a window of free spans (of epochs
 * at most `usable`) and holes that starts or ends where one of them does, in zone z. False
 * when no arena has room. */
typedef struct {
    arena *a;
    uint64_t va, holes;
} window;

static bool best_window(const cs_pool *p, uint64_t size, uint64_t usable, zone z, window *w)
{
    bool found = false;
    for (size_t k = 0; k < p->narenas; k++) {
        arena *a = p->arenas[k];
        for (size_t i = 0; i < a->nspans;) {
            /* A run of free spans and holes: spans [i, j). */
            size_t j = i;
            while (j < a->nspans &&
                   (a->spans[j].kind == SPAN_HOLE || span_usable(&a->spans[j], usable)))
                j++;
            if (j == i) {
                i++;
                continue;
            }
            uint64_t lo = a->spans[i].va, hi = span_end(&a->spans[j - 1]);
            for (size_t s = i; hi - lo >= size && s < j; s++) {
                uint64_t starts[2] = {a->spans[s].va, span_end(&a->spans[s]) - size};
                for (int t = 0; t < 2; t++) {
                    uint64_t va = starts[t];
                    if (va < lo || va > hi - size || (t == 1 && span_end(&a->spans[s]) < size))
                        continue;
                    if (a->spans[span_at(a, va)].kind == SPAN_HOLE)
                        va = va / p->gran * p->gran;  /* chunks map at whole granules */
                    if (!in_zone(p, a, va, size, z))
                        continue;
                    uint64_t holes = holes_in(a, span_at(a, va), va, size);
                    /* A window that ends in a hole maps the rest of its last granule too. */
                    if (a->spans[span_at(a, va + size - 1)].kind == SPAN_HOLE)
                        holes += round_up(va + size, p->gran) - (va + size);
                    if (!found || holes < w->holes) {
                        *w = (window){a, va, holes};
                        found = true;
                    }
                }
            }
            i = j;
        }
    }
    return found;
}

/* The start of the largest hole, if it can take the block (its part in zone z): where chunks
 * larger than what is left to fill can reach past it. */
static bool fresh_window(const cs_pool *p, uint64_t size, zone z, window *w)
{
    bool found = false;
    uint64_t largest = 0;
    for (size_t k = 0; k < p->narenas; k++) {
        arena *a = p->arenas[k];
        uint64_t mid = zone_mid(p, a);
        for (size_t i = 0; i < a->nspans; i++) {
            const span *s = &a->spans[i];
            uint64_t va = z == ZONE_SMALL && s->va < mid ? mid : s->va;
            if (s->kind == SPAN_HOLE && va < span_end(s) && span_end(s) - va >= size &&
                in_zone(p, a, va, size, z) && (!found || s->size > largest)) {
                *w = (window){a, va, size};
                largest = s->size;
                found = true;
            }
        }
    }
    return found;
}

/* ---------------------------------------------------------------- filling a window */

enum { FROM_SPARE, FROM_FREE, FROM_NEW };

/* A chunk to be mapped at va: a spare one, one unmapped from a free span at `from_va`, or a
 * new one (its handle made when the window is filled). */
typedef struct {
    uint64_t va, from_va;
    chunk c;
    int from;
    bool mapped;
    bool stuck;            /* rollback: its unmap failed, still mapped in the window */
    bool keep_old;         /* from a free span whose work is under way: mapped here too, and
                              unmapped there once that work completes (an old mapping) */
    uint64_t epoch;        /* keep_old: that work's epoch */
} place;

/* A piece of the window: a hole to fill, or a free span already mapped. */
typedef struct {
    uint64_t va, size;
    bool hole;
} piece;

typedef struct {
    arena *a;
    uint64_t va, size;
    uint64_t over;         /* the last chunk's bytes past the window: a free span after it */
    piece *pieces;
    size_t npieces;
    place *places;
    size_t nplaces, cap_places;
    chunk *trade;          /* spare chunks that fit nowhere, released for new memory */
    size_t ntrade;
    uint64_t created;
    uint64_t gen;          /* the access generation when the plan was made */
    uint64_t usable;       /* free chunks whose work completed up to this epoch may move */
    bool dry;              /* only count: stop at `left`, take nothing (cs_pool_need) */
    bool ordered;          /* busy chunks may move: the block is ordered after their work */
    uint64_t moved_epoch;  /* the newest epoch of the chunks that keep their old mapping */
    size_t nold;           /* how many do */
    uint64_t left;         /* the new memory the plan takes, once its moves are chosen */
} plan;

static void plan_free(plan *pl)
{
    free(pl->pieces);
    free(pl->places);
    free(pl->trade);
}

static bool add_place(plan *pl, place pc)
{
    if (!grow((void **)&pl->places, &pl->cap_places, pl->nplaces, 1, sizeof *pl->places))
        return false;
    pl->places[pl->nplaces++] = pc;
    return true;
}

/* Is mapping m of the window's arena wholly free, its work done up to the plan's usable epoch,
 * and outside the window? */
static bool movable_at(const arena *a, const plan *pl, size_t m)
{
    const mapping *c = &a->maps[m];
    const span *s = &a->spans[span_at(a, c->va)];
    if (s->kind != SPAN_FREE || c->va + c->size > span_end(s) ||
        (c->va < pl->va + pl->size && pl->va < c->va + c->size) || s->epoch > pl->usable)
        return false;
    for (size_t i = 0; i < pl->nplaces; i++)
        if (pl->places[i].from == FROM_FREE && pl->places[i].from_va == c->va)
            return false;  /* chosen already */
    return true;
}

/* Chunk c of the window's arena is to move to `at`. If the work on its memory may still be
 * under way (its epoch not known complete: not asked, the plan is ordered), it keeps its old
 * mapping until then, and the block is ordered after that work. False without host memory. */
static bool place_moved(const cs_pool *p, const arena *a, plan *pl, uint64_t at, mapping c)
{
    uint64_t e = a->spans[span_at(a, c.va)].epoch;
    bool busy = e > p->done;
    if (!add_place(pl, (place){at, c.va, {c.handle, c.size}, FROM_FREE, false, false, busy,
                               busy ? e : 0}))
        return false;
    if (busy && e > pl->moved_epoch)
        pl->moved_epoch = e;
    pl->nold += busy;
    return true;
}

/* The largest wholly free chunk of the window's arena outside the window of at most `bytes`:
 * its mapping index, or -1. */
static long movable(const arena *a, const plan *pl, uint64_t bytes)
{
    long best = -1;
    for (size_t m = 0; m < a->nmaps; m++)
        if (a->maps[m].size <= bytes && (best < 0 || a->maps[m].size > a->maps[best].size) &&
            movable_at(a, pl, m))
            best = (long)m;
    return best;
}

/* A spare chunk of granularity << e, to be mapped at va: false without host memory (the
 * chunk then stays spare). */
static bool place_spare(cs_pool *p, plan *pl, uint64_t va, int e)
{
    chunk c = spare_pop(p, e);
    if (add_place(pl, (place){va, 0, c, FROM_SPARE, false, false, false, 0}))
        return true;
    spare_push(p, c);  /* room was there: it was just taken */
    return false;
}

/* Give back what plan_make took (the lock held): spare chunks to the spare, chunks marked to
 * move to their free spans. */
static void plan_undo(cs_pool *p, plan *pl)
{
    for (size_t i = 0; i < pl->nplaces; i++)
        if (pl->places[i].from == FROM_SPARE)
            spare_push(p, pl->places[i].c);  /* room was there when it was taken */
    for (size_t i = 0; i < pl->ntrade; i++)
        spare_push(p, pl->trade[i]);
    pl->nplaces = pl->ntrade = 0;
}

/* Under the lock: fill the holes of window w (of `size` bytes) with spare chunks, then with
 * new memory up to max_new, then with chunks moved from free spans, then new memory again.
 * Takes the spare it uses, and marks the window and the chunks to move busy. */
static int plan_make(cs_pool *p, const window *w, uint64_t size, uint64_t max_new, plan *pl)
{
    arena *a = w->a;
    pl->a = a;
    pl->va = w->va;
    pl->size = size;
    /* Asked once for the plan (the oldest pending epochs first), not once per chunk: with
     * the GPU far behind, every busy chunk looked at was a question. */
    pl->usable = usable_epoch(p, pl->ordered);
    size_t first = span_at(a, w->va), n = 0;
    for (size_t i = first; i < a->nspans && a->spans[i].va < w->va + size; i++)
        n++;
    pl->pieces = n ? malloc(n * sizeof *pl->pieces) : NULL;  /* n >= 1: size > 0 */
    if (!pl->pieces)
        return CS_BE_OOM;
    for (size_t i = first; i < first + n; i++) {
        const span *s = &a->spans[i];
        uint64_t lo = s->va > w->va ? s->va : w->va;
        uint64_t hi = span_end(s) < w->va + size ? span_end(s) : w->va + size;
        pl->pieces[pl->npieces++] = (piece){lo, hi - lo, s->kind == SPAN_HOLE};
    }
    /* A window that ends in a hole fills it to a whole granule: the rest is a free span
     * after the block. */
    size_t last = pl->npieces - 1;
    if (pl->pieces[last].hole) {
        pl->over = round_up(w->va + size, p->gran) - (w->va + size);
        pl->pieces[last].size += pl->over;
    }
    /* Each hole from its start: spare chunks, largest first; what is left is its tail. */
    uint64_t left = 0;
    uint64_t *tail = calloc(pl->npieces, sizeof *tail);
    if (!tail)
        return CS_BE_OOM;
    for (size_t i = 0; i < pl->npieces; i++) {
        piece *pc = &pl->pieces[i];
        uint64_t at = pc->va, end = pc->va + pc->size;
        int e;
        while (pc->hole && at < end && (e = spare_fit(p, end - at)) >= 0) {
            if (!place_spare(p, pl, at, e)) {
                free(tail);
                plan_undo(p, pl);
                return CS_BE_OOM;
            }
            at += pl->places[pl->nplaces - 1].c.size;
        }
        tail[i] = pc->hole ? end - at : 0;
        left += tail[i];
    }
    /* The last hole may take a larger chunk, the rest of it a free span past the window, where
     * its hole goes on: a spare one first (the memory is held anyway). */
    uint64_t fill_end = w->va + size + pl->over, extra = 0;
    const span *end_span = &a->spans[span_at(a, fill_end - 1)];
    uint64_t ext = end_span->kind == SPAN_HOLE ? span_end(end_span) - fill_end : 0;
    for (int e = 0; e < p->max_exp && tail[last] && ext; e++) {
        uint64_t sz = p->gran << e;
        if (p->spare[e].n && sz > tail[last] && sz - tail[last] <= ext) {
            uint64_t at = pl->pieces[last].va + pl->pieces[last].size - tail[last];
            if (!place_spare(p, pl, at, e)) {
                free(tail);
                plan_undo(p, pl);
                return CS_BE_OOM;
            }
            extra = sz - tail[last];
            left -= tail[last];
            tail[last] = 0;
        }
    }
    /* Beyond max_new, chunks move from free spans into the tails. */
    size_t nmoved = 0;
    for (size_t i = 0; i < pl->npieces && left > max_new; i++) {
        uint64_t end = pl->pieces[i].va + pl->pieces[i].size;
        long m;
        while (tail[i] && left > max_new && (m = movable(a, pl, tail[i])) >= 0) {
            mapping c = a->maps[m];
            if (!place_moved(p, a, pl, end - tail[i], c)) {
                free(tail);
                plan_undo(p, pl);
                return CS_BE_OOM;
            }
            tail[i] -= c.size;
            left -= c.size;
            nmoved++;
        }
    }
    /* Still short: the smallest free chunk larger than the last tail, if its hole goes on. */
    if (left > max_new && tail[last] && ext) {
        long m = movable(a, pl, tail[last] + ext);
        for (size_t k = 0; m >= 0 && k < a->nmaps; k++)
            if (a->maps[k].size > tail[last] && a->maps[k].size < a->maps[m].size &&
                movable_at(a, pl, k))
                m = (long)k;
        if (m >= 0 && a->maps[m].size > tail[last]) {
            mapping c = a->maps[m];
            uint64_t at = pl->pieces[last].va + pl->pieces[last].size - tail[last];
            if (!place_moved(p, a, pl, at, c)) {
                free(tail);
                plan_undo(p, pl);
                return CS_BE_OOM;
            }
            extra = c.size - tail[last];
            left -= tail[last];
            tail[last] = 0;
            nmoved++;
        }
    }
    pl->over += extra;
    pl->pieces[last].size += extra;
    pl->left = left;
    if (left > max_new || pl->dry) {
        free(tail);
        plan_undo(p, pl);
        return left > max_new ? CS_BE_SHORT : CS_BE_OK;
    }
    /* New memory for the rest of each tail: chunks of one granule, which fit any hole when
     * they move, except for what a large tail holds in whole multiples of BIG_CHUNK granules
     * (in binary: few handles, a mapping costs per handle). */
    for (size_t i = 0; i < pl->npieces; i++) {
        uint64_t at = pl->pieces[i].va + pl->pieces[i].size - tail[i];
        uint64_t big = tail[i] / (BIG_CHUNK * p->gran) * (BIG_CHUNK * p->gran);
        for (int e = p->max_exp - 1; e >= 0; e--) {
            uint64_t sz = p->gran << e;
            uint64_t k = e == 0 ? (tail[i] - big) / p->gran : (big & sz) ? 1 : 0;
            for (; k; k--) {
                if (!add_place(pl, (place){at, 0, {0, sz}, FROM_NEW, false, false, false, 0})) {
                    free(tail);
                    plan_undo(p, pl);
                    return CS_BE_OOM;
                }
                at += sz;
            }
        }
    }
    free(tail);
    pl->created = left;
    /* New memory while spare chunks fit nowhere: they go back first, so that memory held
     * does not grow while some lies unused. */
    if (left) {
        uint64_t got = 0;
        pl->trade = malloc(MAX_EXP * sizeof *pl->trade);
        for (int e = p->max_exp - 1; pl->trade && e >= 0 && got < left; e--)
            while (p->spare[e].n && got < left && pl->ntrade < MAX_EXP) {
                pl->trade[pl->ntrade] = spare_pop(p, e);
                got += pl->trade[pl->ntrade++].size;
            }
    }
    /* Busy: the window as it is (its pieces keep their bounds), and each chunk that moves. */
    if (!room_spans(a, 3 + 2 * nmoved)) {
        plan_undo(p, pl);
        return CS_BE_OOM;
    }
    size_t i = cut(a, w->va, size + pl->over);
    for (size_t k = 0; k < pl->npieces; k++)
        a->spans[i + k].kind = SPAN_BUSY;
    for (size_t k = 0; k < pl->nplaces; k++) {
        place *pc = &pl->places[k];
        if (pc->from != FROM_FREE)
            continue;
        a->spans[cut(a, pc->from_va, pc->c.size)].kind = SPAN_BUSY;
        map_remove(a, map_index(a, pc->from_va));
    }
    a->busy++;
    pl->gen = p->access_gen;
    return CS_BE_OK;
}

/* Under the lock: the new memory a plan for window w takes at the least (with no new memory
 * allowed, it moves all it can): a plan made and undone. */
static uint64_t plan_least(cs_pool *p, const window *w, uint64_t size, bool move, bool ordered)
{
    /* No host memory to plan: all of its holes. */
    plan pl = {.dry = true, .left = round_up(w->holes, p->gran), .ordered = ordered};
    plan_make(p, w, size, move ? 0 : UINT64_MAX, &pl);
    plan_free(&pl);
    return pl.left;
}

/* Without the lock: the driver calls of a plan. Returns CS_BE_OK or the first failure. */
static int plan_run(cs_pool *p, plan *pl, int *raw)
{
    release_chunks(p, pl->trade, pl->ntrade);
    for (size_t i = 0; i < pl->nplaces; i++) {
        place *pc = &pl->places[i];
        int rc = CS_BE_OK;
        if (pc->from == FROM_FREE && !pc->keep_old) {
            rc = p->ops->unmap(p->dev, pc->from_va, pc->c.size, raw);
            if (rc == CS_BE_OK)
                pc->from = FROM_SPARE;  /* unmapped: a spare chunk like the others */
        } else if (pc->from == FROM_NEW) {
            rc = p->ops->create(p->dev, pc->c.size, &pc->c.handle, raw);
            if (rc != CS_BE_OK)
                pc->c.size = 0;  /* nothing made */
        }
        if (rc == CS_BE_OK)
            rc = p->ops->map(p->dev, pc->va, pc->c.size, pc->c.handle, raw);
        if (rc != CS_BE_OK) {
            for (size_t k = i + 1; k < pl->nplaces; k++)
                if (pl->places[k].from == FROM_NEW)
                    pl->places[k].c.size = 0;  /* never made: nothing to count or release */
            return rc;
        }
        pc->mapped = true;
    }
    for (size_t i = 0; i < pl->npieces; i++) {
        int rc = CS_BE_OK;
        if (pl->pieces[i].hole)
            rc = p->ops->access(p->dev, pl->pieces[i].va, pl->pieces[i].size, raw);
        if (rc != CS_BE_OK)
            return rc;
    }
    return CS_BE_OK;
}

/* The count of what a plan did, under the lock. */
static void plan_count(cs_pool *p, const plan *pl)
{
    p->counts.releases += pl->ntrade;
    for (size_t i = 0; i < pl->nplaces; i++) {
        const place *pc = &pl->places[i];
        if (pc->from == FROM_NEW && pc->c.size)
            p->counts.creates++;
        if (pc->from_va && pc->from != FROM_FREE) {
            p->counts.unmaps++;
            p->counts.moves++;
        }
        if (pc->keep_old && pc->mapped)
            p->counts.moves++;  /* its unmap is counted when its old mapping goes */
        p->counts.maps += pc->mapped;
    }
}

/* ---------------------------------------------------------------- arenas in flight */

/* A thread is done with its driver calls on arena a (the lock held). True when it must give
 * the reservation back: the arena was detached meanwhile and this thread was its last. */
static bool arena_leave(arena *a)
{
    return --a->busy == 0 && a->dead && a->unmapped;
}

static void unreserve(cs_pool *p, const arena *a)
{
    int ignored;
    p->ops->unreserve(p->dev, a->va, a->size, &ignored);
}

/* ---------------------------------------------------------------- old mappings */

/* Under the lock: the epoch up to which all work completed, if the work on the oldest old
 * mapping did; else 0. At most two questions: the newest, else the oldest (epochs complete in
 * order). */
static uint64_t olds_done(cs_pool *p)
{
    uint64_t oldest = UINT64_MAX, newest = 0;
    for (size_t k = 0; k < p->narenas; k++)
        for (size_t i = 0; i < p->arenas[k]->nolds; i++) {
            uint64_t e = p->arenas[k]->olds[i].epoch;
            oldest = e < oldest ? e : oldest;
            newest = e > newest ? e : newest;
        }
    return epoch_done(p, newest) || epoch_done(p, oldest) ? p->done : 0;
}

/* Old mappings whose work completed leave: unmapped, their spans holes again. With handle !=
 * 0, those of that chunk (about to be released: its own work completed, and theirs, which came
 * before it, with it). One whose unmap fails stays, to be tried again. p->olds_lock held, the
 * pool's lock not. True when there may be more to take. */
static bool olds_leave(cs_pool *p, uint64_t handle)
{
    enum { BATCH = 32 };
    typedef struct {
        arena *a;
        old_mapping o;
        bool ok;
    } leaving;
    leaving go[BATCH];
    size_t n = 0;
    pthread_mutex_lock(&p->lock);
    uint64_t done = !p->nolds || p->dead ? 0 : handle ? UINT64_MAX : olds_done(p);
    for (size_t k = 0; done && k < p->narenas && n < BATCH; k++) {
        arena *a = p->arenas[k];
        for (size_t i = 0; i < a->nolds && n < BATCH;) {
            const old_mapping *o = &a->olds[i];
            if (handle ? o->handle != handle : o->epoch > done) {
                i++;
                continue;
            }
            go[n++] = (leaving){a, a->olds[i], false};
            a->olds[i] = a->olds[--a->nolds];
            p->nolds--;
            a->busy++;
        }
    }
    pthread_mutex_unlock(&p->lock);
    int raw;
    for (size_t i = 0; i < n; i++)
        go[i].ok = p->ops->unmap(p->dev, go[i].o.va, go[i].o.size, &raw) == CS_BE_OK;
    arena *last[BATCH];
    size_t nlast = 0, nok = 0;
    pthread_mutex_lock(&p->lock);
    for (size_t i = 0; i < n; i++) {
        arena *a = go[i].a;
        nok += go[i].ok;
        p->counts.unmaps += go[i].ok;
        if (go[i].ok && !a->dead) {
            settle(a, span_at(a, go[i].o.va), SPAN_HOLE);
        } else if (!go[i].ok && !a->dead &&
                   grow((void **)&a->olds, &a->cap_olds, a->nolds, 1, sizeof *a->olds)) {
            a->olds[a->nolds++] = go[i].o;  /* again later (its arena's end unmaps it too) */
            p->nolds++;
        }  /* else busy for good: its arena is gone, or no host memory */
        if (arena_leave(a))
            last[nlast++] = a;
    }
    pthread_mutex_unlock(&p->lock);
    for (size_t i = 0; i < nlast; i++)
        unreserve(p, last[i]);
    return n == BATCH && nok > 0;
}

/* Without the lock: the old mappings whose work completed are unmapped. No question to the
 * GPU while there are none. */
static void reap_old(cs_pool *p)
{
    pthread_mutex_lock(&p->olds_lock);
    while (olds_leave(p, 0))
        continue;
    pthread_mutex_unlock(&p->olds_lock);
}

/* Without the lock: a chunk goes back to the driver, its old mappings first. */
static int release_handle(cs_pool *p, uint64_t handle, int *raw)
{
    pthread_mutex_lock(&p->olds_lock);
    while (olds_leave(p, handle))
        continue;
    int rc = p->ops->release(p->dev, handle, raw);
    pthread_mutex_unlock(&p->olds_lock);
    return rc;
}

/* Undo a plan whose driver calls failed, or whose arena was detached meanwhile. Without the
 * lock: unmap what it mapped; then, under it, put the window and the moved chunks' spans back
 * as they were and keep the chunks that can be kept (new ones, and all of them once the
 * arena is gone, go back to the driver). */
static uint64_t plan_rollback(cs_pool *p, plan *pl)
{
    int raw;
    uint64_t kept_new = 0;
    uint64_t unmaps = 0;
    for (size_t i = 0; i < pl->nplaces; i++)
        if (pl->places[i].mapped) {
            bool ok = p->ops->unmap(p->dev, pl->places[i].va, pl->places[i].c.size, &raw) ==
                      CS_BE_OK;
            unmaps += ok;
            pl->places[i].stuck = !ok;
        }
    /* What goes back to the driver, after the lock; a chunk still mapped where it was (a move
     * that never happened, in an arena now gone) is unmapped there first. */
    chunk *back = malloc((pl->nplaces + 1) * sizeof *back);
    place *stale = malloc((pl->nplaces + 1) * sizeof *stale);
    size_t nback = 0, nstale = 0;
    bool sync_first = false;  /* a chunk moved busy goes: its work first */
    pthread_mutex_lock(&p->lock);
    arena *a = pl->a;
    bool dead = a->dead;
    plan_count(p, pl);  /* what the driver did before the failure: counted, then undone */
    p->counts.unmaps += unmaps;
    for (size_t i = 0; i < pl->nplaces; i++) {
        place *pc = &pl->places[i];
        if (pc->from == FROM_FREE) {
            if (!dead && grow((void **)&a->maps, &a->cap_maps, a->nmaps, 1, sizeof *a->maps)) {
                map_insert(a, (mapping){pc->from_va, pc->c.size, pc->c.handle});
                settle(a, span_at(a, pc->from_va), SPAN_FREE);
                if (pl->gen != p->access_gen)  /* a regrant skipped it: as regrant does */
                    p->ops->access(p->dev, pc->from_va, pc->c.size, &raw);
                continue;
            }
            if (!dead)
                settle(a, span_at(a, pc->from_va), SPAN_HOLE);  /* unmapped below */
            sync_first |= pc->keep_old && !dead;
            if (stale)
                stale[nstale++] = *pc;
            p->counts.unmaps++;
            p->counts.releases++;
            continue;
        }
        if (pc->from_va && !dead)  /* unmapped from its free span: a hole there now */
            settle(a, span_at(a, pc->from_va), SPAN_HOLE);
        if (!pc->c.size)
            continue;  /* a new chunk never made */
        if (pc->stuck && !dead) {  /* its unmap failed: still mapped in the window */
            kept_new += pc->from == FROM_NEW ? pc->c.size : 0;
            continue;  /* kept below */
        }
        if (pc->from != FROM_NEW && !dead && spare_push(p, pc->c))
            continue;
        if (back)
            back[nback++] = pc->c;
        else
            p->ops->release(p->dev, pc->c.handle, &raw);  /* no host memory at all: rare
                                                           (an old mapping of it, if any, keeps
                                                           it with the driver until it goes) */
        p->counts.releases++;
    }
    for (size_t k = 0; !dead && k < pl->npieces; k++)
        settle(a, span_at(a, pl->pieces[k].va), pl->pieces[k].hole ? SPAN_HOLE : SPAN_FREE);
    /* A chunk whose unmap failed stays mapped where it is: free there once it is granted,
     * else busy for good (neither handed out nor released: what it holds stays counted). One
     * that kept its old mapping is back there: its second mapping stays busy for good. */
    for (size_t i = 0; i < pl->nplaces; i++) {
        place *pc = &pl->places[i];
        if (!pc->stuck || dead)
            continue;
        if (pc->keep_old) {  /* an old mapping now, its unmap tried again later */
            if (room_spans(a, 2))
                settle(a, cut(a, pc->va, pc->c.size), SPAN_BUSY);
            if (grow((void **)&a->olds, &a->cap_olds, a->nolds, 1, sizeof *a->olds)) {
                a->olds[a->nolds++] = (old_mapping){pc->va, pc->c.size, pc->c.handle, 0};
                p->nolds++;
            }
            continue;
        }
        bool room = room_spans(a, 2) &&
                    grow((void **)&a->maps, &a->cap_maps, a->nmaps, 1, sizeof *a->maps);
        size_t s = room ? cut(a, pc->va, pc->c.size) : span_at(a, pc->va);
        if (room)
            map_insert(a, (mapping){pc->va, pc->c.size, pc->c.handle});
        bool ok = room && p->ops->access(p->dev, pc->va, pc->c.size, &raw) == CS_BE_OK;
        settle(a, s, ok ? SPAN_FREE : SPAN_BUSY);
    }
    bool last = arena_leave(a);
    pthread_mutex_unlock(&p->lock);
    if (sync_first) {  /* no host memory to keep it (rare): an unmap does not wait */
        int ignored = CS_BE_OK;
        wait_device(p, &ignored, &raw);
    }
    for (size_t i = 0; i < nstale; i++) {
        p->ops->unmap(p->dev, stale[i].from_va, stale[i].c.size, &raw);
        release_handle(p, stale[i].c.handle, &raw);
    }
    release_chunks(p, back, nback);
    if (last)
        unreserve(p, a);
    free(back);
    free(stale);
    return kept_new;
}

/* A new arena of at least `size` bytes, registered, unless another thread registered one
 * since the pool had `seen` arenas (then it is given back: the caller looks again). Without
 * the lock. */
static int arena_add(cs_pool *p, uint64_t size, size_t seen, int *raw)
{
    arena *a = calloc(1, sizeof *a);
    if (!a || !room_spans(a, 1)) {
        free(a);
        *raw = HOST_OOM;
        return CS_BE_OOM;
    }
    a->size = size > p->arena_bytes ? size : p->arena_bytes;
    int rc = p->ops->reserve(p->dev, a->size, &a->va, raw);
    if (rc == CS_BE_OK && p->ops->reserve == NULL)
        rc = CS_BE_ERROR;
    if (rc != CS_BE_OK) {
        arena_free(a);
        return rc;
    }
    a->spans[a->nspans++] = (span){a->va, a->size, 0, SPAN_HOLE, NULL};
    pthread_mutex_lock(&p->lock);
    p->counts.reserves++;
    if (p->narenas != seen && !p->dead) {
        p->counts.reserves--;  /* counted as never made */
        pthread_mutex_unlock(&p->lock);
        unreserve(p, a);
        arena_free(a);
        return CS_BE_OK;
    }
    bool ok = !p->dead &&
              grow((void **)&p->arenas, &p->cap_arenas, p->narenas, 1, sizeof *p->arenas);
    if (ok) {
        size_t i = arena_index(p, a->va);
        memmove(&p->arenas[i + 1], &p->arenas[i], (p->narenas - i) * sizeof *p->arenas);
        p->arenas[i] = a;
        p->narenas++;
    }
    bool dead = p->dead;
    pthread_mutex_unlock(&p->lock);
    if (!ok) {
        unreserve(p, a);
        arena_free(a);
        *raw = dead ? DESTROYED : HOST_OOM;
        return dead ? CS_BE_ERROR : CS_BE_OOM;
    }
    return CS_BE_OK;
}

/* ---------------------------------------------------------------- blocks */

/* A used span of `size` bytes cut from the start of free span i (room made beforehand). */
static void carve(cs_pool *p, arena *a, size_t i, uint64_t size, range *r, uint64_t *va,
                  uint64_t *epoch)
{
    i = cut(a, a->spans[i].va, size);
    a->spans[i].kind = SPAN_USED;
    a->spans[i].small = r;
    *va = a->spans[i].va;
    *epoch = epoch_out(p, a->spans[i].epoch);
    if (r && *epoch > r->epoch)
        r->epoch = *epoch;  /* its blocks are ordered after that work, as its own busy slots */
    p->counts.carves++;
}

/* A used span of `size` bytes (CS_POOL_ALIGN bytes; one granule for a small range), a small
 * range when r is not NULL (it then belongs to the span; on failure it stays the caller's).
 * See cs_pool_alloc; a small range made of busy memory keeps its epoch, its slots handed out
 * ordered after it. */
static int alloc_span(cs_pool *p, uint64_t size, range *r, uint64_t max_new, bool ordered,
                      uint64_t *va, uint64_t *created, uint64_t *released, bool *carved,
                      uint64_t *epoch, int *raw)
{
    *carved = false;
    *epoch = 0;
    zone z = r ? ZONE_SMALL : ZONE_LARGE;
    bool anywhere = false;  /* a free span outside the zone rather than no memory */
    int refused = CS_BE_OK; /* short, or the driver's refusal: when nothing outside takes it */
    for (;;) {
        pthread_mutex_lock(&p->lock);
        if (p->dead) {
            pthread_mutex_unlock(&p->lock);
            *raw = DESTROYED;
            return CS_BE_ERROR;
        }
        arena *a;
        size_t i;
        window w;
        uint64_t usable = usable_epoch(p, ordered);
        if (best_fit(p, size, usable, z, &a, &i) ||
            (anywhere && best_fit(p, size, usable, ZONE_ANY, &a, &i))) {
            /* Carved out of a free span: no driver call. */
            if (!room_spans(a, 1)) {
                pthread_mutex_unlock(&p->lock);
                *raw = HOST_OOM;
                return CS_BE_OOM;
            }
            carve(p, a, i, size, r, va, epoch);
            *carved = true;
            if (r) {
                r->va = *va;
                small_add(p, r);
                p->counts.slab_free += p->gran;
            }
            pthread_mutex_unlock(&p->lock);
            return CS_BE_OK;
        }
        if (refused) {
            pthread_mutex_unlock(&p->lock);
            return refused;  /* *raw from the driver's refusal, if it was one */
        }
        if (!best_window(p, size, usable, z, &w)) {
            if (max_new < round_up(size, p->gran) &&
                best_fit(p, size, usable, ZONE_ANY, &a, &i)) {
                pthread_mutex_unlock(&p->lock);
                anywhere = true;  /* a new arena's memory is not allowed: a span outside */
                refused = CS_BE_SHORT;
                continue;
            }
            size_t seen = p->narenas;
            pthread_mutex_unlock(&p->lock);
            int rc = arena_add(p, size, seen, raw);
            if (rc != CS_BE_OK)
                return rc;
            continue;
        }
        plan pl = {.ordered = ordered};
        int rc = plan_make(p, &w, size, max_new, &pl);
        window fresh;
        if (rc == CS_BE_SHORT && fresh_window(p, size, z, &fresh) && fresh.va != w.va) {
            /* Chunks too large for the holes of the best window: where a hole goes on, the
             * last one may reach past the block. */
            plan_free(&pl);
            pl = (plan){.ordered = ordered};
            w = fresh;
            rc = plan_make(p, &w, size, max_new, &pl);
        }
        uint64_t gen = p->access_gen;
        pthread_mutex_unlock(&p->lock);
        if (rc == CS_BE_SHORT && !anywhere) {
            plan_free(&pl);
            anywhere = true;  /* short of new memory even with moves: a free span outside */
            refused = rc;
            continue;
        }
        if (rc != CS_BE_OK) {
            plan_free(&pl);
            if (rc == CS_BE_OOM)
                *raw = HOST_OOM;
            return rc;
        }
        rc = plan_run(p, &pl, raw);
        for (size_t k = 0; k < pl.ntrade; k++)
            *released += pl.trade[k].size;
        pthread_mutex_lock(&p->lock);
        p->counts.releases += pl.ntrade;
        pl.ntrade = 0;
        if (rc != CS_BE_OK || w.a->dead ||
            !grow((void **)&w.a->maps, &w.a->cap_maps, w.a->nmaps, pl.nplaces,
                  sizeof *w.a->maps) ||
            !grow((void **)&w.a->olds, &w.a->cap_olds, w.a->nolds, pl.nold,
                  sizeof *w.a->olds)) {
            if (rc == CS_BE_OK) {
                rc = w.a->dead ? CS_BE_ERROR : CS_BE_OOM;
                *raw = w.a->dead ? DESTROYED : HOST_OOM;
            }
            pthread_mutex_unlock(&p->lock);
            *created = plan_rollback(p, &pl);  /* new chunks it could not unmap: kept */
            plan_free(&pl);
            if (rc == CS_BE_OOM && !anywhere) {
                anywhere = true;  /* the device is full: a free span outside the zone */
                refused = rc;
                continue;
            }
            return rc;
        }
        a = w.a;
        plan_count(p, &pl);
        for (size_t k = 0; k < pl.nplaces; k++) {
            place *pc = &pl.places[k];
            if (pc->keep_old) {  /* moved here busy: mapped where it was until done */
                a->olds[a->nolds++] =
                    (old_mapping){pc->from_va, pc->c.size, pc->c.handle, pc->epoch};
                p->nolds++;
            } else if (pc->from_va) {  /* moved here: a hole where it was */
                settle(a, span_at(a, pc->from_va), SPAN_HOLE);
            }
            map_insert(a, (mapping){pc->va, pc->c.size, pc->c.handle});
        }
        i = span_at(a, pl.va);
        join(a, i, span_at(a, pl.va + size + pl.over - 1) + 1, SPAN_USED);
        *epoch = epoch_out(p, a->spans[i].epoch > pl.moved_epoch ? a->spans[i].epoch
                                                                 : pl.moved_epoch);
        if (r && *epoch > r->epoch)
            r->epoch = *epoch;
        if (pl.over && room_spans(a, 1)) {  /* the last chunk's rest: free, and new (or, of a
                                               chunk moved busy, as busy as it was) */
            split_at(a, pl.va + size);
            a->spans[i + 1].epoch = epoch_out(p, pl.moved_epoch);
            settle(a, i + 1, SPAN_FREE);
        }  /* else (no host memory) the block's span keeps it, and frees it with the block */
        a->spans[i].small = r;
        /* Peer access granted while the window was filled: grant it here too, and to the
         * last chunk's rest (a free span the regrant skipped while it was busy). */
        while (gen != p->access_gen) {
            gen = p->access_gen;
            pthread_mutex_unlock(&p->lock);
            int ignored;
            for (size_t k = 0; k < pl.npieces; k++)
                if (pl.pieces[k].hole)
                    p->ops->access(p->dev, pl.pieces[k].va, pl.pieces[k].size, &ignored);
            pthread_mutex_lock(&p->lock);
        }
        if (r) {
            r->va = pl.va;
            small_add(p, r);
            p->counts.slab_free += p->gran;
        }
        /* Detached meanwhile only if the lock was dropped for a grant above: then the
         * reservation is this thread's to give back if it was the last one on it. */
        bool last = arena_leave(a);
        *va = pl.va;
        *created = pl.created;
        pthread_mutex_unlock(&p->lock);
        plan_free(&pl);
        if (last)
            unreserve(p, a);
        if (ordered)  /* with the driver calls of a mapping, never on a carve */
            reap_old(p);
        return CS_BE_OK;
    }
}

bool cs_pool_carve(cs_pool *p, uint64_t bytes, bool ordered, uint64_t *addr, uint64_t *epoch)
{
    uint64_t size = round_up(bytes, CS_POOL_ALIGN);
    arena *a;
    size_t i;
    pthread_mutex_lock(&p->lock);
    bool ok = !p->dead && best_fit(p, size, usable_epoch(p, ordered), ZONE_LARGE, &a, &i) &&
              room_spans(a, 1);
    if (ok)
        carve(p, a, i, size, NULL, addr, epoch);
    pthread_mutex_unlock(&p->lock);
    return ok;
}

int cs_pool_alloc(cs_pool *p, uint64_t bytes, uint64_t max_new, bool ordered, uint64_t *addr,
                  uint64_t *created, uint64_t *released, bool *carved, uint64_t *epoch,
                  int *raw)
{
    *created = *released = 0;
    bool ignored, *no_call = carved ? carved : &ignored;
    uint64_t none, *at = epoch ? epoch : &none;
    *at = 0;
    if (bytes > cs_pool_slab_max(p->gran))
        return alloc_span(p, round_up(bytes, CS_POOL_ALIGN), NULL, max_new, ordered, addr,
                          created, released, no_call, at, raw);
    /* A slot of a slab, else a new small range (one granule) for it. Other threads may take
     * the new range's pages before this one comes back for its slot: then another range,
     * within what is left of max_new. */
    *no_call = true;
    range *fresh = NULL;  /* the range made for it last */
    for (;;) {
        bool no_mem = false;
        pthread_mutex_lock(&p->lock);
        bool dead = p->dead, ok = !dead && slot_take(p, bytes, ordered, fresh, addr, at, &no_mem);
        pthread_mutex_unlock(&p->lock);
        if (ok)
            return CS_BE_OK;
        *no_call = false;  /* until the new range is found carved */
        if (dead) {  /* the context went, with any range made for this block */
            *raw = DESTROYED;
            return CS_BE_ERROR;
        }
        range *r = no_mem ? NULL : calloc(1, sizeof *r);
        if (!r) {
            *raw = HOST_OOM;
            return CS_BE_OOM;
        }
        r->free_pages = UINT32_MAX;
        uint64_t va, made = 0, gone = 0;
        int rc = alloc_span(p, p->gran, r, max_new > *created ? max_new - *created : 0,
                            ordered, &va, &made, &gone, no_call, at, raw);
        *created += made;
        *released += gone;
        if (rc != CS_BE_OK) {
            free(r);
            return rc;
        }
        fresh = r;
    }
}

/* Under the lock: the chunks wholly inside free spans of [lo, hi) of arena a whose work is
 * done, up to `bytes`, marked busy and out of the mapping list, into out (room for `most`).
 * Returns how many. */
static size_t take_free_chunks(cs_pool *p, arena *a, uint64_t lo, uint64_t hi, uint64_t bytes,
                               mapping *out, size_t most)
{
    size_t n = 0;
    uint64_t got = 0;
    for (size_t m = map_index(a, lo); n < most && got < bytes && m < a->nmaps;) {
        mapping c = a->maps[m];
        if (c.va + c.size > hi || !room_spans(a, 2))
            break;
        const span *s = &a->spans[span_at(a, c.va)];
        if (s->kind != SPAN_FREE || c.va + c.size > span_end(s) || !epoch_done(p, s->epoch)) {
            m++;  /* partly in a block (carved since the lock was last dropped), or busy */
            continue;
        }
        map_remove(a, m);  /* m is the next one now */
        a->spans[cut(a, c.va, c.size)].kind = SPAN_BUSY;
        out[n++] = c;
        got += c.size;
    }
    if (n)
        a->busy++;
    return n;
}

/* Without the lock: unmap what take_free_chunks took and give it back to the driver; their
 * spans become holes. A chunk whose unmap failed stays, free, granted again when peer access
 * changed since it was taken (gen: the access generation then). Returns the bytes released. */
static uint64_t drop_chunks(cs_pool *p, arena *a, const mapping *m, size_t n, uint64_t gen)
{
    if (!n)
        return 0;
    int raw;
    bool ok[64];
    for (size_t i = 0; i < n; i++)
        ok[i] = p->ops->unmap(p->dev, m[i].va, m[i].size, &raw) == CS_BE_OK;
    pthread_mutex_lock(&p->lock);
    bool dead = a->dead, kept[64];
    uint64_t released = 0;
    for (size_t i = 0; i < n; i++) {
        kept[i] = !ok[i] && !dead &&
                  grow((void **)&a->maps, &a->cap_maps, a->nmaps, 1, sizeof *a->maps);
        if (kept[i]) {
            map_insert(a, m[i]);  /* still mapped: free again */
            settle(a, span_at(a, m[i].va), SPAN_FREE);
            if (gen != p->access_gen)  /* a regrant skipped it meanwhile: as regrant does */
                p->ops->access(p->dev, m[i].va, m[i].size, &raw);
            continue;
        }
        if (!dead)
            settle(a, span_at(a, m[i].va), SPAN_HOLE);
        p->counts.unmaps += ok[i];
        p->counts.releases++;
        released += m[i].size;
    }
    bool last = arena_leave(a);
    pthread_mutex_unlock(&p->lock);
    for (size_t i = 0; i < n; i++)
        if (!kept[i])
            release_handle(p, m[i].handle, &raw);
    if (last)
        unreserve(p, a);
    return released;
}

/* Give back the chunks wholly inside free spans of [lo, hi) of arena a whose work is done, up
 * to `bytes`. Called with the lock held, returns with it released. Bytes released. */
static uint64_t release_free(cs_pool *p, arena *a, uint64_t lo, uint64_t hi, uint64_t bytes)
{
    mapping m[64];
    uint64_t total = 0;
    for (;;) {
        size_t n = take_free_chunks(p, a, lo, hi, bytes - total, m, 64);
        uint64_t gen = p->access_gen;
        pthread_mutex_unlock(&p->lock);
        total += drop_chunks(p, a, m, n, gen);
        if (n < 64 || total >= bytes)
            return total;
        pthread_mutex_lock(&p->lock);
        if (a->dead) {
            pthread_mutex_unlock(&p->lock);
            return total;
        }
    }
}

int cs_pool_free(cs_pool *p, uint64_t addr, bool keep, bool done, uint64_t epoch,
                 uint64_t *released, int *raw)
{
    *released = 0;
    int rc = CS_BE_OK;
    /* Memory given back is unmapped at once: its work must be done first. So must any block's
     * when no ready function can tell when its epoch completes. A large block kept joins the
     * free space with its epoch; a small one's slot goes back to its slab, its range keeping
     * the newest such epoch (a block carved from the range is ordered after it). */
    uint64_t upto = 0;  /* after a wait for the device: every epoch up to it completed */
    if (!done && (!keep || !p->ready)) {
        pthread_mutex_lock(&p->lock);
        upto = p->pending_max > epoch ? p->pending_max : epoch;
        pthread_mutex_unlock(&p->lock);
        wait_device(p, &rc, raw);
        if (rc != CS_BE_OK)
            upto = 0;
        done = true;
    }
    pthread_mutex_lock(&p->lock);
    if (upto > p->done)  /* the wait covered the epochs given out before it, not later ones */
        p->done = upto;
    if (p->dead) {  /* its context went (meanwhile, when the pool waited): with the block */
        pthread_mutex_unlock(&p->lock);
        *raw = DESTROYED;
        return CS_BE_ERROR;
    }
    arena *a = arena_at(p, addr);
    size_t i = a ? span_at(a, addr) : 0;
    span *s = a ? &a->spans[i] : NULL;
    if (!s || s->kind != SPAN_USED || (!s->small && addr != s->va)) {
        pthread_mutex_unlock(&p->lock);
        *raw = INVALID_VALUE;
        return CS_BE_ERROR;
    }
    uint64_t busy = 0;  /* a range going whole: its busy slots' newest epoch */
    if (s->small) {
        range *r = s->small;
        slab *sl = r->page_slab[(addr - r->va) / p->page];
        uint64_t off = sl ? addr - r->va - (uint64_t)sl->first * p->page : 1;
        if (!sl || off % sl->slot || off / sl->slot >= sl->nslots) {
            pthread_mutex_unlock(&p->lock);
            *raw = INVALID_VALUE;
            return CS_BE_ERROR;
        }
        slab_class *k = class_find(p, sl->slot);  /* exists: the slab was made through it */
        if (!done && epoch > r->epoch)
            r->epoch = epoch;
        if (r->epoch > p->pending_max)
            p->pending_max = r->epoch;
        sl->free_slots[sl->nfree++] = (uint32_t)(off / sl->slot);
        p->counts.slab_free += sl->slot;
        if (sl->nfree == 1)
            partial_add(k, sl);
        bool range_free_now = false;
        if (sl->nfree == sl->nslots) {
            partial_remove(k, sl);
            range_free_now = slab_unmake(p, sl);
        }
        if (!range_free_now) {
            pthread_mutex_unlock(&p->lock);
            return rc;
        }
        /* The whole range is free: it goes, as a large block would, with its busy slots'
         * newest epoch (none once it completed). */
        busy = r->epoch > p->done ? r->epoch : 0;
        small_remove(p, r);
        p->counts.slab_free -= p->gran;
        range_free(r);
        s->small = NULL;
    }
    s->epoch = done ? 0 : epoch;
    if (busy > s->epoch)
        s->epoch = busy;
    if (s->epoch > p->pending_max)
        p->pending_max = s->epoch;
    const span *f = &a->spans[settle(a, i, SPAN_FREE)];
    if (keep) {
        pthread_mutex_unlock(&p->lock);
        return rc;
    }
    *released = release_free(p, a, f->va, span_end(f), UINT64_MAX);
    return rc;
}

uint64_t cs_pool_most_new(const cs_pool *p, uint64_t bytes)
{
    /* A large block may start in a free span's last granule and end in a hole's. */
    return bytes <= cs_pool_slab_max(p->gran) ? p->gran : round_up(bytes, p->gran) + p->gran;
}

static bool fits_in(cs_pool *p, uint64_t bytes, bool ordered, zone z)
{
    arena *a;
    size_t i;
    pthread_mutex_lock(&p->lock);
    bool fits = best_fit(p, round_up(bytes, CS_POOL_ALIGN), usable_epoch(p, ordered), z, &a, &i);
    pthread_mutex_unlock(&p->lock);
    return fits;
}

bool cs_pool_fits(cs_pool *p, uint64_t bytes, bool ordered)
{
    return fits_in(p, bytes, ordered, ZONE_LARGE);
}

bool cs_pool_fits_anywhere(cs_pool *p, uint64_t bytes, bool ordered)
{
    return fits_in(p, bytes, ordered, ZONE_ANY);
}

uint64_t cs_pool_need(cs_pool *p, uint64_t bytes, bool move, bool ordered)
{
    pthread_mutex_lock(&p->lock);
    uint64_t size = round_up(bytes, CS_POOL_ALIGN);
    bool small = bytes <= cs_pool_slab_max(p->gran);
    if (small) {
        slab_class *k = class_find(p, bytes);
        int first;
        slot_rule rule = {.ordered = ordered};
        size = (k && slab_usable(p, k, &rule)) ||
                       small_with_run(p, slab_pages(p, bytes), &rule, &first)
                   ? 0
                   : p->gran;
    }
    arena *a;
    size_t i;
    window w, fresh;
    uint64_t need = 0;
    zone z = small ? ZONE_SMALL : ZONE_LARGE;
    /* Which free memory may serve is asked (the GPU, for a small block's new slab) only when
     * the block needs free memory at all. */
    uint64_t usable = size ? usable_epoch(p, ordered) : 0;
    if (size && !best_fit(p, size, usable, z, &a, &i)) {
        /* What cs_pool_alloc would take with no more new memory than needed: the best
         * window's plan, else one where the largest hole starts (a new arena: all of it). */
        bool found = best_window(p, size, usable, z, &w);
        need = found ? plan_least(p, &w, size, move, ordered) : round_up(size, p->gran);
        if (need && found && fresh_window(p, size, z, &fresh) && fresh.va != w.va) {
            uint64_t n = plan_least(p, &fresh, size, move, ordered);
            need = n < need ? n : need;
        }
        /* At the least, a free span outside the zone (alloc_span, short of new memory). */
        if (need && move && best_fit(p, size, usable, ZONE_ANY, &a, &i))
            need = 0;
    }
    pthread_mutex_unlock(&p->lock);
    return need;
}

/* Give back the chunks of free spans whose work is done, one span at a time, up to `bytes`.
 * Bytes released. */
static uint64_t trim_done_spans(cs_pool *p, uint64_t bytes)
{
    uint64_t released = 0;
    while (released < bytes) {
        pthread_mutex_lock(&p->lock);
        arena *a = NULL;
        uint64_t lo = 0, hi = 0;
        for (size_t k = 0; k < p->narenas && !a; k++)
            for (size_t i = 0; i < p->arenas[k]->nspans && !a; i++) {
                const arena *b = p->arenas[k];
                const span *s = &b->spans[i];
                size_t m = map_index(b, s->va);
                if (s->kind == SPAN_FREE && m < b->nmaps &&
                    b->maps[m].va + b->maps[m].size <= span_end(s) && epoch_done(p, s->epoch)) {
                    a = p->arenas[k];
                    lo = s->va;
                    hi = span_end(s);
                }
            }
        if (!a) {
            pthread_mutex_unlock(&p->lock);
            break;
        }
        uint64_t n = release_free(p, a, lo, hi, bytes - released);
        if (!n)
            break;
        released += n;
    }
    return released;
}

/* Free memory whose work is still under way: wait for the device, after which all of it is
 * done. False when there was none, or the wait failed. */
static bool wait_for_busy_spans(cs_pool *p)
{
    pthread_mutex_lock(&p->lock);
    uint64_t upto = p->pending_max;
    bool busy = !epoch_done(p, upto);
    pthread_mutex_unlock(&p->lock);
    int rc = CS_BE_OK, raw;
    if (!busy || (wait_device(p, &rc, &raw), rc != CS_BE_OK))
        return false;
    pthread_mutex_lock(&p->lock);
    if (upto > p->done)  /* all work issued before the wait: done */
        p->done = upto;
    pthread_mutex_unlock(&p->lock);
    return true;
}

uint64_t cs_pool_trim(cs_pool *p, uint64_t bytes, bool may_wait)
{
    uint64_t released = 0;
    reap_old(p);
    /* Unmapped chunks first: no driver call but the release. */
    while (released < bytes) {
        chunk out[64];
        int n = 0;
        pthread_mutex_lock(&p->lock);
        for (int e = p->max_exp - 1; e >= 0 && n < 64 && released < bytes; e--)
            while (p->spare[e].n && n < 64 && released < bytes) {
                out[n] = spare_pop(p, e);
                released += out[n++].size;
            }
        p->counts.releases += (uint64_t)n;
        pthread_mutex_unlock(&p->lock);
        release_chunks(p, out, (size_t)n);
        if (n < 64)
            break;
    }
    /* Then the chunks of free spans whose work is done; then, if that was not enough and the
     * pool may wait, the rest once the device has finished its work. */
    if (released < bytes)
        released += trim_done_spans(p, bytes - released);
    if (released < bytes && may_wait && wait_for_busy_spans(p))
        released += trim_done_spans(p, bytes - released);
    return released;
}

uint64_t cs_pool_release_all(cs_pool *p)
{
    pthread_mutex_lock(&p->lock);
    p->dead = true;
    arena **arenas = p->arenas;
    size_t narenas = p->narenas;
    handle_stack spare[MAX_EXP];
    memcpy(spare, p->spare, sizeof spare);
    memset(p->spare, 0, sizeof p->spare);
    p->arenas = NULL;
    p->narenas = p->cap_arenas = 0;
    p->small_free = NULL;
    for (size_t i = 0; i < p->nclasses; i++)
        p->classes[i].head = NULL;  /* the slabs go with their arenas */
    p->counts.spare = p->counts.slab_free = 0;
    for (size_t i = 0; i < narenas; i++)
        arenas[i]->dead = true;
    p->nolds = 0;  /* they go with their arenas */
    pthread_mutex_unlock(&p->lock);
    /* No one touches a detached arena's spans or mappings: they are this thread's (old
     * mappings being unmapped meanwhile: once that is done). */
    pthread_mutex_lock(&p->olds_lock);
    uint64_t released = 0, unmaps = 0, releases = 0;
    int ignored;
    for (size_t i = 0; i < narenas; i++) {
        arena *a = arenas[i];
        for (size_t m = 0; m < a->nolds; m++)  /* their chunks are mapped below too */
            unmaps += p->ops->unmap(p->dev, a->olds[m].va, a->olds[m].size, &ignored) ==
                      CS_BE_OK;
        for (size_t m = 0; m < a->nmaps; m++) {
            unmaps += p->ops->unmap(p->dev, a->maps[m].va, a->maps[m].size, &ignored) ==
                      CS_BE_OK;
            p->ops->release(p->dev, a->maps[m].handle, &ignored);
            released += a->maps[m].size;
            releases++;
        }
        a->nmaps = a->nolds = 0;
    }
    for (int e = 0; e < MAX_EXP; e++) {
        for (size_t k = 0; k < spare[e].n; k++)
            p->ops->release(p->dev, spare[e].h[k], &ignored);
        released += (uint64_t)spare[e].n * (p->gran << e);
        releases += spare[e].n;
        free(spare[e].h);
    }
    pthread_mutex_unlock(&p->olds_lock);
    pthread_mutex_lock(&p->lock);
    p->counts.unmaps += unmaps;
    p->counts.releases += releases;
    bool kept = grow((void **)&p->gone, &p->cap_gone, p->ngone, narenas, sizeof *p->gone);
    bool *now = calloc(narenas + 1, sizeof *now);
    for (size_t i = 0; i < narenas; i++) {
        arenas[i]->unmapped = true;
        if (now)
            now[i] = arenas[i]->busy == 0;  /* else the last thread busy on it unreserves */
        if (kept)
            p->gone[p->ngone++] = arenas[i];
    }
    pthread_mutex_unlock(&p->lock);
    for (size_t i = 0; i < narenas; i++) {
        if (now && now[i])
            unreserve(p, arenas[i]);
        if (!kept && now && now[i])
            arena_free(arenas[i]);  /* no host memory to keep it: safe, nobody is on it */
    }
    free(now);
    free(arenas);
    return released;
}

bool cs_pool_find(cs_pool *p, uint64_t addr, uint64_t *base, uint64_t *size)
{
    pthread_mutex_lock(&p->lock);
    arena *a = arena_at(p, addr);
    if (a) {
        const span *s = &a->spans[span_at(a, addr)];
        *base = addr;  /* in no block, unless found below */
        *size = 0;
        const range *r = s->kind == SPAN_USED ? s->small : NULL;
        slab *sl = r ? r->page_slab[(addr - r->va) / p->page] : NULL;
        uint64_t start = sl ? r->va + (uint64_t)sl->first * p->page : 0;
        if (sl && addr < start + (uint64_t)sl->nslots * sl->slot) {
            *base = start + (addr - start) / sl->slot * sl->slot;
            *size = sl->slot;
        } else if (s->kind == SPAN_USED && !r) {
            *base = s->va;
            *size = s->size;
        }
    }
    pthread_mutex_unlock(&p->lock);
    return a != NULL;
}

bool cs_pool_chunks(cs_pool *p, uint64_t addr, uint64_t size, cs_pool_chunk_fn each, void *arg)
{
    pthread_mutex_lock(&p->lock);
    arena *a = arena_at(p, addr);
    bool ok = a && size && addr + size <= a->va + a->size;
    /* Every mapping that overlaps [addr, addr + size), which they must cover end to end. */
    uint64_t at = addr;
    size_t i = ok ? map_index(a, addr) : 0;
    if (ok && i > 0 && a->maps[i - 1].va + a->maps[i - 1].size > addr)
        i--;
    for (; ok && at < addr + size; i++) {
        const mapping *m = i < a->nmaps ? &a->maps[i] : NULL;
        ok = m && m->va <= at && each(arg, m->va, m->size, m->handle);
        if (ok)
            at = m->va + m->size;
    }
    pthread_mutex_unlock(&p->lock);
    return ok;
}

int cs_pool_regrant(cs_pool *p, int *raw)
{
    int rc = CS_BE_OK;
    pthread_mutex_lock(&p->lock);
    p->access_gen++;
    /* Under the lock: nothing leaves meanwhile (a rare call; the access op does not wait for
     * the GPU). Each run of mapped spans in one call; busy ones are their thread's to grant. */
    for (size_t k = 0; k < p->narenas; k++) {
        const arena *a = p->arenas[k];
        for (size_t i = 0; i < a->nmaps;) {
            size_t j = i + 1;
            while (j < a->nmaps && a->maps[j].va == a->maps[j - 1].va + a->maps[j - 1].size)
                j++;
            int r = p->ops->access(p->dev, a->maps[i].va,
                                   a->maps[j - 1].va + a->maps[j - 1].size - a->maps[i].va, raw);
            if (r != CS_BE_OK && rc == CS_BE_OK)
                rc = r;
            i = j;
        }
    }
    pthread_mutex_unlock(&p->lock);
    return rc;
}

void cs_pool_counts_get(cs_pool *p, cs_pool_counts *out)
{
    pthread_mutex_lock(&p->lock);
    *out = p->counts;
    uint64_t whole;
    free_bytes(p, &out->free_mapped, &whole);
    out->spare += whole;
    pthread_mutex_unlock(&p->lock);
}
