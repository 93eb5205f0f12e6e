/* File descriptors passed between processes of one user, for IPC export of pooled memory
 * (cs_ipc.c). A process that has something to give starts a server: one thread, listening on
 * an abstract unix socket named after the process's pid and a random token (so nothing is
 * left on disk, a process that died leaves nothing behind, and no other process can take the
 * name first or by chance: processes of two containers may have the same pid). Another
 * process that knows both asks with one request; the reply is bytes and descriptors
 * (SCM_RIGHTS). Each side talks only to a process of its own user. No CUDA. */
#ifndef CS_FDPASS_H
#define CS_FDPASS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define CS_FDPASS_MAX_DATA 65536  /* bytes of a request or a reply */
#define CS_FDPASS_MAX_FDS 4096    /* descriptors of a reply */

typedef struct {
    unsigned char data[CS_FDPASS_MAX_DATA];
    size_t len;
    int fds[CS_FDPASS_MAX_FDS];
    size_t nfds;
} cs_fdpass_msg;

/* Fills a reply to a request (on the server's thread); the server closes the reply's
 * descriptors once they are sent (or not: the asker went away). */
typedef void (*cs_fdpass_handler)(const cs_fdpass_msg *request, cs_fdpass_msg *reply);

/* Start this process's server, once (again in a child after fork: the parent's is not its
 * own), and say its token. 0, or an errno. The handler is the same for the process's life. */
int cs_fdpass_serve(cs_fdpass_handler handler, uint64_t *token);

/* Ask the server of process `pid` with that token: 0 with *reply filled (its descriptors are
 * the caller's to close), or an errno (ECONNREFUSED: no such server, the process is gone or
 * never served; ETIMEDOUT: it did not answer within seconds; EPERM: another user's; EMFILE:
 * no room for the descriptors here; EPROTO: a reply that makes no sense). */
int cs_fdpass_ask(pid_t pid, uint64_t token, const cs_fdpass_msg *request, cs_fdpass_msg *reply);

/* A forked child: the parent's server is not the child's (its socket is closed here). */
void cs_fdpass_after_fork_child(void);

#endif
