/* The debug layer's core (cs_debug.h): call sites, the blocks the program holds, bad frees and
 * leaks. Call sites are the stack's return addresses (backtrace), interned so that a block
 * keeps a 32-bit number; they are symbolized only when printed (dladdr). */
#include "cs_debug.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cs_libc.h"
#include "cs_shim.h"

bool cs_debug_on;

/* Frames kept a site, and printed of it (after the shim's own are left out). */
#define SITE_FRAMES 24
#define SITE_PRINTED 12
#define SITE_MAX (1u << 20)
#define LIVE_BUCKETS (1u << 16)
/* Frees remembered for a double free's report: the newest free of an address wins. */
#define FREED_RING 4096
/* Allocation sites printed in the leak report, largest first. */
#define LEAK_SITES_SHOWN 20

typedef struct {
    void *pc[SITE_FRAMES];
    int depth;
    uint64_t hash;
} site_rec;

/* A block the program holds (allocated through the shim, not yet freed). */
typedef struct live {
    uint64_t addr, size;      /* size: what the program asked for */
    const void *ctx;
    cs_site site;
    cs_site free_site;        /* freeing: this thread is freeing it (filling, quarantining) */
    bool freeing;
    cs_scope_frame *frame;
    struct live *next;
} live;

typedef struct {
    uint64_t addr, size;
    cs_site alloc_site, free_site;
} freed;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static cs_cache *cache;
static int modes;           /* CS_DEBUG_* */
static bool exiting;        /* atomic: the exit handler ran; contexts torn down now keep records */
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;

static site_rec *sites;     /* site n is sites[n - 1] */
static uint32_t nsites, sites_cap;
static uint32_t *site_index; /* open addressing: site numbers, 0 empty */
static uint32_t index_cap;

static live *buckets[LIVE_BUCKETS];
static freed ring[FREED_RING];
static unsigned ring_next;

/* ---------------------------------------------------------------- call sites */

