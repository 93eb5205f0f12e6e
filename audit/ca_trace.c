/* The record writer (layer 3, see ca_desc.h): one record per traced call, put when the
 * call returns into the ring of raw records (ca_ring.c) that the formatter's thread turns
 * into the trace's text (ca_drain.c), so that what a program recorded is in a file's pages
 * before it can die, at the cost of a copy on the calling thread. Where the trace is not a
 * file that can be mapped (stderr, a pipe), or the ring cannot be made, each record is
 * formatted and written on the calling thread instead. The filter, the threads' state,
 * fork, and the end of the process: exit(), _exit() and the fatal signals format what is
 * left and finish the file.
 *
 * A thread keeps the records of its calls in progress (a wrapper may call another: the
 * shim's driver calls inside the program's cuMemAlloc), so records reach the file in the
 * order the calls returned. */
#include "ca_trace.h"

#include <errno.h>
#include <fnmatch.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "ca_drain.h"
#include "ca_format.h"
#include "ca_mem.h"
#include "ca_out.h"
#include "ca_ring.h"
#include "ca_stack.h"
#include "cs_options.h"

/* Calls in progress on one thread that can be recorded (a traced call inside a traced call
 * inside ...): deeper ones are not. */
#define CA_DEPTH 8

typedef struct ca_thread {
    struct ca_thread *next;
    long tid;
    int busy;                 /* atomic: records being appended (the end waits while not
                               * 0): more than one when a signal handler's traced call
                               * interrupts this thread's own ca_end */
    int depth;                /* traced calls in progress (a handler's calls on top of the
                               * ones it interrupted, gone again when it returns) */
    ca_rec rec[CA_DEPTH];     /* their records */
    ca_fmt_ids ids;           /* pid and tid as the format writes them */
    char text[2 * CA_REC_TEXT_MAX + 256]; /* one record formatted when there is no ring
                                           * (after the lines of the objects of its call
                                           * site, JSON Lines) */
} ca_thread;

unsigned char ca_traced[CA_FN_COUNT];
/* A bit of ca_traced[fn] (atomic), set once fn's format plan is made (ca_format_ready): the
 * byte ca_begin has just read, instead of a call into the formatter's table at each call. */
#define PLANNED 2

/* initial-exec: a plain %fs-relative load on the hot path instead of __tls_get_addr calls;
 * 8 bytes of the static TLS surplus that glibc keeps for libraries loaded after start. */
static __thread ca_thread *t_self __attribute__((tls_model("initial-exec")));

static pthread_mutex_t g_list_lock = PTHREAD_MUTEX_INITIALIZER; /* the list of threads */
static ca_thread *g_list;                                       /* atomic head */
static int g_ended;   /* atomic: the process is ending, record nothing more: the kernel id
                       * of the thread that finishes the trace */
static int g_end_done; /* atomic: that thread has finished it */
static ca_fmt_ctx g_ctx;
static int g_inited;
/* atomic: the ring of raw records: 0 not made yet (at the first record), 1 in use, -1 none
 * (records formatted on the calling thread). g_ring_lock: making it. */
static int g_ring;
static size_t g_ring_quarter; /* a ring this full wakes the formatter at once */
static pthread_mutex_t g_ring_lock = PTHREAD_MUTEX_INITIALIZER;
/* The ring's file: "" for TRACE.pending beside the trace file (ca_trace_init_fd: its own). */
static char g_ring_path[CS_TRACE_TEXT_MAX + 64];


#ifdef CA_TRACE_BENCH
/* Benchmark builds only (meson -Dtrace_bench=true): SIGUSR2 turns recording off and on, so
 * that scripts/bench-trace-torch compares traced and untraced blocks of one process. */
static int g_bench_off; /* atomic */

static void on_bench_toggle(int sig)
{
    (void)sig;
    __atomic_xor_fetch(&g_bench_off, 1, __ATOMIC_RELAXED);
}
#endif

static void report_line(const char *line, void *arg)
{
    (void)arg;
    ca_out_say(line);
}

/* ---- the filter ----------------------------------------------------------------------------- */

