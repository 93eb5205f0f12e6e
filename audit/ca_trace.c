/* Recording and output: per-thread record buffers, a writer thread, the trace file, and
 * every flush (buffer full, fork, exit).
 *
 * Hot path (ca_begin .. ca_end) touches only the calling thread's chunk of records: no lock,
 * no system call besides two clock reads. A full chunk is handed to a writer thread, which
 * formats and writes it on a core of its own, and the thread goes on in a fresh chunk: the
 * program's threads never format. If the writer falls behind (CA_MAX_QUEUED chunks waiting)
 * or cannot be started, the thread that filled a chunk writes what is queued itself, so
 * memory stays bounded and nothing is dropped.
 *
 * A chunk's records [0, committed) are complete; `committed` is published with release
 * order, so a flusher on another thread (exit() from any thread, fork) can write them while
 * the owner keeps appending behind them. Lock order: g_list_lock, a thread's lock, g_out_lock,
 * g_q_lock. A thread moves its chunk to the queue under its own lock, and every writer
 * drains the queue before writing threads' current chunks, so each thread's records reach
 * the file in the order they were made. */
#include "ca_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "ca_mem.h"
#include "ca_stack.h"
#include "cs_options.h"

/* Records in a chunk: about 200 KiB. */
#define CA_BUF_RECS 1024
/* Bytes formatted before one write(). */
#define CA_CHUNK (64 * 1024)
/* Full chunks waiting for the writer before the filling thread writes them itself
 * (about 13 MiB). */
#define CA_MAX_QUEUED 64
/* Written chunks kept for reuse. */
#define CA_MAX_SPARE 16

typedef struct ca_chunk {
    struct ca_chunk *next; /* in the queue or the spare list */
    long tid;
    unsigned committed;    /* atomic: records [0, committed) are complete */
    unsigned done;         /* records [0, done) are written: under the owner's lock while the
                            * chunk is current, under g_out_lock once queued */
    ca_rec rec[CA_BUF_RECS];
} ca_chunk;

typedef struct ca_tbuf {
    struct ca_tbuf *next;
    pthread_mutex_t lock;     /* flushers, and the owner when it swaps chunks */
    ca_chunk *cur;            /* written by the owner under lock */
    unsigned reserved;        /* owner only: records of cur handed out */
    int depth;                /* owner only: traced calls in progress (a wrapper calling one) */
    uint8_t open_lib[8];      /* owner only: the library of each call in progress */
    long tid;
} ca_tbuf;

unsigned char ca_traced[CA_FN_COUNT];

/* initial-exec: a plain %fs-relative load on the hot path instead of three __tls_get_addr
 * calls a traced call; 8 bytes of the static TLS surplus that glibc keeps for libraries
 * loaded after start. */
static __thread ca_tbuf *t_buf __attribute__((tls_model("initial-exec")));

static pthread_mutex_t g_list_lock = PTHREAD_MUTEX_INITIALIZER; /* the list of buffers */
static ca_tbuf *g_list;                                         /* atomic head */
static pthread_mutex_t g_out_lock = PTHREAD_MUTEX_INITIALIZER;  /* everything below */
static int g_fd = -1;     /* -1: closed; FD_PENDING: to be created at the first write */
#define FD_PENDING (-2)
static int g_pid;
static char g_path[CS_TRACE_TEXT_MAX]; /* the template, "" for stderr */
static long g_events;                  /* events written to this file (Perfetto commas) */
static int g_closed;                   /* atomic: exit flush done, record nothing more */
static ca_fmt_ctx g_ctx;
static int g_inited;

static pthread_mutex_t g_q_lock = PTHREAD_MUTEX_INITIALIZER; /* the queue and spare list */
static pthread_cond_t g_q_cond = PTHREAD_COND_INITIALIZER;   /* the queue is not empty */
static ca_chunk *g_q_head, *g_q_tail;
static int g_queued;
static ca_chunk *g_spare;
static int g_nspare;
static int g_writer;   /* under g_q_lock: 0 not started, 1 running, -1 cannot be started */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- messages and raw output -------------------------------------------------------------- */

static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return; /* a full disk or closed pipe loses the trace, never the program */
        p += w;
        n -= (size_t)w;
    }
}

