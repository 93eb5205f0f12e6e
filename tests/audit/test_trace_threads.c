/* The record writer under contention, in one process (so the sanitizers see the tracer's
 * own code, the ring of raw records, its formatter thread, and the shared mapping of the
 * trace file; with a second argument "inline", records formatted on the calling threads):
 *
 *   test_audit_trace_threads count   THREADS threads record CALLS calls each, growing the
 *                                    file many times: every call is in the file exactly once
 *                                    (here, in end and in stack, every record ca_begin hands
 *                                    out is also at an address its type allows)
 *   test_audit_trace_threads end     the process ends (ca_trace_exit, as exit() or a fatal
 *                                    signal does) while THREADS threads record: every line
 *                                    in the finished file is a whole record
 *   test_audit_trace_threads stack   as count, with call sites (CACHESHIM_TRACE_STACK=4):
 *                                    the threads meet the objects of their stacks at once
 *                                    (here libc's, as the test program is the tracer's own
 *                                    code): each object's line is in the file exactly once,
 *                                    every record has its stack
 *   test_audit_trace_threads stall   the process ends while a thread forks (ca_fork_prepare
 *                                    to ca_fork_parent, 300 ms as for a large process): the
 *                                    formatter's lock is held for longer than the end waits
 *                                    for it, so the end leaves the ring's file; what the trace
 *                                    file and the ring hold then make every call exactly once
 *                                    (ca_recover)
 *   test_audit_trace_threads full    the formatter held up for 2 s (a thread in the middle
 *                                    of a fork) while a thread makes FULL_CALLS calls, more
 *                                    than the ring holds: the calls go on (one 200 ms wait,
 *                                    then those with no room are dropped at once), one line
 *                                    on stderr says so, the trace is whole, and its notes of
 *                                    dropped calls count every call not in it
 *   test_audit_trace_threads signal  a signal handler makes a traced call in the middle of
 *                                    its thread's own ca_end (held up there by a full ring),
 *                                    and another thread ends the process once the handler's
 *                                    call is written, before the handler returns: the end
 *                                    waits for the interrupted call's record, and the trace
 *                                    holds both calls, each once */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ca_format.h"
#include "ca_ring.h"
#include "ca_recover.h"
#include "ca_stack.h"
#include "ca_trace.h"
#include "cs_options.h"

#define THREADS 8
#define CALLS 3000

static int done, stop, end_early, forking;
/* Records at an address their type does not allow (ca_rec is 64-byte aligned, so that its
 * first cache line is one line): undefined behaviour, whatever the sanitizer's own allocator
 * happens to give (atomic). */
static int misaligned;

static void record(int i)
{
    ca_rec *r = ca_begin(CA_FN_cuMemAlloc_v2, 2, CA_LIB_DRIVER, NULL); /* from the program */
    if (!r)
        return; /* after the end */
    if ((uintptr_t)r % _Alignof(ca_rec))
        __atomic_fetch_add(&misaligned, 1, __ATOMIC_RELAXED);
    r->arg[0] = 0x1000;
    r->arg[1] = (uint64_t)i;
    ca_started(r);
    ca_stopped(r);
    ca_set_out(r, 0, 0x7000 + (uint64_t)i);
    ca_end(r, 0);
}

static void *worker(void *arg)
{
    (void)arg;
    for (int i = 0; i < CALLS; i++)
        record(i);
    __atomic_fetch_add(&done, 1, __ATOMIC_RELEASE);
    for (int i = 0; end_early && !__atomic_load_n(&stop, __ATOMIC_ACQUIRE); i++)
        record(i); /* until the end, and after it */
    return NULL;
}

static void *slow_fork(void *arg)
{
    (void)arg;
    ca_fork_prepare();
    __atomic_store_n(&forking, 1, __ATOMIC_RELEASE);
    usleep(300000);
    ca_fork_parent();
    return NULL;
}

/* stall: in a child, the calls made on its main thread while another thread forks, then the
 * end; the child gone (its lock on the ring's file with it), what it left recovered. */
