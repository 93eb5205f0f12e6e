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
 * destructors. (Fork handlers have the same problem; cs_bind.c binds the program's fork to
 * the shim's handlers instead.)
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

/* The program's definition of name, or NULL when the shim is preloaded (or the program's
 * libc was not seen). */
static void *program_symbol(const char *name)
{
    for (int i = 0; i < 2; i++) {
        const struct link_map *l = __atomic_load_n(&program_libs[i], __ATOMIC_ACQUIRE);
        void *f = l ? cs_elf_symbol(l, name) : NULL;
        if (f)
            return f;
    }
    return NULL;
}

int cs_libc_key_create(pthread_key_t *key, void (*destructor)(void *))
{
    key_create_fn f = (key_create_fn)program_symbol("pthread_key_create");
    return f ? f(key, destructor) : pthread_key_create(key, destructor);
}

int cs_libc_setspecific(pthread_key_t key, const void *value)
{
    static setspecific_fn cached;
    setspecific_fn f = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (!f) {
        f = (setspecific_fn)program_symbol("pthread_setspecific");
        if (!f)
            f = pthread_setspecific;
        __atomic_store_n(&cached, f, __ATOMIC_RELAXED);
    }
    return f(key, value);
}
