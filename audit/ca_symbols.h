/* Layer 2 (see ca_desc.h): the symbol tables, the wrappers they hand out, and who is
 * calling. Used by the audit entry points (ca_audit.c) and by the wrappers themselves
 * (ca_wrappers.c, ca_runtime.c); it uses only the record writer (ca_trace.h) below it. */
#ifndef CA_SYMBOLS_H
#define CA_SYMBOLS_H

#include <link.h>

#include "ca_trace.h"

/* The generated wrappers, per library (driver, shim), and the real function behind each. */
extern void *const ca_gen_wrappers[2][CA_GEN_COUNT];
extern void *ca_real[2][CA_GEN_COUNT];

/* ---- ca_symbols.c ---- */

/* The wrapper to hand out for fn of lib (CA_LIB_DRIVER or CA_LIB_SHIM), or NULL to leave the
 * binding alone (filtered out). */
void *ca_wrapper_for(int lib, int fn);
/* Every cu* function l defines: remember it as lib's real function and map its address to
 * the wrapper (for cuGetProcAddress). */
void ca_index_object(const struct link_map *l, int lib);
/* Calls from code inside l count as made by from (CA_FROM_SHIM, CA_FROM_CUDART). */
void ca_note_caller(const struct link_map *l, int from);
/* cuGetProcAddress(_v2) found *pfn: swap in our wrapper for a watched function. */
void ca_after_proc_address(int result, void **pfn);
/* The wrapper of the function at address p (libcuda's or the shim's export), else p. */
void *ca_wrap_address(void *p);

/* ---- ca_runtime.c: the hand-written wrappers; each remembers real ---- */

/* The wrapper for a cudart symbol, or NULL. */
void *ca_runtime_bind(const char *name, void *real);
/* The wrapper for libcacheshim.so's cacheshim_scope_begin or _end, or NULL. */
void *ca_scope_bind(const char *name, void *real);
/* The wrapper for libc's fork, _exit or _Exit, or NULL for other names. */
void *ca_libc_bind(const char *name, void *real);
/* The wrapper for libcacheshim.so's dlsym. */
void *ca_dlsym_bind(void *real);

#endif
