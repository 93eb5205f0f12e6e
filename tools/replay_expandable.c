/* A model of PyTorch's caching allocator with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
 * (c10/cuda/CUDACachingAllocator.cpp), one stream, for cacheshim-replay --vs-expandable: the
 * trace's allocations and frees go through it, and what it reports is the most memory its
 * segments ever had mapped. Pure bookkeeping: no CUDA, no I/O. docs/replay.md says what it
 * leaves out.
 *
 * The rules, as PyTorch has them:
 * - a request is rounded up to a multiple of 512 B, at least 512 (round_size, default config);
 * - up to 1 MiB it goes to the small pool, above to the large pool (get_pool, kSmallSize);
 * - each pool is one expandable segment, a virtual range whose beginning is mapped, in pages of
 *   2 MiB (small, kSmallBuffer) or 20 MiB (large, kLargeBuffer); pages are never unmapped here
 *   (no empty_cache, no out-of-memory in a replay);
 * - a request takes the best-fitting free block of its pool: the smallest at least as large,
 *   the lowest address among equals (BlockComparatorSize); except that the free block at the
 *   mapped end of the segment counts as large as it could grow (get_free_block's
 *   expandable_size), so it is passed over for the next block in that order when there is one;
 * - a block larger than the request is split when the rest is at least 512 B (should_split);
 * - with no free block that fits, the segment maps pages at its end: just enough to extend its
 *   free last block to the request, or, when the last block is in use, to hold the request in a
 *   new block (find_expandable_block, try_allocate_expandable_block); the block is then split;
 * - a freed block joins its free neighbours at once (free_block, try_merge_blocks). */
#include "replay.h"

#include <stdlib.h>

#define ES_MIN_BLOCK 512ull             /* kMinBlockSize */
#define ES_SMALL_SIZE (1ull << 20)      /* kSmallSize: the largest small request */
#define ES_SMALL_PAGE (2ull << 20)      /* kSmallBuffer */
#define ES_LARGE_PAGE (20ull << 20)     /* kLargeBuffer */

/* A block of a segment: in use or free. Blocks tile the mapped part of their segment in
 * address order (prev, next); free ones are also in their pool's tree. */
typedef struct es_block {
    uint64_t addr, size;  /* offset in the segment, bytes */
    bool free;
    struct es_block *prev, *next;   /* neighbours by address */
    struct es_block *left, *right;  /* the free tree (a treap by size, then address) */
    uint32_t prio;                  /* treap priority */
} es_block;

typedef struct {
    uint64_t page;      /* bytes mapped at a time */
    uint64_t mapped;    /* bytes mapped: the segment's mapped end */
    es_block *last;     /* the block that ends at `mapped`; NULL while nothing is mapped */
    es_block *free_tree;
} es_pool;

typedef struct {
    es_pool small, large;
    uint32_t random;  /* xorshift state for treap priorities */
    uint64_t live_bytes;
    replay_expandable_result *out;
} es_model;

/* ---------------------------------------------------------------- the free tree */

static bool key_less(const es_block *a, const es_block *b)
{
    return a->size < b->size || (a->size == b->size && a->addr < b->addr);
}

/* Splits t into the blocks ordered before key (*less) and the rest (*rest). */
static void tree_split(es_block *t, const es_block *key, es_block **less, es_block **rest)
{
    if (!t) {
        *less = *rest = NULL;
    } else if (key_less(t, key)) {
        tree_split(t->right, key, &t->right, rest);
        *less = t;
    } else {
        tree_split(t->left, key, less, &t->left);
        *rest = t;
    }
}

/* Joins two trees, every block of a ordered before every block of b. */
static es_block *tree_join(es_block *a, es_block *b)
{
    if (!a || !b)
        return a ? a : b;
    if (a->prio > b->prio) {
        a->right = tree_join(a->right, b);
        return a;
    }
    b->left = tree_join(a, b->left);
    return b;
}

