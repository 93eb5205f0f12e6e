/* Options: the one table of CACHESHIM_* environment variables, their parser and their
 * formatting. Strings in, strings out through caller buffers: no printing, no CUDA, no
 * global mutable state. docs/variables.md is checked against this table
 * (tests/check_variables_doc.py). */
#include "cs_options.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* ---- the table ------------------------------------------------------------------------ */

enum {
    OPT_DISABLE,
    OPT_CAP,
    OPT_RELEASE_THRESHOLD,
    OPT_STATS,
    OPT_VERBOSE,
    OPT_REUSE,
    OPT_SYNC_FREE,
    OPT_BACKEND,
    OPT_HEADROOM,
    OPT_DEBUG,
    OPT_QUARANTINE,
    OPT_GROUP,
    OPT_TRACE_FORMAT,
    OPT_TRACE_FILE,
    OPT_TRACE_FILTER,
    OPT_HOST_CAP,
    OPT_HOST_RELEASE_THRESHOLD,
    OPT_TRACE_STACK,
    OPT_TRACE_CLOCK,
    OPT_COUNT
};

#define ACCEPT_BOOL "1, 0, true, false, yes, no, on or off"
#define ACCEPT_PATH "stderr or a file path of at most 1023 bytes, %p standing for the process id"
#define ACCEPT_FILTER \
    "memory, all, or a comma-separated list of names and globs like cuMemAlloc*,cuLaunch*"
#define ACCEPT_SIZE \
    "a size like 8G, 512MiB, 1.5GB, 4096, a percentage of device memory like 75%, or none"
#define ACCEPT_CAP \
    "a size of at least 2MiB like 8G, 512MiB, 1.5GB, a percentage of device memory like " \
    "75%, or none"
#define ACCEPT_HOST_SIZE \
    "a size like 8G, 512MiB, 1.5GB, 4096, a percentage of the machine's memory like 25%, or none"
#define ACCEPT_HOST_CAP \
    "a size of at least 4KiB like 8G, 512MiB, 1.5GB, a percentage of the machine's memory " \
    "like 25%, or none"

/* The fallback text is the only place a default lives: cs_options_load parses it to get the
 * default value, so the documented default and the real one cannot drift apart. */
