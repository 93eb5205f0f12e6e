/* The shim as an audit module: LD_AUDIT=libcacheshim.so. The dynamic linker asks la_symbind64
 * about every binding to libcuda (at PLT resolution, at load for BIND_NOW objects, and for
 * each dlsym result, glibc >= 2.35), from every object of every namespace, RTLD_DEEPBIND and
 * dlmopen'ed libraries included, and the shim answers with the wrappers the preload path
 * hands out (cs_wrapper_named). cuGetProcAddress is one of them, so what it returns is
 * wrapped as under the preload. No la_pltenter/la_pltexit: ld.so writes the answer into the
 * caller's GOT once, and later calls cost what they cost under the preload.
 *
 * One cache, one driver per process:
 * - An audit module lives in a namespace of its own; this copy of the shim holds the
 *   process's cache. A libcacheshim.so also preloaded (for cacheshim.h's API, or by habit)
 *   is never entered: every binding to it, and every dlsym answer from it, is redirected to
 *   this copy's function of the same name (its dlsym to the real one), so nothing is
 *   wrapped twice and its cache stays empty.
 * - The driver is the first libcuda the process loads, in any namespace (cs_driver_use). A
 *   dlmopen'ed namespace that loads its own copy of libcuda is bound to that first one, so
 *   its contexts, memory and streams are the process's and the cache can serve them.
 * - The program's fork is not this namespace's: binding the first namespace's fork to a
 *   wrapper runs the shim's fork handlers (pthread_atfork here would register them with the
 *   wrong libc). Thread-specific keys come from the program's libc too (cs_libc.c).
 */
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include "cacheshim.h"
#include "cs_elf.h"
#include "cs_libc.h"
#include "cs_shim.h"

/* What la_objopen saw, kept in the object's cookie. */
enum { OBJ_OTHER = 0, OBJ_DRIVER, OBJ_DRIVER_COPY, OBJ_PRELOADED_SHIM, OBJ_LIBC };

static struct link_map *first_driver;

/* ---------------------------------------------------------------- fork */

typedef pid_t (*fork_fn)(void);
static fork_fn real_fork;

static pid_t bound_fork(void)
{
    cs_shim_before_fork();
    pid_t pid = real_fork();
    if (pid == 0)
        cs_shim_after_fork_child();
    else
        cs_shim_after_fork_parent();
    return pid;
}

/* ---------------------------------------------------------------- answers */

/* This copy's own link map, for its exported functions (cacheshim.h's); set by la_version. */
static struct link_map *own_map;

/* This copy's function for a name the preloaded copy exports: every cacheshim_* function of
 * cacheshim.h (statistics, trim, scopes, debug checks, the PyTorch allocator), found in this
 * copy's own symbol table, so that none reaches the preloaded copy's empty state. */
static void *own_export(const char *name)
{
    if (strcmp(name, "dlsym") == 0)
        return (void *)cs_real_dlsym_fn();
    if (strncmp(name, "cacheshim_", 10) == 0)
        return own_map ? cs_elf_symbol(own_map, name) : NULL;
    return name[0] == 'c' && name[1] == 'u' ? cs_wrapper_named(name) : NULL;
}

/* The first libcuda's definition of a name another copy of libcuda defines. Not through
 * dlsym: this runs while ld.so relocates, and the first libcuda may be one ld.so loaded at
 * start, whose link map dlsym cannot search (glibc 2.36 crashes). */
static void *first_driver_symbol(const char *name)
{
    struct link_map *first = __atomic_load_n(&first_driver, __ATOMIC_ACQUIRE);
    return first ? cs_elf_symbol(first, name) : NULL;
}

static void *answer(uintptr_t kind, const char *name)
{
    void *w;
    switch (kind) {
    case OBJ_DRIVER:
        return name[0] == 'c' && name[1] == 'u' ? cs_wrapper_named(name) : NULL;
    case OBJ_DRIVER_COPY:
        if (name[0] == 'c' && name[1] == 'u' && (w = cs_wrapper_named(name)))
            return w;
        return first_driver_symbol(name);
    case OBJ_PRELOADED_SHIM:
        return own_export(name);
    case OBJ_LIBC:
        return strcmp(name, "fork") == 0 && real_fork ? (void *)bound_fork : NULL;
    default:
        return NULL;
    }
}

