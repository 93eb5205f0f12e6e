/* The group cap (shim/cs_group.c) without any driver: members are forked processes and
 * threads, the segment lives in a temporary directory. The source is included so the tests
 * can forge what a dead, reused or foreign process leaves in a segment. */
#include "../shim/cs_group.c"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/wait.h>

#include <cmocka.h>

#define CAP 1000000ull

static const uint8_t uuid_a[16] = "gpu-aaaaaaaaaaa";
static const uint8_t uuid_b[16] = "gpu-bbbbbbbbbbb";

typedef struct {
    char dir[64];
    char path[256];
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/csgroup-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    assert_true(cs_group_path(f->dir, (unsigned)getuid(), "g", f->path, sizeof f->path));
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    unlink(f->path);
    rmdir(f->dir);
    free(f);
    return 0;
}

static cs_group *member(fx *f, uint64_t cap)
{
    cs_group_status st;
    cs_group *g = cs_group_open(f->dir, "g", (unsigned)getuid(), &st);
    assert_non_null(g);
    cs_group_device(g, 0, uuid_a, cap);
    return g;
}

static segment *seg_of(cs_group *g) { return g->seg; }

/* ---------------------------------------------------------------- one process */

static void test_charge_and_uncharge(void **state)
{
    fx *f = *state;
    cs_group *g = member(f, CAP);
    uint64_t short_by = 0;
    assert_true(cs_group_charge(g, 0, 600000, CAP, &short_by));
    assert_int_equal(cs_group_mine(g, 0), 600000);
    assert_false(cs_group_charge(g, 0, 500000, CAP, &short_by));
    assert_int_equal(short_by, 100000);
    assert_int_equal(cs_group_mine(g, 0), 600000);
    assert_true(cs_group_charge(g, 0, 400000, CAP, &short_by));
    cs_group_uncharge(g, 0, 1000000);
    assert_int_equal(cs_group_mine(g, 0), 0);
    cs_group_uncharge(g, 0, 5);  /* never below zero */
    assert_int_equal(cs_group_mine(g, 0), 0);
    /* A device the group was never told about is not the group's; nor another device. */
    assert_true(cs_group_charge(g, 3, 10 * CAP, CAP, NULL));
    cs_group_device(g, 1, uuid_b, CAP);
    assert_true(cs_group_charge(g, 0, CAP, CAP, NULL));
    assert_true(cs_group_charge(g, 1, CAP, CAP, NULL));
    assert_int_equal(cs_group_others(g, 0), 0);
    /* No cap: counted, never refused. */
    assert_true(cs_group_charge(g, 0, 5 * CAP, CS_GROUP_UNLIMITED, NULL));
    assert_int_equal(cs_group_mine(g, 0), 6 * CAP);
    cs_group_close(g);
}

static void test_bad_names(void **state)
{
    fx *f = *state;
    cs_group_status st;
    const char *bad[] = {"", ".hidden", "a/b", "..", "a b", "name\n",
                         "x12345678901234567890123456789012345678901234567890123456789012345"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_null(cs_group_open(f->dir, bad[i], (unsigned)getuid(), &st));
        assert_int_equal(st.error, CS_GROUP_BAD_NAME);
    }
    assert_true(cs_group_name_ok("train-2.job_7"));
}

/* ---------------------------------------------------------------- members in processes */

/* Runs fn in a forked child that joins the group afresh (the parent's handle, after fork);
 * returns its pid. The child exits with fn's result without leaving the group. */
static pid_t child(cs_group *g, int (*fn)(cs_group *, void *), void *arg)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        cs_group_after_fork(g);
        _exit(fn(g, arg));
    }
    return pid;
}

