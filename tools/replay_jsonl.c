/* Traces of libcacheaudit.so for cacheshim-replay: read with cacheshim-report's reader, turned
 * into the allocation events the replay runs. */
#include "replay.h"
#include "report.h"

#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

/* 1 for JSON Lines, 0 for the allocation format, as cacheshim-report tells them apart: the
 * first line that starts with '{' or with an event letter and a blank decides. -1 after a
 * message when the file cannot be opened. */
static int is_jsonl(const char *path)
{
    tr_input in;
    if (tr_open(&in, path, REPLAY_NAME))
        return -1;
    char *buf;
    size_t len;
    bool cut;
    int found = 0;
    while (tr_next(&in, &buf, &len, &cut) == 1) {
        const char *p = buf + strspn(buf, " \t\r\n");
        if (*p == '{') {
            found = 1;
            break;
        }
        if (strchr("afe", *p) && *p && (p[1] == ' ' || p[1] == '\t'))
            break;
        /* Blank, a comment, or a program's own output before the tracer's first record. */
    }
    tr_close(&in); /* errors, if any, are said when the trace is read */
    return found;
}

/* 1 for cuMemAlloc/cuMemAlloc_v2, 2 for cuMemFree/cuMemFree_v2: what the shim serves. */
static int served(const char *name)
{
    if (!strcmp(name, "cuMemAlloc") || !strcmp(name, "cuMemAlloc_v2"))
        return 1;
    if (!strcmp(name, "cuMemFree") || !strcmp(name, "cuMemFree_v2"))
        return 2;
    return 0;
}

static int from_jsonl(replay_trace *t, const char *path, replay_source *src)
{
    rp_trace rt;
    int rc = rp_trace_load(&rt, path);
    if (rc)
        return rc;
    bool shim = false;
    for (size_t i = 0; i < rt.nev && !shim; i++)
        shim = rt.ev[i].lib == RP_LIB_SHIM && rt.ev[i].role != RP_ROLE_NONE;
    src->level = shim ? "shim" : "driver";
    /* rt.ev is in the order the calls changed memory: allocations at their end, frees at
     * their start, which is the order the replay needs. */
    for (size_t i = 0; i < rt.nev && !rc; i++) {
        const rp_event *e = &rt.ev[i];
        if (e->role == RP_ROLE_NONE)
            continue;
        bool level = shim ? e->lib == RP_LIB_SHIM : (e->lib == RP_LIB_DRIVER &&
                                                       e->from != RP_FROM_SHIM);
        if (!level)
            continue;
        int kind = e->handle ? 0 : served(rp_str(&rt, e->name));
        if (!kind) {
            src->skipped++;
            continue;
        }
        replay_event r = {.ns = rp_when(e)};
        if (kind == 1 && e->result == 0)
            r = (replay_event){.kind = 'a', .size = e->size, .ptr = e->ptr, .ns = r.ns};
        else if (kind == 1)
            r = (replay_event){.kind = 'e', .size = e->size, .err = (uint64_t)e->result,
                               .ns = r.ns};
        else if (e->result == 0)
            r = (replay_event){.kind = 'f', .ptr = e->ptr, .ns = r.ns};
        else
            continue; /* a failed free changed nothing */
        if (!replay_trace_push(t, r)) {
            fprintf(stderr, REPLAY_NAME ": out of memory\n");
            rc = 2;
        }
    }
    rp_trace_free(&rt);
    return rc;
}

int replay_trace_load_any(replay_trace *t, const char *path, replay_source *src)
{
    *src = (replay_source){.level = ""};
    int j = is_jsonl(path);
    if (j < 0)
        return 2;
    if (!j)
        return replay_trace_load(t, path);
    src->jsonl = true;
    *t = (replay_trace){.path = path};
    int rc = from_jsonl(t, path, src);
    if (rc)
        replay_trace_free(t);
    return rc;
}
