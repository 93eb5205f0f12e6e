/* File descriptors passed between processes (shim/cs_fdpass.c), without CUDA: replies of
 * every size around the batches of descriptors, a process with no server, a forked child
 * serving for itself, a server of another user, and requests that make no sense. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cs_fdpass.h"

/* A request is a count n; the reply is n memfds, the i-th holding the number i, and the
 * text "pid:<server's pid>". */
static void handler(const cs_fdpass_msg *req, cs_fdpass_msg *reply)
{
    uint32_t n = 0;
    if (req->len == sizeof n)
        memcpy(&n, req->data, sizeof n);
    for (uint32_t i = 0; i < n && i < CS_FDPASS_MAX_FDS; i++) {
        int fd = memfd_create("fdpass-test", MFD_CLOEXEC);
        if (fd < 0 || pwrite(fd, &i, sizeof i, 0) != sizeof i)
            abort();
        reply->fds[reply->nfds++] = fd;
    }
    reply->len = (size_t)snprintf((char *)reply->data, 64, "pid:%d", (int)getpid());
}

static cs_fdpass_msg g_req, g_reply;
static uint64_t g_token;  /* our server's */

static int ask(pid_t pid, uint64_t token, uint32_t n)
{
    memcpy(g_req.data, &n, sizeof n);
    g_req.len = sizeof n;
    memset(&g_reply, 0, sizeof g_reply);
    return cs_fdpass_ask(pid, token, &g_req, &g_reply);
}

static void serve(void)
{
    uint64_t t = 0;
    assert_int_equal(cs_fdpass_serve(handler, &t), 0);
    if (g_token)
        assert_int_equal(t, g_token);  /* the same server */
    g_token = t;
}

static int fcntl_ok(int fd)
{
    return fcntl(fd, F_GETFD) != -1;
}

static long open_fds(void)
{
    long n = 0;
    for (int fd = 0; fd < 65536; fd++)
        n += fcntl_ok(fd);
    return n;
}

static void test_replies_of_every_size(void **state)
{
    (void)state;
    serve();
    serve();  /* once per process */
    const uint32_t sizes[] = {0, 1, 63, 64, 65, 128, 300, CS_FDPASS_MAX_FDS};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        long before = open_fds();
        assert_int_equal(ask(getpid(), g_token, sizes[k]), 0);
        char want[32];
        snprintf(want, sizeof want, "pid:%d", (int)getpid());
        assert_int_equal(g_reply.len, strlen(want));
        assert_memory_equal(g_reply.data, want, g_reply.len);
        assert_int_equal(g_reply.nfds, sizes[k]);
        for (uint32_t i = 0; i < sizes[k]; i++) {
            uint32_t v = UINT32_MAX;
            assert_int_equal(pread(g_reply.fds[i], &v, sizeof v, 0), sizeof v);
            assert_int_equal(v, i);
            close(g_reply.fds[i]);
        }
        /* The server closes its copies and the connection once it sent them. */
        for (int wait = 0; wait < 200 && open_fds() != before; wait++)
            usleep(10 * 1000);
        assert_int_equal(open_fds(), before);
    }
}

/* No server: a process that is gone, or ours asked with another token (a name only the
 * handle's holder knows). */
static void test_no_server(void **state)
{
    (void)state;
    serve();
    pid_t gone = fork();
    if (gone == 0)
        _exit(0);
    assert_int_equal(waitpid(gone, NULL, 0), gone);
    assert_int_equal(ask(gone, g_token, 1), ECONNREFUSED);
    assert_int_equal(ask(getpid(), g_token ^ 1, 1), ECONNREFUSED);
    g_req.len = CS_FDPASS_MAX_DATA + 1;
    assert_int_equal(cs_fdpass_ask(getpid(), g_token, &g_req, &g_reply), EINVAL);
}

/* A forked child serving for itself, as the shim's fork handler makes it (as user `uid`
 * unless -1), until child_end. */
typedef struct {
    pid_t pid;
    int done;        /* a byte written here ends it */
    uint64_t token;  /* its server's */
} child_server;

