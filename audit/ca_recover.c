/* The calls a killed traced process left in its ring (TRACE.pending) formatted into its
 * trace, as the process's formatter (ca_drain.c) would have: from the position the header
 * says is done, appended where the header says the text ends. The pending file's flock
 * tells whether its process still lives (the kernel drops the lock when the process dies,
 * SIGKILL included). */
#include "ca_recover.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ca_format.h"
#include "ca_ring.h"
#include "cs_options.h"

static const char g_perfetto_head[] = CA_PERFETTO_HEAD;

typedef struct {
    int fd;
    uint64_t off;
    int err;
} out_file;

static void put(out_file *o, const char *p, size_t n)
{
    while (n > 0 && !o->err) {
        ssize_t w = pwrite(o->fd, p, n, (off_t)o->off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            o->err = w < 0 ? errno : EIO;
            break;
        }
        o->off += (uint64_t)w;
        p += w;
        n -= (size_t)w;
    }
}

static int fail(char *msg, size_t cap, const char *pending, const char *what, int err)
{
    snprintf(msg, cap, "cannot finish the trace from '%s': %s%s%s", pending, what,
             err ? ": " : "", err ? strerror(err) : "");
    return CA_RECOVER_ERROR;
}

/* The header, checked: this version's, with a ring of a size it makes; its error text ended
 * and made fit for a JSON string (it goes into the note as it is). */
static int read_head(int fd, ca_ring_head *h)
{
    if (pread(fd, h, sizeof *h, 0) != (ssize_t)sizeof *h)
        return 0;
    h->error[sizeof h->error - 1] = '\0';
    for (char *c = h->error; *c; c++)
        if (*c < 0x20 || *c > 0x7e || *c == '"' || *c == '\\')
            *c = '?';
    int size_ok = 0;
    for (size_t s = CA_RING_SIZE; s >= CA_RING_SIZE / 64; s /= 8)
        size_ok |= h->ring_size == s;
    int v1 = memcmp(h->magic, CA_RING_MAGIC_1, sizeof CA_RING_MAGIC_1 - 1) == 0;
    if (v1) /* times in ns: whatever the clock's place holds */
        memset(h->clock, 0, sizeof h->clock);
    return (v1 || memcmp(h->magic, CA_RING_MAGIC, sizeof CA_RING_MAGIC - 1) == 0) &&
           h->head_size == CA_RING_HEAD_SIZE && h->fn_count == CA_FN_COUNT && size_ok &&
           (h->format == CS_TRACE_TEXT || h->format == CS_TRACE_JSONL ||
            h->format == CS_TRACE_PERFETTO);
}

/* The ring twice in a row, as the writer mapped it. */
static unsigned char *read_ring(int fd, size_t size)
{
    unsigned char *ring = malloc(2 * size);
    if (!ring || pread(fd, ring, size, CA_RING_HEAD_SIZE) != (ssize_t)size) {
        free(ring);
        return NULL;
    }
    memcpy(ring + size, ring, size);
    return ring;
}

/* The records from done->raw_done on, formatted at the end of the text; how many. */
static size_t format_rest(const ca_ring_head *h, const ca_ring_done *done,
                          const unsigned char *ring, out_file *o, unsigned *skipped)
{
    ca_fmt_ctx ctx = {.format = h->format, .pid = h->pid, .t_origin = h->t_origin};
    ca_fmt_ids ids = {0};
    const ca_clock_state *clock = &h->clock[h->clock_gen & 1];
    static char text[CA_REC_TEXT_MAX + 256];
    ca_rec r;
    long tid;
    const char *lines;
    size_t count = 0;
    uint64_t pos = done->raw_done;
    while (pos - done->raw_done < h->ring_size &&
           ca_ring_read(ring, h->ring_size, &pos, 1, &r, &tid, &lines, skipped)) {
        if (r.fn == CA_RAW_TEXT) { /* the objects of a call site */
            put(o, lines, (size_t)r.bytes);
            continue;
        }
        if (!ca_format_ready(r.fn))
            break;
        ca_rec_times_ns(&r, clock);
        put(o, text, ca_format_entry(&ctx, &r, tid, &ids, text));
        count++;
    }
    return count;
}

/* The end the process would have written: the note, and a Chrome trace's "]" ("]}" for a
 * file of the object form, which earlier builds wrote: ca_format.h). */