/* What "memory" means: allocation, freeing, mapping and querying of memory. */
static const char memory_globs[] =
    "cuMemAlloc*,cuMemFree*,cuMemGetInfo*,cuMemHostAlloc*,cuMemHostRegister*,"
    "cuMemHostUnregister*,cuMemCreate*,cuMemRelease*,cuMemMap*,cuMemUnmap*,"
    "cuMemAddressReserve*,cuMemAddressFree*,cuMemGetAddressRange*,cuMemPool*,cuda*,"
    "cacheshim_scope_*";

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

/* ---- the end of the process: fatal signals ----------------------------------------------------- */

/* The signals whose default action ends the program with an error, and SIGTERM/SIGHUP/SIGQUIT
 * (kill, torchrun, a closed terminal). Not SIGINT: Python installs its KeyboardInterrupt
 * handler only where SIGINT is left at its default. */
static const int fatal_signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTRAP,
                                    SIGSYS, SIGTERM, SIGHUP, SIGQUIT, SIGXCPU};

/* Finish the file, then die of the signal as if we had never caught it: the default action
 * (a core dump where that is the default), with the signal as the exit status. */
static void on_fatal(int sig)
{
    int saved = errno;
    ca_trace_exit();
    signal(sig, SIG_DFL);
    raise(sig); /* blocked while this handler runs: delivered as it returns */
    errno = saved;
}

/* Only where the program would die anyway: a disposition someone set before us is kept.
 * A handler the program installs later replaces ours, and the records are still all in the
 * file; only the file's end is not finished then. */
static void catch_fatal_signals(void)
{
    for (size_t i = 0; i < sizeof fatal_signals / sizeof fatal_signals[0]; i++) {
        struct sigaction old, sa;
        if (sigaction(fatal_signals[i], NULL, &old) != 0 || old.sa_handler != SIG_DFL ||
            (old.sa_flags & SA_SIGINFO))
            continue;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_fatal;
        sa.sa_flags = SA_ONSTACK | SA_RESTART;
        sigemptyset(&sa.sa_mask);
        sigaction(fatal_signals[i], &sa, NULL);
    }
}

/* ---- init ------------------------------------------------------------------------------------ */

static void init_common(int format, const char *filter, int clock)
{
    const char *why;
    g_ctx.format = format;
    g_ctx.t_origin = ca_now_ns(); /* before the clock's first pair: no time comes before it */
    ca_clock_init(clock, &why);
    if (why)
        ca_out_say(why);
    g_ctx.pid = (int)getpid();
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
    init_common(o.trace_format, o.trace_filter, o.trace_clock);
    ca_stack_init(o.trace_format == CS_TRACE_JSONL ? o.trace_stack : 0);
    ca_out_open(o.trace_file, o.trace_format);
    catch_fatal_signals();
#ifdef CA_TRACE_BENCH
    signal(SIGUSR2, on_bench_toggle);
#endif
}

void ca_trace_init_fd(int fd, int format, const char *filter, const char *ring)
{
    snprintf(g_ring_path, sizeof g_ring_path, "%s", ring ? ring : "");
    cs_options o;
    cs_options_load(&o, get_variable, report_line, NULL);
    init_common(format, filter, o.trace_clock);
    ca_out_open_fd(fd, format);
}

/* ---- the hot path ----------------------------------------------------------------------------- */

__attribute__((noinline, cold)) static ca_thread *thread_new(void)
{
    /* Aligned as its records are (ca_rec: 64 bytes, its first cache line one line): calloc
     * gives 16. sizeof is a multiple of the alignment, as aligned_alloc asks. */
    ca_thread *t = aligned_alloc(_Alignof(ca_thread), sizeof *t);
    if (!t)
        return NULL;
    memset(t, 0, sizeof *t);
    t->tid = syscall(SYS_gettid);
    /* Taken once per thread, at its first traced call. */
    pthread_mutex_lock(&g_list_lock);
    t->next = g_list;
    __atomic_store_n(&g_list, t, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_list_lock);
    t_self = t;
    return t;
}

