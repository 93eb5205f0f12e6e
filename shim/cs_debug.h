/* The debug layer: CACHESHIM_DEBUG (use after free, bad frees, leaks) and scopes, between the
 * entry points (cs_entry.c) and the cache. Off, it costs the entry points one predictable
 * branch each (cs_debug_active); on, every allocation and free of a cached block passes
 * through here.
 *
 *   cs_debug.c       call sites (backtraces), the blocks the program holds, bad frees, leaks
 *   cs_quarantine.c  freed blocks filled with a pattern and held back, their checks
 *   cs_scope.c       scopes (cacheshim_scope_begin/end): statistics per region of a program
 *
 * The cache core knows nothing of this layer: a quarantined block is, to the cache, a block
 * the program still holds; it is freed into the cache when it leaves the quarantine. */
#ifndef CS_DEBUG_H
#define CS_DEBUG_H

#include <stdbool.h>
#include <stdint.h>

#include "cs_cache.h"
#include "cs_options.h"

/* Any debug mode, or a scope begun at least once. Set before the entry points can see it
 * (cs_debug_init runs in the shim's init) or by the first cacheshim_scope_begin. */
extern bool cs_debug_on;

static inline bool cs_debug_active(void)
{
    return __builtin_expect(__atomic_load_n(&cs_debug_on, __ATOMIC_RELAXED), 0);
}

/* From the shim's init, after the cache was made (cache NULL: disabled, the layer stays off). */
void cs_debug_init(cs_cache *cache, const cs_options *opts);

/* After cs_cache_alloc answered `first` for `size` bytes in heap h: records the block; on
 * CS_OOM, with blocks in the quarantine, checks and frees them and tries once more. Returns
 * the final answer (*addr, *raw and *failure as cs_cache_alloc sets them). */
cs_result cs_debug_alloc(cs_cache *cache, cs_heap *h, const void *ctx, uint64_t size,
                         uint64_t *addr, int *raw, cs_alloc_failure *failure, cs_result first);

/* Instead of cs_cache_free: reports a double free with its call sites (CS_NOT_IN_USE),
 * quarantines the block (CS_OK) or frees it into the cache. CS_FOREIGN: the caller asks the
 * driver and tells cs_debug_foreign_free what it answered. */
cs_result cs_debug_free(cs_cache *cache, uint64_t addr);
void cs_debug_foreign_free(uint64_t addr, int driver_result);

/* The context and its memory are gone: its quarantined blocks and records go too. */
void cs_debug_context_gone(const void *ctx);
/* From the shim's destructor (no driver calls): the leak report (CACHESHIM_DEBUG=leaks) and
 * the scopes' lines (with_scopes: CACHESHIM_STATS=1). */
void cs_debug_exit_report(bool with_scopes);

/* ---- between the layer's files (cs_debug.c) -------------------------------------------- */

/* A call site: the return addresses of the stack where it was taken, interned. 0 is none. */
typedef uint32_t cs_site;
/* The calling stack, when a CACHESHIM_DEBUG mode is on (else 0). */
cs_site cs_site_here(void);
/* The site as lines "    #0 0x... func+0x1a (lib.so+0x1234)" through cs_log, after a
 * heading line `title` ("  allocated at:"). Frames inside the shim are left out. */
void cs_site_print(cs_site site, const char *title);

/* The debug mode bits (CS_DEBUG_*) and the quarantine's size. */
int cs_debug_modes(void);

/* Fork: the layer's lock held across it; the child forgets the parent's blocks. Called by
 * cs_shim_before_fork and its pair (cs_state.c), the one set of fork handlers, which the
 * program's fork runs whether the shim is preloaded or an audit module. */
void cs_debug_before_fork(void);
void cs_debug_after_fork_parent(void);
void cs_debug_after_fork_child(void);

/* ---- the quarantine (cs_quarantine.c) --------------------------------------------------- */

typedef struct cs_quarantined {
    uint64_t addr, size;       /* the block: its base and all its bytes */
    int device;
    const void *ctx;           /* its context (the heap's key) */
    cs_site alloc_site, free_site;
    struct cs_quarantined *next;
    /* While taken out to be checked (the quarantine's lock drops for the read-back): on the
     * list of blocks leaving, where a second free still finds it. */
    struct cs_quarantined *leaving_prev, *leaving_next;
} cs_quarantined;

void cs_quarantine_init(cs_cache *cache, uint64_t limit, bool abort_on_change);
/* Fork, as cs_debug_before_fork and its pair. */
void cs_quarantine_before_fork(void);
void cs_quarantine_after_fork_parent(void);
void cs_quarantine_after_fork_child(void);
/* Fills the block (ordered after every work issued before its free) and holds it: true. False
 * when it cannot be (no driver context, a capture running, out of host memory): the caller
 * frees it into the cache. */
bool cs_quarantine_add(const cs_quarantined *block);
/* Is addr a quarantined block? Then its sites, for a double free's report. */
bool cs_quarantine_holds(uint64_t addr, cs_site *alloc_site, cs_site *free_site, uint64_t *size);
/* Checks and frees every quarantined block: true when any were. */
bool cs_quarantine_drain(void);
/* Checks every quarantined block after synchronizing its context, keeping them; returns the
 * number of blocks found changed (reported; aborts unless uaf-report). final: at exit, and
 * nothing is quarantined after. */
int cs_quarantine_check(bool final);
void cs_quarantine_context_gone(const void *ctx);

/* ---- scopes (cs_scope.c) ----------------------------------------------------------------- */

typedef struct cs_scope_frame cs_scope_frame;
/* The calling thread's innermost open scope, with a reference for the block that keeps it;
 * NULL when none. */
cs_scope_frame *cs_scope_charge(uint64_t size);
/* A block charged to frame is freed (or forgotten): its bytes leave the open scopes. */
void cs_scope_discharge(cs_scope_frame *frame, uint64_t size, bool freed);
/* Scopes' lines for the exit statistics. */
void cs_scope_report(void);
/* Scope calls may be made before any allocation: the layer is then turned on. */
void cs_debug_turn_on(void);

#endif
