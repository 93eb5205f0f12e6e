/* The program's libc, for what libc keeps per copy but a process shares.
 *
 * Preloaded, the shim runs on the program's libc, and these are plain calls. As an audit
 * module (cs_bind.c) it runs on a second libc, that of its own namespace. Most of libc does
 * not mind (its malloc, mutexes and TLS work for the calls the shim makes), but thread-
 * specific keys do: each libc numbers its keys from its own table, while every thread has one
 * array of values, shared by all copies. A key of the shim's libc is a key the program's libc
 * also hands out: its pthread_setspecific overwrote what cudart, libcuda or Python kept there,
 * and they crashed (H100, 2026-11-24: cudart in a kernel launch, Python in PyGILState_Ensure).
 * So the shim's keys come from the program's libc, whose thread exit also runs their
 * destructors. Exit handlers likewise: the shim's libc would run them only when ld.so finishes
 * the shim, after libcuda is gone; the program's exit() runs them first. (Fork handlers have
 * the same problem; cs_bind.c binds the program's fork to the shim's handlers instead.)
 *
 * The functions are looked up when first used, long after the program's libc started; the
 * link map is only stored while ld.so loads objects. */
#include "cs_libc.h"

#include <stdbool.h>

#include "cs_elf.h"

typedef int (*key_create_fn)(pthread_key_t *, void (*)(void *));
typedef int (*setspecific_fn)(pthread_key_t, const void *);

/* libc.so.6, and libpthread.so.0 where the keys lived before glibc 2.34. */
static const struct link_map *program_libs[2];

void cs_libc_use(const struct link_map *map)
{
    for (int i = 0; i < 2; i++) {
        const struct link_map *none = NULL;
        if (__atomic_compare_exchange_n(&program_libs[i], &none, map, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            return;
    }
}

/* name in the program's object i (0, 1: as cs_libc_use saw them), or NULL. */
static void *program_symbol(int i, const char *name)
{
    const struct link_map *l = __atomic_load_n(&program_libs[i], __ATOMIC_ACQUIRE);
    return l ? cs_elf_symbol(l, name) : NULL;
}

/* Both functions from one object: the first of the program's that defines pthread_key_create
 * (libc, or libpthread before glibc 2.34), else this libc's (preloaded: the program's). */
static pthread_once_t resolve_once = PTHREAD_ONCE_INIT;
static key_create_fn key_create = pthread_key_create;
static setspecific_fn setspecific = pthread_setspecific;

static void resolve(void)
{
    for (int i = 0; i < 2; i++) {
        void *create = program_symbol(i, "pthread_key_create");
        void *set = program_symbol(i, "pthread_setspecific");
        if (create && set) {
            key_create = (key_create_fn)create;
            setspecific = (setspecific_fn)set;
            return;
        }
    }
}

int cs_libc_key_create(pthread_key_t *key, void (*destructor)(void *))
{
    pthread_once(&resolve_once, resolve);
    return key_create(key, destructor);
}

int cs_libc_setspecific(pthread_key_t key, const void *value)
{
    pthread_once(&resolve_once, resolve);
    return setspecific(key, value);
}

extern int __cxa_atexit(void (*fn)(void *), void *arg, void *dso);
typedef int (*cxa_atexit_fn)(void (*)(void *), void *, void *);

int cs_libc_atexit(void (*fn)(void *), void *arg)
{
    void *p = program_symbol(0, "__cxa_atexit");
    if (!p)
        p = program_symbol(1, "__cxa_atexit");
    cxa_atexit_fn f = p ? (cxa_atexit_fn)p : __cxa_atexit;
    return f(fn, arg, NULL); /* no object: run at exit(), never at a dlclose */
}