static uint64_t hash_pcs(void *const *pc, int n)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) {
        h ^= (uint64_t)(uintptr_t)pc[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* With the lock held. */
static bool index_grow(void)
{
    uint32_t cap = index_cap ? index_cap * 2 : 1024;
    uint32_t *idx = calloc(cap, sizeof *idx);
    if (!idx)
        return false;
    for (uint32_t n = 1; n <= nsites; n++) {
        uint32_t i = (uint32_t)sites[n - 1].hash & (cap - 1);
        while (idx[i])
            i = (i + 1) & (cap - 1);
        idx[i] = n;
    }
    free(site_index);
    site_index = idx;
    index_cap = cap;
    return true;
}

/* With the lock held: the site's number, made on first sight; 0 when out of room. */
static cs_site intern(void *const *pc, int depth)
{
    uint64_t h = hash_pcs(pc, depth);
    if (index_cap) {
        for (uint32_t i = (uint32_t)h & (index_cap - 1); site_index[i];
             i = (i + 1) & (index_cap - 1)) {
            const site_rec *s = &sites[site_index[i] - 1];
            if (s->hash == h && s->depth == depth && !memcmp(s->pc, pc, sizeof *pc * depth))
                return site_index[i];
        }
    }
    if (nsites >= SITE_MAX)
        return 0;
    if ((nsites + 1) * 2 > index_cap && !index_grow())
        return 0;
    if (nsites == sites_cap) {
        uint32_t cap = sites_cap ? sites_cap * 2 : 256;
        site_rec *grown = realloc(sites, cap * sizeof *grown);
        if (!grown)
            return 0;
        sites = grown;
        sites_cap = cap;
    }
    site_rec *s = &sites[nsites++];
    memcpy(s->pc, pc, sizeof *pc * depth);
    s->depth = depth;
    s->hash = h;
    uint32_t i = (uint32_t)h & (index_cap - 1);
    while (site_index[i])
        i = (i + 1) & (index_cap - 1);
    site_index[i] = nsites;
    return nsites;
}

/* backtrace() loads the unwinder (libgcc_s) the first time it runs. Not at init: as an audit
 * module (cs_bind.c) the shim starts while ld.so is still loading the program, and a libgcc_s
 * loaded then cannot find its own unwind data, and aborts (CACHESHIM_DEBUG under `cacheshim
 * run`, check_bind.py debug). Here, at the first site, outside every lock of the layer. */
static pthread_once_t unwinder_once = PTHREAD_ONCE_INIT;

static void load_unwinder(void)
{
    void *warm[1];
    (void)backtrace(warm, 1);
}

cs_site cs_site_here(void)
{
    if (!modes)
        return 0;
    pthread_once(&unwinder_once, load_unwinder);
    void *pc[SITE_FRAMES];
    int depth = backtrace(pc, SITE_FRAMES);
    if (depth <= 0)
        return 0;
    pthread_mutex_lock(&lock);
    cs_site s = intern(pc, depth);
    pthread_mutex_unlock(&lock);
    return s;
}

static const char *base_name(const char *path)
{
    const char *slash = path ? strrchr(path, '/') : NULL;
    return slash ? slash + 1 : path ? path : "?";
}

void cs_site_print(cs_site site, const char *title)
{
    site_rec s = {.depth = 0};
    pthread_mutex_lock(&lock);
    if (site && site <= nsites)
        s = sites[site - 1];
    pthread_mutex_unlock(&lock);
    cs_log("%s", title);
    if (s.depth == 0) {
        cs_log("    (unknown: taken before CACHESHIM_DEBUG could record it)");
        return;
    }
    Dl_info self;
    void *own_base = dladdr((void *)cs_site_print, &self) ? self.dli_fbase : NULL;
    int shown = 0;
    for (int i = 0; i < s.depth && shown < SITE_PRINTED; i++) {
        Dl_info info;
        bool known = dladdr(s.pc[i], &info) != 0;
        if (known && info.dli_fbase == own_base)
            continue;  /* the shim's own frames: the program's call is what matters */
        uintptr_t pc = (uintptr_t)s.pc[i];
        if (known && info.dli_sname)
            cs_log("    #%d %p %s+0x%" PRIxPTR " (%s+0x%" PRIxPTR ")", shown, s.pc[i],
                   info.dli_sname, pc - (uintptr_t)info.dli_saddr, base_name(info.dli_fname),
                   pc - (uintptr_t)info.dli_fbase);
        else if (known)
            cs_log("    #%d %p (%s+0x%" PRIxPTR ")", shown, s.pc[i], base_name(info.dli_fname),
                   pc - (uintptr_t)info.dli_fbase);
        else
            cs_log("    #%d %p", shown, s.pc[i]);
        shown++;
    }
}

/* ---------------------------------------------------------------- blocks held */

static unsigned bucket_of(uint64_t addr)
{
    return (unsigned)((addr >> 9) * 0x9E3779B97F4A7C15ull >> 48) & (LIVE_BUCKETS - 1);
}

/* With the lock held: the record of the block at addr; NULL if none. */
static live *live_find(uint64_t addr)
{
    for (live *l = buckets[bucket_of(addr)]; l; l = l->next)
        if (l->addr == addr)
            return l;
    return NULL;
}

/* With the lock held: takes the record l off the map. */
static void live_unlink(live *l)
{
    for (live **p = &buckets[bucket_of(l->addr)]; *p; p = &(*p)->next)
        if (*p == l) {
            *p = l->next;
            return;
        }
}

static void live_drop(live *l, bool freed_by_program)
{
    cs_scope_discharge(l->frame, l->size, freed_by_program);
    free(l);
}

static void at_exit_check(void *unused)
{
    (void)unused;
    __atomic_store_n(&exiting, true, __ATOMIC_RELEASE);
    if (modes & CS_DEBUG_UAF)
        cs_quarantine_check(true);
}

/* Registered with the first block, so after the CUDA runtime registered its own exit handler:
 * ours runs first, while the driver's contexts still stand. With the program's libc (as an
 * audit module the shim's own libc would run it only when ld.so finishes the shim, after
 * libcuda: no check, no report). */
static void register_exit(void)
{
    cs_libc_atexit(at_exit_check, NULL);
}

cs_result cs_debug_alloc(cs_cache *c, cs_heap *h, const void *ctx, uint64_t size,
                         uint64_t *addr, int *raw, cs_alloc_failure *failure, cs_result first)
{
    cs_result r = first;
    if (r == CS_OOM && (modes & CS_DEBUG_UAF) && cs_quarantine_drain())
        r = cs_cache_alloc(c, h, size, addr, raw, failure);
    if (r != CS_OK)
        return r;
    pthread_once(&exit_once, register_exit);
    live *l = malloc(sizeof *l);
    if (!l)
        return r;  /* the block is served; only its record is lost */
    l->addr = *addr;
    l->size = size;
    l->ctx = ctx;
    l->site = cs_site_here();
    l->frame = cs_scope_charge(size);
    l->freeing = false;
    l->free_site = 0;
    pthread_mutex_lock(&lock);
    live *stale = live_find(*addr);  /* its context went while exiting */
    if (stale && !stale->freeing)
        live_unlink(stale);
    else
        stale = NULL;
    unsigned b = bucket_of(*addr);
    l->next = buckets[b];
    buckets[b] = l;
    pthread_mutex_unlock(&lock);
    if (stale)
        live_drop(stale, false);
    return r;
}

/* ---------------------------------------------------------------- bad frees */

static void report_double_free(uint64_t addr, uint64_t size, cs_site alloc_site,
                               cs_site first_free, cs_site again)
{
    cs_log("double free of 0x%" PRIx64 " (%" PRIu64 " bytes): the block was freed already; "
           "the driver's answer, CUDA_ERROR_INVALID_VALUE, is returned",
           addr, size);
    cs_site_print(alloc_site, "  allocated at:");
    cs_site_print(first_free, "  first freed at:");
    cs_site_print(again, "  freed again at:");
}

/* A free the cache refused as a double free (the address is no block in use: it lies in
 * memory the cache holds free) that no recorded free explains: a block freed long ago (more
 * than FREED_RING frees back) or before the first scope, or an address never handed out. */
static void report_free_in_free_memory(uint64_t addr, cs_site here)
{
    cs_log("bad free of 0x%" PRIx64 ": no block in use there, the address lies in memory the "
           "cache holds free (a block freed twice, its first free not recorded, or an address "
           "cacheshim never handed out); the driver's answer, CUDA_ERROR_INVALID_VALUE, is "
           "returned",
           addr);
    cs_site_print(here, "  freed at:");
}

/* With the lock held: the newest free of addr that the ring remembers. */
static const freed *ring_find(uint64_t addr)
{
    for (unsigned k = 1; k <= FREED_RING; k++) {
        const freed *f = &ring[(ring_next - k) % FREED_RING];
        if (f->addr == addr)
            return f;
    }
    return NULL;
}

/* The record of a block this thread freed leaves the map. */
static void live_freed(live *l)
{
    pthread_mutex_lock(&lock);
    live_unlink(l);
    pthread_mutex_unlock(&lock);
    live_drop(l, true);
}

cs_result cs_debug_free(cs_cache *c, uint64_t addr)
{
    cs_site here = cs_site_here();
    pthread_mutex_lock(&lock);
    live *l = live_find(addr);
    live racing = {.addr = 0};
    if (l && l->freeing) {  /* another thread frees it at this moment */
        racing = *l;
        l = NULL;
    } else if (l) {
        l->freeing = true;  /* stays on the map, so that a second free finds it */
        l->free_site = here;
        if (modes)
            ring[ring_next++ % FREED_RING] = (freed){addr, l->size, l->site, here};
    }
    pthread_mutex_unlock(&lock);

    if (racing.addr) {
        report_double_free(addr, racing.size, racing.site, racing.free_site, here);
        return CS_NOT_IN_USE;
    }
    if (!l) {
        cs_site qa, qf;
        uint64_t qsize;
        if (modes && cs_quarantine_holds(addr, &qa, &qf, &qsize)) {
            report_double_free(addr, qsize, qa, qf, here);
            return CS_NOT_IN_USE;
        }
        /* Not recorded: a block from before the first scope, or no block of the program. */
        cs_result r = cs_cache_free(c, addr);
        if (r == CS_NOT_IN_USE && modes) {
            pthread_mutex_lock(&lock);
            const freed *f = ring_find(addr);
            freed earlier = f ? *f : (freed){0, 0, 0, 0};
            pthread_mutex_unlock(&lock);
            if (earlier.addr)
                report_double_free(addr, earlier.size, earlier.alloc_site, earlier.free_site,
                                   here);
            else
                report_free_in_free_memory(addr, here);
        }
        return r;
    }

    cs_quarantined q = {.addr = addr, .alloc_site = l->site, .free_site = here};
    cs_block_info info;
    if ((modes & CS_DEBUG_UAF) &&
        !__atomic_load_n(&exiting, __ATOMIC_ACQUIRE) &&
        cs_cache_find(c, addr, &info) == CS_BLOCK_IN_USE && info.base == addr) {
        q.size = info.size;
        q.device = info.device;
        q.ctx = info.key;
        if (cs_quarantine_add(&q)) {
            live_freed(l);  /* after: the quarantine answers for it now */
            return CS_OK;
        }
    }
    live_freed(l);  /* before: once in the cache, the address may be handed out again */
    return cs_cache_free(c, addr);
}

void cs_debug_foreign_free(uint64_t addr, int driver_result)
{
    if (!modes || driver_result == 0)
        return;
    cs_site here = cs_site_here();
    /* A pointer into a block the program holds? (A rare path: every record is looked at.) */
    live inside = {.addr = 0};
    pthread_mutex_lock(&lock);
    for (unsigned b = 0; b < LIVE_BUCKETS && !inside.addr; b++)
        for (live *l = buckets[b]; l; l = l->next)
            if (addr > l->addr && addr - l->addr < l->size)
                inside = *l;
    pthread_mutex_unlock(&lock);
    if (inside.addr) {
        cs_log("bad free of 0x%" PRIx64 ": it points %" PRIu64 " bytes into the block at 0x%" PRIx64
               " of %" PRIu64 " bytes, not at its start; the driver answered error %d",
               addr, addr - inside.addr, inside.addr, inside.size, driver_result);
        cs_site_print(inside.site, "  block allocated at:");
    } else {
        cs_log("bad free of 0x%" PRIx64 ": cacheshim never handed out that pointer; the driver "
               "answered error %d",
               addr, driver_result);
    }
    cs_site_print(here, "  freed at:");
}

/* ---------------------------------------------------------------- contexts, fork, exit */

void cs_debug_context_gone(const void *ctx)
{
    if (!cs_debug_active())
        return;
    cs_quarantine_context_gone(ctx);
    if (__atomic_load_n(&exiting, __ATOMIC_ACQUIRE))
        return;  /* torn down at exit: what the program never freed is still a leak */
    live *gone = NULL;
    pthread_mutex_lock(&lock);
    for (unsigned b = 0; b < LIVE_BUCKETS; b++)
        for (live **p = &buckets[b]; *p;) {
            live *l = *p;
            if (l->ctx == ctx && !l->freeing) {  /* a freeing one: its free drops it */
                *p = l->next;
                l->next = gone;
                gone = l;
            } else {
                p = &l->next;
            }
        }
    pthread_mutex_unlock(&lock);
    while (gone) {
        live *next = gone->next;
        live_drop(gone, false);
        gone = next;
    }
}

void cs_debug_before_fork(void)
{
    pthread_mutex_lock(&lock);
}

void cs_debug_after_fork_parent(void)
{
    pthread_mutex_unlock(&lock);
}

/* The child holds none of the parent's device memory (the cache forgot it too). */
void cs_debug_after_fork_child(void)
{
    for (unsigned b = 0; b < LIVE_BUCKETS; b++)
        while (buckets[b]) {
            live *l = buckets[b];
            buckets[b] = l->next;
            free(l);  /* scope statistics stay as the parent left them */
        }
    memset(ring, 0, sizeof ring);
    pthread_mutex_unlock(&lock);
}

typedef struct {
    cs_site site;
    uint64_t bytes, blocks;
} leak_site;

static int by_bytes(const void *a, const void *b)
{
    const leak_site *x = a, *y = b;
    return x->bytes < y->bytes ? 1 : x->bytes > y->bytes ? -1 : (x->site > y->site) - (x->site < y->site);
}

static void report_leaks(void)
{
    pthread_mutex_lock(&lock);
    uint64_t blocks = 0, bytes = 0;
    leak_site *by = calloc(nsites + 1, sizeof *by);  /* index: the site's number */
    for (unsigned b = 0; b < LIVE_BUCKETS; b++)
        for (live *l = buckets[b]; l; l = l->next) {
            blocks++;
            bytes += l->size;
            if (by) {
                by[l->site].site = l->site;
                by[l->site].bytes += l->size;
                by[l->site].blocks++;
            }
        }
    uint32_t n = nsites + 1;
    pthread_mutex_unlock(&lock);
    if (blocks == 0) {
        cs_log("leaks: none (every block the program allocated was freed)");
        free(by);
        return;
    }
    uint32_t used = 0;
    if (by) {
        for (uint32_t i = 0; i < n; i++)
            if (by[i].blocks)
                by[used++] = by[i];
        qsort(by, used, sizeof *by, by_bytes);
    }
    char total[32];
    cs_bytes_format(bytes, total, sizeof total);
    cs_log("leaks: %" PRIu64 " blocks, %s, never freed, from %" PRIu32
           " allocation sites (largest first)",
           blocks, total, used);
    for (uint32_t i = 0; i < used && i < LEAK_SITES_SHOWN; i++) {
        char sz[32];
        cs_bytes_format(by[i].bytes, sz, sizeof sz);
        char title[96];
        snprintf(title, sizeof title, "  %s in %" PRIu64 " block%s allocated at:", sz,
                 by[i].blocks, by[i].blocks == 1 ? "" : "s");
        cs_site_print(by[i].site, title);
    }
    if (used > LEAK_SITES_SHOWN)
        cs_log("leaks: %" PRIu32 " more allocation sites not shown", used - LEAK_SITES_SHOWN);
    free(by);
}

void cs_debug_exit_report(bool with_scopes)
{
    if (modes & CS_DEBUG_LEAKS)
        report_leaks();
    if (with_scopes)
        cs_scope_report();
}

/* ---------------------------------------------------------------- set-up */

int cs_debug_modes(void)
{
    return modes;
}

void cs_debug_turn_on(void)
{
    __atomic_store_n(&cs_debug_on, true, __ATOMIC_RELAXED);
}

void cs_debug_init(cs_cache *c, const cs_options *opts)
{
    cache = c;
    if (!c)
        return;
    modes = opts->debug;
    if (modes & CS_DEBUG_UAF_REPORT)
        modes |= CS_DEBUG_UAF;
    if (!modes)
        return;
    cs_quarantine_init(c, cs_size_resolve(&opts->quarantine, 0),
                       !(modes & CS_DEBUG_UAF_REPORT));
    cs_debug_turn_on();
}
