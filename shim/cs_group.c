/* A cap shared by a group of processes: the segment, its checks, and lock-free charging.
 * See cs_group.h for the design; the order of the atomic steps below is what keeps the
 * group's total within the cap, so each says why it is where it is. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "cs_group.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- the segment's layout */

static const char seg_magic[8] = {'c', 's', 'g', 'r', 'o', 'u', 'p', '\0'};

/* A member's token: pid in bits 40-61, start time (clock ticks since boot) in bits 0-39;
 * JOINING while the member is still writing its slot. */
#define JOINING (1ull << 63)
#define PID_SHIFT 40
#define PID_LIMIT (1u << 22) /* the kernel's PID_MAX_LIMIT */
#define START_MASK ((1ull << PID_SHIFT) - 1)

/* One device of one member; written only by that member. */
typedef struct {
    uint64_t valid;    /* 1 once uuid is written */
    uint8_t uuid[16];
    uint64_t bytes;    /* charged: held from the driver */
    uint64_t want;     /* being charged: counted by others as held until it is decided */
    uint64_t cap;      /* the member's cap there, for warnings and cacheshim status */
} seg_device;

typedef struct {
    uint64_t owner;    /* 0: free; JOINING | token; token */
    uint64_t ndev;     /* ordinals below this may be valid */
    char comm[16];
    seg_device dev[CS_GROUP_DEVICES];
} seg_member;

typedef struct {
    char magic[8];
    uint32_t version;
    uint32_t uid;
    uint32_t members, devices;
    uint64_t size;
    uint64_t pidns_dev, pidns_ino; /* the PID namespace its members' pids belong to */
    char name[72];
} seg_header;

typedef struct {
    seg_header h;
    seg_member m[CS_GROUP_MEMBERS];
} segment;

struct cs_group {
    segment *seg;
    pthread_mutex_t join_lock;
    int slot;        /* atomic: ours; NOT_JOINED after a fork; LEFT once left */
    uint64_t token;
    /* What cs_group_device was told, to write into a new slot after a fork; known is
     * atomic, set once uuid and cap are. */
    bool known[CS_GROUP_DEVICES];
    uint8_t uuid[CS_GROUP_DEVICES][16];
    uint64_t cap[CS_GROUP_DEVICES];
};

#define NOT_JOINED (-1)
#define LEFT (-2)

