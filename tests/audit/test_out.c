/* A Chrome trace's file (audit/ca_out.c) as the process leaves it, read by the rules of
 * Perfetto's JSON reader (its json_trace_tokenizer.cc): first '[', events with whitespace and
 * one comma between them, a trailing comma, only whitespace after the last event or the first
 * part of one event at the very end; never a zero byte. A finished file must be strict JSON.
 * Each case runs in a child process of its own (the writer's state is the process's), which
 * ends as a killed program would (SIGKILL) or finishes the file (ca_out_finish). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "ca_out.h"
#include "cs_options.h"

/* ---- Perfetto's reader ------------------------------------------------------------------------ */

enum { JS_OK, JS_INCOMPLETE, JS_ERROR };

static size_t ws(const char *p, size_t n, size_t i)
{
    while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r'))
        i++;
    return i;
}

/* One JSON value at *i: JS_OK (*i after it), JS_INCOMPLETE (the text ends inside it) or
 * JS_ERROR. */
static int value(const char *p, size_t n, size_t *i);

static int string(const char *p, size_t n, size_t *i)
{
    for (size_t k = *i + 1; k < n; k++) {
        if (p[k] == '\\') {
            k++;
        } else if (p[k] == '"') {
            *i = k + 1;
            return JS_OK;
        } else if ((unsigned char)p[k] < 0x20) {
            return JS_ERROR;
        }
    }
    return JS_INCOMPLETE;
}

static int members(const char *p, size_t n, size_t *i, char close)
{
    size_t k = ws(p, n, *i + 1);
    if (k < n && p[k] == close) {
        *i = k + 1;
        return JS_OK;
    }
    for (;;) {
        if (k >= n)
            return JS_INCOMPLETE;
        if (close == '}') {
            if (p[k] != '"')
                return JS_ERROR;
            int r = string(p, n, &k);
            if (r != JS_OK)
                return r;
            k = ws(p, n, k);
            if (k >= n)
                return JS_INCOMPLETE;
            if (p[k] != ':')
                return JS_ERROR;
            k = ws(p, n, k + 1);
        }
        int r = value(p, n, &k);
        if (r != JS_OK)
            return r;
        k = ws(p, n, k);
        if (k >= n)
            return JS_INCOMPLETE;
        if (p[k] == close) {
            *i = k + 1;
            return JS_OK;
        }
        if (p[k] != ',')
            return JS_ERROR;
        k = ws(p, n, k + 1);
    }
}

static int value(const char *p, size_t n, size_t *i)
{
    size_t k = *i;
    if (k >= n)
        return JS_INCOMPLETE;
    if (p[k] == '{' || p[k] == '[')
        return members(p, n, i, p[k] == '{' ? '}' : ']');
    if (p[k] == '"')
        return string(p, n, i);
    static const char *const words[] = {"true", "false", "null"};
    for (int w = 0; w < 3; w++) {
        size_t len = strlen(words[w]);
        size_t have = n - k < len ? n - k : len;
        if (memcmp(p + k, words[w], have) == 0) {
            *i = k + have;
            return have < len ? JS_INCOMPLETE : JS_OK;
        }
    }
    size_t start = k;
    while (k < n && strchr("-+.eE0123456789", p[k]) && p[k] != '\0')
        k++;
    if (k == start)
        return JS_ERROR;
    *i = k;
    return k == n ? JS_INCOMPLETE : JS_OK;
}

/* The events Perfetto reads from the file, or -1 (why: on stderr). finished: the file must
 * also be strict JSON, its array closed. */
static long perfetto_reads(const char *p, size_t n, int finished)
{
    if (memchr(p, '\0', n)) {
        fprintf(stderr, "a zero byte at offset %zu\n", (size_t)((const char *)memchr(p, 0, n) - p));
        return -1;
    }
    size_t i = ws(p, n, 0);
    if (i >= n || p[i] != '[') {
        fprintf(stderr, "the first character is not '['\n");
        return -1;
    }
    i++;
    long events = 0;
    int comma = 0;
    for (;;) {
        i = ws(p, n, i);
        if (i < n && p[i] == ',') {
            comma = 1;
            i = ws(p, n, i + 1);
        }
        if (i >= n) {
            if (finished)
                fprintf(stderr, "a finished file without its closing ']'\n");
            return finished ? -1 : events;
        }
        if (p[i] == ']') {
            if (finished && comma) {
                fprintf(stderr, "a comma before the closing ']' (not strict JSON)\n");
                return -1;
            }
            if (ws(p, n, i + 1) != n) {
                fprintf(stderr, "more after the closing ']'\n");
                return -1;
            }
            return events;
        }
        size_t at = i;
        int r = p[i] == '{' ? value(p, n, &i) : JS_ERROR;
        if (r == JS_ERROR || (r == JS_INCOMPLETE && finished)) {
            fprintf(stderr, "%s at offset %zu: %.120s\n",
                    r == JS_ERROR ? "not an event" : "an event cut off", at, p + at);
            return -1;
        }
        if (r == JS_INCOMPLETE) /* the first part of an event, then the end of the file */
            return events;
        events++;
        comma = 0;
    }
}

