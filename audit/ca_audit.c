/* The rtld-audit entry points: which objects are watched, which bindings get a wrapper,
 * and the address -> wrapper map that makes cuGetProcAddress results traceable.
 *
 * ld.so asks la_symbind64 about every binding from an object that la_objopen marked
 * LA_FLG_BINDFROM (all of them) to one marked LA_FLG_BINDTO (libcuda, libcacheshim,
 * libcudart, libc for fork), both at PLT resolution and for dlsym() results (glibc >= 2.35).
 * We answer with our wrapper and keep the real address in the wrapper's slot. We define no
 * la_pltenter/la_pltexit, so ld.so writes the answer into the GOT once and later calls cost
 * nothing here. cuGetProcAddress hands out addresses without any binding: its wrapper
 * looks each result up by identity in a table built from the object's dynamic symbols. */
#include "ca_internal.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>

#include "cs_options.h"

#define CA_EXPORT __attribute__((visibility("default")))

void *ca_real[2][CA_GEN_COUNT];

/* What la_objopen saw, kept in the object's cookie. */
enum { OBJ_OTHER = 0, OBJ_DRIVER, OBJ_SHIM, OBJ_RUNTIME, OBJ_LIBC };

/* ---- names ---------------------------------------------------------------------------------- */

static int cmp_name(const void *key, const void *elem)
{
    return strcmp(key, ((const ca_fn_desc *)elem)->name);
}

/* ca_gen_desc is sorted by name (the generator sorts). */
int ca_lookup_gen(const char *name)
{
    const ca_fn_desc *d =
        bsearch(name, ca_gen_desc, CA_GEN_COUNT, sizeof ca_gen_desc[0], cmp_name);
    return d ? (int)(d - ca_gen_desc) : -1;
}

static int is_proc_address(int fn)
{
    return fn == CA_FN_cuGetProcAddress || fn == CA_FN_cuGetProcAddress_v2;
}

/* The wrapper to hand out for fn of lib (0 driver, 1 shim), or NULL to leave the binding
 * alone: calls the filter leaves out cost nothing. cuGetProcAddress is always wrapped, as
 * it must swap in wrappers for what it returns. */
static void *wrapper_for(int lib, int fn)
{
    return ca_traced[fn] || is_proc_address(fn) ? ca_gen_wrappers[lib][fn] : NULL;
}

/* ---- address -> wrapper, for cuGetProcAddress --------------------------------------------------- */

/* Open addressing; filled at la_objopen (under ld.so's lock), read without a lock. An entry
 * is published by storing its key last, with release order. */
#define MAP_SIZE 8192
static struct {
    uintptr_t addr;
    void *wrapper;
} g_map[MAP_SIZE];

static size_t map_slot(uintptr_t a) { return (size_t)((a >> 4) * 0x9E3779B97F4A7C15ull >> 51) % MAP_SIZE; }

static void map_put(uintptr_t addr, void *wrapper)
{
    for (size_t i = map_slot(addr), n = 0; n < MAP_SIZE; i = (i + 1) % MAP_SIZE, n++) {
        uintptr_t have = __atomic_load_n(&g_map[i].addr, __ATOMIC_ACQUIRE);
        if (have == addr)
            return; /* aliases: the first name wins */
        if (have == 0) {
            g_map[i].wrapper = wrapper;
            __atomic_store_n(&g_map[i].addr, addr, __ATOMIC_RELEASE);
            return;
        }
    }
}

static void *map_get(uintptr_t addr)
{
    for (size_t i = map_slot(addr), n = 0; n < MAP_SIZE; i = (i + 1) % MAP_SIZE, n++) {
        uintptr_t have = __atomic_load_n(&g_map[i].addr, __ATOMIC_ACQUIRE);
        if (have == addr)
            return g_map[i].wrapper;
        if (have == 0)
            return NULL;
    }
    return NULL;
}

void *ca_wrap_address(void *p)
{
    void *w = p ? map_get((uintptr_t)p) : NULL;
    return w ? w : p;
}

void ca_after_proc_address(int result, void **pfn)
{
    if (result != 0 || !pfn || !*pfn)
        return;
    void *w = map_get((uintptr_t)*pfn);
    if (w)
        *pfn = w;
}

/* ---- an object's dynamic symbols ---------------------------------------------------------------- */

/* ld.so has relocated the d_ptr entries of l_ld in place on x86-64; elsewhere they may
 * still be offsets. */
static uintptr_t dyn_ptr(const struct link_map *l, ElfW(Addr) p)
{
    return p < l->l_addr ? (uintptr_t)(p + l->l_addr) : (uintptr_t)p;
}

/* The number of dynamic symbols, from DT_HASH's nchain or by walking DT_GNU_HASH. */
static size_t count_symbols(const struct link_map *l, const ElfW(Word) *hash,
                            const ElfW(Word) *gnu)
{
    if (hash)
        return hash[1];
    if (!gnu)
        return 0;
    ElfW(Word) nbuckets = gnu[0], symoffset = gnu[1], bloom = gnu[2];
    const ElfW(Word) *buckets = (const ElfW(Word) *)((const ElfW(Addr) *)(gnu + 4) + bloom);
    const ElfW(Word) *chain = buckets + nbuckets;
    ElfW(Word) last = 0;
    for (ElfW(Word) b = 0; b < nbuckets; b++)
        if (buckets[b] > last)
            last = buckets[b];
    if (last < symoffset)
        return symoffset;
    while (!(chain[last - symoffset] & 1))
        last++;
    (void)l;
    return last + 1;
}

