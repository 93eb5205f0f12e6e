/* The trace file: records reach the file's pages before the traced call returns.
 *
 * A trace file is mapped MAP_SHARED into one range of address space reserved at the start.
 * A record is appended by reserving its bytes (one compare-and-swap on the offset) and
 * copying them into the mapping: no lock, no system call. The pages are the file's own page
 * cache, which the kernel writes back whatever happens to the process, SIGKILL included.
 * The file grows by CA_OUT_STEP at a time (posix_fallocate, so a full disk is an error
 * here, never a SIGBUS on a page), each step mapped at the end of the last. A Chrome trace
 * grows in spaces instead (written, ca_sys_extend_blank), its header first.
 *
 * So a file whose process died ends in the rest of its last step: zero bytes, which the
 * readers skip (cacheshim-report, cacheshim-replay); in a Chrome trace, spaces after the
 * last event's comma, which Perfetto reads as they are (ca_format.h). Text is copied in
 * the order of its bytes (copy_in_order), so a copy cut short by the process's death leaves
 * a first part of it. A process that ends by exit(), _exit() or a fatal signal gets its file
 * finished: cut to what was written, and a Chrome trace closed with "]".
 *
 * stderr (the default), and any file that cannot be mapped, is written with one write() per
 * record instead.
 *
 * Write errors (a full disk, RLIMIT_FSIZE, a closed pipe): one line on stderr, and from then
 * on records are counted, not written; the count is a note at the end of the trace, kept
 * up to date in the mapping. */
#include "ca_out.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ca_format.h"
#include "ca_sys.h"
#include "cs_options.h"

/* How much the file grows at a time: what a killed process leaves as a tail of zero bytes
 * (a Chrome trace: of spaces). */
#define CA_OUT_STEP ((size_t)1 << 20)
/* Kept free at the end of the mapping for the note of lost records and the closing "]". */
#define NOTE_MAX 256
/* How far the helper thread keeps the file grown (and its pages in memory) ahead of the
 * records, so that the program's threads find their pages ready: no page fault, no system
 * call. */
#define CA_OUT_AHEAD (4 * CA_OUT_STEP)


enum { OUT_NONE, OUT_PENDING, OUT_MAP, OUT_STREAM };

static int g_mode = OUT_NONE;
static int g_fd = -1;
static int g_format; /* CS_TRACE_TEXT, _JSONL, _PERFETTO */
static int g_array;  /* Chrome trace: records end in ",\n", the file in "]" */
static char g_tmpl[CS_TRACE_TEXT_MAX]; /* "" for stderr */
static char g_path[CS_TRACE_TEXT_MAX + 32]; /* the file's name, for messages */
/* 1 when the named file already existed at start: this process traces to PATH.PID, created
 * at its first record, where it says so once (2: said, or a child of fork, which needn't). */
static int g_name_taken;

/* The mapping. g_off, g_mapped and g_limit are atomic; g_grow_lock serialises growth. */
static char *g_base;
static size_t g_reserved;
static size_t g_mapped;
static size_t g_limit; /* g_mapped - NOTE_MAX: records end at or before it */
static size_t g_off;   /* bytes handed out */
static pthread_mutex_t g_grow_lock = PTHREAD_MUTEX_INITIALIZER;
/* The helper thread that grows the file ahead ("cacheshim-trace"): woken when the records
 * pass g_kick (atomic); g_helper under g_grow_lock: 0 not started, 1 running, -1 none. */
static pthread_cond_t g_grow_cond = PTHREAD_COND_INITIALIZER;
static size_t g_kick = SIZE_MAX;
static int g_helper, g_helper_wanted;
static int g_single; /* atomic: one appending thread, no helper (ca_out_single_writer) */
/* A Chrome trace that several threads append to (no ring): one record reserved and copied at a
 * time, taken before g_grow_lock; g_copy_owner (atomic): the thread that holds it. */
static pthread_mutex_t g_copy_lock = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t g_copy_owner;