/* ---------------------------------------------------------------- the audit interface */

/* LD_AUDIT names the cache twice (by hand, or by a launcher inside another): ld.so loads a
 * copy for each entry, each in a namespace of its own, and each copy took the other's
 * wrappers for the driver's functions, without end (a stack overflow at the first
 * allocation). Is another copy of this file mapped already (/proc/self/maps: the namespaces
 * do not see each other's objects)? Then this one is not used (la_version returns 0: ld.so
 * drops it, silently) and the first serves. */
static bool other_copy_mapped(const struct link_map *self)
{
    char path[PATH_MAX], line[PATH_MAX + 128];
    FILE *maps = realpath(self->l_name, path) ? fopen("/proc/self/maps", "re") : NULL;
    bool found = false;
    while (maps && !found && fgets(line, sizeof line, maps)) {
        /* "start-end perms offset dev inode   path": the file's first mapping, elsewhere */
        unsigned long start, offset;
        char *name = strchr(line, '/');
        if (name)
            name[strcspn(name, "\n")] = '\0';
        found = name && strcmp(name, path) == 0 &&
                sscanf(line, "%lx-%*x %*s %lx", &start, &offset) == 2 && offset == 0 &&
                start != (unsigned long)self->l_addr;
    }
    if (maps)
        fclose(maps);
    return found;
}

CS_EXPORT unsigned int la_version(unsigned int version)
{
    Dl_info info;
    if (!dladdr1((void *)la_version, &info, (void **)&own_map, RTLD_DL_LINKMAP))
        own_map = NULL;
    if (own_map && other_copy_mapped(own_map))
        return 0;
    cs_driver_bind_mode();
    cs_shim_get(); /* options read now: CACHESHIM_DISABLE leaves every binding alone */
    return version < LAV_CURRENT ? version : LAV_CURRENT;
}

static int starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

CS_EXPORT unsigned int la_objopen(struct link_map *map, Lmid_t lmid, uintptr_t *cookie)
{
    const char *path = map->l_name ? map->l_name : "";
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    uintptr_t kind = OBJ_OTHER;
    if (starts_with(base, "libcuda.so")) {
        struct link_map *none = NULL;
        kind = __atomic_compare_exchange_n(&first_driver, &none, map, false, __ATOMIC_ACQ_REL,
                                           __ATOMIC_ACQUIRE)
                   ? OBJ_DRIVER
                   : OBJ_DRIVER_COPY;
        if (kind == OBJ_DRIVER)
            cs_driver_use(map, lmid);
    } else if (starts_with(base, "libcacheshim.so")) {
        kind = OBJ_PRELOADED_SHIM;
    } else if (starts_with(base, "libc.so.") && lmid == LM_ID_BASE) {
        kind = OBJ_LIBC;
        cs_libc_use(map);
    } else if (starts_with(base, "libpthread.so.") && lmid == LM_ID_BASE) {
        cs_libc_use(map); /* thread-specific keys, before glibc 2.34 */
    }
    *cookie = kind;
    return kind == OBJ_OTHER ? LA_FLG_BINDFROM : LA_FLG_BINDFROM | LA_FLG_BINDTO;
}

CS_EXPORT uintptr_t la_symbind64(Elf64_Sym *sym, unsigned int ndx, uintptr_t *refcook,
                                 uintptr_t *defcook, unsigned int *flags, const char *symname)
{
    (void)ndx;
    (void)refcook;
    (void)flags;
    uintptr_t real = sym->st_value;
    /* The shim's own lookups of the real driver, and a disabled shim, get what they asked. */
    if (cs_driver_loading() || cs_shim_get()->disabled)
        return real;
    if (*defcook == OBJ_LIBC && strcmp(symname, "fork") == 0)
        real_fork = (fork_fn)real;
    void *w = answer(*defcook, symname);
    return w ? (uintptr_t)w : real;
}