static es_block *tree_insert(es_block *t, es_block *n)
{
    if (!t)
        return n;
    if (n->prio > t->prio) {
        tree_split(t, n, &n->left, &n->right);
        return n;
    }
    if (key_less(n, t))
        t->left = tree_insert(t->left, n);
    else
        t->right = tree_insert(t->right, n);
    return t;
}

static es_block *tree_remove(es_block *t, const es_block *n)
{
    if (t == n)
        return tree_join(t->left, t->right);
    if (key_less(n, t))
        t->left = tree_remove(t->left, n);
    else
        t->right = tree_remove(t->right, n);
    return t;
}

/* The first block in order of at least size bytes (lower_bound), or NULL. */
static es_block *tree_first_fit(es_block *t, uint64_t size)
{
    es_block *fit = NULL;
    while (t) {
        if (t->size >= size) {
            fit = t;
            t = t->left;
        } else {
            t = t->right;
        }
    }
    return fit;
}

/* The block right after b in order, or NULL. */
static es_block *tree_after(es_block *t, const es_block *b)
{
    es_block *after = NULL;
    while (t) {
        if (key_less(b, t)) {
            after = t;
            t = t->left;
        } else {
            t = t->right;
        }
    }
    return after;
}

/* ---------------------------------------------------------------- blocks */

static es_block *new_block(es_model *m, uint64_t addr, uint64_t size)
{
    es_block *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    m->random ^= m->random << 13;
    m->random ^= m->random >> 17;
    m->random ^= m->random << 5;
    *b = (es_block){.addr = addr, .size = size, .prio = m->random};
    return b;
}

static void make_free(es_pool *p, es_block *b)
{
    b->free = true;
    b->left = b->right = NULL;
    p->free_tree = tree_insert(p->free_tree, b);
}

static void take_free(es_pool *p, es_block *b)
{
    p->free_tree = tree_remove(p->free_tree, b);
    b->free = false;
}

/* Puts n right after b in address order (b NULL: n is the segment's first block). */
static void link_after(es_pool *p, es_block *b, es_block *n)
{
    n->prev = b;
    n->next = b ? b->next : NULL;
    if (n->next)
        n->next->prev = n;
    if (b)
        b->next = n;
    if (p->last == b)
        p->last = n;
}

/* Removes gone, a neighbour that b has just absorbed, from the address order. */
static void unlink_absorbed(es_pool *p, es_block *b, es_block *gone)
{
    if (gone == b->prev) {
        b->prev = gone->prev;
        if (b->prev)
            b->prev->next = b;
    } else {
        b->next = gone->next;
        if (b->next)
            b->next->prev = b;
        if (p->last == gone)
            p->last = b;
    }
    free(gone);
}

/* ---------------------------------------------------------------- allocation and free */

static uint64_t round_up(uint64_t n, uint64_t to)
{
    return (n + to - 1) / to * to;
}

static uint64_t request_size(uint64_t size)
{
    return size < ES_MIN_BLOCK ? ES_MIN_BLOCK : round_up(size, ES_MIN_BLOCK);
}

/* get_free_block: the best fit, the segment's free last block only when nothing after it in
 * order fits too. Taken out of the tree; NULL when no free block fits. */
static es_block *take_best_fit(es_pool *p, uint64_t size)
{
    es_block *b = tree_first_fit(p->free_tree, size);
    if (b && b == p->last) {
        es_block *after = tree_after(p->free_tree, b);
        if (after)
            b = after;
    }
    if (b)
        take_free(p, b);
    return b;
}

/* Maps pages at the segment's end for a request of size bytes that no free block fits, and
 * returns the block (in use) that now holds at least size bytes; NULL when out of host memory. */