static const cs_option_desc option_table[OPT_COUNT] = {
    [OPT_DISABLE] = {"CACHESHIM_DISABLE", "bool", "0", ACCEPT_BOOL,
                     "Forward every call to the driver untouched: no caching, no cap."},
    [OPT_CAP] = {"CACHESHIM_CAP", "size", "unlimited", ACCEPT_CAP,
                 "Hard ceiling per device on the bytes held through the shim, in use plus "
                 "cached, memory from cuMemAllocPitch, cuMemAllocManaged, cuMemAllocAsync and "
                 "cuMemCreate included."},
    [OPT_RELEASE_THRESHOLD] = {"CACHESHIM_RELEASE_THRESHOLD", "size", "unlimited", ACCEPT_SIZE,
                               "Idle cached bytes kept per device; above it, idle cached "
                               "blocks go back to the driver."},
    [OPT_STATS] = {"CACHESHIM_STATS", "bool", "0", ACCEPT_BOOL,
                   "Print a table of statistics to stderr at exit, a column per device."},
    [OPT_VERBOSE] = {"CACHESHIM_VERBOSE", "int", "0", "0, 1 or 2",
                     "0: quiet; 1: print the effective configuration at start, one line for "
                     "each failed allocation and every counter in the exit statistics; 2: also "
                     "one line for each release of cached memory to the driver."},
    [OPT_REUSE] = {"CACHESHIM_REUSE", "choice", "ordered", "ordered or completed",
                   "When a freed block may be reused: ordered hands it out at once and makes "
                   "every stream wait on the GPU for its last work first; completed waits "
                   "until that work has finished, taking new memory meanwhile."},
    [OPT_SYNC_FREE] = {"CACHESHIM_SYNC_FREE", "bool", "0", ACCEPT_BOOL,
                       "Make every free of a cached block wait for all work on the device, "
                       "as the driver's cuMemFree/cudaFree does, for programs that use a free "
                       "as a synchronization point."},
    [OPT_HOST_CAP] = {"CACHESHIM_HOST_CAP", "size", "unlimited", ACCEPT_HOST_CAP,
                      "Hard ceiling on the pinned host bytes (cudaMallocHost, cudaHostAlloc) "
                      "held through the shim, in use plus cached, for the whole process."},
    [OPT_HOST_RELEASE_THRESHOLD] = {"CACHESHIM_HOST_RELEASE_THRESHOLD", "size", "unlimited",
                                    ACCEPT_HOST_SIZE,
                                    "Idle cached pinned host bytes kept; above it, idle pinned "
                                    "blocks go back to the driver."},
    [OPT_BACKEND] = {"CACHESHIM_BACKEND", "choice", "pooled", "pooled or classic",
                     "Where blocks get their memory: pooled carves blocks out of physical "
                     "memory mapped into one virtual range per context, freed memory serving "
                     "the next request of any size (devices without virtual memory "
                     "management get classic by themselves); "
                     "classic makes each block one cuMemAlloc, for programs that export "
                     "memory to processes that do not run under cacheshim."},
    [OPT_HEADROOM] = {"CACHESHIM_HEADROOM", "int", "10",
                      "a whole number of percent from 0 to 1000, without the % sign",
                      "Pooled backend: how far memory held may exceed the program's own "
                      "peak in use, in percent, before a miss moves free memory within the "
                      "pool instead of taking new memory. More: fewer mappings when sizes "
                      "shift; 0 keeps memory closest to what the program uses."},
    [OPT_DEBUG] = {"CACHESHIM_DEBUG", "flags", "off",
                   "off, or a comma-separated list of uaf, uaf-report and leaks",
                   "Debug modes: uaf fills freed blocks with a pattern, holds them in a "
                   "quarantine and aborts with both call sites when the pattern changed (a "
                   "use after free); uaf-report only reports and goes on; leaks lists the "
                   "blocks never freed at exit, by allocation site. Any mode also reports bad "
                   "frees with their call sites."},
    [OPT_QUARANTINE] = {"CACHESHIM_QUARANTINE", "size", "256MiB",
                        "a size like 256M, 1G or 4096, 0, or unlimited",
                        "CACHESHIM_DEBUG=uaf: bytes of freed blocks held in the quarantine "
                        "(all devices together); past it the oldest are checked and go back "
                        "to the cache. 0 holds only the most recently freed block."},
    [OPT_GROUP] = {"CACHESHIM_GROUP", "name", "none",
                   "none, or a name of 1 to 64 letters, digits, '.', '_' and '-' that does not "
                   "start with '.'",
                   "Share CACHESHIM_CAP with every process of the same user that sets the same "
                   "name: the group's bytes held on each device (identified by UUID) stay within "
                   "the cap. See docs/usage.md, a cap for a group of processes."},
    [OPT_TRACE_FORMAT] = {"CACHESHIM_TRACE_FORMAT", "choice", "text", "text, jsonl or perfetto",
                          "Tracer (LD_AUDIT=libcacheaudit.so) output format: text lines, JSON "
                          "Lines, or a Chrome-trace/Perfetto JSON file."},
    [OPT_TRACE_FILE] = {"CACHESHIM_TRACE_FILE", "text", "stderr", ACCEPT_PATH,
                        "Tracer output file, created new with mode 0600; %p stands for the "
                        "process id."},
    [OPT_TRACE_FILTER] = {"CACHESHIM_TRACE_FILTER", "text", "memory", ACCEPT_FILTER,
                          "Which driver calls the tracer records: memory calls, all calls, or "
                          "a comma-separated list of names and globs."},
    [OPT_TRACE_STACK] = {"CACHESHIM_TRACE_STACK", "int", "0",
                         "a whole number of frames from 0 to 16",
                         "Tracer call-site capture: the return addresses of up to this many "
                         "frames of the program's stack are recorded with every allocation "
                         "call (JSON Lines), for cacheshim-report's allocation sites; 0 "
                         "records none."},
    [OPT_TRACE_CLOCK] = {"CACHESHIM_TRACE_CLOCK", "choice", "auto", "auto, tsc or monotonic",
                         "Tracer: how a call's start and end are read. tsc: the CPU's "
                         "time-stamp counter (x86-64, invariant), made CLOCK_MONOTONIC "
                         "nanoseconds when the record is formatted, half the cost of monotonic; "
                         "monotonic: clock_gettime(CLOCK_MONOTONIC) at each; auto: tsc where "
                         "the kernel keeps its own clock with that counter, else monotonic."},
};

/* How each row is parsed and where its value goes; indexed like option_table. */
typedef enum {
    VALUE_BOOL, VALUE_INT, VALUE_SIZE, VALUE_CHOICE, VALUE_PATH, VALUE_FILTER, VALUE_FLAGS,
    VALUE_GROUP
} value_type;

