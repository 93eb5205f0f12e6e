/* The symbol tables (layer 2, see ca_desc.h): the cu* functions an object defines, the
 * address -> wrapper map that makes cuGetProcAddress results traceable, and the address
 * ranges that tell who is calling.
 *
 * cuGetProcAddress hands out addresses without any binding that ld.so would report: its
 * wrapper looks each result up by identity in a table built from the object's dynamic
 * symbols when la_objopen saw it. */
#include "ca_symbols.h"

#include <elf.h>
#include <string.h>

void *ca_real[2][CA_GEN_COUNT];

static int is_proc_address(int fn)
{
    return fn == CA_FN_cuGetProcAddress || fn == CA_FN_cuGetProcAddress_v2;
}

/* Calls the filter leaves out cost nothing: no wrapper. cuGetProcAddress is always wrapped,
 * as it must swap in wrappers for what it returns. */
void *ca_wrapper_for(int lib, int fn)
{
    return __atomic_load_n(&ca_traced[fn], __ATOMIC_RELAXED) || is_proc_address(fn)
               ? ca_gen_wrappers[lib][fn]
               : NULL;
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
void ca_index_object(const struct link_map *l, int lib)
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
        void *w = ca_wrapper_for(lib, fn);
        if (w)
            map_put(addr, w);
    }
}

/* ---- who is calling: address ranges of the shim and of cudart ----------------------------------- */

/* The object's loaded extent, from its program headers (mapped with the first segment),
 * for the record writer (ca_trace_caller_range). */
void ca_note_caller(const struct link_map *l, int from)
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
    ca_trace_caller_range(from, lo, hi);
}
