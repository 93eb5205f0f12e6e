/* Scopes (cacheshim_scope_begin/end in cacheshim.h): a program marks a region of its own code,
 * per thread and nestable, and gets what the region allocated, its peak and what it still
 * held at its end. A block counts in its thread's open scopes when it is allocated, and
 * leaves those still open when it is freed, by any thread. An open scope is a frame; a block
 * keeps a reference to its innermost frame, a frame to its parent, so a frame lives while a
 * block or an inner frame needs it. Statistics add up per name for the exit report. */
#include "cs_debug.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cs_shim.h"

#define NAME_MAX_LEN 64
#define NAMES_MAX 256

typedef struct {
    char name[NAME_MAX_LEN];
    uint64_t entries, allocs, allocated, peak, held_at_end, frees, freed, released;
} scope_name;

struct cs_scope_frame {
    scope_name *name;
    cs_scope_frame *parent;
    unsigned flags;
    int refs;                 /* open (1) + blocks charged to it + inner frames */
    bool ended;
    uint64_t allocs, allocated, held, peak, frees, freed;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static scope_name names[NAMES_MAX];
static int nnames;
static bool names_full_said;
static _Thread_local cs_scope_frame *current;

/* With the lock held. */
static void unref(cs_scope_frame *f)
{
    while (f && --f->refs == 0) {
        cs_scope_frame *parent = f->parent;
        free(f);
        f = parent;
    }
}

/* With the lock held: the name's record, made on first use; NULL when the table is full. */
static scope_name *name_rec(const char *name)
{
    char key[NAME_MAX_LEN];
    snprintf(key, sizeof key, "%s", name ? name : "(unnamed)");
    for (int i = 0; i < nnames; i++)
        if (!strcmp(names[i].name, key))
            return &names[i];
    if (nnames == NAMES_MAX)
        return NULL;
    scope_name *n = &names[nnames++];
    memcpy(n->name, key, sizeof key);
    return n;
}

cs_scope_frame *cs_scope_charge(uint64_t size)
{
    cs_scope_frame *f = current;
    if (!f)
        return NULL;
    pthread_mutex_lock(&lock);
    f->refs++;
    for (cs_scope_frame *s = f; s; s = s->parent) {
        s->allocs++;
        s->allocated += size;
        s->held += size;
        if (s->held > s->peak)
            s->peak = s->held;
    }
    pthread_mutex_unlock(&lock);
    return f;
}

void cs_scope_discharge(cs_scope_frame *f, uint64_t size, bool freed)
{
    if (!f)
        return;
    pthread_mutex_lock(&lock);
    for (cs_scope_frame *s = f; s; s = s->parent)
        if (!s->ended) {
            s->held -= size;
            s->frees += freed;
            s->freed += freed ? size : 0;
        }
    unref(f);
    pthread_mutex_unlock(&lock);
}

/* ---------------------------------------------------------------- public API */

CS_EXPORT int cacheshim_scope_begin(const char *name, unsigned flags)
{
    cs_shim *s = cs_shim_get();
    if (s->disabled || !s->cache)
        return -1;
    cs_scope_frame *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    pthread_mutex_lock(&lock);
    f->name = name_rec(name);
    bool say = !f->name && !names_full_said;
    names_full_said |= say;
    f->parent = current;
    if (f->parent)
        f->parent->refs++;
    f->flags = flags;
    f->refs = 1;
    pthread_mutex_unlock(&lock);
    if (say)
        cs_log("scope '%s': more than %d scope names; its statistics are returned by "
               "cacheshim_scope_end but not kept for the exit report (said once)",
               name ? name : "(unnamed)", NAMES_MAX);
    current = f;
    cs_debug_turn_on();
    return 0;
}

CS_EXPORT int cacheshim_scope_end(cacheshim_scope_stats *out, size_t size)
{
    cs_shim *s = cs_shim_get();
    cs_scope_frame *f = current;
    if (!f)
        return -1;
    uint64_t released = 0;
    if (f->flags & CACHESHIM_SCOPE_RELEASE) {
        /* What it freed is idle in the cache (or quarantined: checked and freed first). */
        if (cs_debug_modes() & CS_DEBUG_UAF)
            cs_quarantine_drain();
        released = cs_cache_trim(s->cache);
    }
    cacheshim_scope_stats st;
    pthread_mutex_lock(&lock);
    st = (cacheshim_scope_stats){
        .allocs = f->allocs,
        .bytes_allocated = f->allocated,
        .peak = f->peak,
        .held_at_end = f->held,
        .frees = f->frees,
        .bytes_freed = f->freed,
        .released = released,
    };
    scope_name *n = f->name;
    if (n) {
        n->entries++;
        n->allocs += st.allocs;
        n->allocated += st.bytes_allocated;
        n->peak = n->peak > st.peak ? n->peak : st.peak;
        n->held_at_end = st.held_at_end;
        n->frees += st.frees;
        n->freed += st.bytes_freed;
        n->released += released;
    }
    f->ended = true;
    current = f->parent;
    unref(f);
    pthread_mutex_unlock(&lock);
    if (out)
        memcpy(out, &st, size < sizeof st ? size : sizeof st);
    return 0;
}

/* ---------------------------------------------------------------- report */

void cs_scope_report(void)
{
    pthread_mutex_lock(&lock);
    int n = nnames;
    pthread_mutex_unlock(&lock);
    for (int i = 0; i < n; i++) {
        scope_name c;
        pthread_mutex_lock(&lock);
        c = names[i];
        pthread_mutex_unlock(&lock);
        char alloc[32], peak[32], held[32], rel[32];
        cs_bytes_format(c.allocated, alloc, sizeof alloc);
        cs_bytes_format(c.peak, peak, sizeof peak);
        cs_bytes_format(c.held_at_end, held, sizeof held);
        cs_bytes_format(c.released, rel, sizeof rel);
        cs_log("scope %s: %" PRIu64 " times, %" PRIu64 " allocations, %s allocated, peak %s, "
               "%s held at its last end, %s given back",
               c.name, c.entries, c.allocs, alloc, peak, held, rel);
    }
}