typedef struct {
    value_type type;
    size_t offset;      /* of the field in cs_options */
    int min, max;       /* VALUE_INT; VALUE_SIZE: min is the fewest bytes accepted */
    bool allow_percent; /* VALUE_SIZE */
    const char *const *choices; /* VALUE_CHOICE: the words, their index is the value;
                                   VALUE_FLAGS: word i is bit 1 << i */
} option_slot;

static const char *const trace_formats[] = {"text", "jsonl", "perfetto", NULL};
static const char *const reuse_modes[] = {"ordered", "completed", NULL};
static const char *const backends[] = {"pooled", "classic", NULL};
static const char *const trace_clocks[] = {"auto", "tsc", "monotonic", NULL};
static const char *const debug_modes[] = {"uaf", "uaf-report", "leaks", NULL};

static const option_slot option_slots[OPT_COUNT] = {
    [OPT_DISABLE] = {VALUE_BOOL, offsetof(cs_options, disable), 0, 0, false},
    [OPT_CAP] = {VALUE_SIZE, offsetof(cs_options, cap), (int)CS_MIN_CAP, 0, true},
    [OPT_RELEASE_THRESHOLD] = {VALUE_SIZE, offsetof(cs_options, release_threshold), 0, 0, true},
    [OPT_STATS] = {VALUE_BOOL, offsetof(cs_options, stats), 0, 0, false},
    [OPT_VERBOSE] = {VALUE_INT, offsetof(cs_options, verbose), 0, 2, false},
    [OPT_REUSE] = {VALUE_CHOICE, offsetof(cs_options, reuse), 0, 0, false, reuse_modes},
    [OPT_SYNC_FREE] = {VALUE_BOOL, offsetof(cs_options, sync_free), 0, 0, false},
    [OPT_HOST_CAP] = {VALUE_SIZE, offsetof(cs_options, host_cap), (int)CS_MIN_HOST_CAP, 0, true},
    [OPT_HOST_RELEASE_THRESHOLD] = {VALUE_SIZE, offsetof(cs_options, host_release_threshold), 0,
                                    0, true},
    [OPT_BACKEND] = {VALUE_CHOICE, offsetof(cs_options, backend), 0, 0, false, backends},
    [OPT_HEADROOM] = {VALUE_INT, offsetof(cs_options, headroom), 0, 1000, false},
    [OPT_DEBUG] = {VALUE_FLAGS, offsetof(cs_options, debug), 0, 0, false, debug_modes},
    [OPT_QUARANTINE] = {VALUE_SIZE, offsetof(cs_options, quarantine), 0, 0, false},
    [OPT_GROUP] = {VALUE_GROUP, offsetof(cs_options, group), 0, 0, false},
    [OPT_TRACE_FORMAT] = {VALUE_CHOICE, offsetof(cs_options, trace_format), 0, 0, false,
                          trace_formats},
    [OPT_TRACE_FILE] = {VALUE_PATH, offsetof(cs_options, trace_file), 0, 0, false},
    [OPT_TRACE_FILTER] = {VALUE_FILTER, offsetof(cs_options, trace_filter), 0, 0, false},
    [OPT_TRACE_STACK] = {VALUE_INT, offsetof(cs_options, trace_stack), 0, 16, false},
    [OPT_TRACE_CLOCK] = {VALUE_CHOICE, offsetof(cs_options, trace_clock), 0, 0, false,
                         trace_clocks},
};

const cs_option_desc *cs_option_table(size_t *count)
{
    if (count)
        *count = OPT_COUNT;
    return option_table;
}

/* ---- small text helpers (ASCII only: the program's locale must not change parsing) ---- */

