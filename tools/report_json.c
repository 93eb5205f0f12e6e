/* One JSON Lines record of libcacheaudit.so (docs/tracing.md) into an event, parsed with
 * jansson. A call record gives an event; an "object" record (call sites,
 * CACHESHIM_TRACE_STACK) says where a library was loaded. Which calls allocate and free, and
 * which of their arguments say the address and the size, follows the tracer's own counter
 * (audit/ca_mem.c). */
#include "report.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An unsigned integer: a JSON number, or a "0x..." string (addresses and handles). */
static bool as_u64(const json_t *v, uint64_t *out)
{
    if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);
        return i >= 0 && (*out = (uint64_t)i, true);
    }
    const char *s = json_string_value(v);
    size_t n = s ? json_string_length(v) : 0;
    if (!s || n < 3 || n > 18 || s[0] != '0' || s[1] != 'x' || strlen(s) != n)
        return false;
    uint64_t u = 0;
    for (const char *c = s + 2; *c; c++) {
        int d = *c >= '0' && *c <= '9' ? *c - '0' : *c >= 'a' && *c <= 'f' ? *c - 'a' + 10
              : *c >= 'A' && *c <= 'F' ? *c - 'A' + 10 : -1;
        if (d < 0)
            return false;
        u = u << 4 | (uint64_t)d;
    }
    *out = u;
    return true;
}

static bool as_i64(const json_t *v, int64_t *out)
{
    return json_is_integer(v) && (*out = (int64_t)json_integer_value(v), true);
}

static int pick(const json_t *v, const char *const *names, int n)
{
    const char *s = json_string_value(v);
    for (int i = 0; s && i < n; i++)
        if (!strcmp(s, names[i]))
            return i;
    return -1;
}

enum { ALLOC, PITCH, FREE };

/* ALLOC: out[ptr] received args[size] bytes. PITCH: out[ptr] received out.pPitch * args.Height
 * (asked: WidthInBytes * Height). FREE: args[ptr] is given back. */
static const struct {
    const char *name;
    int kind;
    const char *ptr, *size;
    bool handle;
} roles[] = {
    {"cuMemAlloc", ALLOC, "dptr", "bytesize", false},
    {"cuMemAlloc_v2", ALLOC, "dptr", "bytesize", false},
    {"cuMemAllocManaged", ALLOC, "dptr", "bytesize", false},
    {"cuMemAllocAsync", ALLOC, "dptr", "bytesize", false},
    {"cuMemAllocAsync_ptsz", ALLOC, "dptr", "bytesize", false},
    {"cuMemAllocFromPoolAsync", ALLOC, "dptr", "bytesize", false},
    {"cuMemAllocFromPoolAsync_ptsz", ALLOC, "dptr", "bytesize", false},
    {"cuMemCreate", ALLOC, "handle", "size", true},
    {"cuMemAllocPitch", PITCH, "dptr", NULL, false},
    {"cuMemAllocPitch_v2", PITCH, "dptr", NULL, false},
    {"cudaMalloc", ALLOC, "devPtr", "size", false},
    {"cudaMallocAsync", ALLOC, "devPtr", "size", false},
    {"cudaMallocAsync_ptsz", ALLOC, "devPtr", "size", false},
    {"cuMemFree", FREE, "dptr", NULL, false},
    {"cuMemFree_v2", FREE, "dptr", NULL, false},
    {"cuMemFreeAsync", FREE, "dptr", NULL, false},
    {"cuMemFreeAsync_ptsz", FREE, "dptr", NULL, false},
    {"cuMemRelease", FREE, "handle", NULL, true},
    {"cudaFree", FREE, "devPtr", NULL, false},
    {"cudaFreeAsync", FREE, "devPtr", NULL, false},
    {"cudaFreeAsync_ptsz", FREE, "devPtr", NULL, false},
};

static bool mul_ok(uint64_t a, uint64_t b, uint64_t *out)
{
    if (a && b > UINT64_MAX / a)
        return false;
    *out = a * b;
    return true;
}