/* One write() per record; the Chrome trace's commas go between records, under the lock. */
static pthread_mutex_t g_stream_lock = PTHREAD_MUTEX_INITIALIZER;
static long g_events;
static int g_stream_file; /* the stream is a regular file under a file size limit: SIGXFSZ
                          * blocked around writes */

/* Errors. g_failed, g_failing and g_lost are atomic. */
static int g_failed;
static int g_failing; /* fail() has begun: it runs once */
static uint64_t g_lost;
static size_t g_note_at, g_note_len, g_note_count; /* map: the note and its count field */
static char g_error[160];
static int g_finished;

static const char g_head[] = CA_PERFETTO_HEAD;

/* ---- raw output ---------------------------------------------------------------------------- */

/* 0, or the errno of the failure. Never blocks on a pipe that is full without the caller's
 * consent: the program's own stderr writes would block the same way. */
static int write_some(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return errno;
        if (w == 0)
            return EIO;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* guard: fd may be a regular file (stderr redirected to one): past RLIMIT_FSIZE a write
 * fails with EFBIG and the kernel sends SIGXFSZ, which would kill the program; blocked
 * around the write and taken back (two system calls more, only where it can happen). */
static int write_all(int fd, const char *p, size_t n, int guard)
{
    if (!guard)
        return write_some(fd, p, n);
    ca_sys_xfsz x;
    ca_sys_xfsz_block(&x);
    int err = write_some(fd, p, n);
    ca_sys_xfsz_unblock(&x, err);
    return err;
}

void ca_out_say(const char *line)
{
    char buf[CS_TRACE_TEXT_MAX + 512];
    int n = snprintf(buf, sizeof buf, "%s\n", line);
    if (n > 0)
        (void)write_all(2, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1, 1);
}

/* ---- the note of lost records ------------------------------------------------------------------ */

/* The count, right-aligned in 20 characters: the note keeps its length as it changes. */
static void put_count(char *at, uint64_t v)
{
    char digits[21];
    snprintf(digits, sizeof digits, "%20" PRIu64, v);
    memcpy(at, digits, 20);
}

/* The note in the trace's format (ca_format_note) with a blank count, into buf; *count:
 * where its 20-character count field is. */
static size_t note_text(char *buf, size_t cap, size_t *count)
{
    return ca_format_note(g_format, NULL, g_error, buf, cap, count);
}

static void copy_in_order(char *to, const char *from, size_t n);

/* Under g_grow_lock (map) or g_stream_lock, once: the first failure. g_failed is set last,
 * released: a thread that sees it without the lock (ca_out_append, ca_out_lost) then sees the
 * error's text and the note, whose count it writes. */
static void fail(int err, const char *what)
{
    if (__atomic_exchange_n(&g_failing, 1, __ATOMIC_ACQ_REL))
        return;
    snprintf(g_error, sizeof g_error, "%s", what ? what : strerror(err));
    /* JSON strings: the messages of strerror have no quotes or backslashes. */
    char line[sizeof g_path + sizeof g_error + 128];
    snprintf(line, sizeof line, "cacheshim: cannot write the trace to '%s': %s; calls from now "
                                "on are counted in the trace, not written",
             g_mode == OUT_STREAM && !g_tmpl[0] ? "stderr" : g_path, g_error);
    ca_out_say(line);
    if (g_mode == OUT_MAP && g_mapped >= NOTE_MAX) {
        /* Made here and copied: snprintf ends the text in a zero byte, which in the mapping
         * would stay in the file of a killed process, where a Chrome trace must have none. */
        char note[NOTE_MAX];
        size_t at = g_mapped - NOTE_MAX, count;
        size_t n = note_text(note, sizeof note, &count);
        if (n) {
            put_count(note + count, __atomic_load_n(&g_lost, __ATOMIC_RELAXED));
            copy_in_order(g_base + at, note, n);
            g_note_at = at;
            g_note_len = n;
            g_note_count = count;
        }
    }
    __atomic_store_n(&g_failed, 1, __ATOMIC_RELEASE);
}

static void lost(size_t records)
{
    uint64_t v = __atomic_add_fetch(&g_lost, records, __ATOMIC_RELAXED);
    /* In the mapping: the count survives the process too. Not once the file is cut: its
     * page may be past the end of the file now (SIGBUS). */
    if (g_note_len && !__atomic_load_n(&g_finished, __ATOMIC_ACQUIRE))
        put_count(g_base + g_note_at + g_note_count, v);
}

/* ---- creating the file ------------------------------------------------------------------------ */

/* The template with %p replaced by the pid; a process that is not the first to use the name
 * (child) gets ".PID" appended when there is no %p, so it never shares (or fails to create)
 * its parent's file. */
static int expand_path(const char *tmpl, int pid, int child, char *out, size_t cap)
{
    size_t o = 0;
    int had_pid = 0;
    for (const char *s = tmpl; *s; s++) {
        char num[24];
        const char *piece = s;
        size_t len = 1;
        if (s[0] == '%' && s[1] == 'p') {
            len = (size_t)snprintf(num, sizeof num, "%d", pid);
            piece = num;
            had_pid = 1;
            s++;
        }
        if (o + len >= cap)
            return -1;
        memcpy(out + o, piece, len);
        o += len;
    }
    if (child && !had_pid) {
        int n = snprintf(out + o, cap - o, ".%d", pid);
        if (n < 0 || (size_t)n >= cap - o)
            return -1;
        o += (size_t)n;
    }
    out[o] = '\0';
    return 0;
}

/* Address space for the whole file: its pages are mapped into it as it grows, so a record
 * never straddles two mappings. PROT_NONE and MAP_NORESERVE: no memory is committed. Taken
 * at the first record, not while ld.so loads the program: a sanitizer's runtime maps its
 * shadow memory at fixed addresses when it starts, and must find them free. */
static int reserve_range(void)
{
    for (size_t size = (size_t)1 << 36; size >= ((size_t)1 << 26); size >>= 2) {
        void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p != MAP_FAILED) {
            g_base = p;
            g_reserved = size;
            return 0;
        }
    }
    return -1;
}