static bool is_blank(char c) { return c == ' ' || c == '\t'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static char to_lower(char c) { return (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c; }

/* The n bytes at s equal the lower-case word w, ignoring case. */
static bool word_is(const char *s, size_t n, const char *w)
{
    for (size_t i = 0; i < n; i++)
        if (w[i] == '\0' || to_lower(s[i]) != w[i])
            return false;
    return w[n] == '\0';
}

/* text without surrounding spaces and tabs, as start and length. */
static void trim(const char *text, const char **start, size_t *len)
{
    size_t n = strlen(text);
    while (n > 0 && is_blank(*text))
        text++, n--;
    while (n > 0 && is_blank(text[n - 1]))
        n--;
    *start = text;
    *len = n;
}

/* ---- parsers: each returns 0 and sets *out, or returns -1 and leaves *out alone -------- */

static int parse_bool(const char *text, bool *out)
{
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    const char *s;
    size_t n;
    trim(text, &s, &n);
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        if (word_is(s, n, yes[i])) {
            *out = true;
            return 0;
        }
        if (word_is(s, n, no[i])) {
            *out = false;
            return 0;
        }
    }
    return -1;
}

/* Decimal digits only (no sign), within [min, max]. */
static int parse_int(const char *text, int min, int max, int *out)
{
    const char *s;
    size_t n;
    trim(text, &s, &n);
    if (n == 0)
        return -1;
    long long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!is_digit(s[i]))
            return -1;
        if (v <= max) /* stop growing once out of range: no overflow on long inputs */
            v = v * 10 + (s[i] - '0');
    }
    if (v < min || v > max)
        return -1;
    *out = (int)v;
    return 0;
}

/* One of the words (any case, blanks around allowed); the value is its index. */
static int parse_choice(const char *text, const char *const *choices, int *out)
{
    const char *s;
    size_t n;
    trim(text, &s, &n);
    for (int i = 0; choices[i]; i++) {
        if (word_is(s, n, choices[i])) {
            *out = i;
            return 0;
        }
    }
    return -1;
}

/* "off" or "none" (0), or words of the list separated by commas, blanks around each
 * ignored, each word at most once; the value has bit i set for word i. */
static int parse_flags(const char *text, const char *const *words, int *out)
{
    const char *s;
    size_t n;
    trim(text, &s, &n);
    if (word_is(s, n, "off") || word_is(s, n, "none")) {
        *out = 0;
        return 0;
    }
    int value = 0;
    size_t i = 0;
    for (;;) {
        size_t start = i;
        while (i < n && s[i] != ',')
            i++;
        size_t a = start, b = i;
        while (a < b && is_blank(s[a]))
            a++;
        while (b > a && is_blank(s[b - 1]))
            b--;
        int bit = -1;
        for (int w = 0; words[w]; w++)
            if (word_is(s + a, b - a, words[w]))
                bit = w;
        if (bit < 0 || (value & (1 << bit)))
            return -1; /* "", "uaf,,leaks", "bogus", "uaf,uaf" */
        value |= 1 << bit;
        if (i == n)
            break;
        i++; /* past the comma */
    }
    *out = value;
    return 0;
}

/* Copy the trimmed text into a CS_TRACE_TEXT_MAX buffer; too long, empty or with control
 * characters is bad. "stderr" (any case) stands for the empty path. */
static int parse_path(const char *text, char *out)
{
    const char *s;
    size_t n;
    trim(text, &s, &n);
    if (n == 0 || n >= CS_TRACE_TEXT_MAX)
        return -1;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return -1;
    if (word_is(s, n, "stderr")) {
        out[0] = '\0';
        return 0;
    }
    memcpy(out, s, n);
    out[n] = '\0';
    return 0;
}

/* "memory", "all", or names and globs separated by commas, blanks around each ignored; a name
 * is letters, digits, '_' and the fnmatch characters * ? [ ] !. Kept without the blanks. */
static bool is_glob_char(char c)
{
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
           c == '*' || c == '?' || c == '[' || c == ']' || c == '!';
}

static int parse_filter(const char *text, char *out)
{
    const char *s;
    size_t n;
    trim(text, &s, &n);
    if (word_is(s, n, "memory") || word_is(s, n, "all")) {
        for (size_t i = 0; i < n; i++)
            out[i] = to_lower(s[i]);
        out[n] = '\0';
        return 0;
    }
    if (n == 0 || n >= CS_TRACE_TEXT_MAX)
        return -1;
    char buf[CS_TRACE_TEXT_MAX];
    size_t o = 0, i = 0;
    for (;;) {
        size_t start = i;
        while (i < n && s[i] != ',')
            i++;
        const char *item;
        size_t len;
        char one[CS_TRACE_TEXT_MAX];
        memcpy(one, s + start, i - start);
        one[i - start] = '\0';
        trim(one, &item, &len);
        if (len == 0)
            return -1; /* "a,,b", ",a", "a," */
        for (size_t k = 0; k < len; k++)
            if (!is_glob_char(item[k]))
                return -1; /* "cuMem Alloc", "cu-Mem" */
        memcpy(buf + o, item, len);
        o += len;
        if (i == n)
            break;
        buf[o++] = ',';
        i++; /* past the comma */
    }
    buf[o] = '\0';
    memcpy(out, buf, o + 1);
    return 0;
}

