/* A cap shared by a group of processes (CACHESHIM_GROUP): processes of one user that name the
 * same group share one CACHESHIM_CAP per device, identified by UUID, through a file in shared
 * memory (/dev/shm/cacheshim-UID-NAME, mode 0600) that every member maps.
 *
 * The segment has a slot per member. A member writes only its own slot: per device (by its
 * own ordinal) the device's UUID, the bytes it holds, the bytes it is trying to add (want)
 * and its cap. Nothing in the segment is a lock: a charge adds to its want, sums every live
 * member's bytes and wants of that UUID, and turns want into bytes when the sum is within the
 * cap (two members charging at once: at least one of them sees the other). A slot belongs to
 * a member instance, named by a token of pid and start time (/proc/PID/stat), so a reused pid
 * is never taken for the member. A member that is gone (no such process, a zombie, exiting,
 * a SIGKILL on its way, another start time) still counts until someone needs its room: a charge that does not fit first
 * frees the slots of dead members and tries again, so a process killed with SIGKILL costs
 * the others nothing and nobody ever waits for it.
 *
 * A segment is refused, never trusted, when it is not a regular file of this user with mode
 * 0600 (no access for others), when its size, magic, version, owner or name differ from what
 * this code writes, or when a slot holds a value this code never writes.
 *
 * CUDA-free and driver-free: the shim passes UUIDs in. Thread-safe. */
#ifndef CS_GROUP_H
#define CS_GROUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define CS_GROUP_VERSION 1
#define CS_GROUP_MEMBERS 128     /* live members a group can have */
#define CS_GROUP_DEVICES 64      /* device ordinals a member can use (CS_MAX_DEVICES) */
#define CS_GROUP_NAME_MAX 64     /* letters, digits, '.', '_' and '-' */
#define CS_GROUP_DIR "/dev/shm"  /* where the shim keeps segments (shm_open's directory) */
#define CS_GROUP_PREFIX "cacheshim-"
#define CS_GROUP_UNLIMITED UINT64_MAX

typedef struct cs_group cs_group;

/* Why a segment could not be used. */
typedef enum {
    CS_GROUP_OK = 0,
    CS_GROUP_BAD_NAME,      /* the name is not 1-64 of [A-Za-z0-9._-] */
    CS_GROUP_SYSTEM,        /* a system call failed: errno in the detail */
    CS_GROUP_NOT_OWNED,     /* the file belongs to another user (detail: its uid) */
    CS_GROUP_OPEN_TO_OTHERS,/* other users may read or write it (detail: its mode) */
    CS_GROUP_NOT_FILE,      /* not a regular file */
    CS_GROUP_MALFORMED,     /* size, magic or a slot not as this code writes them */
    CS_GROUP_OTHER_VERSION, /* another layout version (detail: its version) */
    CS_GROUP_OTHER_NAMESPACE, /* made in another PID namespace: its pids are not ours */
    CS_GROUP_FULL,          /* CS_GROUP_MEMBERS live members already */
    CS_GROUP_NO_PROC,       /* /proc/self/stat unreadable: no start time to name us by */
} cs_group_error;

/* A failure: what went wrong and one number that details it (errno, uid, mode, version). */
typedef struct {
    cs_group_error error;
    long detail;
    char path[256];
} cs_group_status;

/* Why the segment was refused, for a message after its path: "belongs to uid 0, not to this
 * user (uid 1000): refused", "is malformed (not a segment this cacheshim writes): refused"... */
void cs_group_explain(const cs_group_status *st, char *buf, size_t len);

/* Is name a valid group name: 1-64 of letters, digits, '.', '_' and '-', not starting with
 * '.'? (Inline: the options parser checks names with it too.) */
static inline bool cs_group_name_ok(const char *name)
{
    size_t n = 0;
    for (; name && name[n]; n++) {
        char c = name[n];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-') || n >= CS_GROUP_NAME_MAX)
            return false;
    }
    return n > 0 && name[0] != '.';
}
/* dir/cacheshim-UID-NAME into buf; false when it does not fit. */
bool cs_group_path(const char *dir, unsigned uid, const char *name, char *buf, size_t len);

/* Opens (creating it if need be) the segment of group `name` of user `uid` in `dir` and
 * joins it: a slot of its own for this process. NULL with *st filled when the segment is
 * refused or cannot be had. `uid` is the caller's (getuid()); tests pass another to see a
 * segment refused as not theirs. */
cs_group *cs_group_open(const char *dir, const char *name, unsigned uid, cs_group_status *st);
/* Leaves the group (the slot is free for others) and unmaps it. NULL is fine. */
void cs_group_close(cs_group *g);
/* The slot belongs to the parent: the child of a fork takes one of its own at its next
 * charge. Call in the child. */
void cs_group_after_fork(cs_group *g);
/* The slot is given up (at exit): from now on charges count for nothing and always pass. */
void cs_group_leave(cs_group *g);

/* The process's device `ordinal` is the GPU with this UUID; `cap` is this process's cap
 * there (CS_GROUP_UNLIMITED for none). Returns another live member's different cap for the
 * same UUID (to warn about), or 0 when all agree. */
uint64_t cs_group_device(cs_group *g, int ordinal, const uint8_t uuid[16], uint64_t cap);

/* Charge `bytes` more on a device against the group: true when the group's total, this
 * member's included, stays within `cap` (always, with CS_GROUP_UNLIMITED). Otherwise false,
 * nothing charged, and *short_by (may be NULL) says how many bytes the group lacks. Members
 * found dead on the way are freed first. A device never given to cs_group_device is not the
 * group's: always true. Never blocks. */
bool cs_group_charge(cs_group *g, int ordinal, uint64_t bytes, uint64_t cap, uint64_t *short_by);
/* Those bytes went back to the driver. */
void cs_group_uncharge(cs_group *g, int ordinal, uint64_t bytes);
/* Bytes the other live members hold (or are charging) on that device; the dead members'
 * slots are freed first. */
uint64_t cs_group_others(cs_group *g, int ordinal);
/* What this member has charged on that device (for tests and the statistics). */
uint64_t cs_group_mine(cs_group *g, int ordinal);

/* ---- reading a segment without joining it (cacheshim status) */

typedef struct {
    uint8_t uuid[16];
    uint64_t bytes;  /* held, with what is being charged */
    uint64_t cap;    /* the member's cap there; CS_GROUP_UNLIMITED for none */
} cs_group_member_device;

typedef struct {
    int pid;
    bool alive;      /* the process with that pid and start time runs */
    char comm[16];   /* its command name, as it wrote it when it joined */
    int ndevices;
    cs_group_member_device dev[CS_GROUP_DEVICES];
} cs_group_member_info;

/* Calls fn for every member of group `name` of user uid in dir, after the same checks as
 * cs_group_open, without joining or changing anything. 0, or the refusal. */
cs_group_error cs_group_read(const char *dir, const char *name, unsigned uid,
                             void (*fn)(const cs_group_member_info *m, void *arg), void *arg,
                             cs_group_status *st);

/* The member's token from pid and start time (for tests that forge slots). */
uint64_t cs_group_token(int pid, uint64_t start);
/* A process's start time in clock ticks since boot, from /proc/PID/stat; false when it is
 * gone, a zombie or exiting. */
bool cs_group_start_time(int pid, uint64_t *start);

#endif
