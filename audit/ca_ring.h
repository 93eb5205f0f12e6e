/* Records not yet formatted (layer 3, under ca_trace.c and ca_drain.c; see ca_desc.h): a
 * ring of raw records in a file of its own beside the trace, TRACE.pending, mapped shared.
 *
 * The traced thread only copies its record's values into the ring (ca_ring_put); the
 * formatter (ca_drain.c) turns them into the trace's text later, off the program's threads.
 * The ring's pages are the file's page cache, so what a thread put survives the process,
 * SIGKILL included: the tools format what a killed program left (ca_recover.c). A process
 * that ends otherwise formats the rest itself and removes the file.
 *
 * The file: one page of header (ca_ring_head), then the ring, mapped twice in a row so that
 * a record that wraps is still one range of memory. A record is a ca_raw_head and its
 * values, a multiple of 8 bytes; it is whole once its seal holds ~(its position), positions
 * counting bytes put since the start (never wrapped), so a record of an earlier lap never
 * passes for one of this lap. */
#ifndef CA_RING_H
#define CA_RING_H

#include <stddef.h>
#include <stdint.h>

#include "ca_clock.h"
#include "ca_rec.h"

/* -2: records may hold ticks (the header's clock says). A tool of a build before it would
 * take them for ns: it refuses the file instead. -1 files (times in ns, the clock's place
 * zero) are still read. */
#define CA_RING_MAGIC "cacheshim-pending-2\n"
#define CA_RING_MAGIC_1 "cacheshim-pending-1\n"
#define CA_RING_HEAD_SIZE 4096
/* The ring's size (an eighth or a sixty-fourth of it where the file cannot be that large):
 * about 80,000 records, a fifth of a second of a PyTorch training loop
 * that calls the driver 400,000 times a second. */
#ifndef CA_RING_SIZE /* the fuzzer's build makes it small */
#define CA_RING_SIZE ((size_t)8 << 20)
#endif
/* A record of text (fn CA_RAW_TEXT, bytes its length, at most CA_RAW_TEXT_MAX): lines the
 * formatter copies as they are. JSON Lines with call sites: the lines describing the objects
 * of a call's stack met for the first time, put by the calling thread just before the call's
 * record, so that what a killed process leaves in the ring describes them too. */
#define CA_RAW_TEXT 0xffffu
#define CA_RAW_TEXT_MAX 4096
/* The longest record: the head, every value, the string with its 0 byte, rounded up; or a
 * text's. */
#define CA_RAW_MAX \
    (sizeof(ca_raw_head) + 8 * (CA_MAX_PARAMS + CA_MAX_OUTS + CA_STACK_MAX) + CA_STR_MAX + 8 + \
     CA_RAW_TEXT_MAX)
/* Suffix of the pending file's name. */
#define CA_RING_SUFFIX ".pending"

/* What the formatter has written so far: the ring position it has formatted up to, the
 * trace file's length after that text, and the calls lost to write errors. Kept in two
 * slots; done_gen's parity names the current one, so that a process killed while the
 * formatter updates it leaves the previous pair whole. */
typedef struct {
    uint64_t raw_done;
    uint64_t text_end;
    uint64_t lost;
} ca_ring_done;

typedef struct {
    char magic[24];        /* CA_RING_MAGIC, NUL-padded */
    uint32_t head_size;    /* CA_RING_HEAD_SIZE */
    uint32_t fn_count;     /* CA_FN_COUNT: the function tables the records index */
    uint64_t ring_size;
    int32_t format;        /* CS_TRACE_* */
    int32_t pid;
    uint64_t t_origin;     /* ns: the times printed are relative to it */
    uint64_t done_gen;
    ca_ring_done done[2];
    char error[160];       /* the write error the lost calls met ("" while none) */
    /* What makes the records' ticks ns (ca_clock.h), in two slots as done is: clock_gen's
     * parity names the current one. All zero: times in ns (a -1 file's are taken as zero). */
    uint64_t clock_gen;
    ca_clock_state clock[2];
} ca_ring_head;
_Static_assert(sizeof(ca_ring_head) <= CA_RING_HEAD_SIZE, "the header fits its page");

typedef struct {
    uint64_t seal;         /* ~position once whole */
    uint32_t len;          /* bytes of the whole record, a multiple of 8 */
    uint32_t tid;
    uint64_t t0, t1;
    int64_t bytes;
    int32_t result;
    uint16_t fn;
    uint8_t lib, from, nout, nstack, nargs, nstr; /* nstr: bytes of str, its 0 excluded */
    uint8_t out_idx[CA_MAX_OUTS];
    /* then: arg[nargs], out[nout], stack[nstack] (uint64_t each), str and its 0 byte */
} ca_raw_head;

/* ---- the writing process -------------------------------------------------------------- */

/* Creates PATH (O_EXCL, mode 0600) with its header, at full size (so a full disk is an
 * error now, not a SIGBUS later), mapped; holds an exclusive flock on it while the process
 * lives, which tells the tools that its owner still writes. 0, or an errno. */
int ca_ring_create(const char *path, int format, int pid, uint64_t t_origin);
/* A hint while a call runs: what ca_ring_put will write and read, fetched into the cache
 * (the memory a record goes to was last read by the formatter's thread, on another core). */
void ca_ring_prefetch(void);
/* r (of thread tid) into the ring: the bytes in use with it, or 0 when the ring has no room
 * for it now. Any thread, no lock; async-signal-safe. */
size_t ca_ring_put(const ca_rec *r, long tid);
/* The same for n bytes of text (n at most CA_RAW_TEXT_MAX). */
size_t ca_ring_put_text(const char *text, size_t n, long tid);
/* The ring's size; bytes put whose text is not yet in the file. */
size_t ca_ring_size(void);
size_t ca_ring_used(void);
/* The consumer (one at a time, under the formatter's lock): the next whole record, decoded
 * into *r (*tid its thread, *text a text's bytes); 1, or 0 when there is none yet. skip: see
 * ca_ring_read. */
int ca_ring_take(ca_rec *r, long *tid, const char **text, int skip, unsigned *skipped);
/* The records taken so far are in the file, whose text now ends at text_end: noted in the
 * header, and their room given back. */
void ca_ring_consumed(uint64_t text_end, uint64_t lost, const char *error);
/* The clock's state, for the records still in the ring (the tools format them with it). */
void ca_ring_clock(const ca_clock_state *clock);
/* Everything put is formatted: the file is removed (the process ends). */
void ca_ring_remove(void);
/* The child of fork: the parent's ring is the parent's (unmapped here, its lock released). */
void ca_ring_fork_child(void);

/* ---- reading a file a process left (ca_recover.c) ------------------------------------- */

/* The record at position *pos of a ring of size bytes whose memory holds it twice in a
 * row (mapped twice, or read twice), decoded into *r and *tid: 1, and *pos moved past it
 * (a record of text: r->fn CA_RAW_TEXT, r->bytes its length, *text its bytes in ring);
 * 0 when no whole record of that position is there. skip: a record never sealed (its thread
 * stopped in the middle of its put, or killed) is passed over, and counted in *skipped, when
 * a whole record follows it within CA_RAW_MAX bytes (to the first one: its length is not
 * believed, as it may not be written yet). */
int ca_ring_read(const unsigned char *ring, size_t size, uint64_t *pos, int skip, ca_rec *r,
                 long *tid, const char **text, unsigned *skipped);

#endif