/* A group name (cs_group_name_ok), blanks around it ignored; "none" or "off" for no group,
 * kept as "". */
static int parse_group(const char *text, char *out)
{
    const char *s;
    size_t n;
    trim(text, &s, &n);
    char name[CS_GROUP_NAME_MAX + 1];
    if (word_is(s, n, "none") || word_is(s, n, "off")) {
        out[0] = '\0';
        return 0;
    }
    if (n > CS_GROUP_NAME_MAX)
        return -1;
    memcpy(name, s, n);
    name[n] = '\0';
    if (!cs_group_name_ok(name))
        return -1;
    memcpy(out, name, n + 1);
    return 0;
}

typedef struct {
    const char *name; /* lower case */
    uint64_t factor;
} size_unit;

static const size_unit size_units[] = {
    {"", 1},
    {"b", 1},
    {"k", 1ull << 10},
    {"kib", 1ull << 10},
    {"kb", 1000ull},
    {"m", 1ull << 20},
    {"mib", 1ull << 20},
    {"mb", 1000000ull},
    {"g", 1ull << 30},
    {"gib", 1ull << 30},
    {"gb", 1000000000ull},
    {"t", 1ull << 40},
    {"tib", 1ull << 40},
    {"tb", 1000000000000ull},
};

/* A percentage keeps at most this many decimals (more are dropped): N / 10^13 with
 * N <= 100 * 10^13 < 2^53 is one exactly rounded division, so "33.3%" gives the double 33.3. */
#define PERCENT_MAX_DECIMALS 13

static int parse_percent(const char *whole, size_t whole_len, const char *frac, size_t frac_len,
                         cs_size_spec *out)
{
    uint64_t ip = 0;
    for (size_t i = 0; i < whole_len; i++) {
        ip = ip * 10 + (uint64_t)(whole[i] - '0');
        if (ip > 100)
            return -1;
    }
    bool frac_nonzero = false;
    for (size_t i = 0; i < frac_len; i++)
        frac_nonzero |= frac[i] != '0';
    if (ip == 100 && frac_nonzero)
        return -1; /* over 100% */

    uint64_t num = ip, den = 1;
    for (size_t i = 0; i < frac_len && i < PERCENT_MAX_DECIMALS; i++) {
        num = num * 10 + (uint64_t)(frac[i] - '0');
        den *= 10;
    }
    if (num == 0)
        return -1; /* 0% (or below what is kept) */
    out->kind = CS_SIZE_PERCENT;
    out->bytes = 0;
    out->percent = (double)num / (double)den;
    return 0;
}

/* number [blanks] unit, where number is digits[.digits]. */
int cs_parse_size(const char *text, bool allow_percent, cs_size_spec *out)
{
    if (!text || !out)
        return -1;
    const char *s;
    size_t n;
    trim(text, &s, &n);
    if (n == 0)
        return -1;
    if (word_is(s, n, "none") || word_is(s, n, "unlimited") || word_is(s, n, "off")) {
        out->kind = CS_SIZE_UNLIMITED;
        out->bytes = 0;
        out->percent = 0.0;
        return 0;
    }

    size_t i = 0;
    const char *whole = s;
    while (i < n && is_digit(s[i]))
        i++;
    size_t whole_len = i;
    if (whole_len == 0)
        return -1; /* "G8", "-5G", ".5G", "nan", "inf" */
    const char *frac = s + i;
    size_t frac_len = 0;
    if (i < n && s[i] == '.') {
        frac = s + ++i;
        while (i < n && is_digit(s[i]))
            i++, frac_len++;
        if (frac_len == 0)
            return -1; /* "5." */
    }
    while (i < n && is_blank(s[i]))
        i++;
    const char *unit = s + i;
    size_t unit_len = n - i; /* the rest, up to the trimmed end */

    if (unit_len == 1 && unit[0] == '%')
        return allow_percent ? parse_percent(whole, whole_len, frac, frac_len, out) : -1;

    uint64_t factor = 0;
    for (size_t u = 0; u < sizeof size_units / sizeof size_units[0]; u++) {
        if (word_is(unit, unit_len, size_units[u].name)) {
            factor = size_units[u].factor;
            break;
        }
    }
    if (factor == 0)
        return -1; /* "8X", "1e3", "8 G B", "8G%" */

    uint64_t bytes = 0;
    for (size_t k = 0; k < whole_len; k++) {
        uint64_t d = (uint64_t)(whole[k] - '0');
        if (bytes > (UINT64_MAX - d) / 10)
            return -1;
        bytes = bytes * 10 + d;
    }
    if (bytes > UINT64_MAX / factor)
        return -1; /* "16777216T" */
    bytes *= factor;

    /* floor(0.d1d2...dn * factor), exactly: from the last digit, part = (d*factor + part)/10
     * (floor(floor(x)/10) == floor(x/10), so no rounding error accumulates). */
    uint64_t part = 0;
    for (size_t k = frac_len; k > 0; k--) {
        uint64_t d = (uint64_t)(frac[k - 1] - '0');
        if (factor == 1 && d != 0)
            return -1; /* "1.5" bytes */
        part = (d * factor + part) / 10;
    }
    if (part > UINT64_MAX - bytes)
        return -1;

    out->kind = CS_SIZE_BYTES;
    out->bytes = bytes + part;
    out->percent = 0.0;
    return 0;
}

