/* The rtld-audit entry points (layer 1, the top; the layers are listed in ca_desc.h): which
 * objects are watched and which bindings get a wrapper.
 *
 * ld.so asks la_symbind64 about every binding from an object that la_objopen marked
 * LA_FLG_BINDFROM (all of them) to one marked LA_FLG_BINDTO (libcuda, libcacheshim,
 * libcudart, libc for fork, _exit, _Exit and quick_exit), both at PLT resolution and for
 * dlsym() results (glibc >= 2.35). We answer with our wrapper and keep the real address in
 * the wrapper's slot. We define no la_pltenter/la_pltexit, so ld.so writes the answer into
 * the GOT once and later calls cost nothing here. */
#include "ca_symbols.h"

#include <dlfcn.h>
#include <string.h>

#define CA_EXPORT __attribute__((visibility("default")))

/* What la_objopen saw, kept in the object's cookie. */
enum { OBJ_OTHER = 0, OBJ_DRIVER, OBJ_SHIM, OBJ_RUNTIME, OBJ_LIBC };

CA_EXPORT unsigned int la_version(unsigned int version)
{
    ca_trace_init();
    return version < LAV_CURRENT ? version : LAV_CURRENT;
}

static int starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

CA_EXPORT unsigned int la_objopen(struct link_map *map, Lmid_t lmid, uintptr_t *cookie)
{
    (void)lmid;
    const char *path = map->l_name ? map->l_name : "";
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    int kind = OBJ_OTHER;
    if (starts_with(base, "libcuda.so")) {
        kind = OBJ_DRIVER;
        ca_index_object(map, CA_LIB_DRIVER);
    } else if (starts_with(base, "libcacheshim.so")) {
        kind = OBJ_SHIM;
        ca_index_object(map, CA_LIB_SHIM);
        ca_note_caller(map, CA_FROM_SHIM);
    } else if (starts_with(base, "libcudart.so")) {
        kind = OBJ_RUNTIME;
        ca_note_caller(map, CA_FROM_CUDART);
    } else if (starts_with(base, "libc.so.")) {
        kind = OBJ_LIBC;
    }
    *cookie = (uintptr_t)kind;
    return kind == OBJ_OTHER ? LA_FLG_BINDFROM : LA_FLG_BINDFROM | LA_FLG_BINDTO;
}

/* The cache as an audit module ahead of this one (LD_AUDIT=libcacheshim.so:libcacheaudit.so,
 * shim/cs_bind.c) answers bindings with its own functions. Is answer one of them? The first
 * one names the module: from then on it is "the shim": its functions are the shim's real ones
 * (over a preloaded copy's, which it never enters), its calls come from the shim. */
static int in_audit_shim(uintptr_t answer)
{
    static int noted;
    Dl_info info;
    struct link_map *l = NULL;
    if (!dladdr1((void *)answer, &info, (void **)&l, RTLD_DL_LINKMAP) || !l || !info.dli_fname)
        return 0;
    const char *base = strrchr(info.dli_fname, '/');
    if (strncmp(base ? base + 1 : info.dli_fname, "libcacheshim", 12) != 0)
        return 0;
    if (!noted) {
        noted = 1;
        memset(ca_real[CA_LIB_SHIM], 0, sizeof ca_real[CA_LIB_SHIM]);
        ca_index_object(l, CA_LIB_SHIM);
        ca_note_caller(l, CA_FROM_SHIM);
    }
    return 1;
}

CA_EXPORT uintptr_t la_symbind64(Elf64_Sym *sym, unsigned int ndx, uintptr_t *refcook,
                                 uintptr_t *defcook, unsigned int *flags, const char *symname)
{
    (void)ndx;
    (void)refcook;
    uintptr_t real = sym->st_value;
    void *w = NULL;
    switch (*defcook) {
    case OBJ_DRIVER:
    case OBJ_SHIM: {
        if (*defcook == OBJ_SHIM && strcmp(symname, "dlsym") == 0) {
            w = ca_dlsym_bind((void *)real);
            break;
        }
        if (*defcook == OBJ_SHIM && strncmp(symname, "cacheshim_scope_", 16) == 0) {
            w = ca_scope_bind(symname, (void *)real);
            break;
        }
        if (symname[0] != 'c' || symname[1] != 'u')
            break;
        /* Answered by the cache as an earlier audit module: the call goes into the shim. */
        int to_shim = (*flags & LA_SYMB_ALTVALUE) && in_audit_shim(real);
        int lib = *defcook == OBJ_DRIVER && !to_shim ? CA_LIB_DRIVER : CA_LIB_SHIM;
        int fn = ca_lookup_gen(symname);
        if (fn < 0)
            break;
        ca_real[lib][fn] = (void *)real;
        w = ca_wrapper_for(lib, fn);
        break;
    }
    case OBJ_RUNTIME:
        if (symname[0] == 'c' && symname[1] == 'u')
            w = ca_runtime_bind(symname, (void *)real);
        break;
    case OBJ_LIBC:
        w = ca_libc_bind(symname, (void *)real);
        break;
    default:
        break;
    }
    return w ? (uintptr_t)w : real;
}

/* Audit modules are finalised after every object of the program: the last moment, and it
 * comes on exit() from any thread. */
__attribute__((destructor)) static void ca_fini(void)
{
    ca_trace_exit();
}