static int stall(void)
{
    char dir[] = "/tmp/ca-ring-XXXXXX", trace[64], ring[80];
    if (!mkdtemp(dir))
        return 1;
    snprintf(trace, sizeof trace, "%s/trace", dir);
    snprintf(ring, sizeof ring, "%s" CA_RING_SUFFIX, trace);
    FILE *f = fopen(trace, "w+");
    if (!f)
        return 1;
    pid_t pid = fork();
    if (pid == 0) {
        ca_trace_init_fd(dup(fileno(f)), CS_TRACE_JSONL, "memory", ring);
        record(CALLS); /* the ring made */
        pthread_t t;
        pthread_create(&t, NULL, slow_fork, NULL);
        while (!__atomic_load_n(&forking, __ATOMIC_ACQUIRE))
            usleep(100);
        for (int i = 0; i < CALLS; i++)
            record(i);
        ca_trace_exit();
        pthread_join(t, NULL);
        usleep(100000); /* the formatter's turn */
        _exit(0);
    }
    int status;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || status != 0)
        return 1;
    char msg[9000];
    int rc = ca_recover(trace, msg, sizeof msg);
    printf("ca_recover: %d %s\n", rc, rc == CA_RECOVER_NONE ? "" : msg);
    int ring_left = access(ring, F_OK) == 0;
    long lines = 0, sum = 0;
    static char line[CA_REC_TEXT_MAX + 2];
    rewind(f);
    while (fgets(line, sizeof line, f)) {
        const char *b = strstr(line, "\"bytesize\":");
        lines++;
        sum += b ? atol(b + 11) : 0;
    }
    unlink(ring);
    unlink(trace);
    rmdir(dir);
    long want_sum = (long)CALLS * (CALLS - 1) / 2 + CALLS;
    printf("%ld lines (expected %d), size sum %ld (expected %ld)%s\n", lines, CALLS + 1, sum,
           want_sum, ring_left ? ", the ring's file left" : "");
    return lines == CALLS + 1 && sum == want_sum && !ring_left ? 0 : 1;
}

#define FULL_CALLS 300000

static void *held_fork(void *arg)
{
    (void)arg;
    ca_fork_prepare();
    __atomic_store_n(&forking, 1, __ATOMIC_RELEASE);
    usleep(2000000);
    __atomic_store_n(&forking, 2, __ATOMIC_RELEASE);
    ca_fork_parent();
    return NULL;
}

/* A run of body in a child whose stderr is a temporary file and whose trace (JSON Lines,
 * the memory calls) goes to another, its ring in a temporary directory: prepare runs first
 * in the child, before tracing starts; body ends the child with _exit. */
typedef struct {
    FILE *trace, *err;
    char dir[32], ring[64];
    int status; /* the child's exit status (waitpid's) */
} child_run;

static int run_child(child_run *c, void (*prepare)(void), void (*body)(void))
{
    c->trace = tmpfile();
    c->err = tmpfile();
    snprintf(c->dir, sizeof c->dir, "/tmp/ca-ring-XXXXXX");
    if (!c->trace || !c->err || !mkdtemp(c->dir))
        return -1;
    snprintf(c->ring, sizeof c->ring, "%s/ring", c->dir);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fileno(c->err), 2);
        if (prepare)
            prepare();
        ca_trace_init_fd(dup(fileno(c->trace)), CS_TRACE_JSONL, "memory", c->ring);
        record(0); /* the ring made */
        body();
        _exit(3);
    }
    if (pid < 0 || waitpid(pid, &c->status, 0) != pid || !WIFEXITED(c->status))
        return -1;
    rewind(c->trace);
    rewind(c->err);
    return 0;
}

/* Whether the child's ring's file was left; both removed. */
static int ring_left(child_run *c)
{
    int left = access(c->ring, F_OK) == 0;
    unlink(c->ring);
    rmdir(c->dir);
    return left;
}

/* full: in a child whose stderr is a file: the calls made while the formatter is held up. */
static void full_body(void)
{
    pthread_t t;
    pthread_create(&t, NULL, held_fork, NULL);
    while (!__atomic_load_n(&forking, __ATOMIC_ACQUIRE))
        usleep(100);
    for (int i = 0; i < FULL_CALLS; i++)
        record(i);
    /* 1: all made while the formatter was held up */
    int in_time = __atomic_load_n(&forking, __ATOMIC_ACQUIRE) == 1;
    pthread_join(t, NULL);
    ca_trace_exit();
    _exit(in_time ? 0 : 2);
}