/* ---- the cases -------------------------------------------------------------------------------- */

static char g_dir[64], g_path[96];

static size_t event(char *buf, size_t cap, int i, size_t pad)
{
    char name[512];
    memset(name, 'x', pad);
    name[pad] = '\0';
    int n = snprintf(buf, cap,
                     "{\"name\":\"e%d%s\",\"ph\":\"X\",\"ts\":%d,\"dur\":1,\"pid\":1,\"tid\":1},\n",
                     i, name, i);
    return (size_t)n;
}

static void append_event(int i)
{
    char buf[640];
    ca_out_append(buf, event(buf, sizeof buf, i, 0), 1);
}

/* Runs fn in a child, then reads the trace: how the child ended (a wait status), the text. */
static int run_child(void (*fn)(void), char **text, size_t *len)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/cacheaudit-out.XXXXXX");
    assert_non_null(mkdtemp(g_dir));
    snprintf(g_path, sizeof g_path, "%s/trace.json", g_dir);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        fn();
        _exit(0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    *text = NULL;
    *len = 0;
    FILE *f = fopen(g_path, "rb");
    if (f) {
        struct stat st;
        assert_int_equal(fstat(fileno(f), &st), 0);
        *text = malloc((size_t)st.st_size + 1);
        assert_non_null(*text);
        *len = fread(*text, 1, (size_t)st.st_size, f);
        fclose(f);
    }
    char pending[128];
    snprintf(pending, sizeof pending, "%s.pending", g_path);
    unlink(pending);
    unlink(g_path);
    rmdir(g_dir);
    return status;
}

static void killed(void)
{
    fflush(NULL);
    raise(SIGKILL);
}

/* A write error (the file reaches RLIMIT_FSIZE): the note of calls not written, kept at the
 * end of the mapping, is there when the process is killed; the file holds no zero byte. The
 * helper thread meets the error (it grows the file 4 MiB ahead, from the first record on),
 * and this thread, which has seen it, counts its calls in the note (no lock between them:
 * ThreadSanitizer sees how the note is handed over). */
static void note_child(void)
{
    struct rlimit lim = {((rlim_t)1 << 20) + 4096, RLIM_INFINITY};
    if (setrlimit(RLIMIT_FSIZE, &lim) != 0)
        _exit(2);
    ca_out_open(g_path, CS_TRACE_PERFETTO);
    append_event(0);
    const char *error = "";
    for (int i = 0; i < 10000 && !*error; i++) {
        (void)ca_out_lost(&error);
        usleep(100);
    }
    for (int i = 1; i < 100; i++)
        append_event(i);
    if (ca_out_lost(&error) != 99)
        _exit(3);
    killed();
}

static void test_killed_after_a_write_error(void **state)
{
    (void)state;
    char *text;
    size_t len;
    int status = run_child(note_child, &text, &len);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    assert_non_null(text);
    assert_non_null(strstr(text, "\"name\":\"cacheshim: calls not written\""));
    assert_non_null(strstr(text, "\"lost\":                  99,"));
    assert_int_equal(perfetto_reads(text, len, 0), 2); /* the first record and the note */
    free(text);
}

/* Several threads write (no ring), one of them held in the middle of its copy: its source
 * text runs into a page it cannot read, where SIGSEGV stops it (held: for good; else for
 * 30 ms, then the page is made readable and the copy goes on). */
static char *g_src;
static size_t g_src_len, g_page;
static int g_stuck, g_hold_for_good, g_b_done, g_handler_records;

static void append_event(int i);

static void on_segv(int sig)
{
    (void)sig;
    __atomic_store_n(&g_stuck, 1, __ATOMIC_RELEASE);
    if (__atomic_load_n(&g_hold_for_good, __ATOMIC_ACQUIRE))
        for (;;)
            pause();
    if (__atomic_load_n(&g_handler_records, __ATOMIC_ACQUIRE)) /* a call of its own */
        append_event(500);
    struct timespec t = {0, 30 * 1000 * 1000};
    nanosleep(&t, NULL);
    mprotect(g_src + g_page, g_page, PROT_READ);
}

static void *writer_a(void *arg)
{
    (void)arg;
    ca_out_append(g_src + g_page - g_src_len / 2, g_src_len, 1);
    return NULL;
}