static int child_status(pid_t pid)
{
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int take_half(cs_group *g, void *arg)
{
    (void)arg;
    uint64_t short_by = 0;
    /* The parent holds 600000: 500000 does not fit, 400000 does. */
    if (cs_group_charge(g, 0, 500000, CAP, &short_by) || short_by != 100000)
        return 1;
    if (cs_group_others(g, 0) != 600000)
        return 2;
    return cs_group_charge(g, 0, 400000, CAP, NULL) ? 0 : 3;
}

static int take_some(cs_group *g, void *arg)
{
    (void)arg;
    return cs_group_charge(g, 0, 300000, CAP, NULL) && cs_group_mine(g, 0) == 300000 ? 0 : 1;
}

static void test_members_share_the_cap(void **state)
{
    fx *f = *state;
    cs_group *g = member(f, CAP);
    assert_true(cs_group_charge(g, 0, 600000, CAP, NULL));
    pid_t pid = child(g, take_half, NULL);
    assert_int_equal(child_status(pid), 0);
    /* The child exited holding 400000 without leaving: the next charge that needs the room
     * frees its slot. */
    assert_true(cs_group_charge(g, 0, 400000, CAP, NULL));
    assert_int_equal(cs_group_others(g, 0), 0);
    /* What the others hold, as the memory view asks, leaves the dead out too. */
    cs_group_uncharge(g, 0, CAP);
    pid = child(g, take_some, NULL);
    assert_int_equal(child_status(pid), 0);
    assert_int_equal(cs_group_others(g, 0), 0);
    cs_group_close(g);
}

/* The sum the members really hold, checked against the cap by every member after each
 * charge it got: in memory shared by all of them. */
typedef struct {
    uint64_t real;
    uint64_t violations;
    uint64_t granted, refused;
} ledger;

static ledger *shared_ledger(void)
{
    ledger *l = mmap(NULL, sizeof *l, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(l != MAP_FAILED);
    memset(l, 0, sizeof *l);
    return l;
}

static void churn(cs_group *g, ledger *l, unsigned seed, int rounds)
{
    uint64_t held[4] = {0};
    for (int i = 0; i < rounds; i++) {
        int k = (int)(rand_r(&seed) % 4);
        if (held[k]) {
            __atomic_sub_fetch(&l->real, held[k], __ATOMIC_SEQ_CST);
            cs_group_uncharge(g, 0, held[k]);
            held[k] = 0;
            continue;
        }
        uint64_t n = 1 + rand_r(&seed) % (CAP / 3);
        if (!cs_group_charge(g, 0, n, CAP, NULL)) {
            __atomic_add_fetch(&l->refused, 1, __ATOMIC_RELAXED);
            continue;
        }
        __atomic_add_fetch(&l->granted, 1, __ATOMIC_RELAXED);
        if (__atomic_add_fetch(&l->real, n, __ATOMIC_SEQ_CST) > CAP)
            __atomic_add_fetch(&l->violations, 1, __ATOMIC_RELAXED);
        held[k] = n;
    }
    for (int k = 0; k < 4; k++) {
        __atomic_sub_fetch(&l->real, held[k], __ATOMIC_SEQ_CST);
        cs_group_uncharge(g, 0, held[k]);
    }
}

static ledger *the_ledger;

static int churn_child(cs_group *g, void *arg)
{
    churn(g, the_ledger, (unsigned)(uintptr_t)arg, 3000);
    cs_group_leave(g);
    return 0;
}

static void test_concurrent_members(void **state)
{
    fx *f = *state;
    the_ledger = shared_ledger();
    cs_group *g = member(f, CAP);
    enum { N = 6 };
    pid_t pids[N];
    for (int i = 0; i < N; i++)
        pids[i] = child(g, churn_child, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < N; i++)
        assert_int_equal(child_status(pids[i]), 0);
    assert_int_equal(the_ledger->violations, 0);
    assert_true(the_ledger->granted > 0);
    assert_true(the_ledger->refused > 0);  /* the cap was reached */
    /* All left: the whole cap is ours. */
    assert_int_equal(cs_group_others(g, 0), 0);
    assert_true(cs_group_charge(g, 0, CAP, CAP, NULL));
    cs_group_close(g);
    munmap(the_ledger, sizeof *the_ledger);
}

static int churn_forever(cs_group *g, void *arg)
{
    int *fd = arg;
    unsigned seed = (unsigned)getpid();
    /* Hold most of the cap, say so, then charge and uncharge without end: killed anywhere. */
    if (!cs_group_charge(g, 0, CAP * 3 / 4, CAP, NULL))
        return 1;
    char c = 'x';
    if (write(fd[1], &c, 1) != 1)
        return 2;
    for (;;) {
        uint64_t n = 1 + rand_r(&seed) % (CAP / 4);
        if (cs_group_charge(g, 0, n, CAP, NULL))
            cs_group_uncharge(g, 0, n);
    }
}

static void test_member_killed_mid_allocation(void **state)
{
    fx *f = *state;
    cs_group *g = member(f, CAP);
    for (int round = 0; round < 20; round++) {
        int fd[2];
        assert_int_equal(pipe(fd), 0);
        pid_t pid = child(g, churn_forever, fd);
        char c;
        assert_int_equal(read(fd[0], &c, 1), 1);
        for (volatile int spin = 0; spin < round * 1000; spin++) {
        }
        assert_int_equal(kill(pid, SIGKILL), 0);
        /* Killed (every other round a zombie not yet waited for; else perhaps still on its
         * way out), perhaps between want and bytes: its share is ours at the first charge,
         * and nothing waits for it. */
        siginfo_t info;
        while (round % 2 && waitid(P_PID, (id_t)pid, &info, WEXITED | WNOWAIT) != 0)
            assert_int_equal(errno, EINTR);
        uint64_t short_by = 0;
        assert_true(cs_group_charge(g, 0, CAP, CAP, &short_by));
        assert_int_equal(cs_group_others(g, 0), 0);
        cs_group_uncharge(g, 0, CAP);
        assert_int_equal(child_status(pid), 128 + SIGKILL);
        close(fd[0]);
        close(fd[1]);
    }
    cs_group_close(g);
}

static int hold_and_report(cs_group *g, void *arg)
{
    int *fd = arg;
    if (!cs_group_charge(g, 0, 250000, CAP, NULL))
        return 1;
    char c = 'x';
    if (write(fd[1], &c, 1) != 1 || read(fd[0], &c, 1) != 1)
        return 2;
    return 0;
}

static void collect(const cs_group_member_info *m, void *arg)
{
    cs_group_member_info *out = arg;
    for (int i = 0; i < 4; i++)
        if (out[i].pid == 0) {
            out[i] = *m;
            return;
        }
}

static void test_status_lists_members(void **state)
{
    fx *f = *state;
    cs_group *g = member(f, CAP);
    assert_true(cs_group_charge(g, 0, 100000, CAP, NULL));
    int to_child[2], from_child[2];
    assert_int_equal(pipe(to_child), 0);
    assert_int_equal(pipe(from_child), 0);
    int fds[2] = {to_child[0], from_child[1]};
    pid_t pid = child(g, hold_and_report, fds);
    char c;
    assert_int_equal(read(from_child[0], &c, 1), 1);
    cs_group_member_info seen[4];
    memset(seen, 0, sizeof seen);
    cs_group_status st;
    assert_int_equal(cs_group_read(f->dir, "g", (unsigned)getuid(), collect, seen, &st), CS_GROUP_OK);
    uint64_t mine = 0, theirs = 0;
    for (int i = 0; i < 4 && seen[i].pid; i++) {
        assert_true(seen[i].alive);
        assert_int_equal(seen[i].ndevices, 1);
        assert_memory_equal(seen[i].dev[0].uuid, uuid_a, 16);
        assert_int_equal(seen[i].dev[0].cap, CAP);
        if (seen[i].pid == getpid())
            mine = seen[i].dev[0].bytes;
        else if (seen[i].pid == pid)
            theirs = seen[i].dev[0].bytes;
    }
    assert_int_equal(mine, 100000);
    assert_int_equal(theirs, 250000);
    assert_int_equal(write(to_child[1], &c, 1), 1);
    assert_int_equal(child_status(pid), 0);
    /* Gone without leaving: listed as dead until someone needs its room. */
    memset(seen, 0, sizeof seen);
    assert_int_equal(cs_group_read(f->dir, "g", (unsigned)getuid(), collect, seen, &st), CS_GROUP_OK);
    bool dead_seen = false;
    for (int i = 0; i < 4 && seen[i].pid; i++)
        dead_seen |= seen[i].pid == pid && !seen[i].alive;
    assert_true(dead_seen);
    cs_group_close(g);
    for (int i = 0; i < 2; i++) {
        close(to_child[i]);
        close(from_child[i]);
    }
}

/* ---------------------------------------------------------------- forged slots */

/* A slot holding `bytes` of device 0 for the token, as a member would leave it. */
static void forge(segment *s, int slot, uint64_t token, uint64_t bytes)
{
    seg_member *m = &s->m[slot];
    m->ndev = 1;
    memcpy(m->dev[0].uuid, uuid_a, 16);
    m->dev[0].valid = 1;
    m->dev[0].bytes = bytes;
    m->dev[0].cap = CAP;
    store(&m->owner, token);
}

static int free_slot(segment *s)
{
    for (int i = 0; i < CS_GROUP_MEMBERS; i++)
        if (!s->m[i].owner)
            return i;
    fail();
    return -1;
}

static void test_reused_pid_is_not_the_member(void **state)
{
    fx *f = *state;
    cs_group *g = member(f, CAP);
    uint64_t start;
    assert_true(cs_group_start_time(getppid(), &start));
    /* Our parent's pid with another start time: an earlier process that had that pid. */
    forge(seg_of(g), free_slot(seg_of(g)), cs_group_token(getppid(), start + 1), CAP);
    assert_true(cs_group_charge(g, 0, CAP, CAP, NULL));
    cs_group_uncharge(g, 0, CAP);
    /* With its own start time it is alive, and its bytes count. */
    forge(seg_of(g), free_slot(seg_of(g)), cs_group_token(getppid(), start), CAP / 2);
    uint64_t short_by = 0;
    assert_false(cs_group_charge(g, 0, CAP, CAP, &short_by));
    assert_int_equal(short_by, CAP / 2);
    cs_group_close(g);
}

static void test_a_dead_members_want_is_freed(void **state)
{
    fx *f = *state;
    cs_group *g = member(f, CAP);
    pid_t pid = fork();
    if (pid == 0)
        _exit(0);
    uint64_t start = 12345;
    assert_int_equal(child_status(pid), 0);
    /* Killed between announcing a charge and deciding it: the want alone fills the cap. */
    segment *s = seg_of(g);
    int slot = free_slot(s);
    forge(s, slot, cs_group_token(pid, start), 0);
    store(&s->m[slot].dev[0].want, CAP);
    assert_true(cs_group_charge(g, 0, CAP / 2, CAP, NULL));
    assert_int_equal(s->m[slot].owner, 0);
    cs_group_close(g);
}

static void test_a_stale_slot_of_our_own_is_dropped(void **state)
{
    fx *f = *state;
    cs_group *g = member(f, CAP);
    cs_group_close(g);
    /* Our own token holding the whole cap: this process before an exec. */
    cs_group_status st;
    segment *s = map_checked(f->path, O_RDWR, (unsigned)getuid(), "g", &st);
    assert_non_null(s);
    uint64_t start;
    assert_true(cs_group_start_time(getpid(), &start));
    forge(s, 5, cs_group_token(getpid(), start), CAP);
    g = member(f, CAP);
    assert_true(cs_group_charge(g, 0, CAP, CAP, NULL));
    cs_group_close(g);
    munmap(s, sizeof *s);
}

static void test_a_full_group_is_refused(void **state)
{
    fx *f = *state;
    cs_group_close(member(f, CAP));
    cs_group_status st;
    segment *s = map_checked(f->path, O_RDWR, (unsigned)getuid(), "g", &st);
    assert_non_null(s);
    uint64_t start;
    assert_true(cs_group_start_time(getppid(), &start));
    for (int i = 0; i < CS_GROUP_MEMBERS; i++)
        forge(s, i, cs_group_token(getppid(), start), 0);
    assert_null(cs_group_open(f->dir, "g", (unsigned)getuid(), &st));
    assert_int_equal(st.error, CS_GROUP_FULL);
    char why[160];
    cs_group_explain(&st, why, sizeof why);
    assert_string_equal(why, "has 128 live members already, the most a group can have");
    /* One of them dead: its slot is taken. */
    store(&s->m[CS_GROUP_MEMBERS - 1].owner, cs_group_token(getppid(), start + 7));
    cs_group *g = cs_group_open(f->dir, "g", (unsigned)getuid(), &st);
    assert_non_null(g);
    cs_group_close(g);
    munmap(s, sizeof *s);
}

static void test_members_with_other_caps_are_told(void **state)
{
    fx *f = *state;
    cs_group *g = member(f, CAP);
    uint64_t start;
    assert_true(cs_group_start_time(getppid(), &start));
    forge(seg_of(g), free_slot(seg_of(g)), cs_group_token(getppid(), start), 0);
    assert_int_equal(cs_group_device(g, 0, uuid_a, CAP), 0);
    assert_int_equal(cs_group_device(g, 0, uuid_a, 2 * CAP), CAP);
    assert_int_equal(cs_group_device(g, 1, uuid_b, 2 * CAP), 0);  /* nobody else on b */
    cs_group_close(g);
}

/* ---------------------------------------------------------------- refused segments */

static void ignore(const cs_group_member_info *m, void *arg)
{
    (void)m;
    (void)arg;
}

static cs_group_error open_error(fx *f, unsigned uid, long *detail)
{
    cs_group_status st;
    cs_group *g = cs_group_open(f->dir, "g", uid, &st);
    if (g) {
        cs_group_close(g);
        return CS_GROUP_OK;
    }
    if (detail)
        *detail = st.detail;
    /* status reads it with the same checks */
    cs_group_status rs;
    cs_group_error r = cs_group_read(f->dir, "g", uid, ignore, NULL, &rs);
    assert_int_equal(r, st.error == CS_GROUP_FULL ? CS_GROUP_OK : st.error);
    return st.error;
}

/* The segment's file, mapped for the test to spoil. */
static segment *spoil(fx *f)
{
    cs_group_close(member(f, CAP));
    int fd = open(f->path, O_RDWR);
    assert_true(fd >= 0);
    segment *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    assert_true(s != MAP_FAILED);
    return s;
}

static void test_corrupt_segments_are_refused(void **state)
{
    fx *f = *state;
    unsigned uid = (unsigned)getuid();
    segment *s = spoil(f);
    long detail = 0;

    s->h.magic[0] = 'X';
    assert_int_equal(open_error(f, uid, NULL), CS_GROUP_MALFORMED);
    s->h.magic[0] = 'c';
    assert_int_equal(open_error(f, uid, NULL), CS_GROUP_OK);

    s->m[3].owner = 77;  /* a start time without a pid */
    assert_int_equal(open_error(f, uid, NULL), CS_GROUP_MALFORMED);
    s->m[3].owner = 0;
    s->m[9].dev[2].valid = 7;
    assert_int_equal(open_error(f, uid, NULL), CS_GROUP_MALFORMED);
    s->m[9].dev[2].valid = 0;
    s->m[1].ndev = CS_GROUP_DEVICES + 1;
    assert_int_equal(open_error(f, uid, NULL), CS_GROUP_MALFORMED);
    s->m[1].ndev = 0;
    s->h.members = 4;
    assert_int_equal(open_error(f, uid, NULL), CS_GROUP_MALFORMED);
    s->h.members = CS_GROUP_MEMBERS;
    memset(s->h.name, 'z', sizeof s->h.name);  /* no terminator */
    assert_int_equal(open_error(f, uid, NULL), CS_GROUP_MALFORMED);
    strcpy(s->h.name, "other");  /* another group's segment under this name */
    assert_int_equal(open_error(f, uid, NULL), CS_GROUP_MALFORMED);
    strcpy(s->h.name, "g");

    s->h.version = 2;
    assert_int_equal(open_error(f, uid, &detail), CS_GROUP_OTHER_VERSION);
    assert_int_equal(detail, 2);
    s->h.version = CS_GROUP_VERSION;

    s->h.uid = uid + 1;  /* says it is another user's */
    assert_int_equal(open_error(f, uid, &detail), CS_GROUP_NOT_OWNED);
    assert_int_equal(detail, uid + 1);
    s->h.uid = uid;

    s->h.pidns_ino ^= 1;
    assert_int_equal(open_error(f, uid, NULL), CS_GROUP_OTHER_NAMESPACE);
    s->h.pidns_ino ^= 1;
    assert_int_equal(open_error(f, uid, NULL), CS_GROUP_OK);
    munmap(s, sizeof *s);

    /* Cut short, then empty. */
    assert_int_equal(truncate(f->path, 4096), 0);
    assert_int_equal(open_error(f, uid, NULL), CS_GROUP_MALFORMED);
    assert_int_equal(truncate(f->path, 0), 0);
    assert_int_equal(open_error(f, uid, NULL), CS_GROUP_MALFORMED);
}

static void test_foreign_files_are_refused(void **state)
{
    fx *f = *state;
    unsigned uid = (unsigned)getuid();
    long detail = 0;
    cs_group_close(member(f, CAP));
    /* Another user's file: the file's owner is checked, not only what it says of itself
     * (without root no file of another user can be made here, so "another user" is the
     * caller's uid that differs from the file's). */
    assert_int_equal(open_error(f, uid + 1, &detail), CS_GROUP_NOT_OWNED);
    assert_int_equal(detail, uid);
    if (uid == 0) {  /* root can make the real thing: a file of another user */
        assert_int_equal(chown(f->path, 4242, (gid_t)-1), 0);
        assert_int_equal(open_error(f, uid, &detail), CS_GROUP_NOT_OWNED);
        assert_int_equal(detail, 4242);
        assert_int_equal(chown(f->path, uid, (gid_t)-1), 0);
    }
    /* Open to others: anyone could have written it. */
    assert_int_equal(chmod(f->path, 0644), 0);
    assert_int_equal(open_error(f, uid, &detail), CS_GROUP_OPEN_TO_OTHERS);
    assert_int_equal(detail, 0644);
    char why[160];
    cs_group_status st = {.error = CS_GROUP_OPEN_TO_OTHERS, .detail = detail};
    cs_group_explain(&st, why, sizeof why);
    assert_string_equal(why, "has mode 0644, open to other users: refused");
    assert_int_equal(chmod(f->path, 0600), 0);
    /* A link planted in its place, and a directory. */
    assert_int_equal(unlink(f->path), 0);
    assert_int_equal(symlink("/etc/passwd", f->path), 0);
    assert_int_equal(open_error(f, uid, NULL), CS_GROUP_NOT_FILE);
    assert_int_equal(unlink(f->path), 0);
    assert_int_equal(mkdir(f->path, 0700), 0);
    assert_true(open_error(f, uid, NULL) != CS_GROUP_OK);
    assert_int_equal(rmdir(f->path), 0);
    /* And nothing there, but the half-made file of a process killed while it made the
     * segment, under our pid: made anew, mode 0600. */
    char tmp[320];
    snprintf(tmp, sizeof tmp, "%s/." CS_GROUP_PREFIX "%u-g.%d", f->dir, uid, (int)getpid());
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(open_error(f, uid, NULL), CS_GROUP_OK);
    assert_int_equal(access(tmp, F_OK), -1);
    struct stat sb;
    assert_int_equal(stat(f->path, &sb), 0);
    assert_int_equal(sb.st_mode & 07777, 0600);
}

/* ---------------------------------------------------------------- threads (TSan) */

typedef struct {
    cs_group *g;
    ledger *l;
    unsigned seed;
} thread_arg;

static void *churn_thread(void *p)
{
    thread_arg *a = p;
    churn(a->g, a->l, a->seed, 2000);
    return NULL;
}

static void test_threads_of_one_member(void **state)
{
    fx *f = *state;
    cs_group *g = member(f, CAP);
    ledger l = {0};
    enum { N = 4 };
    pthread_t t[N];
    thread_arg a[N];
    for (int i = 0; i < N; i++) {
        a[i] = (thread_arg){g, &l, (unsigned)i + 1};
        assert_int_equal(pthread_create(&t[i], NULL, churn_thread, &a[i]), 0);
    }
    for (int i = 0; i < N; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(l.violations, 0);
    assert_int_equal(cs_group_mine(g, 0), 0);
    cs_group_close(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_charge_and_uncharge, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_names, setup, teardown),
        cmocka_unit_test_setup_teardown(test_members_share_the_cap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_members, setup, teardown),
        cmocka_unit_test_setup_teardown(test_member_killed_mid_allocation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_status_lists_members, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reused_pid_is_not_the_member, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_dead_members_want_is_freed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_stale_slot_of_our_own_is_dropped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_full_group_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_members_with_other_caps_are_told, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_segments_are_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_foreign_files_are_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads_of_one_member, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
