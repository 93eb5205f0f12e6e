/* What the writer's files and locks need of the system, done the same way wherever they
 * need it (layer 3, under ca_out.c, ca_ring.c and ca_drain.c; see ca_desc.h). */
#ifndef CA_SYS_H
#define CA_SYS_H

#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <sys/types.h>

/* Blocks [off, off + len) of fd (posix_fallocate), or the errno. Past RLIMIT_FSIZE the
 * kernel also sends SIGXFSZ, whose default action would kill the program: it is blocked
 * here and taken back. */
int ca_sys_allocate(int fd, off_t off, off_t len);
/* fd, off bytes long, made off + len bytes long: head (nhead bytes, at most len) at off, then
 * spaces, written (pwritev), not allocated: the file never holds a zero byte, even when
 * the process dies in the middle (the kernel lengthens it as it writes). 0, or the errno
 * (ENOSPC, EFBIG past RLIMIT_FSIZE, whose SIGXFSZ is blocked and taken back as above). */
int ca_sys_extend_blank(int fd, off_t off, size_t len, const char *head, size_t nhead);
/* The same for write()s to a regular file (stderr redirected to one): SIGXFSZ blocked from
 * ca_sys_xfsz_block to ca_sys_xfsz_unblock, which takes back one that a failure (err not 0)
 * raised meanwhile. */
typedef struct {
    sigset_t old;
    int was_pending;
} ca_sys_xfsz;
void ca_sys_xfsz_block(ca_sys_xfsz *x);
void ca_sys_xfsz_unblock(ca_sys_xfsz *x, int err);
/* The pages of [p, p + len) of a shared mapping brought in now, writable (Linux 5.14;
 * older kernels fault them in at their first write), 64 KiB at a time: the kernel holds
 * the process's memory-map lock while it fills them, and the program's own mmap, munmap
 * and page faults wait behind it. */
void ca_sys_populate(void *p, size_t len);
/* m locked within about ms milliseconds (trylock, then again every 100 us): 1, or 0 when a
 * thread stopped while holding it (in a debugger, or the one that crashed) would hold up
 * the end of the process. */
int ca_sys_lock_within(pthread_mutex_t *m, int ms);
/* A detached thread running fn, named `name`, with every signal blocked (signals stay with the
 * program's threads): 1, or 0 when it could not be made. */
int ca_sys_thread(void *(*fn)(void *), const char *name);

#endif