/* The memory side of a call. Sizes and addresses are read only from the calls that change
 * device bytes, and must be there: a record without them is not the tracer's. */
static const char *memory_role(const char *name, const json_t *args, const json_t *out,
                               rp_event *e)
{
    size_t i = 0, n = sizeof roles / sizeof roles[0];
    while (i < n && strcmp(roles[i].name, name))
        i++;
    if (i == n)
        return NULL;
    e->handle = roles[i].handle;
    if (roles[i].kind == FREE) {
        e->role = RP_ROLE_FREE;
        return as_u64(json_object_get(args, roles[i].ptr), &e->ptr)
                   ? NULL : "a free without its pointer in \"args\"";
    }
    e->role = RP_ROLE_ALLOC;
    if (e->result == 0 && !as_u64(json_object_get(out, roles[i].ptr), &e->ptr))
        return "a successful allocation without its pointer in \"out\"";
    if (roles[i].kind == ALLOC)
        return as_u64(json_object_get(args, roles[i].size), &e->size)
                   ? NULL : "an allocation without its size in \"args\"";
    uint64_t width, height, pitch;
    if (!as_u64(json_object_get(args, "Height"), &height) ||
        !as_u64(json_object_get(args, "WidthInBytes"), &width))
        return "cuMemAllocPitch without WidthInBytes and Height in \"args\"";
    if (e->result != 0)
        return mul_ok(width, height, &e->size) ? NULL : "cuMemAllocPitch size overflows";
    if (!as_u64(json_object_get(out, "pPitch"), &pitch))
        return "a successful cuMemAllocPitch without pPitch in \"out\"";
    return mul_ok(pitch, height, &e->size) ? NULL : "cuMemAllocPitch size overflows";
}

/* The shim's scopes: a begin names its scope (a string, or null: "(unnamed)" as the shim). */
static const char *scope_call(const char *name, const json_t *args, rp_trace *t, rp_event *e,
                              int *oom)
{
    if (!strcmp(name, "cacheshim_scope_end"))
        e->scope = RP_SCOPE_END;
    if (strcmp(name, "cacheshim_scope_begin"))
        return NULL;
    const json_t *v = json_object_get(args, "name");
    if (!v || (!json_is_string(v) && !json_is_null(v)))
        return "cacheshim_scope_begin without its name (a string or null) in \"args\"";
    e->scope = RP_SCOPE_BEGIN;
    e->scope_name = v && json_is_string(v) ? rp_intern(t, json_string_value(v), json_string_length(v))
                                           : rp_intern(t, "(unnamed)", 9);
    *oom = e->scope_name == RP_NO_STRING;
    return NULL;
}

/* The call site: "PID 0xPC 0xPC ..." interned, so that equal stacks are one site. */
static const char *call_site(const json_t *stack, rp_trace *t, rp_event *e, int *oom)
{
    e->stack = RP_NO_STRING;
    if (!stack)
        return NULL;
    if (!json_is_array(stack) || json_array_size(stack) > RP_STACK_MAX)
        return "\"stack\" must be an array of at most 64 addresses";
    if (json_array_size(stack) == 0)
        return NULL;
    char text[32 + RP_STACK_MAX * 20];
    int k = snprintf(text, sizeof text, "%" PRId64, e->pid);
    size_t i;
    json_t *pc;
    json_array_foreach(stack, i, pc) {
        uint64_t u;
        if (!as_u64(pc, &u))
            return "\"stack\" must be an array of at most 64 addresses";
        k += snprintf(text + k, sizeof text - (size_t)k, " 0x%" PRIx64, u);
    }
    e->stack = rp_intern(t, text, (size_t)k);
    *oom = e->stack == RP_NO_STRING;
    return NULL;
}

