/* What the tracer's files and threads need of the system (audit/ca_sys.c): a file grown in
 * blanks, and threads with room on their stacks. Run with a large static TLS
 * (GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16777216, as a ThreadSanitizer program under
 * LD_AUDIT needs), where glibc's default leaves a thread some 8 KiB of stack. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "ca_sys.h"

static int g_done;

/* 128 KiB of the stack, written: more than any of the tracer's threads needs. */
static void *deep(void *arg)
{
    (void)arg;
    volatile char room[128 << 10];
    for (size_t i = 0; i < sizeof room; i += 512)
        room[i] = (char)i;
    __atomic_store_n(&g_done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void test_thread_has_room(void **state)
{
    (void)state;
    assert_int_equal(ca_sys_thread(deep, "test-deep"), 1);
    for (int i = 0; i < 10000 && !__atomic_load_n(&g_done, __ATOMIC_ACQUIRE); i++)
        usleep(1000);
    assert_int_equal(__atomic_load_n(&g_done, __ATOMIC_ACQUIRE), 1);
}

static int temp_file(void)
{
    char path[] = "/tmp/cacheaudit-sys.XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    return fd;
}

static void test_extend_blank(void **state)
{
    (void)state;
    int fd = temp_file();
    /* The head, then spaces; then a second step after it: 3 MiB and 7 bytes, no zero byte. */
    size_t first = ((size_t)1 << 20) + 5, second = ((size_t)2 << 20) + 2;
    assert_int_equal(ca_sys_extend_blank(fd, 0, first, "[\n", 2), 0);
    assert_int_equal(ca_sys_extend_blank(fd, (off_t)first, second, NULL, 0), 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    assert_int_equal(st.st_size, (off_t)(first + second));
    char *all = malloc(first + second);
    assert_non_null(all);
    assert_int_equal(pread(fd, all, first + second, 0), (ssize_t)(first + second));
    assert_memory_equal(all, "[\n", 2);
    size_t blanks = 0;
    for (size_t i = 2; i < first + second; i++)
        blanks += all[i] == ' ';
    assert_int_equal(blanks, first + second - 2);
    free(all);
    close(fd);
}

/* Past RLIMIT_FSIZE: EFBIG, and the SIGXFSZ it raises does not end the process. */
static void test_extend_past_the_limit(void **state)
{
    (void)state;
    int fd = temp_file();
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 100000;
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int err = ca_sys_extend_blank(fd, 0, (size_t)1 << 20, "[\n", 2);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    assert_int_equal(err, EFBIG);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    assert_int_equal(st.st_size, 100000); /* what fitted: the head and blanks */
    sigset_t pending;
    assert_int_equal(sigpending(&pending), 0);
    assert_false(sigismember(&pending, SIGXFSZ));
    close(fd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_thread_has_room),
        cmocka_unit_test(test_extend_blank),
        cmocka_unit_test(test_extend_past_the_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
