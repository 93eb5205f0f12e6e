/* The record writer (layer 3, see ca_desc.h): one record per traced call, formatted and
 * appended to the trace file (ca_out.c) on the calling thread when the call returns, so
 * that what a program recorded is in the file's pages before it can die. The filter, the
 * threads' state, fork, and the end of the process: exit(), _exit() and the fatal signals
 * finish the file.
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

#include "ca_format.h"
#include "ca_mem.h"
#include "ca_out.h"
#include "ca_stack.h"
#include "cs_options.h"

/* Calls in progress on one thread that can be recorded (a traced call inside a traced call
 * inside ...): deeper ones are not. */
#define CA_DEPTH 8

typedef struct ca_thread {
    struct ca_thread *next;
    long tid;
    int busy;                 /* atomic: appending a record (the end waits for it) */
    int depth;                /* traced calls in progress */
    ca_rec rec[CA_DEPTH];     /* their records */
    ca_fmt_ids ids;           /* pid and tid as the format writes them */
    char text[2 * CA_REC_TEXT_MAX + 8]; /* one record formatted (after the lines of the
                                         * objects of its call site, JSON Lines) */
} ca_thread;

unsigned char ca_traced[CA_FN_COUNT];

/* initial-exec: a plain %fs-relative load on the hot path instead of __tls_get_addr calls;
 * 8 bytes of the static TLS surplus that glibc keeps for libraries loaded after start. */
static __thread ca_thread *t_self __attribute__((tls_model("initial-exec")));

static pthread_mutex_t g_list_lock = PTHREAD_MUTEX_INITIALIZER; /* the list of threads */
static ca_thread *g_list;                                       /* atomic head */
static int g_ended;   /* atomic: the process is ending, record nothing more */
static ca_fmt_ctx g_ctx;
static int g_inited;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

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

static void init_common(int format, const char *filter)
{
    g_ctx.format = format;
    g_ctx.t_origin = now_ns();
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
    init_common(o.trace_format, o.trace_filter);
    ca_stack_init(o.trace_format == CS_TRACE_JSONL ? o.trace_stack : 0);
    ca_out_open(o.trace_file, o.trace_format);
    catch_fatal_signals();
}

void ca_trace_init_fd(int fd, int format, const char *filter)
{
    init_common(format, filter);
    ca_out_open_fd(fd, format);
}

/* ---- the hot path ----------------------------------------------------------------------------- */

static ca_thread *thread_new(void)
{
    ca_thread *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->tid = syscall(SYS_gettid);
    /* Taken once per thread, at its first traced call. */
    pthread_mutex_lock(&g_list_lock);
    t->next = g_list;
    __atomic_store_n(&g_list, t, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_list_lock);
    t_self = t;
    return t;
}

ca_rec *ca_begin(unsigned fn, int lib, int from)
{
    if (!ca_traced[fn] || __atomic_load_n(&g_ended, __ATOMIC_RELAXED))
        return NULL;
    ca_thread *t = t_self;
    if (__builtin_expect(t == NULL, 0) && (t = thread_new()) == NULL)
        return NULL;
    if (t->depth >= CA_DEPTH)
        return NULL;
    /* A call made while one into the shim or cudart is in progress on this thread comes from
     * that library, even when it arrives by a tail call (the return address is then the
     * program's). */
    if (t->depth > 0 && from == CA_FROM_APP) {
        int outer = t->rec[t->depth - 1].lib;
        from = outer == CA_LIB_SHIM ? CA_FROM_SHIM : outer == CA_LIB_RUNTIME ? CA_FROM_CUDART : from;
    }
    ca_rec *r = &t->rec[t->depth++];
    r->fn = (uint16_t)fn;
    r->lib = (uint8_t)lib;
    r->from = (uint8_t)from;
    r->nout = 0;
    r->bytes = -1;
    r->nstack = ca_stack_fn[fn] ? (uint8_t)ca_stack_capture(r->stack) : 0;
    /* What ca_end will write to and read, fetched while the call runs. */
    for (int i = 0; i < 384; i += 64)
        __builtin_prefetch(t->text + i, 1);
    ca_format_prefetch(fn);
    return r;
}

void ca_started(ca_rec *r) { r->t0 = now_ns(); }
void ca_stopped(ca_rec *r) { r->t1 = now_ns(); }

void ca_end(ca_rec *r, int result)
{
    ca_thread *t = t_self;
    r->result = result;
    r->bytes = g_ctx.format == CS_TRACE_PERFETTO ? ca_mem_account(r) : -1; /* its counter */
    /* JSON Lines: the objects of its call site not yet described in this file, before it */
    size_t n = r->nstack ? ca_stack_objects(g_ctx.pid, r, t->text, CA_REC_TEXT_MAX) : 0;
    n += ca_format_rec(&g_ctx, r, t->tid, &t->ids, t->text + n, CA_REC_TEXT_MAX);
    if (n > 0 && g_ctx.format == CS_TRACE_PERFETTO) {
        t->text[n++] = ',';
        t->text[n++] = '\n';
        if (r->bytes >= 0) {
            n += ca_format_counter(&g_ctx, r, t->text + n, CA_REC_TEXT_MAX);
            t->text[n++] = ',';
            t->text[n++] = '\n';
        }
    }
    /* busy before the test of g_ended, both sequentially consistent: either the end sees
     * this thread busy and waits, or this thread sees the end and writes nothing. */
    __atomic_store_n(&t->busy, 1, __ATOMIC_SEQ_CST);
    if (n > 0 && !__atomic_load_n(&g_ended, __ATOMIC_SEQ_CST))
        ca_out_append(t->text, n);
    __atomic_store_n(&t->busy, 0, __ATOMIC_RELEASE);
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

void ca_trace_exit(void)
{
    if (!g_inited || __atomic_exchange_n(&g_ended, 1, __ATOMIC_SEQ_CST))
        return;
    wait_for_writers();
    ca_out_finish();
}

/* ---- fork ---------------------------------------------------------------------------------- */

/* Like pthread_atfork's three handlers, called by our fork wrapper (ca_runtime.c): the
 * auditor's own pthread_atfork would never run for the program's fork. The locks are held
 * across fork so that the child finds them in a known state. */
void ca_fork_prepare(void)
{
    pthread_mutex_lock(&g_list_lock);
    ca_out_fork_prepare();
}

void ca_fork_parent(void)
{
    ca_out_fork_parent();
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
    ca_out_fork_child();
    g_ctx.pid = (int)getpid();
    ca_mem_after_fork();
    ca_stack_fork_child();
}
