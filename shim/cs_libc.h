/* The program's libc, for what libc keeps per copy but a process shares (cs_libc.c). */
#ifndef CS_LIBC_H
#define CS_LIBC_H

#include <link.h>
#include <pthread.h>

/* As an audit module (cs_bind.c): map is the libc (or, before glibc 2.34, libpthread) of the
 * program's first namespace, given by la_objopen. Preloaded, never called. */
void cs_libc_use(const struct link_map *map);

/* pthread_key_create and pthread_setspecific of the program's libc. */
int cs_libc_key_create(pthread_key_t *key, void (*destructor)(void *));
int cs_libc_setspecific(pthread_key_t key, const void *value);
/* fn(arg) at the program's exit(), as atexit does, before ld.so finishes any library. */
int cs_libc_atexit(void (*fn)(void *), void *arg);

#endif