static uint64_t load(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
static void store(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
static void add(uint64_t *p, uint64_t v) { __atomic_add_fetch(p, v, __ATOMIC_SEQ_CST); }
static void sub(uint64_t *p, uint64_t v) { __atomic_sub_fetch(p, v, __ATOMIC_SEQ_CST); }
static bool cas(uint64_t *p, uint64_t from, uint64_t to)
{
    return __atomic_compare_exchange_n(p, &from, to, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

static uint64_t sat_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

/* ---------------------------------------------------------------- processes */

uint64_t cs_group_token(int pid, uint64_t start)
{
    return ((uint64_t)pid << PID_SHIFT) | (start & START_MASK);
}

static int token_pid(uint64_t token) { return (int)((token & ~JOINING) >> PID_SHIFT); }

/* /proc/PID/FILE into buf, NUL-terminated: false when the process (or the file) is gone. */
static bool read_proc(int pid, const char *file, char *buf, size_t len)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/%s", pid, file);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, len - 1);
    close(fd);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    return true;
}

/* /proc/PID/stat: its state, kernel flags and start time, and (comm may be NULL) its
 * command name. */
static bool read_stat(int pid, char *state, uint64_t *flags, uint64_t *start, char *comm,
                      size_t comm_len)
{
    char buf[1024];
    if (!read_proc(pid, "stat", buf, sizeof buf))
        return false;
    char *open_paren = strchr(buf, '('), *close_paren = strrchr(buf, ')');
    if (!open_paren || !close_paren || close_paren < open_paren || close_paren[1] != ' ')
        return false;
    if (comm) {
        size_t len = (size_t)(close_paren - open_paren - 1);
        if (len >= comm_len)
            len = comm_len - 1;
        memcpy(comm, open_paren + 1, len);
        comm[len] = '\0';
    }
    char *p = close_paren + 2;
    *state = *p;
    /* Field 3 is the state, 9 the flags, 22 the start time. */
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p)
            return false;
        p++;
        if (field + 1 == 9)
            *flags = strtoull(p, NULL, 10);
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(p, &end, 10);
    if (errno || end == p)
        return false;
    *start = v;
    return true;
}

/* SIGKILL sent to the process and not yet acted on (/proc/PID/status): it is dying. */
static bool kill_pending(int pid)
{
    char buf[4096];
    if (!read_proc(pid, "status", buf, sizeof buf))
        return false;
    static const char *const fields[] = {"\nSigPnd:", "\nShdPnd:"};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        const char *f = strstr(buf, fields[i]);
        if (f && (strtoull(f + strlen(fields[i]), NULL, 16) & (1ull << (SIGKILL - 1))))
            return true;
    }
    return false;
}

#define PF_EXITING 0x4 /* the kernel's flag of a task in exit */

bool cs_group_start_time(int pid, uint64_t *start)
{
    char state;
    uint64_t flags = 0;
    return read_stat(pid, &state, &flags, start, NULL, 0) && state != 'Z' && state != 'X' &&
           !(flags & PF_EXITING);
}

/* Does the member instance the token names still run? A process that is gone, a zombie, one
 * that is exiting or has a SIGKILL on its way is done with its memory (the driver frees it
 * as it exits): its share is the others'. */
static bool alive(uint64_t token)
{
    uint64_t start;
    int pid = token_pid(token);
    return pid > 0 && !kill_pending(pid) && cs_group_start_time(pid, &start) &&
           (start & START_MASK) == (token & START_MASK);
}

static bool pid_namespace(uint64_t *dev, uint64_t *ino)
{
    struct stat s;
    if (stat("/proc/self/ns/pid", &s) != 0)
        return false;
    *dev = (uint64_t)s.st_dev;
    *ino = (uint64_t)s.st_ino;
    return true;
}

/* ---------------------------------------------------------------- names and paths */

bool cs_group_path(const char *dir, unsigned uid, const char *name, char *buf, size_t len)
{
    int n = snprintf(buf, len, "%s/" CS_GROUP_PREFIX "%u-%s", dir, uid, name);
    return n > 0 && (size_t)n < len;
}

/* The reasons without a detail; the others are formatted in cs_group_explain. */
static const char *const plain_reason[] = {
    [CS_GROUP_OK] = "usable",
    [CS_GROUP_BAD_NAME] = "not a valid group name",
    [CS_GROUP_NOT_FILE] = "is not a regular file: refused",
    [CS_GROUP_MALFORMED] = "is malformed (not a segment this cacheshim writes): refused",
    [CS_GROUP_OTHER_NAMESPACE] = "was made in another PID namespace, whose pids are not ours: "
                                 "refused",
};

void cs_group_explain(const cs_group_status *st, char *buf, size_t len)
{
    long v = st->detail;
    switch (st->error) {
    case CS_GROUP_SYSTEM:
        snprintf(buf, len, "cannot be used (%s)", strerror((int)v));
        return;
    case CS_GROUP_NOT_OWNED:
        snprintf(buf, len, "belongs to uid %ld, not to this user (uid %u): refused", v,
                 (unsigned)getuid());
        return;
    case CS_GROUP_OPEN_TO_OTHERS:
        snprintf(buf, len, "has mode %04lo, open to other users: refused", (unsigned long)v);
        return;
    case CS_GROUP_OTHER_VERSION:
        snprintf(buf, len, "has layout version %ld, this cacheshim uses version %d: refused", v,
                 CS_GROUP_VERSION);
        return;
    case CS_GROUP_FULL:
        snprintf(buf, len, "has %ld live members already, the most a group can have", v);
        return;
    case CS_GROUP_NO_PROC:
        snprintf(buf, len, "cannot be joined: /proc/self/stat cannot be read (%s)",
                 strerror((int)v));
        return;
    default:
        snprintf(buf, len, "%s", plain_reason[st->error]);
    }
}

/* ---------------------------------------------------------------- checking a segment */

static cs_group_error fail(cs_group_status *st, cs_group_error e, long detail)
{
    if (st) {
        st->error = e;
        st->detail = detail;
    }
    return e;
}

/* The file as opened: a regular file of uid with no access for others, of a size that can
 * hold a header. */
static cs_group_error check_file(int fd, unsigned uid, struct stat *s, cs_group_status *st)
{
    if (fstat(fd, s) != 0)
        return fail(st, CS_GROUP_SYSTEM, errno);
    if (!S_ISREG(s->st_mode))
        return fail(st, CS_GROUP_NOT_FILE, 0);
    if (s->st_uid != uid)
        return fail(st, CS_GROUP_NOT_OWNED, (long)s->st_uid);
    if (s->st_mode & 077)
        return fail(st, CS_GROUP_OPEN_TO_OTHERS, (long)(s->st_mode & 07777));
    if ((size_t)s->st_size < sizeof(seg_header))
        return fail(st, CS_GROUP_MALFORMED, 0);
    return CS_GROUP_OK;
}

/* Every field as this code writes it. Members may be writing their slots meanwhile: every
 * value they write passes. */
static cs_group_error check_segment(const segment *g, size_t size, unsigned uid, const char *name,
                                    cs_group_status *st)
{
    const seg_header *h = &g->h;
    if (memcmp(h->magic, seg_magic, sizeof seg_magic) != 0)
        return fail(st, CS_GROUP_MALFORMED, 0);
    if (h->version != CS_GROUP_VERSION)
        return fail(st, CS_GROUP_OTHER_VERSION, (long)h->version);
    if (size != sizeof(segment) || h->size != sizeof(segment) ||
        h->members != CS_GROUP_MEMBERS || h->devices != CS_GROUP_DEVICES ||
        memchr(h->name, '\0', sizeof h->name) == NULL || (name && strcmp(h->name, name) != 0))
        return fail(st, CS_GROUP_MALFORMED, 0);
    if (h->uid != uid)
        return fail(st, CS_GROUP_NOT_OWNED, (long)h->uid);
    for (int i = 0; i < CS_GROUP_MEMBERS; i++) {
        const seg_member *m = &g->m[i];
        uint64_t o = load(&m->owner);
        int pid = token_pid(o);
        if ((o && (pid <= 0 || (unsigned)pid >= PID_LIMIT)) || load(&m->ndev) > CS_GROUP_DEVICES)
            return fail(st, CS_GROUP_MALFORMED, 0);
        for (int d = 0; d < CS_GROUP_DEVICES; d++)
            if (load(&m->dev[d].valid) > 1)
                return fail(st, CS_GROUP_MALFORMED, 0);
    }
    return CS_GROUP_OK;
}

/* Opens path (mode: O_RDWR or O_RDONLY) and maps it after every check; NULL when refused. */
static segment *map_checked(const char *path, int mode, unsigned uid, const char *name,
                            cs_group_status *st)
{
    int fd = open(path, mode | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        struct stat s;
        /* A file that is not ours and closed to us, or a link: say which. */
        if (e == EACCES && lstat(path, &s) == 0 && s.st_uid != uid)
            fail(st, CS_GROUP_NOT_OWNED, (long)s.st_uid);
        else if (e == ELOOP || e == EISDIR)
            fail(st, CS_GROUP_NOT_FILE, 0);
        else
            fail(st, CS_GROUP_SYSTEM, e);
        return NULL;
    }
    struct stat s;
    if (check_file(fd, uid, &s, st) != CS_GROUP_OK) {
        close(fd);
        return NULL;
    }
    int prot = mode == O_RDONLY ? PROT_READ : PROT_READ | PROT_WRITE;
    void *p = mmap(NULL, (size_t)s.st_size, prot, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) {
        fail(st, CS_GROUP_SYSTEM, e);
        return NULL;
    }
    if (check_segment(p, (size_t)s.st_size, uid, name, st) != CS_GROUP_OK) {
        munmap(p, (size_t)s.st_size);
        return NULL;
    }
    const segment *seg = p;
    uint64_t dev = 0, ino = 0;
    if (pid_namespace(&dev, &ino) && (seg->h.pidns_dev != dev || seg->h.pidns_ino != ino)) {
        munmap(p, (size_t)s.st_size);
        fail(st, CS_GROUP_OTHER_NAMESPACE, 0);
        return NULL;
    }
    return p;
}

/* A new segment, complete before anyone can open it: written under a name of its own, then
 * linked into place (if another process linked one first, that one is the group's). */
static cs_group_error create(const char *dir, const char *path, unsigned uid, const char *name,
                             cs_group_status *st)
{
    char tmp[320];
    snprintf(tmp, sizeof tmp, "%s/." CS_GROUP_PREFIX "%u-%s.%d", dir, uid, name, (int)getpid());
    int flags = O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
    int fd = open(tmp, flags, 0600);
    /* Our pid's name: left by a process killed here before us (another user's stays). */
    if (fd < 0 && errno == EEXIST && unlink(tmp) == 0)
        fd = open(tmp, flags, 0600);
    if (fd < 0)
        return fail(st, CS_GROUP_SYSTEM, errno);
    seg_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, seg_magic, sizeof seg_magic);
    h.version = CS_GROUP_VERSION;
    h.uid = uid;
    h.members = CS_GROUP_MEMBERS;
    h.devices = CS_GROUP_DEVICES;
    h.size = sizeof(segment);
    snprintf(h.name, sizeof h.name, "%s", name);
    pid_namespace(&h.pidns_dev, &h.pidns_ino);
    int rc = 0;
    if (fchmod(fd, 0600) != 0 || ftruncate(fd, (off_t)sizeof(segment)) != 0 ||
        pwrite(fd, &h, sizeof h, 0) != (ssize_t)sizeof h ||
        (link(tmp, path) != 0 && errno != EEXIST))
        rc = errno ? errno : EIO;
    close(fd);
    unlink(tmp);
    return rc ? fail(st, CS_GROUP_SYSTEM, rc) : CS_GROUP_OK;
}

