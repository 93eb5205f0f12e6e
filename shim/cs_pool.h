/* The physical pool of one heap: blocks carved out of arenas, large virtual reservations
 * whose pages are backed by chunks of physical memory where they are needed. Pure C: no CUDA
 * types and no I/O; the driver is reached through cs_vmm_ops, so the replay tool and the
 * tests drive the same code with a simulated device.
 *
 * An arena is one virtual reservation (twice the device's memory, at least what a block
 * needs) cut into spans, end to end: a hole (nothing mapped), free (mapped, in no block) or
 * used (a large block, or a small range). A large block (more than half the granularity) is
 * a used span of its size (CS_POOL_ALIGN bytes; the chunks mapped under it are whole
 * granules, the rest of the last one a free span); small blocks live in small ranges of one
 * granule cut into 32 pages, where a slab is a run of pages (the shortest whose unused tail
 * is at most an eighth of it) cut into equal slots of one size class. A freed block's span
 * turns free and joins the free spans beside it, so memory freed at one size serves the next
 * request of any size without a driver call: a block is carved out of the smallest free span
 * it fits (best fit). A free span remembers the fence of the work last done on its memory (an
 * epoch, as the cache counts them): memory freed while the GPU still works on it joins the
 * free space at once, and a block carved out of it is handed out with that epoch, for the
 * cache to order the block's next work after it (or, not ordered, is carved only once the
 * epoch completed). A small block freed busy goes back to its slab at once, its range keeping
 * the newest such epoch: a block from that range is ordered after it in the same way. Only
 * when none fits does the pool map memory: into the place that needs the least of it (a
 * window of free spans and holes), filling its holes with spare chunks first, then with new
 * ones, and, when the cache allows no new memory, with chunks moved from free spans elsewhere
 * (a move). A chunk is one physical allocation of the granularity times a power of two, mapped
 * whole: new memory comes in the hole's size in binary, so a mapping costs few handles. A
 * chunk moves only once every page of it is free. An unmap never waits for the GPU, so a
 * chunk whose work is still under way moves only for an ordered block: it is mapped at its new
 * place as well (the driver maps one physical allocation at several addresses), the block is
 * ordered after that work, and its old mapping, a busy span meanwhile, is unmapped once the
 * work completed (an old mapping). A chunk goes back to the driver only once its work
 * completed, after its old mappings: the pool waits for the device only to give back memory
 * whose work is still under way (a trim, a release of the cache). */
#ifndef CS_POOL_H
#define CS_POOL_H

#include <stdbool.h>
#include <stdint.h>

/* What a backend call returns (the pool's and the cache's backends alike). */
enum {
    CS_BE_OK = 0,
    CS_BE_OOM = 1,     /* the device is out of memory: recovery may help */
    CS_BE_ERROR = 2,   /* any other failure; the raw driver code is passed back */
    CS_BE_SHORT = 3,   /* pool: more new memory needed than allowed (the spare went meanwhile) */
};

/* The device's virtual memory calls. Each returns a CS_BE_* code (cs_cache.h) with the raw
 * driver code in *raw. All are called without the pool's lock or the cache's; unmap and
 * release may run under the pool's lock of old mappings, so neither may call into the pool. */
typedef struct cs_vmm_ops {
    /* Physical memory of `size` bytes (a multiple of the granularity). */
    int (*create)(void *dev, uint64_t size, uint64_t *handle, int *raw);
    int (*release)(void *dev, uint64_t handle, int *raw);
    /* A virtual range of `size` bytes aligned to the granularity, and its end. */
    int (*reserve)(void *dev, uint64_t size, uint64_t *va, int *raw);
    int (*unreserve)(void *dev, uint64_t va, uint64_t size, int *raw);
    /* Map a whole chunk at va; then make [va, va + size) readable and writable by every
     * device allowed to use the heap's memory. */
    int (*map)(void *dev, uint64_t va, uint64_t size, uint64_t handle, int *raw);
    int (*access)(void *dev, uint64_t va, uint64_t size, int *raw);
    int (*unmap)(void *dev, uint64_t va, uint64_t size, int *raw);
    /* Wait for all work on the device: before unmapping memory whose fence is not known to
     * have completed. */
    int (*sync)(void *dev, int *raw);
} cs_vmm_ops;

typedef struct cs_pool cs_pool;

/* Large blocks are carved at this alignment (cuMemAlloc's is 256 bytes). */
#define CS_POOL_ALIGN 512u

/* What the pool did, added up (for the statistics and the replay's cost estimate). */
typedef struct cs_pool_counts {
    uint64_t creates, releases, maps, unmaps, reserves;
    uint64_t carves;         /* blocks carved out of free spans: no driver call */
    uint64_t moves;          /* chunks moved from free spans to fill a hole elsewhere (one
                                whose work was under way mapped there while it stays mapped
                                where it was, until that work completed) */
    uint64_t spare;          /* bytes that can go back to the driver: unmapped chunks, and
                                mapped chunks every page of which is free */
    uint64_t free_mapped;    /* bytes of free spans (mapped, in no block) */
    uint64_t slab_free;      /* bytes of free slots in slabs */
} cs_pool_counts;

/* Has all work up to `epoch` completed? Never blocks (false when it cannot be known). */
typedef bool (*cs_pool_ready_fn)(void *arg, uint64_t epoch);

/* arena_bytes: the virtual size of an arena (twice the device's memory is plenty; a block
 * larger than it gets an arena of its own size). ready (may be NULL: every freed block is
 * then waited for, cs_pool_free) tells which epochs completed; it is called under the pool's
 * lock. */