/* ---- resolving and formatting ---------------------------------------------------------- */

/* Percentages are applied in millionths of a percent, in integers: exact for every
 * percentage written with up to 6 decimals, and no overflow for any device size. */
#define PERCENT_SCALE 1000000ull            /* millionths per percent */
#define PERCENT_WHOLE (100ull * PERCENT_SCALE) /* 100% */

static uint64_t percent_millionths(double percent)
{
    if (!(percent > 0.0))
        return 0;
    if (percent >= 100.0)
        return PERCENT_WHOLE;
    return (uint64_t)(percent * (double)PERCENT_SCALE + 0.5);
}

uint64_t cs_size_resolve(const cs_size_spec *spec, uint64_t device_total)
{
    if (!spec)
        return UINT64_MAX;
    switch (spec->kind) {
    case CS_SIZE_BYTES:
        return spec->bytes;
    case CS_SIZE_PERCENT: {
        uint64_t m = percent_millionths(spec->percent);
        /* floor(total * m / WHOLE) without overflow: split total = q * WHOLE + r. */
        uint64_t q = device_total / PERCENT_WHOLE, r = device_total % PERCENT_WHOLE;
        return q * m + r * m / PERCENT_WHOLE;
    }
    case CS_SIZE_UNLIMITED:
    default:
        return UINT64_MAX;
    }
}

uint64_t cs_cap_resolve(const cs_size_spec *cap, uint64_t device_total, uint64_t min)
{
    uint64_t c = cs_size_resolve(cap, device_total);
    return c < min ? UINT64_MAX : c;
}

bool cs_threshold_above_cap(const cs_size_spec *cap, const cs_size_spec *threshold,
                            const char *cap_name, const char *threshold_name,
                            uint64_t device_total, const char *where, char *buf, size_t len)
{
    uint64_t c = cs_size_resolve(cap, device_total), t = cs_size_resolve(threshold, device_total);
    if (c == UINT64_MAX || t == UINT64_MAX || t <= c)
        return false;
    char cs[64], ts[64];
    cs_size_format(cap, cs, sizeof cs);
    cs_size_format(threshold, ts, sizeof ts);
    snprintf(buf, len,
             "cacheshim: %s (%s) is above %s (%s) for %s: the cap gives idle memory back "
             "first, and the threshold never acts",
             threshold_name, ts, cap_name, cs, where);
    return true;
}

static void format_percent(double percent, char *buf, size_t len)
{
    uint64_t m = percent_millionths(percent);
    uint64_t ip = m / PERCENT_SCALE, fp = m % PERCENT_SCALE;
    if (fp == 0) {
        snprintf(buf, len, "%" PRIu64, ip);
        return;
    }
    int digits = 6;
    while (fp % 10 == 0)
        fp /= 10, digits--;
    snprintf(buf, len, "%" PRIu64 ".%0*" PRIu64, ip, digits, fp);
}

