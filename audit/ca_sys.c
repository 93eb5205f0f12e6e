/* What the writer's files and locks need of the system (ca_sys.h). */
#include "ca_sys.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

#define POPULATE_STEP ((size_t)64 << 10)

int ca_sys_allocate(int fd, off_t off, off_t len)
{
    sigset_t xfsz, old, pending;
    sigemptyset(&xfsz);
    sigaddset(&xfsz, SIGXFSZ);
    pthread_sigmask(SIG_BLOCK, &xfsz, &old);
    int was_pending = sigpending(&pending) == 0 && sigismember(&pending, SIGXFSZ);
    int err = posix_fallocate(fd, off, len);
    if (err && !was_pending && sigpending(&pending) == 0 && sigismember(&pending, SIGXFSZ)) {
        struct timespec zero = {0, 0};
        sigtimedwait(&xfsz, NULL, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
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