static child_server child_start(int uid)
{
    int ready[2], done[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(done), 0);
    pid_t child = fork();
    if (child == 0) {
        close(ready[0]);
        close(done[1]);
        cs_fdpass_after_fork_child();
        uint64_t t = 0;
        char c;
        if ((uid >= 0 && (setgid((gid_t)uid) != 0 || setuid((uid_t)uid) != 0)) ||
            cs_fdpass_serve(handler, &t) != 0 || write(ready[1], &t, sizeof t) != sizeof t ||
            read(done[0], &c, 1) != 1)
            _exit(1);
        _exit(0);
    }
    close(ready[1]);  /* a child that dies is then an end of file, not a wait */
    close(done[0]);
    child_server c = {.pid = child, .done = done[1]};
    assert_int_equal(read(ready[0], &c.token, sizeof c.token), sizeof c.token);
    close(ready[0]);
    return c;
}

static void child_end(child_server c)
{
    assert_int_equal(write(c.done, "x", 1), 1);
    int status;
    assert_int_equal(waitpid(c.pid, &status, 0), c.pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(c.done);
}

/* A child after fork serves for itself (the parent's server is not its own); the parent
 * asks it. */
static void test_forked_child_serves(void **state)
{
    (void)state;
    serve();
    child_server child = child_start(-1);
    assert_true(child.token != g_token);
    assert_int_equal(ask(child.pid, g_token, 2), ECONNREFUSED);  /* the parent's token is not its */
    assert_int_equal(ask(child.pid, child.token, 2), 0);
    char want[32];
    snprintf(want, sizeof want, "pid:%d", (int)child.pid);
    assert_int_equal(g_reply.len, strlen(want));
    assert_memory_equal(g_reply.data, want, g_reply.len);
    assert_int_equal(g_reply.nfds, 2);
    close(g_reply.fds[0]);
    close(g_reply.fds[1]);
    child_end(child);
    /* And ours still answers. */
    assert_int_equal(ask(getpid(), g_token, 1), 0);
    close(g_reply.fds[0]);
}

/* A server of another user is not asked (nor would it answer). Needs root to make a process
 * of another user; without, only that the switch is refused is checked. */
static void test_other_user(void **state)
{
    (void)state;
    if (getuid() != 0) {
        assert_int_equal(setuid(65534), -1);
        return;
    }
    child_server child = child_start(65534);
    assert_int_equal(ask(child.pid, child.token, 1), EPERM);
    assert_int_equal(g_reply.nfds, 0);
    child_end(child);
}

/* A process whose effective user is not its real one (it dropped privileges with seteuid)
 * is still of its own user: it asks its own server, and is answered. The kernel names a
 * peer by its effective user. Needs root, as test_other_user. */
static void test_effective_user(void **state)
{
    (void)state;
    if (getuid() != 0) {
        assert_int_equal(seteuid(65534), -1);
        return;
    }
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        cs_fdpass_after_fork_child();
        uint64_t t = 0;
        if (setegid(65534) != 0 || seteuid(65534) != 0 || cs_fdpass_serve(handler, &t) != 0)
            _exit(2);
        int e = ask(getpid(), t, 2);
        if (e != 0 || g_reply.nfds != 2) {
            fprintf(stderr, "effective user: ask gave %s, %zu descriptors\n", strerror(e),
                    g_reply.nfds);
            _exit(3);
        }
        _exit(0);
    }
    int status;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* Bytes that are no request: the server hangs up without a reply, and keeps serving. */
static void test_garbage_request(void **state)
{
    (void)state;
    serve();
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int n = snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "cacheshim-ipc-%d-%016llx",
                     (int)getpid(), (unsigned long long)g_token);
    assert_int_equal(connect(fd, (struct sockaddr *)&a,
                             (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n)),
                     0);
    const char junk[] = "this is not a request at all";
    assert_int_equal(send(fd, junk, sizeof junk, 0), (ssize_t)sizeof junk);
    char buf[16];
    ssize_t k = recv(fd, buf, sizeof buf, 0);  /* closed (reset: our bytes went unread) */
    assert_true(k == 0 || (k < 0 && errno == ECONNRESET));
    close(fd);
    assert_int_equal(ask(getpid(), g_token, 3), 0);
    assert_int_equal(g_reply.nfds, 3);
    for (int i = 0; i < 3; i++)
        close(g_reply.fds[i]);
}

int main(void)
{
    /* The largest reply has CS_FDPASS_MAX_FDS descriptors at once. */
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
        r.rlim_cur = r.rlim_max;
        setrlimit(RLIMIT_NOFILE, &r);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replies_of_every_size),
        cmocka_unit_test(test_no_server),
        cmocka_unit_test(test_forked_child_serves),
        cmocka_unit_test(test_other_user),
        cmocka_unit_test(test_effective_user),
        cmocka_unit_test(test_garbage_request),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
