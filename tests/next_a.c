/* For the dlsym-next test: a library that defines cs_next_value and asks for the *next*
 * definition with dlsym(RTLD_NEXT), as interposing libraries do. */
#include <dlfcn.h>

__attribute__((visibility("default"))) int cs_next_value(void)
{
    return 1;
}

__attribute__((visibility("default"))) int cs_next_from_a(void)
{
    int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "cs_next_value");
    return next ? next() : -1;
}

/* A name starting with "cu", which the shim's dlsym looks at more closely. */
__attribute__((visibility("default"))) int cuNextProbe(void)
{
    return 1;
}

__attribute__((visibility("default"))) int cu_next_probe_from_a(void)
{
    int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "cuNextProbe");
    return next ? next() : -1;
}
