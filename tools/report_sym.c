/* Call sites into names: each frame's object (the tracer's "object" records: path, load bias,
 * build-id) is opened with elfutils' libdwfl at its recorded address, and the address looked
 * up in its symbol table and DWARF line table (separate debug files found the standard way:
 * /usr/lib/debug/.build-id). Done when the report is made, on the machine that makes it: an
 * object missing there, or rebuilt since (its build-id differs), gives "object+0xOFFSET". */
#include "report.h"

#include <elfutils/libdwfl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static const Dwfl_Callbacks callbacks = {
    .find_elf = dwfl_build_id_find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
};

/* One process's objects reported to a Dwfl at their load addresses. */
typedef struct {
    int64_t pid;
    Dwfl *dwfl;
} proc;

static proc *g_procs;
static size_t g_nprocs;

static Dwfl *dwfl_of(const rp_trace *t, int64_t pid)
{
    for (size_t i = 0; i < g_nprocs; i++)
        if (g_procs[i].pid == pid)
            return g_procs[i].dwfl;
    Dwfl *d = dwfl_begin(&callbacks);
    if (d) {
        dwfl_report_begin(d);
        for (size_t i = 0; i < t->nobj; i++) {
            const rp_object *o = &t->obj[i];
            if (o->pid == pid) /* a file missing here is reported missing: no module */
                dwfl_report_elf(d, rp_str(t, o->path), rp_str(t, o->path), -1, o->base, false);
        }
        dwfl_report_end(d, NULL, NULL);
    }
    proc *p = realloc(g_procs, (g_nprocs + 1) * sizeof *p);
    if (p) {
        g_procs = p;
        g_procs[g_nprocs++] = (proc){pid, d};
    }
    return d;
}

/* The recorded object holding pc (the highest base at or below it), or NULL. */
static const rp_object *object_of(const rp_trace *t, int64_t pid, uint64_t pc)
{
    const rp_object *best = NULL;
    for (size_t i = 0; i < t->nobj; i++) {
        const rp_object *o = &t->obj[i];
        if (o->pid == pid && o->base <= pc && (!best || o->base > best->base))
            best = o;
    }
    return best;
}

static bool same_build_id(Dwfl_Module *m, const char *want)
{
    const unsigned char *bits;
    GElf_Addr vaddr;
    int n = dwfl_module_build_id(m, &bits, &vaddr);
    if (n <= 0 || !*want)
        return true; /* nothing to compare */
    char hex[2 * 64 + 1];
    for (int i = 0; i < n && i < 64; i++)
        snprintf(hex + 2 * i, 3, "%02x", bits[i]);
    return !strcmp(hex, want);
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* One frame into out. The address is a return address: looked up one byte before it, in
 * the call instruction. */
static void frame(const rp_trace *t, int64_t pid, uint64_t pc, char *out, size_t cap)
{
    const rp_object *o = object_of(t, pid, pc);
    Dwfl *d = dwfl_of(t, pid);
    Dwfl_Module *m = d ? dwfl_addrmodule(d, pc - 1) : NULL;
    if (m && o && same_build_id(m, rp_str(t, o->build_id))) {
        const char *fn = dwfl_module_addrname(m, pc - 1);
        Dwfl_Line *line = dwfl_module_getsrc(m, pc - 1);
        int ln = 0;
        const char *file = line ? dwfl_lineinfo(line, NULL, &ln, NULL, NULL, NULL) : NULL;
        if (fn && file)
            snprintf(out, cap, "%s (%s:%d)", fn, base_name(file), ln);
        else if (fn)
            snprintf(out, cap, "%s (%s)", fn, base_name(rp_str(t, o->path)));
        else
            snprintf(out, cap, "%s+0x%" PRIx64, base_name(rp_str(t, o->path)), pc - o->base);
    } else if (o) {
        snprintf(out, cap, "%s+0x%" PRIx64 "%s", base_name(rp_str(t, o->path)), pc - o->base,
                 m ? " (build-id differs)" : "");
    } else {
        snprintf(out, cap, "0x%" PRIx64, pc);
    }
}

char *rp_sym_site(const rp_trace *t, uint32_t site)
{
    if (site == RP_NO_STRING)
        return strdup("(no call site recorded)");
    const char *s = rp_str(t, site);
    char *end;
    int64_t pid = strtoll(s, &end, 10);
    size_t cap = 256, n = 0;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    out[0] = '\0';
    while (*end == ' ') {
        uint64_t pc = strtoull(end + 1, &end, 16);
        char one[512];
        frame(t, pid, pc, one, sizeof one);
        size_t k = strlen(one);
        if (n + k + 8 > cap) {
            cap = (n + k + 8) * 2;
            char *p = realloc(out, cap);
            if (!p) {
                free(out);
                return NULL;
            }
            out = p;
        }
        n += (size_t)snprintf(out + n, cap - n, "%s%s", n ? " < " : "", one);
    }
    return out;
}

int rp_sym_sites(rp_summary *s)
{
    for (size_t i = 0; i < s->nsites && i < RP_MAX_SITES; i++)
        if (!(s->sites[i].where = rp_sym_site(s->trace, s->sites[i].stack)))
            return -1;
    for (size_t i = 0; i < g_nprocs; i++)
        if (g_procs[i].dwfl)
            dwfl_end(g_procs[i].dwfl);
    free(g_procs);
    g_procs = NULL;
    g_nprocs = 0;
    return 0;
}