/* Every defined function of l that cuda.h declares: remember it as lib's real function and
 * map its address to our wrapper. */
static void index_object(const struct link_map *l, int lib)
{
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const ElfW(Word) *hash = NULL, *gnu = NULL;
    for (const ElfW(Dyn) *d = l->l_ld; d && d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB: symtab = (const ElfW(Sym) *)dyn_ptr(l, d->d_un.d_ptr); break;
        case DT_STRTAB: strtab = (const char *)dyn_ptr(l, d->d_un.d_ptr); break;
        case DT_HASH: hash = (const ElfW(Word) *)dyn_ptr(l, d->d_un.d_ptr); break;
        case DT_GNU_HASH: gnu = (const ElfW(Word) *)dyn_ptr(l, d->d_un.d_ptr); break;
        default: break;
        }
    }
    if (!symtab || !strtab)
        return;
    size_t n = count_symbols(l, hash, gnu);
    for (size_t i = 0; i < n; i++) {
        const ElfW(Sym) *s = &symtab[i];
        if (s->st_shndx == SHN_UNDEF || ELF64_ST_TYPE(s->st_info) != STT_FUNC)
            continue;
        const char *name = strtab + s->st_name;
        if (name[0] != 'c' || name[1] != 'u')
            continue;
        int fn = ca_lookup_gen(name);
        if (fn < 0)
            continue;
        uintptr_t addr = l->l_addr + s->st_value;
        if (!ca_real[lib][fn])
            ca_real[lib][fn] = (void *)addr;
        void *w = wrapper_for(lib, fn);
        if (w)
            map_put(addr, w);
    }
}

/* ---- who is calling: address ranges of the shim and of cudart ----------------------------------- */

static struct {
    uintptr_t lo, hi;
} g_range[3]; /* [CA_FROM_SHIM], [CA_FROM_CUDART] */

/* The object's loaded extent, from its program headers (mapped with the first segment). */
static void note_range(const struct link_map *l, int from)
{
    const ElfW(Ehdr) *eh = (const ElfW(Ehdr) *)l->l_addr;
    if (!l->l_addr || memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0)
        return;
    const ElfW(Phdr) *ph = (const ElfW(Phdr) *)(l->l_addr + eh->e_phoff);
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (int i = 0; i < eh->e_phnum; i++) {
        if (ph[i].p_type != PT_LOAD)
            continue;
        uintptr_t a = l->l_addr + ph[i].p_vaddr;
        if (a < lo)
            lo = a;
        if (a + ph[i].p_memsz > hi)
            hi = a + ph[i].p_memsz;
    }
    __atomic_store_n(&g_range[from].hi, hi, __ATOMIC_RELAXED);
    __atomic_store_n(&g_range[from].lo, lo, __ATOMIC_RELAXED);
}

int ca_from_of(const void *ret)
{
    uintptr_t a = (uintptr_t)ret;
    for (int f = CA_FROM_SHIM; f <= CA_FROM_CUDART; f++)
        if (a >= __atomic_load_n(&g_range[f].lo, __ATOMIC_RELAXED) &&
            a < __atomic_load_n(&g_range[f].hi, __ATOMIC_RELAXED))
            return f;
    return CA_FROM_APP;
}

/* ---- the audit interface ------------------------------------------------------------------------- */

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
        index_object(map, CA_LIB_DRIVER);
    } else if (starts_with(base, "libcacheshim.so")) {
        kind = OBJ_SHIM;
        index_object(map, CA_LIB_SHIM);
        note_range(map, CA_FROM_SHIM);
    } else if (starts_with(base, "libcudart.so")) {
        kind = OBJ_RUNTIME;
        note_range(map, CA_FROM_CUDART);
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
        index_object(l, CA_LIB_SHIM);
        note_range(l, CA_FROM_SHIM);
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
        if (symname[0] != 'c' || symname[1] != 'u')
            break;
        /* Answered by the cache as an earlier audit module: the call goes into the shim. */
        int to_shim = (*flags & LA_SYMB_ALTVALUE) && in_audit_shim(real);
        int lib = *defcook == OBJ_DRIVER && !to_shim ? CA_LIB_DRIVER : CA_LIB_SHIM;
        int fn = ca_lookup_gen(symname);
        if (fn < 0)
            break;
        ca_real[lib][fn] = (void *)real;
        w = wrapper_for(lib, fn);
        break;
    }
    case OBJ_RUNTIME:
        if (symname[0] == 'c' && symname[1] == 'u')
            w = ca_runtime_bind(symname, (void *)real);
        break;
    case OBJ_LIBC:
        if (strcmp(symname, "fork") == 0)
            w = ca_fork_bind((void *)real);
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
    ca_flush_all(1);
}
