/* Call sites: glibc's backtrace() at each traced allocation (when CACHESHIM_TRACE_STACK asks
 * for it), on the calling thread as its record is begun, the tracer's own frames left out;
 * as the record is written (on the same thread), the object of each address through
 * dladdr1, its path, load bias and GNU build-id read from its program headers in memory,
 * written once per object and file. Only libc and libdl.
 *
 * Any thread may write a record: the objects table is read without a lock (entries are
 * published by a release store of the count and never change after), a new entry is looked
 * up with no lock held (dladdr1 takes ld.so's lock) and added under a lock held only for the
 * copy, and whose line goes in this process's file is decided by one exchange. */
#include "ca_stack.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <unwind.h>

unsigned char ca_stack_fn[CA_FN_COUNT];
static int g_depth;
static uintptr_t g_self_lo, g_self_hi; /* the tracer's own mapping */
static const void *g_self_eh_frame;    /* and its .eh_frame, from its PT_GNU_EH_FRAME */

/* The allocation calls (ca_mem.c's roles, frees and pitch included minus the frees). */
static const char *const alloc_names[] = {
    "cuMemAlloc", "cuMemAlloc_v2", "cuMemAllocManaged", "cuMemAllocAsync",
    "cuMemAllocAsync_ptsz", "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz",
    "cuMemCreate", "cuMemAllocPitch", "cuMemAllocPitch_v2",
};

static const void *eh_frame_of(const unsigned char *hdr);

/* [lo, hi) of the PT_LOAD segments of the object whose ELF header is at base; its .eh_frame
 * into *eh_frame unless that is NULL (NULL if none is found). */
static void object_range(const void *base, uintptr_t bias, uintptr_t *lo, uintptr_t *hi,
                         const void **eh_frame)
{
    const ElfW(Ehdr) *eh = base;
    const ElfW(Phdr) *ph = (const ElfW(Phdr) *)((const char *)base + eh->e_phoff);
    *lo = UINTPTR_MAX;
    *hi = 0;
    if (eh_frame)
        *eh_frame = NULL;
    for (int i = 0; i < eh->e_phnum; i++) {
        if (ph[i].p_type == PT_GNU_EH_FRAME && eh_frame)
            *eh_frame = eh_frame_of((const unsigned char *)(bias + ph[i].p_vaddr));
        if (ph[i].p_type != PT_LOAD)
            continue;
        uintptr_t a = bias + ph[i].p_vaddr, b = a + ph[i].p_memsz;
        *lo = a < *lo ? a : *lo;
        *hi = b > *hi ? b : *hi;
    }
}

void ca_stack_init(int depth)
{
    g_depth = depth < 0 ? 0 : depth > CA_STACK_MAX ? CA_STACK_MAX : depth;
    if (!g_depth)
        return;
    for (size_t i = 0; i < sizeof alloc_names / sizeof alloc_names[0]; i++) {
        int fn = ca_lookup_gen(alloc_names[i]);
        if (fn >= 0)
            ca_stack_fn[fn] = 1;
    }
    ca_stack_fn[CA_RT_cudaMalloc] = 1;
    ca_stack_fn[CA_RT_cudaMallocAsync] = 1;
    ca_stack_fn[CA_RT_cudaMallocAsync_ptsz] = 1;
    Dl_info info;
    struct link_map *lm = NULL;
    if (dladdr1((void *)ca_stack_capture, &info, (void **)&lm, RTLD_DL_LINKMAP) && lm)
        object_range(info.dli_fbase, lm->l_addr, &g_self_lo, &g_self_hi, &g_self_eh_frame);
}

/* The unwinder: libgcc_s's _Unwind_Backtrace, loaded by the tracer from its own namespace at
 * the first capture (not at start: a dlopen while the program is still being loaded aborted
 * under a preloaded cache), with the tracer's own unwind data registered where ld.so cannot
 * tell it (register_self). */
typedef _Unwind_Reason_Code (*unwind_backtrace_fn)(_Unwind_Trace_Fn, void *);
typedef _Unwind_Ptr (*unwind_get_ip_fn)(struct _Unwind_Context *);

typedef void (*register_frame_info_fn)(const void *, void *);

static pthread_once_t unwinder_once = PTHREAD_ONCE_INIT;
static unwind_backtrace_fn unwind_backtrace;
static unwind_get_ip_fn unwind_get_ip;
/* libgcc's record of a registered .eh_frame (its struct object: 6 words in libgcc 12). */
static void *g_self_frames[16];

