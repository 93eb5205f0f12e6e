/* Symbols of loaded objects, read from their dynamic sections (cs_elf.c). */
#ifndef CS_ELF_H
#define CS_ELF_H

#include <link.h>

/* The address of the symbol `name` that the object l defines, or NULL. */
void *cs_elf_symbol(const struct link_map *l, const char *name);

#endif