void cs_size_format(const cs_size_spec *spec, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    if (!buf || len == 0)
        return;
    if (!spec) {
        snprintf(buf, len, "unlimited");
        return;
    }
    switch (spec->kind) {
    case CS_SIZE_BYTES: {
        uint64_t v = spec->bytes;
        size_t u = 0;
        while (v != 0 && u + 1 < sizeof units / sizeof units[0] && v % 1024 == 0)
            v /= 1024, u++;
        snprintf(buf, len, "%" PRIu64 " %s", v, units[u]);
        return;
    }
    case CS_SIZE_PERCENT: {
        char p[32];
        format_percent(spec->percent, p, sizeof p);
        snprintf(buf, len, "%s%% of device memory", p);
        return;
    }
    case CS_SIZE_UNLIMITED:
    default:
        snprintf(buf, len, "unlimited");
        return;
    }
}

/* Three significant digits: "512 B", "1.50 KiB", "37.2 MiB", "512 MiB", "8.00 GiB".
 * Integer output only (no %f), so the program's LC_NUMERIC cannot turn '.' into ','. */
void cs_bytes_format(uint64_t bytes, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    enum { LAST_UNIT = sizeof units / sizeof units[0] - 1 };
    if (!buf || len == 0)
        return;
    if (bytes < 1024) {
        snprintf(buf, len, "%" PRIu64 " B", bytes);
        return;
    }
    size_t u = 0;
    double v = (double)bytes;
    while (v >= 1024.0 && u < LAST_UNIT)
        v /= 1024.0, u++;
    for (;;) {
        int decimals = v < 10.0 ? 2 : v < 100.0 ? 1 : 0;
        uint64_t scale = decimals == 2 ? 100 : decimals == 1 ? 10 : 1;
        uint64_t n = (uint64_t)(v * (double)scale + 0.5);
        if (decimals > 0 && n >= 1000) {
            /* rounding carried into one more digit (9.996 -> 10.00): one decimal fewer */
            v = (double)n / (double)scale;
            continue;
        }
        if (decimals == 0 && n >= 1024 && u < LAST_UNIT) {
            v = (double)n / 1024.0, u++; /* 1023.7 KiB -> 1.00 MiB */
            continue;
        }
        if (decimals == 0)
            snprintf(buf, len, "%" PRIu64 " %s", n, units[u]);
        else
            snprintf(buf, len, "%" PRIu64 ".%0*" PRIu64 " %s", n / scale, decimals, n % scale,
                     units[u]);
        return;
    }
}

/* ---- loading and printing ---------------------------------------------------------------- */

static void *slot_field(cs_options *opts, size_t i)
{
    return (char *)opts + option_slots[i].offset;
}

/* Parse text into row i's field; -1 leaves the field alone. */
static int parse_into(size_t i, const char *text, cs_options *opts)
{
    const option_slot *slot = &option_slots[i];
    switch (slot->type) {
    case VALUE_BOOL:
        return parse_bool(text, (bool *)slot_field(opts, i));
    case VALUE_INT:
        return parse_int(text, slot->min, slot->max, (int *)slot_field(opts, i));
    case VALUE_SIZE: {
        cs_size_spec spec;
        if (cs_parse_size(text, slot->allow_percent, &spec) != 0 ||
            (spec.kind == CS_SIZE_BYTES && spec.bytes < (uint64_t)slot->min))
            return -1;
        *(cs_size_spec *)slot_field(opts, i) = spec;
        return 0;
    }
    case VALUE_CHOICE:
        return parse_choice(text, slot->choices, (int *)slot_field(opts, i));
    case VALUE_PATH:
        return parse_path(text, (char *)slot_field(opts, i));
    case VALUE_FILTER:
        return parse_filter(text, (char *)slot_field(opts, i));
    case VALUE_FLAGS:
        return parse_flags(text, slot->choices, (int *)slot_field(opts, i));
    case VALUE_GROUP:
        return parse_group(text, (char *)slot_field(opts, i));
    }
    return -1;
}

static void load_defaults(cs_options *opts)
{
    memset(opts, 0, sizeof *opts);
    for (size_t i = 0; i < OPT_COUNT; i++)
        (void)parse_into(i, option_table[i].fallback, opts); /* tests check these parse */
}

#define SHOWN_MAX 64
_Static_assert(CS_VALUE_SHOWN_LEN >= SHOWN_MAX * 4 + 4, "room for every byte as \\xNN, ... and NUL");

void cs_value_show(const char *value, char *buf, size_t len)
{
    if (!buf || len < CS_VALUE_SHOWN_LEN)
        return;
    if (!value)
        value = "";
    size_t o = 0, i = 0;
    for (; value[i] != '\0' && i < SHOWN_MAX; i++) {
        unsigned char c = (unsigned char)value[i];
        if (c < 0x20 || c == 0x7f)
            o += (size_t)snprintf(buf + o, len - o, "\\x%02x", c);
        else
            buf[o++] = (char)c;
    }
    if (value[i] != '\0') {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o] = '\0';
}

