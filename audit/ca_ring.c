/* Records not yet formatted: the ring in TRACE.pending (see ca_ring.h). Writers reserve a
 * record's bytes with one compare-and-swap on the position put so far, copy the values, and
 * seal the record; the one consumer (the formatter, under its lock) reads whole records in
 * position order and hands their room back once their text is in the trace file. */
#include "ca_ring.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ca_sys.h"

static int g_fd = -1;
static char g_path[4200];
static ca_ring_head *g_head;   /* the header page */
static unsigned char *g_ring;  /* the ring, mapped twice in a row */
static size_t g_size;
_Static_assert((CA_RING_SIZE & (CA_RING_SIZE - 1)) == 0, "ring sizes are powers of two");
static size_t g_mask; /* g_size - 1: the sizes are powers of two (a division costs the writers) */
/* Each on a cache line of its own: the writers' (put), the consumer's (read, read_end), and
 * the one the consumer writes once a batch for the writers to read (taken). */
static struct {
    _Alignas(64) uint64_t put;   /* atomic: bytes reserved since the start */
    _Alignas(64) uint64_t read;  /* the consumer's cursor: records read up to it */
    uint64_t read_end;           /* the consumer's: put as it last read it */
    _Alignas(64) uint64_t taken; /* atomic: bytes whose text is in the trace file: room again */
    _Alignas(64) char end;
} g_pos;

static size_t raw_len(unsigned nargs, unsigned nout, unsigned nstack, unsigned nstr)
{
    size_t n = sizeof(ca_raw_head) + 8u * (nargs + nout + nstack) + nstr + 1;
    return (n + 7) & ~(size_t)7;
}

/* ---- the writing process ----------------------------------------------------------------- */

/* The file at the largest of the sizes that fits (a file size limit, a nearly full disk:
 * a smaller ring, formatted more often); its ring's size, or 0 and *err. */
static size_t allocate(int fd, int *err)
{
    static const size_t sizes[] = {CA_RING_SIZE, CA_RING_SIZE / 8, CA_RING_SIZE / 64};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *err = ca_sys_allocate(fd, 0, (off_t)(CA_RING_HEAD_SIZE + sizes[i]));
        if (*err == 0)
            return sizes[i];
        if (*err != EFBIG && *err != ENOSPC)
            break;
    }
    return 0;
}