/* The start of the .eh_frame that an .eh_frame_hdr points at, or NULL for an encoding other
 * than the linkers' (pc-relative 4 bytes, or absolute). */
static const void *eh_frame_of(const unsigned char *hdr)
{
    const unsigned char *field = hdr + 4;
    int32_t rel;
    switch (hdr[1]) {
    case 0x1b: /* DW_EH_PE_pcrel | DW_EH_PE_sdata4 */
        memcpy(&rel, field, sizeof rel);
        return field + rel;
    case 0x00: { /* DW_EH_PE_absptr */
        const void *p;
        memcpy(&p, field, sizeof p);
        return p;
    }
    default:
        return NULL;
    }
}

/* In an audit namespace after the first (LD_AUDIT=libcacheshim.so:libcacheaudit.so, what
 * `cacheshim trace --cache` sets), ld.so's table of objects (_dl_find_object, which libgcc
 * asks for a frame's unwind data) does not know the tracer (glibc 2.36), so no stack could be
 * unwound past the tracer's own frames: every stack came out empty. Its .eh_frame is then
 * registered with the unwinder directly, as objects without that table once were. */
static void register_self(void *libgcc)
{
#if __GLIBC_PREREQ(2, 35) /* before, libgcc searches every namespace (dl_iterate_phdr) */
    struct dl_find_object found;
    if (!g_self_eh_frame || _dl_find_object((void *)ca_stack_capture, &found) == 0)
        return;
    void *reg = dlsym(libgcc, "__register_frame_info");
    register_frame_info_fn f;
    if (reg) {
        memcpy(&f, &reg, sizeof f);
        f(g_self_eh_frame, g_self_frames);
    }
#else
    (void)libgcc;
#endif
}

static void load_unwinder(void)
{
    void *h = dlopen("libgcc_s.so.1", RTLD_NOW);
    void *bt = h ? dlsym(h, "_Unwind_Backtrace") : NULL;
    void *ip = h ? dlsym(h, "_Unwind_GetIP") : NULL;
    if (bt && ip) {
        register_self(h);
        memcpy(&unwind_get_ip, &ip, sizeof ip);
        memcpy(&unwind_backtrace, &bt, sizeof bt);
    }
}

typedef struct {
    uint64_t *pcs;
    unsigned n;
} walk;

/* One frame: kept unless it is the tracer's own (its wrappers, this function's callers). */
static _Unwind_Reason_Code frame(struct _Unwind_Context *ctx, void *arg)
{
    walk *w = arg;
    uintptr_t pc = (uintptr_t)unwind_get_ip(ctx);
    if (pc == 0)
        return _URC_END_OF_STACK;
    if (pc >= g_self_lo && pc < g_self_hi)
        return _URC_NO_REASON;
    w->pcs[w->n++] = pc;
    return w->n < (unsigned)g_depth ? _URC_NO_REASON : _URC_END_OF_STACK;
}

unsigned ca_stack_capture(uint64_t *pcs)
{
    pthread_once(&unwinder_once, load_unwinder);
    if (!unwind_backtrace || g_depth == 0)
        return 0;
    walk w = {pcs, 0};
    unwind_backtrace(frame, &w);
    return w.n;
}

/* ---- objects, as records are written ------------------------------------------------------ */

#define MAX_OBJECTS 512

typedef struct {
    uintptr_t lo, hi;
    int written_pid; /* atomic: the process whose file has its line; 0 none */
    char line[1200]; /* its JSON line without pid, "" when it has no usable path */
} object;

static object g_obj[MAX_OBJECTS];
static int g_nobj;                                         /* atomic: entries published */
static pthread_mutex_t g_add_lock = PTHREAD_MUTEX_INITIALIZER; /* adding an entry */

static size_t hex_of(const unsigned char *p, size_t n, char *out, size_t cap)
{
    static const char digits[] = "0123456789abcdef";
    size_t o = 0;
    for (size_t i = 0; i < n && o + 3 <= cap; i++) {
        out[o++] = digits[p[i] >> 4];
        out[o++] = digits[p[i] & 15];
    }
    out[o] = '\0';
    return o;
}