static int grow_locked(size_t need);

/* Under g_grow_lock: a regular file is mapped (at its first record), anything else written;
 * the Chrome trace's header. */
/* Is a file size limit in force (RLIMIT_FSIZE)? Only then can a write raise SIGXFSZ. Read once,
 * when the file is started: a limit the program sets later is not covered, which spares every
 * record of a trace on stderr two system calls. */
static int fsize_limited(void)
{
    struct rlimit r;
    return getrlimit(RLIMIT_FSIZE, &r) != 0 || r.rlim_cur != RLIM_INFINITY;
}

static void start_file(void)
{
    struct stat st;
    g_mode = OUT_STREAM;
    int regular = fstat(g_fd, &st) == 0 && S_ISREG(st.st_mode);
    if (g_fd > 2 && regular)
        g_mode = OUT_MAP;
    g_stream_file = regular && fsize_limited();
    g_events = 0;
    if (g_array && g_mode == OUT_STREAM) {
        int err = write_all(g_fd, g_head, sizeof g_head - 1, g_stream_file);
        if (err)
            fail(err, NULL);
    }
}

/* Under g_grow_lock, at the first growth: the address space, and the header at the start of
 * the file (no other thread reserves before g_limit is set). */
static int start_mapping(void)
{
    if (reserve_range() != 0)
        return ENOMEM;
    if (g_array)
        __atomic_store_n(&g_off, sizeof g_head - 1, __ATOMIC_RELAXED);
    return 0;
}

/* Under g_grow_lock. A new file only (O_EXCL), never through a symbolic link (O_NOFOLLOW on
 * the last component; O_EXCL also refuses a dangling link), mode 0600. On failure: one
 * line, and the trace goes to stderr.
 *
 * A program started by the traced program (subprocess, popen, torchrun's workers) inherits
 * CACHESHIM_TRACE_FILE and finds the file of its ancestor there. With no %p in the name it
 * then traces to PATH.PID, created at its first record: a shell or gzip that never calls the
 * driver leaves no file and prints nothing. */