/* Who calls: the extents of the shim and of cudart, by CA_FROM_*. */
static struct {
    uintptr_t lo, hi;
} g_range[3];

/* lo first, hi last (released), and read the other way round (hi acquired): a call on
 * another thread while a range is first made sees either the empty range (hi 0) or the
 * whole one, never the new end with the old start, 0, which would take the program's own
 * code for the library's. */
void ca_trace_caller_range(int from, uintptr_t lo, uintptr_t hi)
{
    __atomic_store_n(&g_range[from].lo, lo, __ATOMIC_RELAXED);
    __atomic_store_n(&g_range[from].hi, hi, __ATOMIC_RELEASE);
}

static int from_of(const void *ret)
{
    uintptr_t a = (uintptr_t)ret;
    for (int f = CA_FROM_SHIM; f <= CA_FROM_CUDART; f++)
        if (a < __atomic_load_n(&g_range[f].hi, __ATOMIC_ACQUIRE) &&
            a >= __atomic_load_n(&g_range[f].lo, __ATOMIC_RELAXED))
            return f;
    return CA_FROM_APP;
}

__attribute__((hot)) ca_rec *ca_begin(unsigned fn, unsigned nargs, int lib, const void *ret)
{
    if (!__atomic_load_n(&ca_traced[fn], __ATOMIC_RELAXED) ||
        __atomic_load_n(&g_ended, __ATOMIC_RELAXED))
        return NULL;
#ifdef CA_TRACE_BENCH
    if (__atomic_load_n(&g_bench_off, __ATOMIC_RELAXED))
        return NULL;
#endif
    ca_thread *t = t_self;
    if (__builtin_expect(t == NULL, 0) && (t = thread_new()) == NULL)
        return NULL;
    if (t->depth >= CA_DEPTH)
        return NULL;
    int from = from_of(ret);
    /* A call made while one into the shim or cudart is in progress on this thread comes from
     * that library, even when it arrives by a tail call (the return address is then the
     * program's). */
    if (t->depth > 0 && from == CA_FROM_APP) {
        int outer = t->rec[t->depth - 1].lib;
        from = outer == CA_LIB_SHIM ? CA_FROM_SHIM : outer == CA_LIB_RUNTIME ? CA_FROM_CUDART : from;
    }
    /* A signal handler's traced call in the middle of this thread's own takes the next
     * slot, above the interrupted call's, and gives it back before the interrupted code
     * goes on. */
    ca_rec *r = &t->rec[t->depth++];
    r->fn = (uint16_t)fn;
    r->lib = (uint8_t)lib;
    r->from = (uint8_t)from;
    r->nout = 0;
    r->nargs = (uint8_t)nargs;
    r->nstr = 0;
    r->bytes = -1;
    r->nstack = ca_stack_fn[fn] ? (uint8_t)ca_stack_capture(r->stack) : 0;
    ca_ring_prefetch();
    return r;
}


/* The ring, at the first record (the file is opened then: a child's at its first record),
 * and the formatter's thread with it; -1 where there is none. */