static void report_line(const char *line, void *arg)
{
    (void)arg;
    char buf[CS_TRACE_TEXT_MAX + 512];
    int n = snprintf(buf, sizeof buf, "%s\n", line);
    if (n > 0)
        write_all(2, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

/* ---- the output file ---------------------------------------------------------------------- */

/* The template with %p replaced by the pid; a child of fork whose template has no %p gets
 * ".PID" appended, so it never shares (or fails to create) its parent's file. */
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

/* 1 when the named file already existed at start: this process traces to PATH.PID, created
 * at its first write, where it says so once (2: said, or a child of fork, which needn't). */
static int g_name_taken;

/* Under g_out_lock. A new file only (O_EXCL), never through a symbolic link (O_NOFOLLOW on
 * the last component; O_EXCL also refuses a dangling link), mode 0600. On failure: one
 * line, and the trace goes to stderr.
 *
 * A program started by the traced program (subprocess, popen, torchrun's workers) inherits
 * CACHESHIM_TRACE_FILE and finds the file of its ancestor there. With no %p in the name it
 * then traces to PATH.PID, created at its first write: a shell or gzip that never calls the
 * driver leaves no file and prints nothing. */
static void open_output(int child)
{
    g_pid = (int)getpid();
    g_events = 0;
    g_fd = 2;
    if (g_path[0] != '\0') {
        char path[CS_TRACE_TEXT_MAX + 32];
        if (expand_path(g_path, g_pid, child || g_name_taken, path, sizeof path) != 0) {
            report_line("cacheshim: trace file name too long; tracing to stderr", NULL);
        } else {
            int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
            if (fd < 0 && errno == EEXIST && !child && !g_name_taken &&
                strstr(g_path, "%p") == NULL) {
                g_name_taken = 1;
                g_fd = FD_PENDING;
                return;
            }
            if (fd < 0) {
                char line[sizeof path + 128];
                snprintf(line, sizeof line, "cacheshim: cannot create trace file '%s': %s; "
                                            "tracing to stderr", path, strerror(errno));
                report_line(line, NULL);
            } else {
                g_fd = fd;
                if (g_name_taken == 1) {
                    g_name_taken = 2;
                    char line[2 * sizeof path + 128];
                    snprintf(line, sizeof line, "cacheshim: trace file '%s' exists; process %d "
                                                "traces to '%s'", g_path, g_pid, path);
                    report_line(line, NULL);
                }
            }
        }
    }
    if (g_ctx.format == CS_TRACE_PERFETTO) {
        static const char head[] = "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
        write_all(g_fd, head, sizeof head - 1);
    }
}

static void close_output(void)
{
    if (g_fd == FD_PENDING) { /* a child that wrote nothing: no file */
        g_fd = -1;
        return;
    }
    if (g_ctx.format == CS_TRACE_PERFETTO) {
        static const char tail[] = "\n]}\n";
        write_all(g_fd, tail, sizeof tail - 1);
    }
    if (g_fd > 2)
        close(g_fd);
    g_fd = -1;
}

/* ---- the filter ----------------------------------------------------------------------------- */

/* What "memory" means: allocation, freeing, mapping and querying of memory. */
static const char memory_globs[] =
    "cuMemAlloc*,cuMemFree*,cuMemGetInfo*,cuMemHostAlloc*,cuMemHostRegister*,"
    "cuMemHostUnregister*,cuMemCreate*,cuMemRelease*,cuMemMap*,cuMemUnmap*,"
    "cuMemAddressReserve*,cuMemAddressFree*,cuMemGetAddressRange*,cuMemPool*,cuda*";

static int matches(const char *list, const char *name)
{
    char item[CS_TRACE_TEXT_MAX];
    const char *s = list;
    while (*s) {
        size_t n = strcspn(s, ",");
        if (n < sizeof item) {
            memcpy(item, s, n);
            item[n] = '\0';
            if (fnmatch(item, name, 0) == 0)
                return 1;
        }
        s += n;
        if (*s == ',')
            s++;
    }
    return 0;
}

static void set_filter(const char *filter)
{
    int all = strcmp(filter, "all") == 0;
    const char *list = strcmp(filter, "memory") == 0 ? memory_globs : filter;
    for (unsigned fn = 0; fn < CA_FN_COUNT; fn++)
        ca_traced[fn] = (unsigned char)(all || matches(list, ca_desc(fn)->name));
}

/* ---- init ------------------------------------------------------------------------------------ */

static void init_common(int format, const char *filter)
{
    g_ctx.format = format;
    g_ctx.t_origin = now_ns();
    set_filter(filter);
    ca_mem_init(format == CS_TRACE_PERFETTO);
    g_inited = 1;
}

/* Only the tracer's own variables: the cache's are the shim's to read and report, so a bad
 * CACHESHIM_CAP is not reported twice when both libraries are loaded. */
static const char *get_variable(const char *name)
{
    if (strncmp(name, "CACHESHIM_TRACE_", 16) != 0)
        return NULL;
    return secure_getenv(name);
}

void ca_trace_init(void)
{
    if (g_inited)
        return;
    cs_options o;
    cs_options_load(&o, get_variable, report_line, NULL);
    memcpy(g_path, o.trace_file, sizeof g_path);
    init_common(o.trace_format, o.trace_filter);
    ca_stack_init(o.trace_format == CS_TRACE_JSONL ? o.trace_stack : 0);
    pthread_mutex_lock(&g_out_lock);
    open_output(0);
    g_ctx.pid = g_pid;
    pthread_mutex_unlock(&g_out_lock);
}

void ca_trace_init_fd(int fd, int format, const char *filter)
{
    init_common(format, filter);
    pthread_mutex_lock(&g_out_lock);
    g_path[0] = '\0';
    open_output(0);
    g_fd = fd;
    g_ctx.pid = g_pid;
    pthread_mutex_unlock(&g_out_lock);
}

/* ---- chunks and the queue ------------------------------------------------------------------- */

static ca_chunk *chunk_get(long tid)
{
    pthread_mutex_lock(&g_q_lock);
    ca_chunk *c = g_spare;
    if (c) {
        g_spare = c->next;
        g_nspare--;
    }
    pthread_mutex_unlock(&g_q_lock);
    if (!c && (c = malloc(sizeof *c)) == NULL)
        return NULL;
    c->next = NULL;
    c->tid = tid;
    c->done = 0;
    __atomic_store_n(&c->committed, 0, __ATOMIC_RELAXED);
    return c;
}

static void chunk_put(ca_chunk *c)
{
    pthread_mutex_lock(&g_q_lock);
    if (g_nspare < CA_MAX_SPARE) {
        c->next = g_spare;
        g_spare = c;
        g_nspare++;
        c = NULL;
    }
    pthread_mutex_unlock(&g_q_lock);
    free(c);
}

/* Under g_out_lock: write records [done, committed) of c. */
static void write_chunk(ca_chunk *c)
{
    unsigned end = __atomic_load_n(&c->committed, __ATOMIC_ACQUIRE);
    if (c->done >= end || g_fd == -1 || __atomic_load_n(&g_closed, __ATOMIC_RELAXED))
        return;
    if (g_fd == FD_PENDING) {
        open_output(1);
        g_ctx.pid = g_pid;
    } else if ((int)getpid() != g_pid) {
        /* A child made by a path that did not pass our fork wrapper (clone, vfork...): its
         * own file, as after fork. Records from before the fork may appear in both files. */
        if (g_fd > 2)
            close(g_fd);
        open_output(1);
        g_ctx.pid = g_pid;
    }
    static char text[CA_CHUNK]; /* under g_out_lock */
    size_t used = 0;
    for (unsigned i = c->done; i < end; i++) {
        if (CA_CHUNK - used < 2 * CA_REC_TEXT_MAX + 8) {
            write_all(g_fd, text, used);
            used = 0;
        }
        const ca_rec *r = &c->rec[i];
        if (g_ctx.format == CS_TRACE_PERFETTO && g_events++ > 0)
            text[used++] = ',', text[used++] = '\n';
        used += ca_format_rec(&g_ctx, r, c->tid, text + used, CA_REC_TEXT_MAX);
        if (g_ctx.format == CS_TRACE_PERFETTO && r->bytes >= 0) {
            text[used++] = ',', text[used++] = '\n';
            used += ca_format_counter(&g_ctx, r, text + used, CA_REC_TEXT_MAX);
        }
    }
    write_all(g_fd, text, used);
    c->done = end;
}

static ca_chunk *queue_pop(void) /* under g_q_lock */
{
    ca_chunk *c = g_q_head;
    if (c) {
        g_q_head = c->next;
        if (!g_q_head)
            g_q_tail = NULL;
        g_queued--;
    }
    return c;
}

/* Under g_out_lock: write every queued chunk, oldest first. */
static void drain_queue(void)
{
    for (;;) {
        pthread_mutex_lock(&g_q_lock);
        ca_chunk *c = queue_pop();
        pthread_mutex_unlock(&g_q_lock);
        if (!c)
            return;
        write_chunk(c);
        chunk_put(c);
    }
}

/* The writer pops under g_out_lock, so no flusher writes a thread's later records between
 * this thread taking a chunk and writing it. */
static void *writer_main(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&g_q_lock);
        while (!g_q_head)
            pthread_cond_wait(&g_q_cond, &g_q_lock);
        pthread_mutex_unlock(&g_q_lock);
        pthread_mutex_lock(&g_out_lock);
        drain_queue();
        pthread_mutex_unlock(&g_out_lock);
    }
    return NULL;
}

