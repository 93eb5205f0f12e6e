/* File descriptors passed between processes (see cs_fdpass.h). On the socket, a request is a
 * header (magic, length) and its bytes; a reply a header (magic, length, descriptor count),
 * its bytes, then its descriptors, at most BATCH to a one-byte message. */
#include "cs_fdpass.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/random.h>
#include <sys/un.h>
#include <unistd.h>

#define MAGIC 0x44465343u  /* "CSFD" */
#define BATCH 64           /* descriptors per message (the kernel takes up to 253) */
#define TIMEOUT_S 10       /* a peer that stops answering is given up */

typedef struct {
    uint32_t magic, len, nfds;
} header;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pid_t g_pid;           /* the process whose server runs (0: none) */
static int g_fd = -1;         /* its listening socket */
static uint64_t g_token;
static cs_fdpass_handler g_handler;

/* The abstract address of a server: no file, gone with the process. */
static socklen_t address_of(pid_t pid, uint64_t token, struct sockaddr_un *a)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "cacheshim-ipc-%ld-%016llx",
                     (long)pid, (unsigned long long)token);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static void set_timeouts(int fd)
{
    struct timeval tv = {.tv_sec = TIMEOUT_S};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

static int error_of(int e)
{
    return e == EAGAIN || e == EWOULDBLOCK ? ETIMEDOUT : e ? e : EPROTO;
}

/* All of n bytes sent (out) or received, or an errno (EPROTO: the peer closed first). */
static int transfer(int fd, char *c, size_t n, bool out)
{
    while (n) {
        ssize_t k = out ? send(fd, c, n, MSG_NOSIGNAL) : recv(fd, c, n, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return error_of(k < 0 ? errno : 0);
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

static int send_all(int fd, const void *p, size_t n)
{
    return transfer(fd, (char *)p, n, true);  /* only read from */
}

static int recv_all(int fd, void *p, size_t n)
{
    return transfer(fd, p, n, false);
}

static int send_fds(int fd, const int *fds, size_t n)
{
    for (size_t i = 0; i < n; i += BATCH) {
        size_t k = n - i < BATCH ? n - i : BATCH;
        char byte = 0, ctl[CMSG_SPACE(BATCH * sizeof(int))];
        memset(ctl, 0, sizeof ctl);
        struct iovec iov = {&byte, 1};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl,
                           .msg_controllen = CMSG_SPACE(k * sizeof(int))};
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(k * sizeof(int));
        memcpy(CMSG_DATA(c), fds + i, k * sizeof(int));
        ssize_t r;
        while ((r = sendmsg(fd, &m, MSG_NOSIGNAL)) < 0 && errno == EINTR)
            ;
        if (r != 1)
            return error_of(r < 0 ? errno : 0);
    }
    return 0;
}

/* n descriptors into fds; those received before a failure are closed. */
static int recv_fds(int fd, int *fds, size_t n)
{
    size_t got = 0;
    int rc = 0;
    while (got < n && !rc) {
        size_t k = n - got < BATCH ? n - got : BATCH;
        char byte, ctl[CMSG_SPACE(BATCH * sizeof(int))];
        struct iovec iov = {&byte, 1};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl,
                           .msg_controllen = sizeof ctl};
        ssize_t r;
        while ((r = recvmsg(fd, &m, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR)
            ;
        if (r != 1) {
            rc = error_of(r < 0 ? errno : 0);
            break;
        }
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        size_t carried = c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS
                             ? (c->cmsg_len - CMSG_LEN(0)) / sizeof(int)
                             : 0;
        if (carried)
            memcpy(fds + got, CMSG_DATA(c), (carried < k ? carried : k) * sizeof(int));
        for (size_t j = k; j < carried; j++) {  /* more than announced: not ours to keep */
            int extra;
            memcpy(&extra, CMSG_DATA(c) + j * sizeof(int), sizeof extra);
            close(extra);
        }
        got += carried < k ? carried : k;
        if (m.msg_flags & MSG_CTRUNC)
            rc = EMFILE;  /* the kernel dropped descriptors this process has no room for */
        else if (carried != k)
            rc = EPROTO;
    }
    if (rc)
        for (size_t j = 0; j < got; j++)
            close(fds[j]);
    return rc;
}

/* ---------------------------------------------------------------- the server */

/* The peer's user is its effective one (SO_PEERCRED): compared with ours. */
static bool same_user(int fd)
{
    struct ucred cred;
    socklen_t len = sizeof cred;
    return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == geteuid();
}

static void answer(int fd, cs_fdpass_msg *req, cs_fdpass_msg *reply)
{
    header h;
    set_timeouts(fd);
    if (!same_user(fd) || recv_all(fd, &h, sizeof h) || h.magic != MAGIC ||
        h.len > CS_FDPASS_MAX_DATA || recv_all(fd, req->data, h.len))
        return;
    req->len = h.len;
    req->nfds = 0;
    reply->len = reply->nfds = 0;
    g_handler(req, reply);
    h = (header){MAGIC, (uint32_t)reply->len, (uint32_t)reply->nfds};
    if (!send_all(fd, &h, sizeof h) && !send_all(fd, reply->data, reply->len))
        send_fds(fd, reply->fds, reply->nfds);
    for (size_t i = 0; i < reply->nfds; i++)
        close(reply->fds[i]);
}

static void *serve(void *arg)
{
    int listener = (int)(intptr_t)arg;
    cs_fdpass_msg *req = malloc(sizeof *req), *reply = malloc(sizeof *reply);
    for (;;) {
        int fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE ||
                errno == ENOBUFS || errno == ENOMEM) {
                if (errno != EINTR && errno != ECONNABORTED)
                    sleep(1);  /* out of descriptors or memory: try again later */
                continue;
            }
            break;  /* the socket is gone */
        }
        if (req && reply)
            answer(fd, req, reply);
        close(fd);
    }
    free(req);
    free(reply);
    return NULL;
}

/* At exit the server stops taking requests: the driver may be torn down soon. */
static void stop(void)
{
    pthread_mutex_lock(&g_lock);
    if (g_pid == getpid() && g_fd >= 0)
        shutdown(g_fd, SHUT_RDWR);  /* accept fails: the thread ends */
    pthread_mutex_unlock(&g_lock);
}

int cs_fdpass_serve(cs_fdpass_handler handler, uint64_t *token)
{
    static bool stop_at_exit;
    pthread_mutex_lock(&g_lock);
    int rc = 0;
    if (g_pid == getpid())
        goto out;
    if (g_fd >= 0)
        close(g_fd);  /* a parent's, if the fork handler did not run */
    g_fd = -1;
    g_handler = handler;
    if (getrandom(&g_token, sizeof g_token, 0) != sizeof g_token) {
        rc = errno ? errno : EIO;
        goto out;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a;
    socklen_t len = address_of(getpid(), g_token, &a);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, len) != 0 || listen(fd, 64) != 0) {
        rc = errno ? errno : EPROTO;
        if (fd >= 0)
            close(fd);
        goto out;
    }
    /* The thread takes none of the program's signals. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr;
    pthread_t t;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    rc = pthread_create(&t, &attr, serve, (void *)(intptr_t)fd);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) {
        close(fd);
        goto out;
    }
    g_fd = fd;
    g_pid = getpid();
    if (!stop_at_exit)
        stop_at_exit = atexit(stop) == 0;
out:
    *token = g_token;
    pthread_mutex_unlock(&g_lock);
    return rc;
}

void cs_fdpass_after_fork_child(void)
{
    /* A fork during cs_fdpass_serve left the lock held: the child's is new. */
    pthread_mutex_init(&g_lock, NULL);
    if (g_fd >= 0)
        close(g_fd);  /* else the parent's name stays bound for as long as the child lives */
    g_fd = -1;
    g_pid = 0;
}

/* ---------------------------------------------------------------- asking */

int cs_fdpass_ask(pid_t pid, uint64_t token, const cs_fdpass_msg *request, cs_fdpass_msg *reply)
{
    if (request->len > CS_FDPASS_MAX_DATA)
        return EINVAL;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return errno;
    set_timeouts(fd);
    struct sockaddr_un a;
    socklen_t len = address_of(pid, token, &a);
    int rc;
    while ((rc = connect(fd, (struct sockaddr *)&a, len)) != 0 && errno == EINTR)
        ;
    header h = {MAGIC, (uint32_t)request->len, 0};
    if (rc != 0)
        rc = errno == ENOENT ? ECONNREFUSED : error_of(errno);  /* no such name: no server */
    else if (!same_user(fd))
        rc = EPERM;
    else if (!(rc = send_all(fd, &h, sizeof h)) && !(rc = send_all(fd, request->data, request->len)) &&
             !(rc = recv_all(fd, &h, sizeof h))) {
        if (h.magic != MAGIC || h.len > CS_FDPASS_MAX_DATA || h.nfds > CS_FDPASS_MAX_FDS)
            rc = EPROTO;
        else if (!(rc = recv_all(fd, reply->data, h.len)) &&
                 !(rc = recv_fds(fd, reply->fds, h.nfds))) {
            reply->len = h.len;
            reply->nfds = h.nfds;
        }
    }
    close(fd);
    return rc;
}