__attribute__((noinline, cold)) static int start_ring(void)
{
    pthread_mutex_lock(&g_ring_lock);
    int state = __atomic_load_n(&g_ring, __ATOMIC_RELAXED);
    if (state == 0) {
        const char *path = ca_out_mapped_path(); /* "" for ca_trace_init_fd's file */
        /* Static, under g_ring_lock: this runs on whichever thread records first, whose
         * stack may have little room left (a sanitized program's, under a large static TLS). */
        static char pending[sizeof g_ring_path], line[sizeof pending + 160];
        state = -1;
        if (path && g_ring_path[0])
            snprintf(pending, sizeof pending, "%s", g_ring_path);
        else if (path && path[0])
            snprintf(pending, sizeof pending, "%s" CA_RING_SUFFIX, path);
        else
            pending[0] = '\0';
        if (pending[0]) {
            int err = ca_ring_create(pending, g_ctx.format, g_ctx.pid, g_ctx.t_origin);
            if (err == 0) {
                /* A rate for the ticks of the first records, in the file for the tools
                 * too, should the process be killed before the formatter runs. */
                ca_clock_state clock;
                ca_clock_current(1, &clock);
                ca_ring_clock(&clock);
                g_ring_quarter = ca_ring_size() / 4;
                ca_out_single_writer();
                ca_drain_start(&g_ctx);
                state = 1;
            } else {
                snprintf(line, sizeof line, "cacheshim: cannot create '%s': %s; each call is "
                                            "formatted on its own thread instead (slower)",
                         pending, strerror(err));
                ca_out_say(line);
            }
        }
        __atomic_store_n(&g_ring, state, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_ring_lock);
    return state;
}

/* No ring: the record formatted and written here, its times made ns first. */
__attribute__((noinline)) static void write_here(ca_thread *t, ca_rec *r)
{
    if (ca_clock_ticks) {
        ca_clock_state clock;
        ca_clock_current(1, &clock);
        ca_rec_times_ns(r, &clock);
    }
    /* JSON Lines: the objects of its call site not yet described in this file, before it */
    size_t n = r->nstack ? ca_stack_objects(g_ctx.pid, r, t->text, CA_REC_TEXT_MAX) : 0;
    n += ca_format_entry(&g_ctx, r, t->tid, &t->ids, t->text + n);
    if (n > 0)
        ca_out_append(t->text, n, 1);
}

/* JSON Lines: the lines of the objects of r's call site not yet described in this file,
 * into the ring ahead of r, from this thread: a process killed before its formatter ran
 * leaves them in the ring with r (ca_recover.c). */
__attribute__((noinline)) static void put_objects(ca_thread *t, const ca_rec *r)
{
    size_t n = ca_stack_objects(g_ctx.pid, r, t->text, CA_RAW_TEXT_MAX);
    if (n > 0 && ca_ring_put_text(t->text, n, t->tid) == 0)
        ca_drain_full(NULL, t->text, n, t->tid);
}

static int planned(unsigned fn)
{
    if (__builtin_expect(__atomic_load_n(&ca_traced[fn], __ATOMIC_RELAXED) & PLANNED, 1))
        return 1;
    if (!ca_format_ready(fn))
        return 0;
    __atomic_fetch_or(&ca_traced[fn], PLANNED, __ATOMIC_RELAXED);
    return 1;
}

__attribute__((hot)) void ca_end(ca_rec *r, int result)
{
    ca_thread *t = t_self;
    r->result = result;
    r->bytes = g_ctx.format == CS_TRACE_PERFETTO ? ca_mem_account(r) : -1; /* its counter */
    /* busy before the test of g_ended, both sequentially consistent: either the end sees
     * this thread busy and waits, or this thread sees the end and writes nothing. Counted,
     * not set: a signal handler that makes a traced call in the middle of this one runs to
     * its end before this thread goes on, and must leave busy as it found it (set, when it
     * came after this store), or the end would no longer wait for this record. Only this
     * thread (and its handlers, which give back what they add) writes it, so a load and a
     * store do, without a locked read-modify-write. */
    __atomic_store_n(&t->busy, __atomic_load_n(&t->busy, __ATOMIC_RELAXED) + 1,
                     __ATOMIC_SEQ_CST);
    /* The function's plan is made here, on the calling thread, so that whoever formats the
     * record later (a fatal signal's handler too) never allocates. */
    if (!__atomic_load_n(&g_ended, __ATOMIC_SEQ_CST) && planned(r->fn)) {
        int ring = __atomic_load_n(&g_ring, __ATOMIC_ACQUIRE);
        if (__builtin_expect(ring == 0, 0))
            ring = start_ring();
        size_t used;
        if (ring > 0 && r->nstack)
            put_objects(t, r);
        if (ring < 0)
            write_here(t, r);
        else if (__builtin_expect((used = ca_ring_put(r, t->tid)) == 0, 0))
            ca_drain_full(r, NULL, 0, t->tid);
        else if (used > g_ring_quarter)
            ca_drain_kick();
    }
    __atomic_store_n(&t->busy, __atomic_load_n(&t->busy, __ATOMIC_RELAXED) - 1,
                     __ATOMIC_RELEASE);
    t->depth--;
}

/* ---- the end: exit, _exit, fatal signals ------------------------------------------------------- */

/* Up to 100 ms for other threads to finish the record they are appending: a thread stopped
 * for good (in a debugger, or the one that crashed inside the tracer) does not hold the end
 * up for longer. */
static void wait_for_writers(void)
{
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (ca_thread *t = __atomic_load_n(&g_list, __ATOMIC_ACQUIRE); t; t = t->next) {
        while (t != t_self && __atomic_load_n(&t->busy, __ATOMIC_ACQUIRE)) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            if ((now.tv_sec - start.tv_sec) * 1000000000L + (now.tv_nsec - start.tv_nsec) >
                100000000L)
                return;
            sched_yield();
        }
    }
}