cs_pool *cs_pool_create(const cs_vmm_ops *ops, void *dev, uint64_t granularity,
                        uint64_t arena_bytes, cs_pool_ready_fn ready, void *ready_arg);
/* Frees the pool's bookkeeping only (the driver may be gone). */
void cs_pool_destroy(cs_pool *p);

/* The largest block served from a slab: half the granularity. */
uint64_t cs_pool_slab_max(uint64_t granularity);

/* A block of `bytes` (the cache's block size: a size class up to cs_pool_slab_max, else a
 * multiple of CS_POOL_ALIGN). At most max_new bytes of new physical memory may be taken
 * from the driver: CS_BE_SHORT when more would be needed (the spare went meanwhile).
 * *created: bytes taken from the driver; *released: spare bytes given back to the driver to
 * make room (a block that needs new memory first trades spare chunks that fit nowhere).
 * *carved (may be NULL): the block was carved out of free memory (a free span, a slab's slot)
 * with no driver call at all. ordered: the block may take memory whose epoch has not completed
 * (a free span, a slot of a busy range, a chunk that moves busy); *epoch (may be NULL) is then
 * the newest such epoch (0: none), and the caller must order every stream's next work after it
 * before the block is used. Ordered, the pool also unmaps old mappings whose work completed
 * (the caller allows no ordered block while a stream capture runs). Not ordered, only memory
 * whose work completed is taken. */
int cs_pool_alloc(cs_pool *p, uint64_t bytes, uint64_t max_new, bool ordered, uint64_t *addr,
                  uint64_t *created, uint64_t *released, bool *carved, uint64_t *epoch,
                  int *raw);
/* A large block of `bytes` carved out of a free span, or false when none takes it (or the
 * host has no memory for the bookkeeping): never a driver call, so the caller may hold its
 * own locks. ordered and *epoch as for cs_pool_alloc. */
bool cs_pool_carve(cs_pool *p, uint64_t bytes, bool ordered, uint64_t *addr, uint64_t *epoch);
/* A block leaves the cache. keep: its memory stays in the pool, free (a move); else the
 * chunks that are then wholly free, their work done, go back to the driver. done: the work
 * before its free is known to have completed; else that work completes at `epoch`: a block
 * kept (with a ready function) joins the free space at once, remembering it (a small one's
 * slot in its range's epoch); otherwise the pool waits for the device first. *released: bytes
 * given back. */
int cs_pool_free(cs_pool *p, uint64_t addr, bool keep, bool done, uint64_t epoch,
                 uint64_t *released, int *raw);
/* The most new physical memory a block of `bytes` can ever take from the driver: a small block
 * may need a whole new small range (one granule). */
uint64_t cs_pool_most_new(const cs_pool *p, uint64_t bytes);
/* Does a free span of large blocks' zone (an arena's lower half, or anywhere for a block over
 * a quarter of an arena) take a large block of `bytes` as it is (no driver call)? ordered: as
 * for cs_pool_alloc. */
bool cs_pool_fits(cs_pool *p, uint64_t bytes, bool ordered);
/* The same, with a free span outside the zone too (where cs_pool_alloc goes when it may not
 * take new memory). */
bool cs_pool_fits_anywhere(cs_pool *p, uint64_t bytes, bool ordered);
/* New physical bytes a block of `bytes` would take from the driver now: with `move`, at the
 * least (free chunks moving into its holes where they can), else what its holes lack after
 * the spare chunks. ordered: as for cs_pool_alloc. */
uint64_t cs_pool_need(cs_pool *p, uint64_t bytes, bool move, bool ordered);
/* Give memory outside blocks back to the driver (unmapped chunks first, then mapped chunks
 * every page of which is free) until `bytes` are released or none is left: bytes released.
 * Free memory whose work is still under way goes last, after the pool waited for the
 * device, if it may wait (not while a stream capture runs: that would break it). */
uint64_t cs_pool_trim(cs_pool *p, uint64_t bytes, bool may_wait);
/* The context the pool's memory was made in is gone, with its work, but virtual memory
 * belongs to no context: unmap everything, free every reservation and release every chunk,
 * mapped or spare. The pool is then empty. Bytes released. */
uint64_t cs_pool_release_all(cs_pool *p);
/* The block that contains addr: its base and its size (a large block's span, a small block's
 * slot); size 0 where addr is in an arena but in no block (a free span, a hole, a slab's
 * tail, a page no slab has). False if addr is in none of the pool's arenas. */
bool cs_pool_find(cs_pool *p, uint64_t addr, uint64_t *base, uint64_t *size);
/* The chunks mapped under [addr, addr + size) (a block, cs_pool_find), in address order:
 * each(arg, va, size, handle) for each, with the pool's lock held, so that none is unmapped or
 * released meanwhile; `each` may make a driver call but must not call into the pool. False
 * when the range is not in one arena, not mapped end to end, or `each` returned false. */
typedef bool (*cs_pool_chunk_fn)(void *arg, uint64_t va, uint64_t size, uint64_t handle);
bool cs_pool_chunks(cs_pool *p, uint64_t addr, uint64_t size, cs_pool_chunk_fn each, void *arg);
/* The devices allowed to use the heap's memory changed (peer access): every mapped span gets
 * the access op again, and blocks being built meanwhile get it once more before they are
 * handed out. Returns 0, or the first failing CS_BE_* code. */
int cs_pool_regrant(cs_pool *p, int *raw);
void cs_pool_counts_get(cs_pool *p, cs_pool_counts *out);

#endif