/* {"pid":P,"object":PATH,"base":"0x..","build_id":HEX}: where a library was loaded. */
static int object_record(const json_t *root, rp_trace *t, const char **why)
{
    rp_object o;
    const json_t *path = json_object_get(root, "object"), *id = json_object_get(root, "build_id");
    if (!as_i64(json_object_get(root, "pid"), &o.pid) || !json_is_string(path) ||
        !json_string_length(path) || !as_u64(json_object_get(root, "base"), &o.base) ||
        (id && !json_is_string(id))) {
        *why = "an object record needs \"pid\", \"object\" (a path) and \"base\" (an address)";
        return -1;
    }
    o.path = rp_intern(t, json_string_value(path), strlen(json_string_value(path)));
    const char *ids = id ? json_string_value(id) : "";
    o.build_id = rp_intern(t, ids, strlen(ids));
    if (o.path == RP_NO_STRING || o.build_id == RP_NO_STRING || !rp_object_add(t, &o)) {
        *why = "out of memory";
        return -2;
    }
    return 1;
}

int rp_json_record(const char *line, size_t len, rp_trace *t, rp_event *e, const char **why,
                   size_t *col)
{
    static const char *const libs[] = {"driver", "shim", "runtime"};
    static const char *const froms[] = {"app", "shim", "cudart"};
    static char message[JSON_ERROR_TEXT_LENGTH + 16];
    json_error_t err;
    *col = 0;
    json_t *root = json_loadb(line, len, 0, &err);
    if (!root) {
        snprintf(message, sizeof message, "JSON: %s", err.text);
        *why = message;
        *col = err.column > 0 ? (size_t)err.column : (size_t)err.position + 1;
        return -1;
    }
    int rc = -1;
    if (!json_is_object(root)) {
        *why = "expected an object";
        goto done;
    }
    if (json_object_get(root, "object")) {
        rc = object_record(root, t, why);
        goto done;
    }
    *e = (rp_event){.result_name = RP_NO_STRING, .stack = RP_NO_STRING};
    const json_t *name = json_object_get(root, "name"), *rn = json_object_get(root, "result_name");
    const json_t *args = json_object_get(root, "args"), *out = json_object_get(root, "out");
    int lib = pick(json_object_get(root, "lib"), libs, 3);
    int from = pick(json_object_get(root, "from"), froms, 3);
    int oom = 0;
    *why = NULL;
    if (!as_i64(json_object_get(root, "pid"), &e->pid) ||
        !as_i64(json_object_get(root, "tid"), &e->tid))
        *why = "\"pid\" and \"tid\" must be integers";
    else if (!as_u64(json_object_get(root, "ts_ns"), &e->t) ||
             !as_u64(json_object_get(root, "dur_ns"), &e->dur) || e->dur > UINT64_MAX - e->t)
        *why = "\"ts_ns\" and \"dur_ns\" must be integers >= 0";
    else if (lib < 0)
        *why = "\"lib\" must be \"driver\", \"shim\" or \"runtime\"";
    else if (from < 0)
        *why = "\"from\" must be \"app\", \"shim\" or \"cudart\"";
    else if (!json_is_string(name) || !json_string_length(name) ||
             strlen(json_string_value(name)) != json_string_length(name))
        *why = "\"name\" must be a non-empty string";
    else if (!as_i64(json_object_get(root, "result"), &e->result))
        *why = "\"result\" must be an integer";
    else if (rn && !json_is_string(rn) && !json_is_null(rn))
        *why = "\"result_name\" must be a string or null";
    else if ((args && !json_is_object(args)) || (out && !json_is_object(out)))
        *why = "\"args\" and \"out\" must be objects";
    else if (!(*why = memory_role(json_string_value(name), args, out, e)) &&
             !(*why = scope_call(json_string_value(name), args, t, e, &oom)))
        *why = call_site(json_object_get(root, "stack"), t, e, &oom);
    if (*why)
        goto done;
    e->lib = (uint8_t)lib;
    e->from = (uint8_t)from;
    e->name = rp_intern(t, json_string_value(name), json_string_length(name));
    if (json_is_string(rn))
        e->result_name = rp_intern(t, json_string_value(rn), strlen(json_string_value(rn)));
    if (oom || e->name == RP_NO_STRING || (json_is_string(rn) && e->result_name == RP_NO_STRING)) {
        *why = "out of memory";
        rc = -2;
        goto done;
    }
    rc = 0;
done:
    json_decref(root);
    return rc;
}