int cs_options_load(cs_options *opts, cs_getenv_fn getenv_fn, cs_report_fn report, void *arg)
{
    if (!opts)
        return 0;
    load_defaults(opts);
    if (!getenv_fn)
        return 0;
    int bad = 0;
    for (size_t i = 0; i < OPT_COUNT; i++) {
        const cs_option_desc *d = &option_table[i];
        const char *value = getenv_fn(d->name);
        if (!value || value[0] == '\0')
            continue; /* unset, or set to nothing: the default */
        if (parse_into(i, value, opts) == 0)
            continue;
        bad++;
        if (report) {
            char shown[CS_VALUE_SHOWN_LEN];
            char line[sizeof shown + 512];
            cs_value_show(value, shown, sizeof shown);
            snprintf(line, sizeof line,
                     "cacheshim: %s='%s' is not valid: expected %s; using the default (%s)",
                     d->name, shown, d->accepted, d->fallback);
            report(line, arg);
        }
    }
    return bad;
}

int cs_option_parse(cs_options *opts, const char *name, const char *value)
{
    if (!opts || !name || !value)
        return -1;
    for (size_t i = 0; i < OPT_COUNT; i++) {
        if (strcmp(option_table[i].name, name) == 0)
            return parse_into(i, value, opts);
    }
    return -2;
}

/* "off", or the words of the set bits joined by commas. */
static void flags_format(int value, const char *const *words, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int w = 0; words[w]; w++)
        if (value & (1 << w))
            o += (size_t)snprintf(buf + o, len - o, "%s%s", o ? "," : "", words[w]);
    if (o == 0)
        snprintf(buf, len, "off");
}

static bool sizes_equal(const cs_size_spec *a, const cs_size_spec *b)
{
    if (a->kind != b->kind)
        return false;
    if (a->kind == CS_SIZE_BYTES)
        return a->bytes == b->bytes;
    if (a->kind == CS_SIZE_PERCENT)
        return a->percent == b->percent;
    return true;
}

void cs_options_print(const cs_options *opts, cs_report_fn report, void *arg)
{
    if (!opts || !report)
        return;
    cs_options defaults;
    load_defaults(&defaults);
    for (size_t i = 0; i < OPT_COUNT; i++) {
        const size_t off = option_slots[i].offset;
        const void *have = (const char *)opts + off, *dflt = (const char *)&defaults + off;
        char value[CS_TRACE_TEXT_MAX];
        bool is_default = false;
        switch (option_slots[i].type) {
        case VALUE_BOOL:
            snprintf(value, sizeof value, "%d", *(const bool *)have ? 1 : 0);
            is_default = *(const bool *)have == *(const bool *)dflt;
            break;
        case VALUE_INT:
            snprintf(value, sizeof value, "%d", *(const int *)have);
            is_default = *(const int *)have == *(const int *)dflt;
            break;
        case VALUE_SIZE:
            cs_size_format(have, value, sizeof value);
            is_default = sizes_equal(have, dflt);
            break;
        case VALUE_CHOICE:
            snprintf(value, sizeof value, "%s", option_slots[i].choices[*(const int *)have]);
            is_default = *(const int *)have == *(const int *)dflt;
            break;
        case VALUE_FLAGS:
            flags_format(*(const int *)have, option_slots[i].choices, value, sizeof value);
            is_default = *(const int *)have == *(const int *)dflt;
            break;
        case VALUE_PATH:
        case VALUE_FILTER:
            snprintf(value, sizeof value, "%s", *(const char *)have ? (const char *)have : "stderr");
            is_default = strcmp(have, dflt) == 0;
            break;
        case VALUE_GROUP:
            snprintf(value, sizeof value, "%s", *(const char *)have ? (const char *)have : "none");
            is_default = strcmp(have, dflt) == 0;
            break;
        }
        char line[CS_TRACE_TEXT_MAX + 128];
        snprintf(line, sizeof line, "cacheshim: %s = %s (%s)", option_table[i].name, value,
                 is_default ? "default" : "set");
        report(line, arg);
    }
}

int cs_utf8_len(const unsigned char *s)
{
    unsigned char c = s[0];
    int n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] > 0x9f) || /* overlong, surrogates */
        (c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] > 0x8f))
        return 0;
    return n;
}