static void open_output(int child)
{
    int pid = (int)getpid();
    g_fd = 2;
    if (g_tmpl[0] != '\0') {
        if (expand_path(g_tmpl, pid, child || g_name_taken, g_path, sizeof g_path) != 0) {
            ca_out_say("cacheshim: trace file name too long; tracing to stderr");
        } else {
            int fd = open(g_path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
            if (fd < 0 && errno == EEXIST && !child && !g_name_taken &&
                strstr(g_tmpl, "%p") == NULL) {
                g_name_taken = 1;
                g_mode = OUT_PENDING;
                return;
            }
            if (fd < 0) {
                char line[sizeof g_path + 128];
                snprintf(line, sizeof line, "cacheshim: cannot create trace file '%s': %s; "
                                            "tracing to stderr", g_path, strerror(errno));
                ca_out_say(line);
            } else {
                g_fd = fd;
                if (g_name_taken == 1) {
                    g_name_taken = 2;
                    char line[2 * sizeof g_path + 128];
                    snprintf(line, sizeof line, "cacheshim: trace file '%s' exists; process %d "
                                                "traces to '%s'", g_tmpl, pid, g_path);
                    ca_out_say(line);
                }
            }
        }
    }
    start_file();
}

void ca_out_open(const char *tmpl, int format)
{
    pthread_mutex_lock(&g_grow_lock);
    snprintf(g_tmpl, sizeof g_tmpl, "%s", tmpl);
    g_format = format;
    g_array = format == CS_TRACE_PERFETTO;
    open_output(0);
    pthread_mutex_unlock(&g_grow_lock);
}

void ca_out_open_fd(int fd, int format)
{
    pthread_mutex_lock(&g_grow_lock);
    g_tmpl[0] = '\0';
    g_format = format;
    g_array = format == CS_TRACE_PERFETTO;
    g_fd = fd;
    start_file();
    pthread_mutex_unlock(&g_grow_lock);
}

/* ---- growing the mapping ------------------------------------------------------------------------ */

/* Under g_grow_lock: map at least up to need + NOTE_MAX; 0 after a failure (said once). */
static int grow_locked(size_t need)
{
    int ok = 1;
    while (__atomic_load_n(&g_limit, __ATOMIC_RELAXED) < need) {
        if (__atomic_load_n(&g_failed, __ATOMIC_RELAXED) || g_mode != OUT_MAP ||
            __atomic_load_n(&g_finished, __ATOMIC_ACQUIRE)) {
            ok = 0;
            break;
        }
        int err = g_base ? 0 : start_mapping();
        if (err) {
            fail(err, "no address space to map the trace file into");
            ok = 0;
            break;
        }
        if (g_mapped == 0 && g_array)
            need += sizeof g_head - 1;
        size_t want = need + NOTE_MAX > g_mapped + CA_OUT_STEP ? need + NOTE_MAX
                                                               : g_mapped + CA_OUT_STEP;
        want = (want + CA_OUT_STEP - 1) / CA_OUT_STEP * CA_OUT_STEP;
        if (want > g_reserved)
            err = EFBIG;
        else if (g_array) /* the header at the start, spaces after it */
            err = ca_sys_extend_blank(g_fd, (off_t)g_mapped, want - g_mapped, g_head,
                                      g_mapped == 0 ? sizeof g_head - 1 : 0);
        else
            err = ca_sys_allocate(g_fd, (off_t)g_mapped, (off_t)(want - g_mapped));
        if (err == 0 && mmap(g_base + g_mapped, want - g_mapped, PROT_READ | PROT_WRITE,
                             MAP_SHARED | MAP_FIXED, g_fd, (off_t)g_mapped) == MAP_FAILED)
            err = errno;
        if (err) {
            fail(err, want > g_reserved ? "the trace outgrew the address space reserved for it"
                                        : NULL);
            ok = 0;
            break;
        }
        ca_sys_populate(g_base + g_mapped, want - g_mapped); /* the pages now */
        __atomic_store_n(&g_mapped, want, __ATOMIC_RELAXED);
        __atomic_store_n(&g_limit, want - NOTE_MAX, __ATOMIC_RELEASE);
        __atomic_store_n(&g_kick, want > CA_OUT_AHEAD ? want - CA_OUT_AHEAD : 0,
                         __ATOMIC_RELAXED);
    }
    return ok;
}

static int grow(size_t need)
{
    pthread_mutex_lock(&g_grow_lock);
    int ok = grow_locked(need);
    pthread_mutex_unlock(&g_grow_lock);
    return ok;
}

static void *helper_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&g_grow_lock);
    for (;;) {
        while (!g_helper_wanted)
            pthread_cond_wait(&g_grow_cond, &g_grow_lock);
        g_helper_wanted = 0;
        if (g_mode == OUT_MAP && !__atomic_load_n(&g_finished, __ATOMIC_RELAXED))
            (void)grow_locked(__atomic_load_n(&g_off, __ATOMIC_RELAXED) + CA_OUT_AHEAD);
    }
    return NULL;
}