static void *writer_b(void *arg)
{
    (void)arg;
    append_event(1000);
    __atomic_store_n(&g_b_done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* Thread A's event: 300 bytes, its second half on a page that is then made unreadable. */
static pthread_t start_held_writer(void)
{
    g_page = (size_t)sysconf(_SC_PAGESIZE);
    g_src = mmap(NULL, 2 * g_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (g_src == MAP_FAILED)
        _exit(2);
    char text[640];
    g_src_len = event(text, sizeof text, 999, 240);
    memcpy(g_src + g_page - g_src_len / 2, text, g_src_len);
    mprotect(g_src + g_page, g_page, PROT_NONE);
    struct sigaction sa = {.sa_handler = on_segv};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, NULL);
    ca_out_open(g_path, CS_TRACE_PERFETTO);
    append_event(0);
    append_event(1);
    pthread_t a;
    if (pthread_create(&a, NULL, writer_a, NULL) != 0)
        _exit(2);
    while (!__atomic_load_n(&g_stuck, __ATOMIC_ACQUIRE))
        usleep(100);
    return a;
}

/* Killed while A is held: another thread's record may not follow A's first part. */
static void held_child(void)
{
    __atomic_store_n(&g_hold_for_good, 1, __ATOMIC_RELEASE);
    (void)start_held_writer();
    pthread_t b;
    if (pthread_create(&b, NULL, writer_b, NULL) != 0)
        _exit(2);
    for (int i = 0; i < 200 && !__atomic_load_n(&g_b_done, __ATOMIC_ACQUIRE); i++)
        usleep(1000);
    killed();
}

static void test_killed_while_a_thread_copies(void **state)
{
    (void)state;
    char *text;
    size_t len;
    int status = run_child(held_child, &text, &len);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    assert_non_null(text);
    assert_true(perfetto_reads(text, len, 0) >= 2);
    free(text);
}

/* The end (exit) while A is in the middle of its copy, which it completes 30 ms later: the
 * file is cut after A's record and closed as strict JSON. */
static void end_child(void)
{
    pthread_t a = start_held_writer();
    ca_out_finish();
    pthread_join(a, NULL);
}

static void test_end_while_a_thread_copies(void **state)
{
    (void)state;
    char *text;
    size_t len;
    int status = run_child(end_child, &text, &len);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_non_null(text);
    assert_true(perfetto_reads(text, len, 1) >= 2);
    free(text);
}

/* The same with a signal handler that records a call on A's thread, in the middle of A's copy
 * (as a program's handler may make driver calls): it must not wait for its own thread. */
static void handler_child(void)
{
    alarm(10); /* SIGALRM ends a child that waits for itself */
    __atomic_store_n(&g_handler_records, 1, __ATOMIC_RELEASE);
    pthread_t a = start_held_writer();
    pthread_join(a, NULL);
    ca_out_finish();
}

static void test_handler_records_during_a_copy(void **state)
{
    (void)state;
    char *text;
    size_t len;
    int status = run_child(handler_child, &text, &len);
    assert_int_equal(WIFSIGNALED(status) ? WTERMSIG(status) : 0, 0); /* not SIGALRM (14) */
    assert_non_null(text);
    assert_true(perfetto_reads(text, len, 1) >= 4);
    free(text);
}

/* A file size limit smaller than the header ("[\n"): the first growth fails, and the end,
 * which writes the header and "]" itself, must not raise SIGXFSZ (which would end the
 * program). */
static void tiny_limit_child(void)
{
    struct rlimit lim = {1, RLIM_INFINITY};
    if (setrlimit(RLIMIT_FSIZE, &lim) != 0)
        _exit(2);
    ca_out_open(g_path, CS_TRACE_PERFETTO);
    append_event(0);
    ca_out_finish();
}

static void test_end_under_a_tiny_file_size_limit(void **state)
{
    (void)state;
    char *text;
    size_t len;
    int status = run_child(tiny_limit_child, &text, &len);
    assert_int_equal(WIFSIGNALED(status) ? WTERMSIG(status) : 0, 0); /* not SIGXFSZ (25) */
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_non_null(text);
    assert_true(len <= 1 && memcmp(text, "[", len) == 0);
    free(text);
}

/* The checker itself: what Perfetto takes and what it refuses. */
static void test_reader(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        long open, closed; /* events read, -1: refused */
    } cases[] = {
        {"[\n{\"a\":1},\n{\"b\":[2,\"x\"]},\n   ", 2, -1},
        {"[\n{\"a\":1},\n{\"b\":[2,\"x\"]}\n]\n", 2, 2},
        {"[\n{\"a\":1},\n]\n", 1, -1},
        {"[\n{\"a\":1},\n{\"b\":\"cut   ", 1, -1},
        {"[\n{\"a\":1},\n{\"b\":\"cut   {\"c\":1},\n   ", -1, -1},
        {"[\n{\"a\":1},\n{\"b\":1,   {\"c\":1},\n   ", -1, -1},
        {"[\n{\"a\":1},\n  \0  ", -1, -1},
        {"{\"traceEvents\":[\n{\"a\":1},\n", -1, -1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t n = strlen(cases[c].text);
        if (c == 6) /* its zero byte, and the two spaces after it */
            n += 3;
        assert_int_equal(perfetto_reads(cases[c].text, n, 0), cases[c].open);
        assert_int_equal(perfetto_reads(cases[c].text, n, 1), cases[c].closed);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reader),
        cmocka_unit_test(test_killed_after_a_write_error),
        cmocka_unit_test(test_killed_while_a_thread_copies),
        cmocka_unit_test(test_end_while_a_thread_copies),
        cmocka_unit_test(test_handler_records_during_a_copy),
        cmocka_unit_test(test_end_under_a_tiny_file_size_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
