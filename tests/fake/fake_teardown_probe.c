/* Test helper for test_fake: lets a test run code after the fake driver's destructor.
 *
 * glibc runs the executable's destructors before _dl_fini, so nothing the test executable
 * registers can run after a library's destructor. But exit handlers registered *during*
 * _dl_fini run once it has finished. This library is dlopen'ed after libcuda.so.1, so its
 * destructor runs before the fake's; it registers the test's hook from there. */
#include <stdlib.h>

static void (*g_hook)(void);

__attribute__((visibility("default"))) void fake_probe_arm(void (*hook)(void)) { g_hook = hook; }

__attribute__((destructor)) static void probe_fini(void)
{
    if (g_hook)
        atexit(g_hook);
}