int ca_ring_create(const char *path, int format, int pid, uint64_t t_origin)
{
    size_t size = 0;
    /* Kept absolute, for ca_ring_remove: the program may change its working directory
     * before it ends (and another program's file of that name may be in the new one). */
    size_t dir = 0;
    if (path[0] != '/') {
        if (!getcwd(g_path, sizeof g_path))
            return errno;
        dir = strlen(g_path);
        g_path[dir++] = '/';
    }
    if (dir + strlen(path) >= sizeof g_path)
        return ENAMETOOLONG;
    strcpy(g_path + dir, path);
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return errno;
    int err = 0;
    unsigned char *ring = MAP_FAILED;
    void *head = MAP_FAILED;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0)
        err = errno;
    if (!err)
        size = allocate(fd, &err);
    if (!err) {
        head = mmap(NULL, CA_RING_HEAD_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        ring = mmap(NULL, 2 * size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (head == MAP_FAILED || ring == MAP_FAILED)
            err = errno;
    }
    for (int i = 0; i < 2 && !err; i++)
        if (mmap(ring + i * size, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
                 CA_RING_HEAD_SIZE) == MAP_FAILED)
            err = errno;
    if (!err)
        ca_sys_populate(ring, size); /* the pages now, not at the first record on each */
    if (err) {
        if (ring != MAP_FAILED && size)
            munmap(ring, 2 * size);
        if (head != MAP_FAILED)
            munmap(head, CA_RING_HEAD_SIZE);
        unlink(path);
        close(fd);
        return err;
    }
    ca_ring_head *h = head;
    memcpy(h->magic, CA_RING_MAGIC, sizeof CA_RING_MAGIC - 1);
    h->head_size = CA_RING_HEAD_SIZE;
    h->fn_count = CA_FN_COUNT;
    h->ring_size = size;
    h->format = format;
    h->pid = pid;
    h->t_origin = t_origin;
    g_fd = fd;
    g_head = h;
    g_mask = size - 1;
    g_size = size; /* the positions are 0: at the start, and after fork (ca_ring_fork_child) */
    __atomic_store_n(&g_ring, ring, __ATOMIC_RELEASE);
    return 0;
}

__attribute__((hot)) void ca_ring_prefetch(void)
{
    /* Acquire: g_size, written before the ring is published, is read below (a plain load
     * that may otherwise come first, and find 0). */
    unsigned char *ring = __atomic_load_n(&g_ring, __ATOMIC_ACQUIRE);
    if (!ring)
        return;
    const unsigned char *at = ring + (__atomic_load_n(&g_pos.put, __ATOMIC_RELAXED) & g_mask);
    __builtin_prefetch(at, 1);
    __builtin_prefetch(at + 64, 1);
    __builtin_prefetch(at + 128, 1);
    __builtin_prefetch(&g_pos.taken, 0);
}

/* len bytes of the ring for the caller alone: its head with the length set, or NULL when
 * there is no room now; *pos its position, *used the bytes in use with it. (A reader reads
 * the length only once the record is sealed: until this store, the field holds what an
 * earlier lap left, and a signal, or the process's death, can come between the two.) */
static ca_raw_head *reserve(size_t len, uint64_t *pos, size_t *used)
{
    uint64_t p = __atomic_load_n(&g_pos.put, __ATOMIC_RELAXED);
    do {
        *used = (size_t)(p + len - __atomic_load_n(&g_pos.taken, __ATOMIC_ACQUIRE));
        if (*used > g_size)
            return NULL;
    } while (!__atomic_compare_exchange_n(&g_pos.put, &p, p + len, 1, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    ca_raw_head *h = (ca_raw_head *)(g_ring + (p & g_mask));
    __atomic_store_n(&h->len, (uint32_t)len, __ATOMIC_RELAXED);
    *pos = p;
    return h;
}

size_t ca_ring_put_text(const char *text, size_t n, long tid)
{
    uint64_t pos;
    size_t used;
    ca_raw_head *h = reserve(raw_len(0, 0, 0, (unsigned)n), &pos, &used);
    if (!h)
        return 0;
    h->tid = (uint32_t)tid;
    h->fn = CA_RAW_TEXT;
    h->bytes = (int64_t)n;
    memcpy(h + 1, text, n);
    ((char *)(h + 1))[n] = '\0';
    __atomic_store_n(&h->seal, ~pos, __ATOMIC_RELEASE);
    return used;
}

/* Not vectorized (nor unrolled, below): the few words here gain nothing from it, and the
 * code would be three times the size, read from memory again at each call of a real program.
 * (gcc's attribute; clang builds only the fuzzers.) */
#if defined(__clang__)
#define NOT_VECTORIZED
#else
#define NOT_VECTORIZED __attribute__((optimize("no-tree-vectorize")))
#endif
__attribute__((hot)) NOT_VECTORIZED size_t ca_ring_put(const ca_rec *r, long tid)
{
    unsigned nargs = r->nargs, nstr = r->nstr;
    uint64_t pos;
    size_t used;
    ca_raw_head *h = reserve(raw_len(nargs, r->nout, r->nstack, nstr), &pos, &used);
    if (!h)
        return 0;
    /* The values, then the seal. */
    h->tid = (uint32_t)tid;
    h->t0 = r->t0;
    h->t1 = r->t1;
    h->bytes = r->bytes;
    h->result = r->result;
    h->fn = r->fn;
    h->lib = r->lib;
    h->from = r->from;
    h->nout = r->nout;
    h->nstack = r->nstack;
    h->nargs = (uint8_t)nargs;
    h->nstr = (uint8_t)nstr;
    memcpy(h->out_idx, r->out_idx, sizeof h->out_idx);
    /* Loops, not memcpy: the compiler would make a copy of unknown length a rep movs, slow
     * to start for the few words here. */
    uint64_t *v = (uint64_t *)(h + 1);
#pragma GCC unroll 1
    for (unsigned i = 0; i < nargs; i++)
        *v++ = r->arg[i];
#pragma GCC unroll 1
    for (unsigned i = 0; i < r->nout; i++)
        *v++ = r->out[i];
#pragma GCC unroll 1
    for (unsigned i = 0; i < r->nstack; i++)
        *v++ = r->stack[i];
    if (nstr)
        memcpy(v, r->str, nstr);
    ((char *)v)[nstr] = '\0';
    __atomic_store_n(&h->seal, ~pos, __ATOMIC_RELEASE);
    return used;
}

__attribute__((hot)) size_t ca_ring_size(void)
{
    return g_size;
}

size_t ca_ring_used(void)
{
    return (size_t)(__atomic_load_n(&g_pos.put, __ATOMIC_RELAXED) -
                    __atomic_load_n(&g_pos.taken, __ATOMIC_RELAXED));
}

int ca_ring_take(ca_rec *r, long *tid, const char **text, int skip, unsigned *skipped)
{
    uint64_t pos = g_pos.read;
    /* put read again only when the records seen before are taken: its line is the
     * writers'. */
    if (pos == g_pos.read_end)
        g_pos.read_end = __atomic_load_n(&g_pos.put, __ATOMIC_ACQUIRE);
    if (pos == g_pos.read_end || !ca_ring_read(g_ring, g_size, &pos, skip, r, tid, text, skipped))
        return 0;
    g_pos.read = pos; /* its room stays taken until its text is in the file (ca_ring_consumed) */
    return 1;
}

void ca_ring_consumed(uint64_t text_end, uint64_t lost, const char *error)
{
    ca_ring_head *h = g_head;
    if (!h)
        return;
    uint64_t gen = h->done_gen;
    ca_ring_done *d = &h->done[(gen + 1) & 1];
    d->raw_done = g_pos.read;
    d->text_end = text_end;
    d->lost = lost;
    if (error && error[0] && !h->error[0])
        strncpy(h->error, error, sizeof h->error - 1);
    /* The other slot whole before it becomes the current one; the room of the records it
     * covers back to the writers after that: a process killed now leaves either pair whole,
     * each with its records still in the ring. */
    __atomic_store_n(&h->done_gen, gen + 1, __ATOMIC_RELEASE);
    __atomic_store_n(&g_pos.taken, g_pos.read, __ATOMIC_RELEASE);
}

void ca_ring_clock(const ca_clock_state *clock)
{
    ca_ring_head *h = g_head;
    if (!h)
        return;
    uint64_t gen = h->clock_gen;
    h->clock[(gen + 1) & 1] = *clock;
    __atomic_store_n(&h->clock_gen, gen + 1, __ATOMIC_RELEASE);
}

void ca_ring_remove(void)
{
    if (g_fd < 0)
        return;
    unlink(g_path);
    close(g_fd); /* the lock with it; the mappings stay (another thread may still read) */
    g_fd = -1;
}

void ca_ring_fork_child(void)
{
    unsigned char *ring = g_ring;
    __atomic_store_n(&g_ring, NULL, __ATOMIC_RELEASE);
    if (ring)
        munmap(ring, 2 * g_size);
    if (g_head)
        munmap(g_head, CA_RING_HEAD_SIZE);
    g_head = NULL;
    /* The child's reference to the open file goes: the parent alone holds its lock. */
    if (g_fd >= 0)
        close(g_fd);
    g_fd = -1;
    g_pos.put = g_pos.read = g_pos.read_end = g_pos.taken = 0;
}

/* ---- reading ------------------------------------------------------------------------------ */

static int whole(const unsigned char *ring, size_t size, uint64_t pos)
{
    const ca_raw_head *h = (const ca_raw_head *)(ring + pos % size);
    return __atomic_load_n(&h->seal, __ATOMIC_ACQUIRE) == ~pos;
}

int ca_ring_read(const unsigned char *ring, size_t size, uint64_t *pos, int skip, ca_rec *r,
                 long *tid, const char **text, unsigned *skipped)
{
    uint64_t p = *pos;
    if (p % 8) /* records are whole multiples of 8 bytes: a header that says otherwise lies */
        return 0;
    const ca_raw_head *h = (const ca_raw_head *)(ring + p % size);
    if (!whole(ring, size, p)) {
        /* Passed over: to the first whole record after it, within the longest a record can
         * be. Not to where its length says: the length may not be written yet (its thread
         * stopped right after taking its room: killed, or in a signal handler whose traced
         * call comes next in the ring, while the process ends), and what the field holds then
         * is what an earlier lap left there, which may point past whole records of this lap.
         * A seal holds its own position: nothing an earlier lap left passes for one (inside
         * the room of the record passed over, only a value of its own that happened to be
         * the complement of its place could). */
        uint64_t next = 0;
        if (!skip)
            return 0;
        for (uint64_t q = p + 8; !next && q <= p + CA_RAW_MAX && q - p < size; q += 8)
            if (whole(ring, size, q))
                next = q;
        if (!next)
            return 0;
        p = next;
        h = (const ca_raw_head *)(ring + p % size);
        ++*skipped;
    }
    /* What the writer wrote is checked again here: a file a process left may hold anything. */
    if (h->fn == CA_RAW_TEXT) {
        if (h->bytes <= 0 || h->bytes > CA_RAW_TEXT_MAX ||
            h->len != raw_len(0, 0, 0, (unsigned)h->bytes))
            return 0;
        r->fn = CA_RAW_TEXT;
        r->bytes = h->bytes;
        *text = (const char *)(h + 1);
        *tid = (long)h->tid;
        *pos = p + h->len;
        return 1;
    }
    if (h->fn >= CA_FN_COUNT || h->nargs != ca_desc(h->fn)->nparams || h->nout > CA_MAX_OUTS ||
        h->nstack > CA_STACK_MAX || h->nstr > CA_STR_MAX || h->len > size ||
        h->len != raw_len(h->nargs, h->nout, h->nstack, h->nstr))
        return 0;
    r->fn = h->fn;
    r->lib = h->lib;
    r->from = h->from;
    r->nout = h->nout;
    r->nargs = h->nargs;
    r->nstack = h->nstack;
    r->nstr = h->nstr;
    memcpy(r->out_idx, h->out_idx, sizeof r->out_idx);
    const ca_param *params = ca_desc(h->fn)->params;
    for (unsigned i = 0; i < r->nout; i++) /* the formatter prints only out-parameters */
        if (r->out_idx[i] >= h->nargs || !params[r->out_idx[i]].out_kind)
            return 0;
    r->result = h->result;
    r->t0 = h->t0;
    r->t1 = h->t1;
    r->bytes = h->bytes;
    const uint64_t *v = (const uint64_t *)(h + 1);
    memcpy(r->arg, v, 8u * h->nargs);
    v += h->nargs;
    memcpy(r->out, v, 8u * h->nout);
    v += h->nout;
    memcpy(r->stack, v, 8u * h->nstack);
    v += h->nstack;
    memcpy(r->str, v, h->nstr);
    r->str[h->nstr] = '\0';
    *tid = (long)h->tid;
    *pos = p + h->len;
    return 1;
}
