/* A defined symbol of a loaded object, found in its dynamic symbol table through its hash
 * table, as ld.so does: no dlsym, so it can be called while ld.so relocates (cs_bind.c). */
#include "cs_elf.h"

#include <elf.h>
#include <string.h>

/* ld.so has relocated the d_ptr entries of l_ld in place on x86-64; elsewhere they may still
 * be offsets. */
static uintptr_t dyn_ptr(const struct link_map *l, ElfW(Addr) p)
{
    return p < l->l_addr ? (uintptr_t)(p + l->l_addr) : (uintptr_t)p;
}

static int defines(const ElfW(Sym) *s, const char *strtab, const char *name)
{
    return s->st_shndx != SHN_UNDEF && s->st_value != 0 && strcmp(strtab + s->st_name, name) == 0;
}

static const ElfW(Sym) *gnu_lookup(const uint32_t *gnu, const ElfW(Sym) *symtab,
                                   const char *strtab, const char *name)
{
    uint32_t h = 5381;
    for (const unsigned char *c = (const unsigned char *)name; *c; c++)
        h = h * 33 + *c;
    uint32_t nbuckets = gnu[0], symoffset = gnu[1], bloom_words = gnu[2];
    const uint32_t *buckets = (const uint32_t *)((const ElfW(Addr) *)(gnu + 4) + bloom_words);
    const uint32_t *chain = buckets + nbuckets;
    uint32_t i = nbuckets ? buckets[h % nbuckets] : 0;
    if (i < symoffset)
        return NULL;
    for (;; i++) {
        uint32_t ch = chain[i - symoffset];
        if ((ch | 1) == (h | 1) && defines(&symtab[i], strtab, name))
            return &symtab[i];
        if (ch & 1)
            return NULL;
    }
}

static const ElfW(Sym) *sysv_lookup(const uint32_t *hash, const ElfW(Sym) *symtab,
                                    const char *strtab, const char *name)
{
    uint32_t h = 0;
    for (const unsigned char *c = (const unsigned char *)name; *c; c++) {
        h = (h << 4) + *c;
        uint32_t g = h & 0xf0000000u;
        h ^= g >> 24;
        h &= ~g;
    }
    uint32_t nbucket = hash[0];
    const uint32_t *bucket = hash + 2, *chain = bucket + nbucket;
    for (uint32_t i = nbucket ? bucket[h % nbucket] : 0; i != STN_UNDEF; i = chain[i])
        if (defines(&symtab[i], strtab, name))
            return &symtab[i];
    return NULL;
}

void *cs_elf_symbol(const struct link_map *l, const char *name)
{
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const uint32_t *hash = NULL, *gnu = NULL;
    for (const ElfW(Dyn) *d = l->l_ld; d && d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB: symtab = (const ElfW(Sym) *)dyn_ptr(l, d->d_un.d_ptr); break;
        case DT_STRTAB: strtab = (const char *)dyn_ptr(l, d->d_un.d_ptr); break;
        case DT_HASH: hash = (const uint32_t *)dyn_ptr(l, d->d_un.d_ptr); break;
        case DT_GNU_HASH: gnu = (const uint32_t *)dyn_ptr(l, d->d_un.d_ptr); break;
        default: break;
        }
    }
    if (!symtab || !strtab)
        return NULL;
    const ElfW(Sym) *s = gnu    ? gnu_lookup(gnu, symtab, strtab, name)
                         : hash ? sysv_lookup(hash, symtab, strtab, name)
                                : NULL;
    return s ? (void *)(l->l_addr + s->st_value) : NULL;
}