/* Under g_q_lock. Signals stay with the program's threads. */
static void writer_start(void)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr;
    pthread_t t;
    int ok = pthread_attr_init(&attr) == 0;
    ok = ok && pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED) == 0 &&
         pthread_create(&t, &attr, writer_main, NULL) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    g_writer = ok ? 1 : -1;
    if (ok)
        pthread_setname_np(t, "cacheshim-trace");
    else
        report_line("cacheshim: cannot start the trace writer thread; threads write their own "
                    "records", NULL);
}

/* ---- the hot path ----------------------------------------------------------------------------- */

static ca_tbuf *tbuf_new(void)
{
    ca_tbuf *tb = calloc(1, sizeof *tb);
    if (!tb)
        return NULL;
    tb->tid = syscall(SYS_gettid);
    tb->cur = chunk_get(tb->tid);
    if (!tb->cur) {
        free(tb);
        return NULL;
    }
    pthread_mutex_init(&tb->lock, NULL);
    /* Taken once per thread, at its first traced call. */
    pthread_mutex_lock(&g_list_lock);
    tb->next = g_list;
    __atomic_store_n(&g_list, tb, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_list_lock);
    t_buf = tb;
    return tb;
}

/* The owner's chunk is full and no traced call of this thread is in progress: queue it for
 * the writer and go on in a fresh one; without a writer or a fresh chunk, or when the writer
 * is too far behind, write the queue and the chunk here. */