/* Under g_grow_lock. */
static void helper_start(void)
{
    /* Without it, the program's threads grow the file themselves. */
    g_helper = ca_sys_thread(helper_main, "cacheshim-trace") ? 1 : -1;
}

/* The records passed the mark: wake the helper (started here, at the first time: not while
 * ld.so loads the program). Once per step of growth. */
static void kick(size_t mark)
{
    if (!__atomic_compare_exchange_n(&g_kick, &mark, SIZE_MAX, 0, __ATOMIC_RELAXED,
                                     __ATOMIC_RELAXED) ||
        __atomic_load_n(&g_single, __ATOMIC_RELAXED))
        return; /* another thread did, or no helper */
    pthread_mutex_lock(&g_grow_lock);
    if (g_helper == 0)
        helper_start();
    g_helper_wanted = 1;
    pthread_cond_signal(&g_grow_cond);
    pthread_mutex_unlock(&g_grow_lock);
}

/* Bytes [off, off + n) of the mapping for the caller alone, or SIZE_MAX. */
static size_t reserve(size_t n)
{
    for (;;) {
        size_t off = __atomic_load_n(&g_off, __ATOMIC_RELAXED);
        size_t lim = __atomic_load_n(&g_limit, __ATOMIC_ACQUIRE);
        if (off + n > lim) {
            if (!grow(off + n))
                return SIZE_MAX;
            continue;
        }
        if (__atomic_compare_exchange_n(&g_off, &off, off + n, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
            return off;
    }
}

/* ---- appending -------------------------------------------------------------------------------- */

/* n bytes copied in the order of their addresses, 16 at a time: a process killed in the
 * middle leaves a first part of them in its file, never bytes further on without those
 * before (glibc's memcpy stores a long copy's first and last bytes last). A Chrome trace
 * cut that way ends in part of an event, which Perfetto leaves out. */
static void copy_in_order(char *to, const char *from, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        memcpy(to + i, from + i, 16);
        __asm__ volatile("" ::: "memory"); /* one piece after the other, as written */
    }
    for (; i < n; i++) {
        to[i] = from[i];
        __asm__ volatile("" ::: "memory");
    }
}

__attribute__((noinline, cold)) static void append_stream(const char *p, size_t n,
                                                          size_t records)
{
    pthread_mutex_lock(&g_stream_lock);
    int err = 0;
    if (__atomic_load_n(&g_failed, __ATOMIC_RELAXED)) {
        lost(records);
    } else if (g_array) {
        /* Commas between events, not after the last: records end in ",\n". */
        if (g_events++ > 0)
            err = write_all(g_fd, ",\n", 2, g_stream_file);
        if (!err)
            err = write_all(g_fd, p, n >= 2 ? n - 2 : n, g_stream_file);
    } else {
        err = write_all(g_fd, p, n, g_stream_file);
    }
    if (err) {
        fail(err, NULL);
        lost(records);
    }
    pthread_mutex_unlock(&g_stream_lock);
}

/* A process started by the traced one: its own file, at its first record. */
__attribute__((noinline, cold)) static int open_pending(void)
{
    pthread_mutex_lock(&g_grow_lock);
    if (g_mode == OUT_PENDING)
        open_output(1);
    pthread_mutex_unlock(&g_grow_lock);
    return g_mode;
}

void ca_out_append(const char *p, size_t n, size_t records)
{
    int mode = __atomic_load_n(&g_mode, __ATOMIC_ACQUIRE);
    if (__builtin_expect(mode == OUT_PENDING, 0))
        mode = open_pending();
    if (mode == OUT_STREAM) {
        append_stream(p, n, records);
    } else if (mode == OUT_MAP) {
        /* Perfetto reads the first part of an event only at the end of the file: a record
         * that a death cuts short must be the last, so no other thread's may be reserved (and
         * written after it) while it is copied. Not on the thread that holds the lock: a
         * signal handler's driver call, made in the middle of its copy, would wait for it. */
        int one = g_array && !__atomic_load_n(&g_single, __ATOMIC_RELAXED);
        uintptr_t self = one ? (uintptr_t)pthread_self() : 0;
        one = one && __atomic_load_n(&g_copy_owner, __ATOMIC_RELAXED) != self;
        if (one) {
            pthread_mutex_lock(&g_copy_lock);
            __atomic_store_n(&g_copy_owner, self, __ATOMIC_RELAXED);
        }
        size_t off = __atomic_load_n(&g_failed, __ATOMIC_ACQUIRE) ? SIZE_MAX : reserve(n);
        if (off != SIZE_MAX)
            copy_in_order(g_base + off, p, n);
        if (one) {
            __atomic_store_n(&g_copy_owner, 0, __ATOMIC_RELAXED);
            pthread_mutex_unlock(&g_copy_lock);
        }
        if (off == SIZE_MAX) {
            lost(records);
            return;
        }
        size_t mark = __atomic_load_n(&g_kick, __ATOMIC_RELAXED);
        if (off + n >= mark)
            kick(mark);
    }
}

void ca_out_single_writer(void)
{
    __atomic_store_n(&g_single, 1, __ATOMIC_RELAXED);
}

const char *ca_out_mapped_path(void)
{
    int mode = __atomic_load_n(&g_mode, __ATOMIC_ACQUIRE);
    if (mode == OUT_PENDING)
        mode = open_pending();
    return mode == OUT_MAP ? g_path : NULL;
}

/* What g_off becomes at the end: no reservation succeeds after it (no record is copied past
 * the end of the cut file, which would be a SIGBUS), and off + n cannot overflow. */
#define OFF_CLOSED (SIZE_MAX / 2)

size_t ca_out_end(void)
{
    size_t off = __atomic_load_n(&g_off, __ATOMIC_ACQUIRE);
    /* g_finished after g_off: a record not written because the end had begun is seen here */
    return off >= OFF_CLOSED || __atomic_load_n(&g_finished, __ATOMIC_ACQUIRE) ? SIZE_MAX : off;
}

uint64_t ca_out_lost(const char **error)
{
    *error = __atomic_load_n(&g_failed, __ATOMIC_ACQUIRE) ? g_error : "";
    return __atomic_load_n(&g_lost, __ATOMIC_RELAXED);
}

/* ---- the end ---------------------------------------------------------------------------------- */

void ca_out_finish(void)
{
    if (__atomic_exchange_n(&g_finished, 1, __ATOMIC_ACQ_REL))
        return;
    /* Records reserved from now on are not written; those reserved before lie below end. */
    size_t end = __atomic_exchange_n(&g_off, OFF_CLOSED, __ATOMIC_ACQ_REL);
    __atomic_store_n(&g_limit, 0, __ATOMIC_RELEASE);
    /* Up to 100 ms for the record being copied into a Chrome trace (several threads): the
     * array is closed after it, not over its blanks, whose comma would come before the "]". */
    int copied = g_array && ca_sys_lock_within(&g_copy_lock, 100);
    /* Up to 100 ms for a growth under way, so that the file does not grow after it is cut;
     * a thread stopped while holding the lock does not stop the end. */
    int locked = ca_sys_lock_within(&g_grow_lock, 100);
    if (g_mode == OUT_MAP && g_mapped > 0) {
        if (g_note_len) { /* the note moves to the end of what was written */
            put_count(g_base + g_note_at + g_note_count, __atomic_load_n(&g_lost, __ATOMIC_RELAXED));
            memmove(g_base + end, g_base + g_note_at, g_note_len);
            end += g_note_len;
        }
        if (g_array) { /* over the last record's comma */
            size_t back;
            const char *close =
                ca_format_array_end(end >= 2 ? g_base + end - 2 : NULL, 0, &back);
            end -= back;
            memcpy(g_base + end, close, strlen(close));
            end += strlen(close);
        }
        (void)ftruncate(g_fd, (off_t)end);
    } else if (g_mode == OUT_MAP && g_array) { /* no record: the header and its end */
        /* SIGXFSZ blocked: this is also the end of a file whose first growth failed, under a
         * file size limit smaller than these bytes, where a write raises it. */
        ca_sys_xfsz x;
        ca_sys_xfsz_block(&x);
        int err = pwrite(g_fd, g_head, sizeof g_head - 1, 0) != (ssize_t)(sizeof g_head - 1) ||
                  pwrite(g_fd, "]\n", 2, (off_t)(sizeof g_head - 1)) != 2;
        ca_sys_xfsz_unblock(&x, err);
    } else if (g_mode == OUT_STREAM) {
        if (g_failed) { /* most likely fails too; the line on stderr said it already */
            char note[NOTE_MAX];
            size_t count, n = note_text(note, sizeof note, &count);
            if (n) {
                put_count(note + count, __atomic_load_n(&g_lost, __ATOMIC_RELAXED));
                if (g_array && g_events++ > 0)
                    (void)write_all(g_fd, ",\n", 2, g_stream_file);
                (void)write_all(g_fd, note, n - (g_array ? 2 : 0), g_stream_file);
            }
        }
        if (g_array)
            (void)write_all(g_fd, g_events > 0 ? "\n]\n" : "]\n", g_events > 0 ? 3 : 2,
                            g_stream_file);
    }
    __atomic_store_n(&g_mode, OUT_NONE, __ATOMIC_RELEASE);
    if (g_fd > 2)
        close(g_fd);
    g_fd = -1;
    if (locked)
        pthread_mutex_unlock(&g_grow_lock);
    if (copied)
        pthread_mutex_unlock(&g_copy_lock);
}

/* ---- fork ------------------------------------------------------------------------------------- */

void ca_out_fork_prepare(void)
{
    pthread_mutex_lock(&g_copy_lock);
    pthread_mutex_lock(&g_grow_lock);
    pthread_mutex_lock(&g_stream_lock);
}

void ca_out_fork_parent(void)
{
    pthread_mutex_unlock(&g_stream_lock);
    pthread_mutex_unlock(&g_grow_lock);
    pthread_mutex_unlock(&g_copy_lock);
}

/* The parent's file is the parent's to finish: the child unmaps it and starts its own at
 * its first record, not now: a child that only calls exec (subprocess) must not leave an
 * empty file behind, nor take the name that the program it runs, with the same pid, will
 * want for its own trace. */
void ca_out_fork_child(void)
{
    pthread_mutex_init(&g_copy_lock, NULL);
    g_copy_owner = 0;
    pthread_mutex_init(&g_grow_lock, NULL);
    pthread_cond_init(&g_grow_cond, NULL);
    g_helper = g_helper_wanted = 0; /* not in the child; started again when needed */
    g_single = 0;
    g_kick = SIZE_MAX;
    pthread_mutex_init(&g_stream_lock, NULL);
    if (g_base)
        munmap(g_base, g_reserved);
    g_base = NULL;
    g_reserved = g_mapped = g_limit = g_off = 0;
    g_failed = g_failing = 0;
    g_lost = 0;
    g_note_len = 0;
    g_events = 0;
    if (g_name_taken)
        g_name_taken = 2;
    if (g_finished || g_mode == OUT_NONE)
        return;
    if (g_tmpl[0] != '\0') {
        if (g_fd > 2)
            close(g_fd);
        g_fd = -1;
        g_mode = OUT_PENDING;
    }
}
