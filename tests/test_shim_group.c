/* CACHESHIM_GROUP through the shim, on the fake driver: two processes of one group under
 * CACHESHIM_CAP=64MiB (tests/meson.build). One holds 40 MiB; the other is refused 40 MiB,
 * sees the group's room in cuMemGetInfo, and gets its 40 MiB once the first is killed with
 * SIGKILL. The program gives itself a group name of its own and runs itself again with it
 * (the shim reads its variables once, at start), so runs beside it never share its group. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "shim_util.h"

/* A child's steps, each one checked; its exit status says which failed. */
static int member(int tell, int hear, bool first)
{
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx))
        return 10;
    CUdeviceptr p = 0;
    char c = 'x';
    if (first) {
        if (cuMemAlloc(&p, 40 * MiB) != CUDA_SUCCESS)
            return 11;
        if (write(tell, &c, 1) != 1)
            return 12;
        pause();  /* killed here, holding 40 MiB */
        return 13;
    }
    if (cuMemAlloc(&p, 40 * MiB) != CUDA_ERROR_OUT_OF_MEMORY)
        return 20;
    size_t free_b = 0, total_b = 0;
    if (cuMemGetInfo(&free_b, &total_b) || total_b != 64 * MiB || free_b > 24 * MiB)
        return 21;
    if (write(tell, &c, 1) != 1 || read(hear, &c, 1) != 1)
        return 22;
    /* The first member is dead (perhaps not yet waited for): its 40 MiB are ours. */
    if (cuMemAlloc(&p, 40 * MiB) != CUDA_SUCCESS)
        return 23;
    if (cuMemGetInfo(&free_b, &total_b) || free_b > 24 * MiB)
        return 24;
    return cuMemFree(p) == CUDA_SUCCESS ? 0 : 25;
}

static pid_t spawn(int tell, int hear, bool first)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int rc = member(tell, hear, first);
        if (rc && write(tell, "F", 1) != 1)  /* the parent must not wait for a step never done */
            rc = 99;
        _exit(rc);
    }
    return pid;
}

static int status_of(pid_t pid)
{
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void test_killed_member_gives_its_share(void **state)
{
    (void)state;
    int up[2], down[2];
    assert_int_equal(pipe(up), 0);
    assert_int_equal(pipe(down), 0);
    char c;
    pid_t first = spawn(up[1], down[0], true);
    assert_int_equal(read(up[0], &c, 1), 1);
    if (c == 'F')
        fail_msg("the first member failed at step %d", status_of(first));
    pid_t second = spawn(up[1], down[0], false);
    assert_int_equal(read(up[0], &c, 1), 1);
    if (c == 'F') {
        kill(first, SIGKILL);
        fail_msg("the second member failed at step %d", status_of(second));
    }
    assert_int_equal(kill(first, SIGKILL), 0);
    assert_int_equal(write(down[1], &c, 1), 1);
    assert_int_equal(status_of(second), 0);
    assert_int_equal(status_of(first), 128 + SIGKILL);
}

int main(int argc, char **argv)
{
    (void)argc;
    if (!getenv("CACHESHIM_GROUP")) {
        char name[64];
        snprintf(name, sizeof name, "test-%d-%ld", (int)getpid(), (long)time(NULL));
        setenv("CACHESHIM_GROUP", name, 1);
        execv("/proc/self/exe", argv);
        perror("execv");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_killed_member_gives_its_share),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char path[256];
    snprintf(path, sizeof path, "/dev/shm/cacheshim-%u-%s", (unsigned)getuid(),
             getenv("CACHESHIM_GROUP"));
    unlink(path);
    return rc;
}