static int full(void)
{
    child_run c;
    if (run_child(&c, NULL, full_body) != 0)
        return 1;
    FILE *f = c.trace, *err = c.err;
    int status = c.status;
    static char line[CA_REC_TEXT_MAX + 2];
    long lines = 0, whole = 0, said = 0, notes = 0, dropped = 0;
    while (fgets(line, sizeof line, f)) {
        size_t n = strlen(line);
        if (!strncmp(line, "{\"cacheshim_lost\":", 18) &&
            strstr(line, "\"error\":\"dropped: the ring of unformatted calls stayed full\"}\n")) {
            notes++;
            dropped += strtol(line + 18, NULL, 10);
            continue;
        }
        lines++;
        whole += n > 2 && line[0] == '{' && line[n - 2] == '}' && line[n - 1] == '\n';
    }
    while (fgets(line, sizeof line, err))
        said += strstr(line, "cacheshim: the trace's ring of unformatted calls stayed full") != NULL;
    int left = ring_left(&c);
    printf("calls made while the formatter was held up: %s; %ld records in the trace, %ld "
           "whole, and %ld dropped in %ld notes, of %d calls; said %ld times%s\n",
           WEXITSTATUS(status) == 0 ? "all" : "not all", lines, whole, dropped, notes,
           FULL_CALLS + 1, said, left ? "; the ring's file left" : "");
    return WEXITSTATUS(status) == 0 && whole == lines && lines > 1 && lines <= FULL_CALLS &&
                   notes >= 1 && lines + dropped == FULL_CALLS + 1 && said == 1 && !left
               ? 0
               : 1;
}

/* signal: the thread T's last call finds the ring full while the formatter's lock is held
 * (a fork under way, sig_holder), so T waits inside its ca_end; a signal there runs a
 * handler that makes a traced call of its own, which gets through once the lock is let go;
 * the main thread then ends the process while the handler, its call written, has not
 * returned yet. Stages (sig_stage): */
enum {
    SIG_KNOWN = 1, /* T has its thread's state (made under the lock the fork takes) */
    SIG_HELD,      /* the formatter's lock is held: the ring fills */
    SIG_FULL,      /* the ring is full: T makes the call that waits for room */
    SIG_HANDLER,   /* the handler runs: the lock may go */
    SIG_WRITTEN,   /* the handler's call is written */
    SIG_ENDING,    /* the end has begun */
};
#define SIG_OUTER 777777 /* the size of T's waiting call */
#define SIG_INNER 555555 /* the handler's */
#define SIG_STR_(x) #x
#define SIG_STR(x) SIG_STR_(x)
static int sig_stage;

static void sig_pause(long us)
{
    struct timespec ts = {us / 1000000, us % 1000000 * 1000};
    nanosleep(&ts, NULL); /* async-signal-safe, unlike usleep */
}

static void sig_wait(int stage)
{
    while (__atomic_load_n(&sig_stage, __ATOMIC_ACQUIRE) < stage)
        sig_pause(100);
}

static void sig_set(int stage)
{
    __atomic_store_n(&sig_stage, stage, __ATOMIC_RELEASE);
}

static void on_signal(int sig)
{
    (void)sig;
    sig_set(SIG_HANDLER);
    record(SIG_INNER);
    sig_set(SIG_WRITTEN);
    sig_wait(SIG_ENDING);
    sig_pause(50000); /* the end waits for T meanwhile, or finishes without T's record */
}

static void *sig_holder(void *arg)
{
    (void)arg;
    sig_wait(SIG_KNOWN);
    ca_fork_prepare();
    sig_set(SIG_HELD);
    sig_wait(SIG_HANDLER);
    ca_fork_parent();
    return NULL;
}

static void *sig_thread(void *arg)
{
    (void)arg;
    /* A cuMemAlloc_v2's raw record: its head, 2 arguments, 1 out-value and the 0 byte of its
     * (empty) string, rounded up to 8 (ca_ring.h). */
    const size_t rec = (sizeof(ca_raw_head) + 8 * 3 + 1 + 7) & ~(size_t)7;
    record(1);
    sig_set(SIG_KNOWN);
    sig_wait(SIG_HELD);
    while (ca_ring_size() - ca_ring_used() >= rec)
        record(2);
    sig_set(SIG_FULL);
    record(SIG_OUTER);
    return NULL;
}

/* A small ring (128 KiB: a file size limit lets the ring's file have no more, and the trace
 * its first MiB), filled and formatted in a moment; the handler in place. */
static void signal_prepare(void)
{
    struct rlimit lim = {1 << 20, 1 << 20};
    setrlimit(RLIMIT_FSIZE, &lim);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
}

static void signal_body(void)
{
    pthread_t t, h;
    pthread_create(&h, NULL, sig_holder, NULL);
    pthread_create(&t, NULL, sig_thread, NULL);
    sig_wait(SIG_FULL);
    usleep(20000); /* T waits for room (for up to 200 ms) */
    pthread_kill(t, SIGUSR1);
    sig_wait(SIG_WRITTEN);
    sig_set(SIG_ENDING);
    ca_trace_exit();
    pthread_join(t, NULL);
    pthread_join(h, NULL);
    _exit(0);
}

