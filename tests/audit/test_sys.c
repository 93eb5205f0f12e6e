/* What the tracer's threads need of the system (audit/ca_sys.c): room on their stacks. Run with a large static TLS
 * (GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16777216, as a ThreadSanitizer program under
 * LD_AUDIT needs), where glibc's default leaves a thread some 8 KiB of stack. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_thread_has_room),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