static es_block *grow(es_model *m, es_pool *p, uint64_t size)
{
    es_block *b = p->last;
    if (b && b->free) {
        take_free(p, b);
        uint64_t more = round_up(size - b->size, p->page);
        b->size += more;
        p->mapped += more;
        return b;
    }
    uint64_t more = round_up(size, p->page);
    es_block *n = new_block(m, p->mapped, more);
    if (!n)
        return NULL;
    link_after(p, b, n);
    p->mapped += more;
    return n;
}

/* Cuts b down to size, the rest a free block after it, when the rest is at least 512 B;
 * false when out of host memory. */
static bool split(es_model *m, es_pool *p, es_block *b, uint64_t size)
{
    if (b->size - size < ES_MIN_BLOCK)
        return true;
    es_block *rest = new_block(m, b->addr + size, b->size - size);
    if (!rest)
        return false;
    b->size = size;
    link_after(p, b, rest);
    make_free(p, rest);
    return true;
}

/* The pool of a request: a block in use stays in it until freed. */
static es_pool *pool_for(es_model *m, uint64_t requested)
{
    return request_size(requested) <= ES_SMALL_SIZE ? &m->small : &m->large;
}

static es_block *model_alloc(es_model *m, uint64_t requested)
{
    uint64_t size = request_size(requested);
    es_pool *p = pool_for(m, requested);
    es_block *b = take_best_fit(p, size);
    if (!b)
        b = grow(m, p, size);
    if (!b || !split(m, p, b, size))
        return NULL;
    uint64_t mapped = m->small.mapped + m->large.mapped;
    if (mapped > m->out->peak_mapped)
        m->out->peak_mapped = mapped;
    return b;
}

static void model_free(es_pool *p, es_block *b)
{
    es_block *prev = b->prev, *next = b->next;
    if (prev && prev->free) {
        take_free(p, prev);
        b->addr = prev->addr;
        b->size += prev->size;
        unlink_absorbed(p, b, prev);
    }
    if (next && next->free) {
        take_free(p, next);
        b->size += next->size;
        unlink_absorbed(p, b, next);
    }
    make_free(p, b);
}

/* ---------------------------------------------------------------- the trace through it */

/* One event, as replay_sim.c counts it: a PTR allocated again while live keeps its old block
 * in use and its bytes live (freed by a path the trace missed); a free of a PTR not live is
 * skipped; e lines are not replayed. False when out of host memory. */
static bool model_event(es_model *m, replay_map *live, const replay_event *e)
{
    replay_slot old;
    if (e->kind == 'a') {
        es_block *b = model_alloc(m, e->size);
        replay_map_take(live, e->ptr, &old);
        if (!b || !replay_map_put(live, (replay_slot){.key = e->ptr, .addr = (uintptr_t)b,
                                                      .size = e->size}))
            return false;
        m->live_bytes += e->size;
        if (m->live_bytes > m->out->peak_live)
            m->out->peak_live = m->live_bytes;
    } else if (e->kind == 'f' && e->ptr && replay_map_take(live, e->ptr, &old)) {
        model_free(pool_for(m, old.size), (es_block *)(uintptr_t)old.addr);
        m->live_bytes -= old.size;
    }
    return true;
}

static void free_segment(es_pool *p)
{
    for (es_block *b = p->last, *prev; b; b = prev) {
        prev = b->prev;
        free(b);
    }
}

int replay_expandable_run(const replay_trace *t, replay_expandable_result *out)
{
    *out = (replay_expandable_result){0};
    es_model m = {.small = {.page = ES_SMALL_PAGE}, .large = {.page = ES_LARGE_PAGE},
                  .random = 2463534242u, .out = out};
    replay_map live;
    bool ok = replay_map_init(&live, 1024);
    for (size_t i = 0; ok && i < t->nev; i++)
        ok = model_event(&m, &live, &t->ev[i]);
    free_segment(&m.small);
    free_segment(&m.large);
    replay_map_free(&live);
    out->over_live = out->peak_live ? (double)out->peak_mapped / (double)out->peak_live : 0;
    return ok ? 0 : -1;
}