static void finish(const ca_ring_head *h, const ca_ring_done *done, out_file *o)
{
    if (done->lost > 0) {
        char note[512];
        size_t at, n = ca_format_note(h->format, &done->lost, h->error, note, sizeof note, &at);
        put(o, note, n);
    }
    if (h->format != CS_TRACE_PERFETTO)
        return;
    char last[2], first = 0;
    int have = o->off >= sizeof g_perfetto_head + 1 &&
               pread(o->fd, last, 2, (off_t)(o->off - 2)) == 2;
    int dict = pread(o->fd, &first, 1, 0) == 1 && first == '{';
    size_t back;
    const char *close = ca_format_array_end(have ? last : NULL, dict, &back);
    o->off -= back;
    put(o, close, strlen(close));
}

/* The pending file's lock: 1 taken, 0 held by its process, still alive (h->pid; 0 when the
 * header cannot be read), -1 an error. A lock held while its process is gone is another
 * tool's, finishing the same trace: waited for, up to 10 s. A header not written yet is a
 * process still making the file (its ring is allocated and brought in first): waited for,
 * up to 2 s. */
static int take_lock(int fd, ca_ring_head *h)
{
    for (int i = 0; i < 1000; i++) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
            return 1;
        if (errno != EWOULDBLOCK)
            return -1;
        int pid = read_head(fd, h) ? h->pid : 0;
        h->pid = pid;
        if ((pid <= 0 && i >= 200) || (pid > 0 && (kill(pid, 0) == 0 || errno == EPERM)))
            return 0;
        usleep(10000);
    }
    return 0;
}

int ca_recover(const char *trace, char *msg, size_t cap)
{
    char pending[4200];
    if (snprintf(pending, sizeof pending, "%s" CA_RING_SUFFIX, trace) >= (int)sizeof pending)
        return CA_RECOVER_NONE;
    int pfd = open(pending, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (pfd < 0)
        return errno == ENOENT ? CA_RECOVER_NONE : fail(msg, cap, pending, "open", errno);
    ca_ring_head h;
    int locked = take_lock(pfd, &h);
    if (locked < 0) {
        int err = errno;
        close(pfd);
        return fail(msg, cap, pending, "flock", err);
    }
    if (!locked) {
        close(pfd);
        snprintf(msg, cap, "'%s' is still being written by process %d: read as far as it is",
                 trace, h.pid);
        return CA_RECOVER_BUSY;
    }
    struct stat pst;
    if (fstat(pfd, &pst) == 0 && pst.st_nlink == 0) { /* another tool finished it meanwhile */
        close(pfd);
        return CA_RECOVER_NONE;
    }
    int rc = CA_RECOVER_ERROR;
    unsigned char *ring = NULL;
    int tfd = -1;
    if (!read_head(pfd, &h)) {
        fail(msg, cap, pending, "not a pending trace of this version of cacheshim", 0);
        goto out;
    }
    ca_ring_done done = h.done[h.done_gen & 1];
    if (!(ring = read_ring(pfd, h.ring_size))) {
        fail(msg, cap, pending, "cannot read its ring", errno);
        goto out;
    }
    tfd = open(trace, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (tfd < 0 || fstat(tfd, &st) != 0) {
        fail(msg, cap, trace, "open", errno);
        goto out;
    }
    if ((uint64_t)st.st_size < done.text_end) {
        fail(msg, cap, pending, "the trace is shorter than its text was", 0);
        goto out;
    }
    out_file o = {.fd = tfd, .off = done.text_end};
    if (h.format == CS_TRACE_PERFETTO && o.off == 0)
        put(&o, g_perfetto_head, sizeof g_perfetto_head - 1); /* no record reached the file */
    unsigned skipped = 0;
    size_t count = format_rest(&h, &done, ring, &o, &skipped);
    finish(&h, &done, &o);
    if (!o.err && ftruncate(tfd, (off_t)o.off) != 0)
        o.err = errno;
    if (o.err) {
        fail(msg, cap, trace, "write", o.err);
        goto out;
    }
    unlink(pending);
    snprintf(msg, cap, "'%s': process %d ended without finishing its trace; %zu calls it left "
                       "in '%s' formatted into it%s",
             trace, h.pid, count, pending, skipped ? " (some cut off in the middle)" : "");
    rc = CA_RECOVER_DONE;
out:
    free(ring);
    if (tfd >= 0)
        close(tfd);
    close(pfd);
    return rc;
}