/* ---------------------------------------------------------------- slots */

/* Frees the slots of members that are gone (never ours): how many. */
static int reap_dead(segment *seg, int mine)
{
    int n = 0;
    for (int i = 0; i < CS_GROUP_MEMBERS; i++) {
        uint64_t o = load(&seg->m[i].owner);
        /* The exact token: a slot freed and taken by another member meanwhile stays. */
        if (i != mine && o && !alive(o & ~JOINING) && cas(&seg->m[i].owner, o, 0))
            n++;
    }
    return n;
}

static void write_device(seg_member *m, int ordinal, const uint8_t uuid[16], uint64_t cap)
{
    seg_device *d = &m->dev[ordinal];
    store(&d->cap, cap);
    /* The UUID before valid: a reader that sees valid reads the right UUID. Registered
     * before any charge on it, so a charger's want is seen with it. */
    if (!load(&d->valid)) {
        memcpy(d->uuid, uuid, 16);
        store(&d->valid, 1);
    }
    uint64_t n = load(&m->ndev);
    while ((uint64_t)ordinal + 1 > n && !__atomic_compare_exchange_n(
               &m->ndev, &n, (uint64_t)ordinal + 1, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
}

/* A slot for this process: its token written only once the slot is clean. */
static cs_group_error join(cs_group *g, cs_group_status *st)
{
    segment *seg = g->seg;
    uint64_t start;
    char state, comm[16];
    uint64_t flags;
    if (!read_stat(getpid(), &state, &flags, &start, comm, sizeof comm))
        return fail(st, CS_GROUP_NO_PROC, errno);
    uint64_t token = cs_group_token(getpid(), start);
    /* Our own token from before an exec: that image's memory went with it. */
    for (int i = 0; i < CS_GROUP_MEMBERS; i++) {
        uint64_t o = load(&seg->m[i].owner);
        if (o && (o & ~JOINING) == token)
            cas(&seg->m[i].owner, o, 0);
    }
    for (int attempt = 0; attempt < 2; attempt++) {
        for (int i = 0; i < CS_GROUP_MEMBERS; i++) {
            seg_member *m = &seg->m[i];
            if (!cas(&m->owner, 0, JOINING | token))
                continue;
            /* Others skip a joining slot: it holds nothing yet. */
            store(&m->ndev, 0);
            for (int d = 0; d < CS_GROUP_DEVICES; d++) {
                store(&m->dev[d].valid, 0);
                store(&m->dev[d].bytes, 0);
                store(&m->dev[d].want, 0);
                store(&m->dev[d].cap, 0);
            }
            memcpy(m->comm, comm, sizeof comm);
            for (int d = 0; d < CS_GROUP_DEVICES; d++)
                if (g->known[d])
                    write_device(m, d, g->uuid[d], g->cap[d]);
            store(&m->owner, token);
            g->token = token;
            __atomic_store_n(&g->slot, i, __ATOMIC_SEQ_CST);
            return CS_GROUP_OK;
        }
        if (!reap_dead(seg, -1))
            break;
    }
    return fail(st, CS_GROUP_FULL, CS_GROUP_MEMBERS);
}

/* Our slot, joining first after a fork; NULL once left or when no slot can be had. */
static seg_member *my_slot(cs_group *g)
{
    int slot = __atomic_load_n(&g->slot, __ATOMIC_SEQ_CST);
    if (slot >= 0)
        return &g->seg->m[slot];
    if (slot == LEFT)
        return NULL;
    pthread_mutex_lock(&g->join_lock);
    if (__atomic_load_n(&g->slot, __ATOMIC_SEQ_CST) == NOT_JOINED)
        join(g, NULL);
    slot = __atomic_load_n(&g->slot, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&g->join_lock);
    return slot >= 0 ? &g->seg->m[slot] : NULL;
}

/* ---------------------------------------------------------------- open and close */

cs_group *cs_group_open(const char *dir, const char *name, unsigned uid, cs_group_status *st)
{
    if (st)
        memset(st, 0, sizeof *st);
    if (!cs_group_name_ok(name)) {
        fail(st, CS_GROUP_BAD_NAME, 0);
        return NULL;
    }
    char path[256];
    if (!cs_group_path(dir, uid, name, path, sizeof path)) {
        fail(st, CS_GROUP_SYSTEM, ENAMETOOLONG);
        return NULL;
    }
    if (st)
        snprintf(st->path, sizeof st->path, "%s", path);
    segment *seg = NULL;
    for (int attempt = 0; !seg && attempt < 3; attempt++) {
        cs_group_status s = {0};
        seg = map_checked(path, O_RDWR, uid, name, &s);
        if (seg)
            break;
        if (s.error != CS_GROUP_SYSTEM || s.detail != ENOENT ||
            create(dir, path, uid, name, &s) != CS_GROUP_OK) {
            fail(st, s.error, s.detail);
            return NULL;
        }
    }
    if (!seg) {
        fail(st, CS_GROUP_SYSTEM, ENOENT);
        return NULL;
    }
    cs_group *g = calloc(1, sizeof *g);
    if (!g) {
        munmap(seg, sizeof *seg);
        fail(st, CS_GROUP_SYSTEM, ENOMEM);
        return NULL;
    }
    g->seg = seg;
    g->slot = NOT_JOINED;
    pthread_mutex_init(&g->join_lock, NULL);
    if (join(g, st) != CS_GROUP_OK) {
        cs_group_close(g);
        return NULL;
    }
    return g;
}

void cs_group_leave(cs_group *g)
{
    if (!g)
        return;
    int slot = __atomic_exchange_n(&g->slot, LEFT, __ATOMIC_SEQ_CST);
    if (slot >= 0)
        cas(&g->seg->m[slot].owner, g->token, 0);
}

void cs_group_close(cs_group *g)
{
    if (!g)
        return;
    cs_group_leave(g);
    munmap(g->seg, sizeof *g->seg);
    pthread_mutex_destroy(&g->join_lock);
    free(g);
}

void cs_group_after_fork(cs_group *g)
{
    if (!g)
        return;
    /* The only thread of the child: no other holds the lock, whatever the parent's did. */
    pthread_mutex_init(&g->join_lock, NULL);
    if (__atomic_load_n(&g->slot, __ATOMIC_SEQ_CST) != LEFT)
        __atomic_store_n(&g->slot, NOT_JOINED, __ATOMIC_SEQ_CST);
}

/* ---------------------------------------------------------------- devices and charges */

uint64_t cs_group_device(cs_group *g, int ordinal, const uint8_t uuid[16], uint64_t cap)
{
    if (!g || ordinal < 0 || ordinal >= CS_GROUP_DEVICES)
        return 0;
    pthread_mutex_lock(&g->join_lock);
    memcpy(g->uuid[ordinal], uuid, 16);
    g->cap[ordinal] = cap;
    __atomic_store_n(&g->known[ordinal], true, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g->join_lock);
    seg_member *me = my_slot(g);
    if (!me)
        return 0;
    write_device(me, ordinal, uuid, cap);
    for (int i = 0; i < CS_GROUP_MEMBERS; i++) {
        const seg_member *m = &g->seg->m[i];
        uint64_t o = load(&m->owner);
        if (m == me || !o || (o & JOINING))
            continue;
        uint64_t n = load(&m->ndev);
        for (uint64_t d = 0; d < n && d < CS_GROUP_DEVICES; d++)
            if (load(&m->dev[d].valid) && memcmp(m->dev[d].uuid, uuid, 16) == 0 &&
                load(&m->dev[d].cap) != cap && alive(o))
                return load(&m->dev[d].cap);
    }
    return 0;
}

/* The device entry of ours for an ordinal the group knows, else NULL. */
static seg_device *my_device(cs_group *g, int ordinal)
{
    if (!g || ordinal < 0 || ordinal >= CS_GROUP_DEVICES ||
        !__atomic_load_n(&g->known[ordinal], __ATOMIC_ACQUIRE))
        return NULL;
    seg_member *me = my_slot(g);
    return me && load(&me->dev[ordinal].valid) ? &me->dev[ordinal] : NULL;
}

/* Every live member's bytes of the UUID (with their wants when with_want), ours included.
 * Each member's want is read before its bytes: a charge moves want into bytes by adding to
 * bytes first, so the amount is seen at least once. */
static uint64_t group_total(const segment *seg, const uint8_t uuid[16], bool with_want)
{
    uint64_t sum = 0;
    for (int i = 0; i < CS_GROUP_MEMBERS; i++) {
        const seg_member *m = &seg->m[i];
        uint64_t o = load(&m->owner);
        if (!o || (o & JOINING))
            continue;
        uint64_t n = load(&m->ndev);
        for (uint64_t d = 0; d < n && d < CS_GROUP_DEVICES; d++) {
            const seg_device *e = &m->dev[d];
            if (!load(&e->valid) || memcmp(e->uuid, uuid, 16) != 0)
                continue;
            if (with_want)
                sum = sat_add(sum, load(&e->want));
            sum = sat_add(sum, load(&e->bytes));
        }
    }
    return sum;
}

/* Tries before a charge that meets only other members' undecided wants gives up. */
#define CONTENDED_TRIES 1000

bool cs_group_charge(cs_group *g, int ordinal, uint64_t bytes, uint64_t cap, uint64_t *short_by)
{
    seg_device *e = my_device(g, ordinal);
    if (!e || bytes == 0)
        return true;
    if (cap == CS_GROUP_UNLIMITED) {
        add(&e->bytes, bytes);
        return true;
    }
    int mine = __atomic_load_n(&g->slot, __ATOMIC_SEQ_CST);
    for (int tries = 0;; tries++) {
        /* Announce, then look: of two members charging at once, the later to look sees the
         * other's want (all of these are sequentially consistent). */
        add(&e->want, bytes);
        uint64_t total = group_total(g->seg, e->uuid, true);
        if (total <= cap) {
            add(&e->bytes, bytes);  /* bytes first: never counted by nobody */
            sub(&e->want, bytes);
            return true;
        }
        sub(&e->want, bytes);
        uint64_t held = sat_add(group_total(g->seg, e->uuid, false), bytes);
        bool contended = held <= cap;
        /* The group's room is taken: by the dead, which we free, or by the living. Another
         * member's undecided want is decided in a few instructions, unless its member died
         * there (freed here) or is stopped (then it counts, after a while). */
        if (contended && tries < CONTENDED_TRIES) {
            if (tries % 16 == 15)
                reap_dead(g->seg, mine);
            sched_yield();
            continue;
        }
        if (reap_dead(g->seg, mine))
            continue;
        if (short_by)
            *short_by = (contended ? total : held) - cap;
        return false;
    }
}

void cs_group_uncharge(cs_group *g, int ordinal, uint64_t bytes)
{
    seg_device *e = my_device(g, ordinal);
    if (!e)
        return;
    /* Never below zero, whatever the caller believes it held. */
    uint64_t have = load(&e->bytes);
    while (!__atomic_compare_exchange_n(&e->bytes, &have, have > bytes ? have - bytes : 0, false,
                                        __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
}

uint64_t cs_group_others(cs_group *g, int ordinal)
{
    seg_device *e = my_device(g, ordinal);
    if (!e)
        return 0;
    /* What the program is shown as free leaves out the shares of the dead. */
    reap_dead(g->seg, __atomic_load_n(&g->slot, __ATOMIC_SEQ_CST));
    uint64_t total = group_total(g->seg, e->uuid, true);
    uint64_t mine = load(&e->bytes) + load(&e->want);
    return total > mine ? total - mine : 0;
}

uint64_t cs_group_mine(cs_group *g, int ordinal)
{
    seg_device *e = my_device(g, ordinal);
    return e ? load(&e->bytes) : 0;
}

/* ---------------------------------------------------------------- reading (status) */

cs_group_error cs_group_read(const char *dir, const char *name, unsigned uid,
                             void (*fn)(const cs_group_member_info *m, void *arg), void *arg,
                             cs_group_status *st)
{
    char path[256];
    if (st)
        memset(st, 0, sizeof *st);
    if (!cs_group_name_ok(name))
        return fail(st, CS_GROUP_BAD_NAME, 0);
    if (!cs_group_path(dir, uid, name, path, sizeof path))
        return fail(st, CS_GROUP_SYSTEM, ENAMETOOLONG);
    if (st)
        snprintf(st->path, sizeof st->path, "%s", path);
    segment *seg = map_checked(path, O_RDONLY, uid, name, st);
    if (!seg)
        return st ? st->error : CS_GROUP_SYSTEM;
    for (int i = 0; i < CS_GROUP_MEMBERS; i++) {
        const seg_member *m = &seg->m[i];
        uint64_t o = load(&m->owner);
        if (!o || (o & JOINING))
            continue;
        cs_group_member_info info;
        memset(&info, 0, sizeof info);
        info.pid = token_pid(o);
        info.alive = alive(o);
        memcpy(info.comm, m->comm, sizeof info.comm);
        info.comm[sizeof info.comm - 1] = '\0';
        uint64_t n = load(&m->ndev);
        for (uint64_t d = 0; d < n && d < CS_GROUP_DEVICES; d++) {
            const seg_device *e = &m->dev[d];
            if (!load(&e->valid))
                continue;
            cs_group_member_device *out = &info.dev[info.ndevices++];
            memcpy(out->uuid, e->uuid, 16);
            out->bytes = sat_add(load(&e->want), load(&e->bytes));
            out->cap = load(&e->cap);
        }
        fn(&info, arg);
    }
    munmap(seg, sizeof *seg);
    return CS_GROUP_OK;
}