static void chunk_full(ca_tbuf *tb)
{
    pthread_mutex_lock(&g_q_lock);
    if (g_writer == 0)
        writer_start();
    int have_writer = g_writer == 1;
    pthread_mutex_unlock(&g_q_lock);
    ca_chunk *fresh = have_writer ? chunk_get(tb->tid) : NULL;

    pthread_mutex_lock(&tb->lock);
    int write_here = 1;
    if (fresh) {
        pthread_mutex_lock(&g_q_lock);
        tb->cur->next = NULL;
        if (g_q_tail)
            g_q_tail->next = tb->cur;
        else
            g_q_head = tb->cur;
        g_q_tail = tb->cur;
        write_here = ++g_queued > CA_MAX_QUEUED;
        pthread_cond_signal(&g_q_cond);
        pthread_mutex_unlock(&g_q_lock);
        tb->cur = fresh;
        tb->reserved = 0;
    }
    if (write_here) {
        pthread_mutex_lock(&g_out_lock);
        drain_queue();
        write_chunk(tb->cur);
        pthread_mutex_unlock(&g_out_lock);
    }
    if (tb->reserved == CA_BUF_RECS) { /* written here: reuse it */
        tb->cur->done = 0;
        tb->reserved = 0;
        __atomic_store_n(&tb->cur->committed, 0, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&tb->lock);
}

ca_rec *ca_begin(unsigned fn, int lib, void *ret)
{
    if (!ca_traced[fn] || __atomic_load_n(&g_closed, __ATOMIC_RELAXED))
        return NULL;
    ca_tbuf *tb = t_buf;
    if (__builtin_expect(tb == NULL, 0) && (tb = tbuf_new()) == NULL)
        return NULL;
    if (__builtin_expect(tb->reserved == CA_BUF_RECS, 0)) {
        if (tb->depth > 0)
            return NULL; /* full inside a nested call: this inner call goes unrecorded */
        chunk_full(tb);
    }
    ca_rec *r = &tb->cur->rec[tb->reserved++];
    int from = ca_from_of(ret);
    /* A call made while one into the shim or cudart is in progress on this thread comes from
     * that library, even when it arrives by a tail call (the return address is then the
     * program's). */
    if (tb->depth > 0 && tb->depth <= 8 && from == CA_FROM_APP) {
        int outer = tb->open_lib[tb->depth - 1];
        from = outer == CA_LIB_SHIM ? CA_FROM_SHIM : outer == CA_LIB_RUNTIME ? CA_FROM_CUDART : from;
    }
    if (tb->depth < 8)
        tb->open_lib[tb->depth] = (uint8_t)lib;
    tb->depth++;
    r->fn = (uint16_t)fn;
    r->lib = (uint8_t)lib;
    r->from = (uint8_t)from;
    r->nout = 0;
    r->bytes = -1;
    r->nstack = ca_stack_fn[fn] ? (uint8_t)ca_stack_capture(r->stack) : 0;
    return r;
}

void ca_started(ca_rec *r) { r->t0 = now_ns(); }
void ca_stopped(ca_rec *r) { r->t1 = now_ns(); }

void ca_end(ca_rec *r, int result)
{
    r->result = result;
    r->bytes = ca_mem_account(r);
    ca_tbuf *tb = t_buf;
    /* Publish only when the outermost call ends: records stay in start order and a flusher
     * never sees a nested call's record before its caller's is complete. */
    if (--tb->depth == 0)
        __atomic_store_n(&tb->cur->committed, tb->reserved, __ATOMIC_RELEASE);
}

/* ---- flushing from other threads: exit and fork ------------------------------------------------ */

void ca_flush_all(int last)
{
    if (!g_inited)
        return;
    pthread_mutex_lock(&g_list_lock);
    for (ca_tbuf *tb = __atomic_load_n(&g_list, __ATOMIC_ACQUIRE); tb; tb = tb->next) {
        pthread_mutex_lock(&tb->lock);
        pthread_mutex_lock(&g_out_lock);
        drain_queue(); /* this thread's older chunks first */
        write_chunk(tb->cur);
        pthread_mutex_unlock(&g_out_lock);
        pthread_mutex_unlock(&tb->lock);
    }
    pthread_mutex_lock(&g_out_lock);
    drain_queue();
    if (last && !__atomic_exchange_n(&g_closed, 1, __ATOMIC_RELAXED))
        close_output();
    pthread_mutex_unlock(&g_out_lock);
    pthread_mutex_unlock(&g_list_lock);
}

/* Like pthread_atfork's three handlers, called by our fork wrapper (ca_runtime.c): the
 * auditor's own pthread_atfork would never run for the program's fork. The parent writes
 * everything recorded so far, holding every lock across fork so that the child finds them
 * in a known state. */
void ca_fork_prepare(void)
{
    pthread_mutex_lock(&g_list_lock);
    for (ca_tbuf *tb = g_list; tb; tb = tb->next)
        pthread_mutex_lock(&tb->lock);
    pthread_mutex_lock(&g_out_lock);
    if (g_inited) {
        drain_queue();
        for (ca_tbuf *tb = g_list; tb; tb = tb->next)
            write_chunk(tb->cur);
    }
    pthread_mutex_lock(&g_q_lock);
}

void ca_fork_parent(void)
{
    pthread_mutex_unlock(&g_q_lock);
    pthread_mutex_unlock(&g_out_lock);
    for (ca_tbuf *tb = g_list; tb; tb = tb->next)
        pthread_mutex_unlock(&tb->lock);
    pthread_mutex_unlock(&g_list_lock);
}

/* The child: only the forking thread lives on, the writer thread included is gone (a new one
 * starts when needed). What other threads recorded after the prepare step belongs to the
 * parent; the child starts its own file. */
void ca_fork_child(void)
{
    for (ca_tbuf *tb = g_list; tb; tb = tb->next) {
        if (tb != t_buf) {
            tb->depth = 0;
            tb->reserved = 0;
            __atomic_store_n(&tb->cur->committed, 0, __ATOMIC_RELAXED);
        }
        tb->cur->done = __atomic_load_n(&tb->cur->committed, __ATOMIC_RELAXED);
        pthread_mutex_init(&tb->lock, NULL);
    }
    if (t_buf) {
        t_buf->tid = syscall(SYS_gettid);
        t_buf->cur->tid = t_buf->tid;
    }
    pthread_mutex_init(&g_out_lock, NULL);
    pthread_mutex_init(&g_list_lock, NULL);
    pthread_mutex_init(&g_q_lock, NULL);
    pthread_cond_init(&g_q_cond, NULL);
    g_writer = 0;
    if (g_inited && !g_closed && g_path[0] != '\0') {
        if (g_fd > 2)
            close(g_fd); /* the parent's file: the parent finishes it */
        /* The child's own file is created at its first write, not now: a child that only
         * calls exec (subprocess) must not leave an empty file behind, nor take the name
         * that the program it runs, with the same pid, will want for its own trace. */
        g_fd = FD_PENDING;
    }
    if (g_name_taken)
        g_name_taken = 2;
    g_pid = (int)getpid();
    g_ctx.pid = g_pid;
    ca_mem_after_fork();
}