/* The GNU build-id in the object's PT_NOTE segments, as hex; "" without one. */
static void build_id(const void *base, uintptr_t bias, char *out, size_t cap)
{
    const ElfW(Ehdr) *eh = base;
    const ElfW(Phdr) *ph = (const ElfW(Phdr) *)((const char *)base + eh->e_phoff);
    out[0] = '\0';
    for (int i = 0; i < eh->e_phnum; i++) {
        if (ph[i].p_type != PT_NOTE)
            continue;
        const char *p = (const char *)(bias + ph[i].p_vaddr), *end = p + ph[i].p_memsz;
        while (p + sizeof(ElfW(Nhdr)) <= end) {
            const ElfW(Nhdr) *nh = (const ElfW(Nhdr) *)p;
            const char *name = p + sizeof *nh;
            const unsigned char *desc = (const unsigned char *)name + ((nh->n_namesz + 3) & ~3u);
            if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && !memcmp(name, "GNU", 4) &&
                (const char *)desc + nh->n_descsz <= end) {
                hex_of(desc, nh->n_descsz, out, cap);
                return;
            }
            p = (const char *)desc + ((nh->n_descsz + 3) & ~3u);
        }
    }
}

/* s as a JSON string body into out; false when it does not fit. */
static int json_escape(const char *s, char *out, size_t cap)
{
    size_t o = 0;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (o + 7 >= cap)
            return 0;
        if (c == '"' || c == '\\') {
            out[o++] = '\\';
            out[o++] = (char)c;
        } else if (c < 0x20 || c == 0x7f) {
            o += (size_t)snprintf(out + o, cap - o, "\\u%04x", c);
        } else {
            out[o++] = (char)c;
        }
    }
    out[o] = '\0';
    return 1;
}

static object *known_object(uintptr_t pc, int from, int to)
{
    for (int i = from; i < to; i++)
        if (pc >= g_obj[i].lo && pc < g_obj[i].hi)
            return &g_obj[i];
    return NULL;
}

/* The object holding pc: known, or found through dladdr1 and added; NULL when none. */
static object *object_of(uintptr_t pc)
{
    int n = __atomic_load_n(&g_nobj, __ATOMIC_ACQUIRE);
    object *known = known_object(pc, 0, n);
    if (known)
        return known;
    Dl_info info;
    struct link_map *lm = NULL;
    if (n == MAX_OBJECTS || !dladdr1((void *)pc, &info, (void **)&lm, RTLD_DL_LINKMAP) ||
        !lm || !info.dli_fbase)
        return NULL;
    object o;
    object_range(info.dli_fbase, lm->l_addr, &o.lo, &o.hi, NULL);
    if (pc < o.lo || pc >= o.hi)
        return NULL;
    char path[1024] = "", esc[800], id[130];
    const char *name = lm->l_name;
    if (!name || !name[0]) { /* the main program */
        ssize_t k = readlink("/proc/self/exe", path, sizeof path - 1);
        path[k > 0 ? k : 0] = '\0';
        name = path;
    }
    build_id(info.dli_fbase, lm->l_addr, id, sizeof id);
    o.line[0] = '\0';
    if (name[0] && json_escape(name, esc, sizeof esc))
        snprintf(o.line, sizeof o.line,
                 "\"object\":\"%s\",\"base\":\"0x%lx\",\"build_id\":\"%s\"}", esc,
                 (unsigned long)lm->l_addr, id);
    o.written_pid = 0;
    /* Another thread may have added it meanwhile. */
    pthread_mutex_lock(&g_add_lock);
    int now = __atomic_load_n(&g_nobj, __ATOMIC_RELAXED);
    object *added = known_object(pc, n, now);
    if (!added && now < MAX_OBJECTS) {
        added = &g_obj[now];
        memcpy(added, &o, sizeof o);
        __atomic_store_n(&g_nobj, now + 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_add_lock);
    return added;
}

size_t ca_stack_objects(int pid, const ca_rec *r, char *buf, size_t cap)
{
    size_t n = 0;
    for (unsigned i = 0; i < r->nstack; i++) {
        object *o = object_of((uintptr_t)r->stack[i]);
        if (!o || !o->line[0] || __atomic_load_n(&o->written_pid, __ATOMIC_RELAXED) == pid)
            continue;
        int k = snprintf(buf + n, cap - n, "{\"pid\":%d,%s\n", pid, o->line);
        if (k < 0 || (size_t)k >= cap - n) /* no room now: with a later record */
            break;
        if (__atomic_exchange_n(&o->written_pid, pid, __ATOMIC_RELAXED) != pid)
            n += (size_t)k; /* else another thread's record has it */
    }
    return n;
}

/* A thread of the parent may have been adding an entry: its copy was not published. */
void ca_stack_fork_child(void)
{
    pthread_mutex_init(&g_add_lock, NULL);
}
