/* What the writer's files and locks need of the system (ca_sys.h). */
#include "ca_sys.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

#define POPULATE_STEP ((size_t)64 << 10)

void ca_sys_xfsz_block(ca_sys_xfsz *x)
{
    sigset_t xfsz, pending;
    sigemptyset(&xfsz);
    sigaddset(&xfsz, SIGXFSZ);
    pthread_sigmask(SIG_BLOCK, &xfsz, &x->old);
    x->was_pending = sigpending(&pending) == 0 && sigismember(&pending, SIGXFSZ);
}

void ca_sys_xfsz_unblock(ca_sys_xfsz *x, int err)
{
    sigset_t xfsz, pending;
    sigemptyset(&xfsz);
    sigaddset(&xfsz, SIGXFSZ);
    if (err && !x->was_pending && sigpending(&pending) == 0 && sigismember(&pending, SIGXFSZ)) {
        struct timespec zero = {0, 0};
        sigtimedwait(&xfsz, NULL, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &x->old, NULL);
}

int ca_sys_allocate(int fd, off_t off, off_t len)
{
    ca_sys_xfsz x;
    ca_sys_xfsz_block(&x);
    int err = posix_fallocate(fd, off, len);
    ca_sys_xfsz_unblock(&x, err);
    return err;
}

int ca_sys_extend_blank(int fd, off_t off, size_t len, const char *head, size_t nhead)
{
    static const char spaces[4096] = {[0 ... 4095] = ' '};
    ca_sys_xfsz x;
    ca_sys_xfsz_block(&x);
    int err = 0;
    size_t done = 0;
    while (done < len && !err) {
        struct iovec v[32]; /* up to 128 KiB a system call */
        int n = 0;
        size_t planned = 0;
        if (done < nhead) { /* what is left of the head, then spaces */
            v[n++] = (struct iovec){(char *)head + done, nhead - done};
            planned = nhead - done;
        }
        while (n < 32 && done + planned < len) {
            size_t left = len - (done + planned);
            size_t piece = left < sizeof spaces ? left : sizeof spaces;
            v[n++] = (struct iovec){(char *)spaces, piece};
            planned += piece;
        }
        ssize_t w = pwritev(fd, v, n, off + (off_t)done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            err = errno;
        else if (w == 0)
            err = EIO;
        else
            done += (size_t)w;
    }
    ca_sys_xfsz_unblock(&x, err);
    return err;
}

void ca_sys_populate(void *p, size_t len)
{
    for (size_t at = 0; at < len; at += POPULATE_STEP)
        (void)madvise((char *)p + at, POPULATE_STEP < len - at ? POPULATE_STEP : len - at,
                      MADV_POPULATE_WRITE);
}

int ca_sys_lock_within(pthread_mutex_t *m, int ms)
{
    for (int i = 0; i < 10 * ms; i++) {
        if (pthread_mutex_trylock(m) == 0)
            return 1;
        usleep(100);
    }
    return 0;
}

int ca_sys_thread(void *(*fn)(void *), const char *name)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr, dflt;
    pthread_t t;
    int ok = 0;
    /* The default size plus 256 KiB: glibc carves a thread's static TLS out of its stack, and
     * where the TLS is large (glibc.rtld.optional_static_tls, which a ThreadSanitizer
     * program needs under LD_AUDIT) its default leaves some 8 KiB of stack, which a
     * lazily bound libc function and a message's buffers overflow. Address space only. */
    size_t size = (size_t)8 << 20;
    if (pthread_getattr_default_np(&dflt) == 0) {
        (void)pthread_attr_getstacksize(&dflt, &size);
        pthread_attr_destroy(&dflt);
    }
    if (pthread_attr_init(&attr) == 0) {
        ok = pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED) == 0 &&
             pthread_attr_setstacksize(&attr, size + ((size_t)256 << 10)) == 0 &&
             pthread_create(&t, &attr, fn, NULL) == 0;
        pthread_attr_destroy(&attr);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (ok)
        pthread_setname_np(t, name);
    return ok;
}