static int signalled(void)
{
    child_run c;
    if (run_child(&c, signal_prepare, signal_body) != 0 || WEXITSTATUS(c.status) != 0)
        return 1;
    FILE *f = c.trace, *err = c.err;
    static char line[CA_REC_TEXT_MAX + 2];
    long lines = 0, whole = 0, outer = 0, inner = 0;
    while (fgets(line, sizeof line, f)) {
        size_t n = strlen(line);
        lines++;
        whole += n > 2 && line[0] == '{' && line[n - 2] == '}' && line[n - 1] == '\n';
        outer += strstr(line, "\"bytesize\":" SIG_STR(SIG_OUTER) "}") != NULL;
        inner += strstr(line, "\"bytesize\":" SIG_STR(SIG_INNER) "}") != NULL;
    }
    while (fgets(line, sizeof line, err))
        fputs(line, stdout);
    int left = ring_left(&c);
    printf("%ld records, %ld whole; the interrupted call's %ld times, the handler's %ld "
           "times (each expected once)%s\n",
           lines, whole, outer, inner, left ? "; the ring's file left" : "");
    return whole == lines && lines > 2 && outer == 1 && inner == 1 && !left ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "stall") == 0)
        return stall();
    if (argc > 1 && strcmp(argv[1], "full") == 0)
        return full();
    if (argc > 1 && strcmp(argv[1], "signal") == 0)
        return signalled();
    end_early = argc > 1 && strcmp(argv[1], "end") == 0;
    int stacks = argc > 1 && strcmp(argv[1], "stack") == 0;
    int with_ring = !(argc > 2 && strcmp(argv[2], "inline") == 0);
    FILE *f = tmpfile();
    char dir[] = "/tmp/ca-ring-XXXXXX", ring[64];
    if (!f || !mkdtemp(dir))
        return 1;
    snprintf(ring, sizeof ring, "%s/ring", dir);
    ca_trace_init_fd(dup(fileno(f)), CS_TRACE_JSONL, "memory", with_ring ? ring : NULL);
    if (stacks)
        ca_stack_init(4);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, worker, NULL);
    if (end_early) {
        while (__atomic_load_n(&done, __ATOMIC_ACQUIRE) < 1)
            usleep(100);
        ca_trace_exit();
        __atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    ca_trace_exit();
    /* Everything formatted at the end: the ring's file is gone. */
    int ring_left = access(ring, F_OK) == 0;
    unlink(ring);
    rmdir(dir);
    if (ring_left) {
        printf("the ring's file is left after the end\n");
        return 1;
    }
    if (misaligned) {
        printf("%d records not aligned as ca_rec must be (%zu bytes)\n", misaligned,
               _Alignof(ca_rec));
        return 1;
    }
    rewind(f);
    static char line[CA_REC_TEXT_MAX + 2], objects[16][CA_REC_TEXT_MAX + 2];
    long lines = 0, whole = 0, sum = 0, nobj = 0, twice = 0, with_stack = 0;
    while (fgets(line, sizeof line, f)) {
        size_t n = strlen(line);
        if (strstr(line, "\"object\":")) {
            for (long i = 0; i < nobj; i++)
                twice += strcmp(objects[i], line) == 0;
            if (nobj < 16)
                snprintf(objects[nobj++], sizeof objects[0], "%s", line);
            continue;
        }
        with_stack += strstr(line, "\"stack\":[\"0x") != NULL;
        lines++;
        whole += n > 2 && line[0] == '{' && line[n - 2] == '}' && line[n - 1] == '\n';
        const char *b = strstr(line, "\"bytesize\":");
        if (b)
            sum += atol(b + 11);
    }
    if (end_early) {
        printf("%ld lines, %ld whole records\n", lines, whole);
        return lines >= CALLS && whole == lines ? 0 : 1;
    }
    if (stacks) {
        printf("%ld records with a stack of %ld, %ld objects, %ld written twice\n", with_stack,
               lines, nobj, twice);
        if (with_stack != lines || nobj == 0 || twice)
            return 1;
    }
    long want_sum = (long)THREADS * CALLS * (CALLS - 1) / 2;
    printf("%ld lines (expected %d), %ld whole, size sum %ld (expected %ld)\n", lines,
           THREADS * CALLS, whole, sum, want_sum);
    return lines == THREADS * CALLS && whole == lines && sum == want_sum ? 0 : 1;
}