/* Another thread is finishing the trace while this one ends the process (_exit, a fatal
 * signal, exit() once the other began after a crash): up to 5 s for it (its own waits are at
 * most 300 ms, then what the ring holds is formatted), so that the process does not die with
 * the file half finished. Not when this thread is the one finishing it (a signal during its
 * own end). */
static void wait_for_end(int ender)
{
    if (ender == (int)syscall(SYS_gettid))
        return;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (!__atomic_load_n(&g_end_done, __ATOMIC_ACQUIRE)) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec >= 5)
            return;
        struct timespec pause = {0, 1000000};
        nanosleep(&pause, NULL);
    }
}

void ca_trace_exit(void)
{
    /* Only the process whose trace it is: a child of vfork (or of a raw clone) that calls
     * _exit shares, or copies, the parent's state and files; ending here would end the
     * parent's trace (the parent's fork wrapper makes g_ctx.pid a fork child's own). */
    if (!g_inited || (int)getpid() != g_ctx.pid)
        return;
    int ender = 0, self = (int)syscall(SYS_gettid);
    if (!__atomic_compare_exchange_n(&g_ended, &ender, self, 0, __ATOMIC_SEQ_CST,
                                     __ATOMIC_SEQ_CST)) {
        wait_for_end(ender);
        return;
    }
    wait_for_writers();
    /* What the ring still holds, formatted; the ring's file goes once it is all in the
     * trace (else it stays for the tools: ca_recover.c). */
    int ring = __atomic_load_n(&g_ring, __ATOMIC_ACQUIRE);
    int empty = ring > 0 ? ca_drain_finish() : 1;
    ca_out_finish();
    if (ring > 0 && empty)
        ca_ring_remove();
    __atomic_store_n(&g_end_done, 1, __ATOMIC_RELEASE);
}

/* ---- fork ---------------------------------------------------------------------------------- */

/* Like pthread_atfork's three handlers, called by our fork wrapper (ca_runtime.c): the
 * auditor's own pthread_atfork would never run for the program's fork. The locks are held
 * across fork so that the child finds them in a known state. */
void ca_fork_prepare(void)
{
    pthread_mutex_lock(&g_list_lock);
    pthread_mutex_lock(&g_ring_lock);
    ca_drain_fork_prepare(); /* the parent's records formatted before the child exists */
    ca_out_fork_prepare();
}

void ca_fork_parent(void)
{
    ca_out_fork_parent();
    ca_drain_fork_parent();
    pthread_mutex_unlock(&g_ring_lock);
    pthread_mutex_unlock(&g_list_lock);
}

/* The child: only the forking thread lives on; it starts its own file. */
void ca_fork_child(void)
{
    for (ca_thread *t = g_list; t; t = t->next) {
        if (t != t_self) {
            t->busy = 0;
            t->depth = 0;
        }
    }
    if (t_self)
        t_self->tid = syscall(SYS_gettid);
    pthread_mutex_init(&g_list_lock, NULL);
    pthread_mutex_init(&g_ring_lock, NULL);
    ca_drain_fork_child();
    ca_ring_fork_child();
    g_ring = 0; /* the child's own, at its first record */
    ca_out_fork_child();
    g_ctx.pid = (int)getpid();
    ca_mem_after_fork();
    ca_stack_fork_child();
    ca_clock_fork_child();
}
