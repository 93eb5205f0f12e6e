/* Options: one table of every CACHESHIM_* environment variable and one parser for it. */
#ifndef CS_OPTIONS_H
#define CS_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cs_group.h"

typedef enum {
    CS_SIZE_UNLIMITED = 0, /* no limit ("none", "unlimited", "off", or unset with that default) */
    CS_SIZE_BYTES,         /* an absolute number of bytes */
    CS_SIZE_PERCENT,       /* a percentage of the device's total memory */
} cs_size_kind;

typedef struct {
    cs_size_kind kind;
    uint64_t bytes;  /* CS_SIZE_BYTES */
    double percent;  /* CS_SIZE_PERCENT: 0 < percent <= 100 */
} cs_size_spec;

/* CACHESHIM_DEBUG's words, in the order of its list. */
enum { CS_DEBUG_UAF = 1, CS_DEBUG_UAF_REPORT = 2, CS_DEBUG_LEAKS = 4 };

enum { CS_TRACE_TEXT = 0, CS_TRACE_JSONL = 1, CS_TRACE_PERFETTO = 2 };
enum { CS_TRACE_CLOCK_AUTO = 0, CS_TRACE_CLOCK_TSC = 1, CS_TRACE_CLOCK_MONOTONIC = 2 };
/* Longest value kept for the tracer's text variables (path, filter), terminator included. */
#define CS_TRACE_TEXT_MAX 1024

typedef struct cs_options {
    bool disable;                   /* CACHESHIM_DISABLE: forward every call untouched */
    cs_size_spec cap;               /* CACHESHIM_CAP: hard ceiling on bytes held per device */
    cs_size_spec release_threshold; /* CACHESHIM_RELEASE_THRESHOLD: idle cached bytes kept per device */
    bool stats;                     /* CACHESHIM_STATS: statistics table on stderr at exit */
    int verbose;                    /* CACHESHIM_VERBOSE: 0 quiet, 1 config + OOM reports, 2 also every release */
    int reuse;                      /* CACHESHIM_REUSE: CS_REUSE_ORDERED or CS_REUSE_COMPLETED (cs_cache.h) */
    int backend;                    /* CACHESHIM_BACKEND: 0 pooled, 1 classic */
    int headroom;                   /* CACHESHIM_HEADROOM: percent over the program's peak */
    bool sync_free;                 /* CACHESHIM_SYNC_FREE: a free waits for the device */
    int debug;                      /* CACHESHIM_DEBUG: CS_DEBUG_* bits, 0 for off */
    cs_size_spec quarantine;        /* CACHESHIM_QUARANTINE: bytes of freed blocks held back */
    cs_size_spec host_cap;          /* CACHESHIM_HOST_CAP: ceiling on pinned host bytes held */
    cs_size_spec host_release_threshold; /* CACHESHIM_HOST_RELEASE_THRESHOLD: idle pinned bytes kept */
    char group[CS_GROUP_NAME_MAX + 1]; /* CACHESHIM_GROUP: "" for none (cs_group.h) */
    /* The tracer (audit/, libcacheaudit.so) reads these; the shim ignores them. */
    int trace_format;               /* CACHESHIM_TRACE_FORMAT: CS_TRACE_TEXT, _JSONL or _PERFETTO */
    char trace_file[CS_TRACE_TEXT_MAX];   /* CACHESHIM_TRACE_FILE: "" for stderr; %p = pid */
    char trace_filter[CS_TRACE_TEXT_MAX]; /* CACHESHIM_TRACE_FILTER: "memory", "all" or globs */
    int trace_stack;                /* CACHESHIM_TRACE_STACK: frames recorded per allocation, 0 off */
    int trace_clock;                /* CACHESHIM_TRACE_CLOCK: CS_TRACE_CLOCK_AUTO, _TSC or _MONOTONIC */
} cs_options;

/* How the parser reads a variable; the library passes secure_getenv, tests pass their own. */
typedef const char *(*cs_getenv_fn)(const char *name);
/* Where one-line messages about bad values go (without trailing newline). */
typedef void (*cs_report_fn)(const char *line, void *arg);

/* One row of the table: what docs/variables.md and the verbose print are made from. */
typedef struct {
    const char *name;       /* "CACHESHIM_CAP" */
    const char *type;       /* "size", "bool", "int", "choice", "flags", "text" */
    const char *fallback;   /* default, as a user would write it */
    const char *accepted;   /* what values are accepted, as printed in error messages */
    const char *help;       /* one sentence */
} cs_option_desc;

const cs_option_desc *cs_option_table(size_t *count);

/* Defaults, then every variable of the table read through getenv_fn. A bad value keeps the
 * default and reports one line: variable, value, what is accepted, what is used instead.
 * Returns the number of bad values. Never aborts. */
int cs_options_load(cs_options *opts, cs_getenv_fn getenv_fn, cs_report_fn report, void *arg);

/* Parse a size: "123", "8G", "512MiB", "1.5GB", "75%", "none". Returns 0 on success. */
int cs_parse_size(const char *text, bool allow_percent, cs_size_spec *out);

/* The smallest caps accepted: one block of the pooled backend's (a 2 MiB granule) on a
 * device, one page of pinned host memory. A smaller cap could hold no allocation. */
#define CS_MIN_CAP (2ull << 20)
#define CS_MIN_HOST_CAP 4096ull

/* A cap's bytes on a device of device_total bytes: UINT64_MAX (no cap) when it resolves below
 * min, as a percentage of a small device can (such a cap could hold no allocation). */
uint64_t cs_cap_resolve(const cs_size_spec *cap, uint64_t device_total, uint64_t min);

/* A threshold above the cap does nothing: the cap gives cached memory back first. The line
 * that says so for one device (or "pinned host memory"), of device_total bytes, into buf;
 * false (buf untouched) when the two agree. */
bool cs_threshold_above_cap(const cs_size_spec *cap, const cs_size_spec *threshold,
                            const char *cap_name, const char *threshold_name,
                            uint64_t device_total, const char *where, char *buf, size_t len);

/* Bytes a spec stands for on a device of device_total bytes; UINT64_MAX when unlimited. */
uint64_t cs_size_resolve(const cs_size_spec *spec, uint64_t device_total);

/* "8 GiB", "75% of device memory", "unlimited": for the verbose print and messages. */
void cs_size_format(const cs_size_spec *spec, char *buf, size_t len);
void cs_bytes_format(uint64_t bytes, char *buf, size_t len);
/* The length of the valid UTF-8 sequence at s, or 0 (not one, or one that JSON readers
 * refuse: overlong, a surrogate, beyond U+10FFFF). Shared by the tracer and the report. */
int cs_utf8_len(const unsigned char *s);

/* One variable of the table, by name, parsed into opts as cs_options_load would parse it
 * (the launcher checks its command line with this). Returns 0; -1 for a bad value or a NULL
 * argument, opts untouched; -2 when name is not in the table. An empty value is bad here:
 * only cs_options_load reads "set to nothing" as unset. */
int cs_option_parse(cs_options *opts, const char *name, const char *value);

/* value as the user wrote it, made safe for a one-line message: control characters as \xNN,
 * the first 64 bytes only, then "...". buf must hold CS_VALUE_SHOWN_LEN bytes (else nothing
 * is written); NULL shows as "". */
#define CS_VALUE_SHOWN_LEN 260
void cs_value_show(const char *value, char *buf, size_t len);

/* Every variable with its effective value, one line each, through report. */
void cs_options_print(const cs_options *opts, cs_report_fn report, void *arg);

#endif
