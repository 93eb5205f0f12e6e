/* Unit tests of the options layer (shim/cs_options.c): parsing, the bad-value messages,
 * defaults, printing, formatting and resolving sizes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cs_options.h"

#define KiB (1ull << 10)
#define MiB (1ull << 20)
#define GiB (1ull << 30)
#define TiB (1ull << 40)

/* ---- a fake environment and a report collector ---------------------------------------- */

#define ENV_MAX 20

static struct {
    const char *name[ENV_MAX];
    const char *value[ENV_MAX];
    int count;
    int lookups[ENV_MAX]; /* getenv calls per variable set here */
    int misses;           /* getenv calls for variables not set here */
} env;

static void env_clear(void) { memset(&env, 0, sizeof env); }

static void env_set(const char *name, const char *value)
{
    assert_true(env.count < ENV_MAX);
    env.name[env.count] = name;
    env.value[env.count] = value;
    env.count++;
}

static const char *fake_getenv(const char *name)
{
    for (int i = 0; i < env.count; i++) {
        if (strcmp(env.name[i], name) == 0) {
            env.lookups[i]++;
            return env.value[i];
        }
    }
    env.misses++;
    return NULL;
}

#define LINES_MAX 20

typedef struct {
    int count;
    char line[LINES_MAX][1024];
} reports;

static void collect(const char *line, void *arg)
{
    reports *r = arg;
    assert_non_null(line);
    assert_null(strchr(line, '\n'));
    assert_true(strlen(line) < sizeof r->line[0]);
    if (r->count < LINES_MAX)
        strcpy(r->line[r->count], line);
    r->count++;
}

static int setup(void **state)
{
    (void)state;
    env_clear();
    return 0;
}

static void assert_defaults(const cs_options *o)
{
    assert_false(o->disable);
    assert_int_equal(o->cap.kind, CS_SIZE_UNLIMITED);
    assert_int_equal(o->release_threshold.kind, CS_SIZE_UNLIMITED);
    assert_false(o->stats);
    assert_int_equal(o->verbose, 0);
    assert_int_equal(o->reuse, 0);
    assert_false(o->sync_free);
    assert_int_equal(o->backend, 0); /* pooled */
    assert_int_equal(o->headroom, 10);
    assert_string_equal(o->group, "");
    assert_int_equal(o->trace_format, CS_TRACE_TEXT);
    assert_string_equal(o->trace_file, "");
    assert_string_equal(o->trace_filter, "memory");
    assert_int_equal(o->host_cap.kind, CS_SIZE_UNLIMITED);
    assert_int_equal(o->host_release_threshold.kind, CS_SIZE_UNLIMITED);
    assert_int_equal(o->trace_stack, 0);
    assert_int_equal(o->trace_clock, CS_TRACE_CLOCK_AUTO);
}

/* ---- the table ------------------------------------------------------------------------- */

static void test_table(void **state)
{
    (void)state;
    static const char *const names[] = {"CACHESHIM_DISABLE", "CACHESHIM_CAP",
                                        "CACHESHIM_RELEASE_THRESHOLD", "CACHESHIM_STATS",
                                        "CACHESHIM_VERBOSE", "CACHESHIM_REUSE",
                                        "CACHESHIM_SYNC_FREE", "CACHESHIM_BACKEND",
                                        "CACHESHIM_HEADROOM", "CACHESHIM_DEBUG",
                                        "CACHESHIM_QUARANTINE", "CACHESHIM_GROUP",
                                        "CACHESHIM_TRACE_FORMAT",
                                        "CACHESHIM_TRACE_FILE", "CACHESHIM_TRACE_FILTER",
                                        "CACHESHIM_HOST_CAP",
                                        "CACHESHIM_HOST_RELEASE_THRESHOLD",
                                        "CACHESHIM_TRACE_STACK", "CACHESHIM_TRACE_CLOCK"};
    size_t n = 0;
    const cs_option_desc *t = cs_option_table(&n);
    assert_non_null(t);
    assert_int_equal(n, 19);
    assert_ptr_equal(cs_option_table(NULL), t);
    for (size_t i = 0; i < n; i++) {
        assert_string_equal(t[i].name, names[i]);
        assert_non_null(t[i].type);
        assert_non_null(t[i].fallback);
        assert_non_null(t[i].accepted);
        assert_non_null(t[i].help);
        assert_true(strcmp(t[i].type, "bool") == 0 || strcmp(t[i].type, "int") == 0 ||
                    strcmp(t[i].type, "size") == 0 || strcmp(t[i].type, "choice") == 0 ||
                    strcmp(t[i].type, "flags") == 0 || strcmp(t[i].type, "text") == 0 ||
                    strcmp(t[i].type, "name") == 0);
        /* The doc table is built from these texts: no cell separators, no newlines. */
        assert_null(strchr(t[i].help, '|'));
        assert_null(strchr(t[i].help, '\n'));
        assert_null(strchr(t[i].accepted, '\n'));
    }
}

/* Each row's fallback text, set explicitly, gives the default and no complaint. */
static void test_fallback_text_is_the_default(void **state)
{
    (void)state;
    size_t n = 0;
    const cs_option_desc *t = cs_option_table(&n);
    for (size_t i = 0; i < n; i++) {
        env_clear();
        env_set(t[i].name, t[i].fallback);
        reports r = {0};
        cs_options o;
        memset(&o, 0xa5, sizeof o);
        assert_int_equal(cs_options_load(&o, fake_getenv, collect, &r), 0);
        assert_int_equal(r.count, 0);
        assert_defaults(&o);
    }
}

/* ---- defaults and loading ---------------------------------------------------------------- */

static void test_defaults_when_nothing_set(void **state)
{
    (void)state;
    reports r = {0};
    cs_options o;
    memset(&o, 0xa5, sizeof o);
    assert_int_equal(cs_options_load(&o, fake_getenv, collect, &r), 0);
    assert_int_equal(r.count, 0);
    assert_defaults(&o);
    assert_int_equal(env.misses, 19); /* each variable asked for exactly once */

    memset(&o, 0xa5, sizeof o);
    assert_int_equal(cs_options_load(&o, NULL, collect, &r), 0);
    assert_defaults(&o);
}

static void test_each_variable_read_once(void **state)
{
    (void)state;
    env_set("CACHESHIM_DISABLE", "1");
    env_set("CACHESHIM_CAP", "8G");
    env_set("CACHESHIM_RELEASE_THRESHOLD", "bad");
    env_set("CACHESHIM_STATS", "yes");
    env_set("CACHESHIM_VERBOSE", "2");
    env_set("CACHESHIM_CAPP", "1G"); /* a typo: never asked for */
    cs_options o;
    reports r = {0};
    assert_int_equal(cs_options_load(&o, fake_getenv, collect, &r), 1);
    for (int i = 0; i < 5; i++)
        assert_int_equal(env.lookups[i], 1);
    assert_int_equal(env.lookups[5], 0);
    assert_int_equal(env.misses, 14); /* REUSE, SYNC_FREE, BACKEND, HEADROOM, DEBUG, QUARANTINE,
                                         GROUP, TRACE_*, HOST_*: unset */
}

static void test_empty_is_unset(void **state)
{
    (void)state;
    env_set("CACHESHIM_DISABLE", "");
    env_set("CACHESHIM_CAP", "");
    env_set("CACHESHIM_RELEASE_THRESHOLD", "");
    env_set("CACHESHIM_STATS", "");
    env_set("CACHESHIM_VERBOSE", "");
    reports r = {0};
    cs_options o;
    assert_int_equal(cs_options_load(&o, fake_getenv, collect, &r), 0);
    assert_int_equal(r.count, 0);
    assert_defaults(&o);
}

static void test_all_set(void **state)
{
    (void)state;
    env_set("CACHESHIM_DISABLE", "TRUE");
    env_set("CACHESHIM_CAP", "75%");
    env_set("CACHESHIM_RELEASE_THRESHOLD", " 2 GiB ");
    env_set("CACHESHIM_STATS", "on");
    env_set("CACHESHIM_VERBOSE", "1");
    reports r = {0};
    cs_options o;
    assert_int_equal(cs_options_load(&o, fake_getenv, collect, &r), 0);
    assert_int_equal(r.count, 0);
    assert_true(o.disable);
    assert_int_equal(o.cap.kind, CS_SIZE_PERCENT);
    assert_true(o.cap.percent == 75.0);
    assert_int_equal(o.release_threshold.kind, CS_SIZE_BYTES);
    assert_int_equal(o.release_threshold.bytes, 2 * GiB);
    assert_true(o.stats);
    assert_int_equal(o.verbose, 1);
}

static void test_several_bad_values(void **state)
{
    (void)state;
    env_set("CACHESHIM_CAP", "8X");
    env_set("CACHESHIM_STATS", "1");
    env_set("CACHESHIM_VERBOSE", "9");
    reports r = {0};
    cs_options o;
    assert_int_equal(cs_options_load(&o, fake_getenv, collect, &r), 2);
    assert_int_equal(r.count, 2);
    assert_string_equal(r.line[0], "cacheshim: CACHESHIM_CAP='8X' is not valid: expected a size "
                                   "of at least 2MiB like 8G, 512MiB, 1.5GB, a percentage of "
                                   "device memory like 75%, or none; using the default "
                                   "(unlimited)");
    assert_string_equal(r.line[1], "cacheshim: CACHESHIM_VERBOSE='9' is not valid: expected 0, "
                                   "1 or 2; using the default (0)");
    assert_int_equal(o.cap.kind, CS_SIZE_UNLIMITED);
    assert_true(o.stats);
    assert_int_equal(o.verbose, 0);

    /* Without a report function the count is still right and nothing breaks. */
    assert_int_equal(cs_options_load(&o, fake_getenv, NULL, NULL), 2);
}

/* ---- good values --------------------------------------------------------------------------- */

static void test_good_bools(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        bool value;
    } cases[] = {
        {"1", true},     {"0", false},   {"true", true},  {"false", false}, {"yes", true},
        {"no", false},   {"on", true},   {"off", false},  {"TRUE", true},   {"False", false},
        {"Yes", true},   {"NO", false},  {"oN", true},    {"OFF", false},   {" 1 ", true},
        {"\tyes", true}, {"off ", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        env_clear();
        env_set("CACHESHIM_STATS", cases[i].text);
        env_set("CACHESHIM_DISABLE", cases[i].text);
        reports r = {0};
        cs_options o;
        assert_int_equal(cs_options_load(&o, fake_getenv, collect, &r), 0);
        assert_int_equal(r.count, 0);
        if (o.stats != cases[i].value || o.disable != cases[i].value)
            fail_msg("'%s' should read as %d", cases[i].text, cases[i].value);
    }
}

static void test_good_ints(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        int value;
    } cases[] = {{"0", 0}, {"1", 1}, {"2", 2}, {" 2 ", 2}, {"002", 2}, {"\t1", 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        env_clear();
        env_set("CACHESHIM_VERBOSE", cases[i].text);
        reports r = {0};
        cs_options o;
        assert_int_equal(cs_options_load(&o, fake_getenv, collect, &r), 0);
        assert_int_equal(r.count, 0);
        if (o.verbose != cases[i].value)
            fail_msg("'%s' should read as %d, got %d", cases[i].text, cases[i].value, o.verbose);
    }
}

/* The backend's words in any case, and the headroom's whole percent from 0 to 1000. */
static void test_good_backend_and_headroom(void **state)
{
    (void)state;
    static const struct {
        const char *backend, *headroom;
        int b, h;
    } cases[] = {
        {"pooled", "0", 0, 0},     {"classic", "25", 1, 25}, {" Classic ", "1000", 1, 1000},
        {"POOLED", "0010", 0, 10}, {"\tclassic", " 50 ", 1, 50}, {"Pooled", "999", 0, 999},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        env_clear();
        env_set("CACHESHIM_BACKEND", cases[i].backend);
        env_set("CACHESHIM_HEADROOM", cases[i].headroom);
        reports r = {0};
        cs_options o;
        assert_int_equal(cs_options_load(&o, fake_getenv, collect, &r), 0);
        assert_int_equal(r.count, 0);
        if (o.backend != cases[i].b || o.headroom != cases[i].h)
            fail_msg("'%s', '%s': got backend %d, headroom %d", cases[i].backend,
                     cases[i].headroom, o.backend, o.headroom);
    }
}

/* Group names: kept as written without the blanks around; none and off for no group. */
static void test_good_group(void **state)
{
    (void)state;
    static const struct {
        const char *value, *group;
    } cases[] = {{"train", "train"},       {" a.b_c-1 ", "a.b_c-1"}, {"None", ""},
                 {"off", ""},              {"-", "-"},
                 {"1234567890123456789012345678901234567890123456789012345678901234",
                  "1234567890123456789012345678901234567890123456789012345678901234"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cs_options o;
        assert_int_equal(cs_option_parse(&o, "CACHESHIM_GROUP", cases[i].value), 0);
        assert_string_equal(o.group, cases[i].group);
    }
}

static void test_good_sizes(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        uint64_t bytes;
    } cases[] = {
        {"0", 0},
        {"4096", 4096},
        {"8G", 8 * GiB},
        {"8g", 8 * GiB},
        {"8GiB", 8 * GiB},
        {"8gib", 8 * GiB},
        {"8GIB", 8 * GiB},
        {"8 G", 8 * GiB},
        {"8\tGiB", 8 * GiB},
        {"  8G  ", 8 * GiB},
        {"000008G", 8 * GiB},
        {"512MiB", 512 * MiB},
        {"512M", 512 * MiB},
        {"1.5GB", 1500000000},
        {"1.5gb", 1500000000},
        {"1.5G", 1536 * MiB},
        {"0.5G", 512 * MiB},
        {"1K", KiB},
        {"1k", KiB},
        {"1KiB", KiB},
        {"1KB", 1000},
        {"1kb", 1000},
        {"1M", MiB},
        {"1MB", 1000000},
        {"1T", TiB},
        {"1TiB", TiB},
        {"1TB", 1000000000000ull},
        {"2B", 2},
        {"2 b", 2},
        {"1.0", 1},
        {"7.000B", 7},
        {"1.5K", 1536},
        {"1.5KB", 1500},
        {"0.1K", 102},             /* 102.4 rounds down */
        {"1.0000001K", 1024},      /* 1024.0001024 rounds down */
        {"0.001KB", 1},
        {"0.0001KB", 0},
        {"0.999999999999999999999999G", GiB - 1},
        {"18446744073709551615", UINT64_MAX},
        {"18446744073709551615B", UINT64_MAX},
        {"16777215T", 16777215ull * TiB},
        {"16777215.999999999999T", UINT64_MAX - 1},
        {"17179869183G", 17179869183ull * GiB},
        {"18446744073709551.615KB", UINT64_MAX},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (int pct = 0; pct < 2; pct++) {
            cs_size_spec s = {CS_SIZE_PERCENT, 12345, 1.0};
            if (cs_parse_size(cases[i].text, pct, &s) != 0)
                fail_msg("'%s' should parse", cases[i].text);
            assert_int_equal(s.kind, CS_SIZE_BYTES);
            if (s.bytes != cases[i].bytes)
                fail_msg("'%s': expected %llu bytes, got %llu", cases[i].text,
                         (unsigned long long)cases[i].bytes, (unsigned long long)s.bytes);
        }
        /* and the same through the environment, for both size variables */
        /* (a cap must hold one allocation: 2 MiB at least, test_cap_minimum) */
        env_clear();
        bool cap_ok = cases[i].bytes >= 2 * MiB;
        if (cap_ok)
            env_set("CACHESHIM_CAP", cases[i].text);
        env_set("CACHESHIM_RELEASE_THRESHOLD", cases[i].text);
        reports r = {0};
        cs_options o;
        assert_int_equal(cs_options_load(&o, fake_getenv, collect, &r), 0);
        assert_int_equal(r.count, 0);
        assert_int_equal(o.cap.kind, cap_ok ? CS_SIZE_BYTES : CS_SIZE_UNLIMITED);
        if (cap_ok)
            assert_int_equal(o.cap.bytes, cases[i].bytes);
        assert_int_equal(o.release_threshold.bytes, cases[i].bytes);
    }
}

static void test_good_percents(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        double percent;
    } cases[] = {
        {"75%", 75.0},     {"12.5%", 12.5},  {"100%", 100.0},    {"100.000%", 100.0},
        {"0.5%", 0.5},     {" 75 % ", 75.0}, {"75\t%", 75.0},    {"33.3%", 33.3},
        {"0.001%", 0.001}, {"1%", 1.0},      {"099.9%", 99.9},   {"0.000001%", 0.000001},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cs_size_spec s = {CS_SIZE_BYTES, 12345, 0.0};
        if (cs_parse_size(cases[i].text, true, &s) != 0)
            fail_msg("'%s' should parse", cases[i].text);
        assert_int_equal(s.kind, CS_SIZE_PERCENT);
        if (s.percent != cases[i].percent)
            fail_msg("'%s': expected %.17g%%, got %.17g%%", cases[i].text, cases[i].percent,
                     s.percent);

        /* not where percentages are not allowed, and *out stays as it was */
        cs_size_spec t = {CS_SIZE_BYTES, 12345, 0.0};
        assert_int_equal(cs_parse_size(cases[i].text, false, &t), -1);
        assert_int_equal(t.kind, CS_SIZE_BYTES);
        assert_int_equal(t.bytes, 12345);
    }
}

static void test_unlimited_words(void **state)
{
    (void)state;
    static const char *const words[] = {"none", "NONE", "None", "unlimited", "UNLIMITED",
                                        "Unlimited", "off", "OFF", " none ", "\tunlimited"};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        cs_size_spec s = {CS_SIZE_BYTES, 12345, 0.0};
        if (cs_parse_size(words[i], false, &s) != 0)
            fail_msg("'%s' should parse", words[i]);
        assert_int_equal(s.kind, CS_SIZE_UNLIMITED);
    }
}

static void test_parse_size_bad_arguments(void **state)
{
    (void)state;
    cs_size_spec s = {CS_SIZE_BYTES, 7, 0.0};
    assert_int_equal(cs_parse_size(NULL, true, &s), -1);
    assert_int_equal(cs_parse_size("8G", true, NULL), -1);
    assert_int_equal(cs_parse_size("", true, &s), -1);
    assert_int_equal(cs_parse_size("   ", true, &s), -1);
    assert_int_equal(s.kind, CS_SIZE_BYTES);
    assert_int_equal(s.bytes, 7);
}

/* ---- bad values ------------------------------------------------------------------------------ */

#define TAIL_BOOL "is not valid: expected 1, 0, true, false, yes, no, on or off; using the default (0)"
#define TAIL_INT "is not valid: expected 0, 1 or 2; using the default (0)"
#define TAIL_SIZE                                                                           \
    "is not valid: expected a size like 8G, 512MiB, 1.5GB, 4096, a percentage of device " \
    "memory like 75%, or none; using the default (unlimited)"

#define TAIL_CAP                                                                            \
    "is not valid: expected a size of at least 2MiB like 8G, 512MiB, 1.5GB, a percentage of " \
    "device memory like 75%, or none; using the default (unlimited)"
#define TAIL_HOST_CAP                                                                        \
    "is not valid: expected a size of at least 4KiB like 8G, 512MiB, 1.5GB, a percentage of " \
    "the machine's memory like 25%, or none; using the default (unlimited)"
#define TAIL_HOST_SIZE                                                                      \
    "is not valid: expected a size like 8G, 512MiB, 1.5GB, 4096, a percentage of the " \
    "machine's memory like 25%, or none; using the default (unlimited)"

#define TAIL_FORMAT "is not valid: expected text, jsonl or perfetto; using the default (text)"
#define TAIL_CLOCK "is not valid: expected auto, tsc or monotonic; using the default (auto)"
#define TAIL_REUSE "is not valid: expected ordered or completed; using the default (ordered)"
#define TAIL_BACKEND "is not valid: expected pooled or classic; using the default (pooled)"
#define TAIL_STACK "is not valid: expected a whole number of frames from 0 to 16; using the default (0)"
#define TAIL_HEADROOM                                                                      \
    "is not valid: expected a whole number of percent from 0 to 1000, without the % sign; " \
    "using the default (10)"
#define TAIL_GROUP                                                                           \
    "is not valid: expected none, or a name of 1 to 64 letters, digits, '.', '_' and '-' that " \
    "does not start with '.'; using the default (none)"
#define TAIL_FILE                                                                            \
    "is not valid: expected stderr or a file path of at most 1023 bytes, %p standing for the " \
    "process id; using the default (stderr)"
#define TAIL_FILTER                                                                         \
    "is not valid: expected memory, all, or a comma-separated list of names and globs like " \
    "cuMemAlloc*,cuLaunch*; using the default (memory)"

/* value as set, and as shown in the message (they differ only for control characters) */
#define BAD(var, value, tail) {"CACHESHIM_" var, value, "cacheshim: CACHESHIM_" var "='" value "' " tail}
#define BAD_SHOWN(var, value, shown, tail) {"CACHESHIM_" var, value, "cacheshim: CACHESHIM_" var "='" shown "' " tail}

static const struct {
    const char *name;
    const char *value;
    const char *line;
} bad_values[] = {
    /* bools */
    BAD("DISABLE", "2", TAIL_BOOL),
    BAD("DISABLE", "yes please", TAIL_BOOL),
    BAD("DISABLE", "   ", TAIL_BOOL),
    BAD("DISABLE", "tru", TAIL_BOOL),
    BAD("DISABLE", "y", TAIL_BOOL),
    BAD("DISABLE", "-1", TAIL_BOOL),
    BAD("DISABLE", "01", TAIL_BOOL),
    BAD("DISABLE", "enable", TAIL_BOOL),
    BAD("DISABLE", "1 1", TAIL_BOOL),
    BAD_SHOWN("DISABLE", "on\n", "on\\x0a", TAIL_BOOL),
    BAD("STATS", "2", TAIL_BOOL),
    BAD("STATS", "none", TAIL_BOOL),
    BAD("STATS", "ok", TAIL_BOOL),
    BAD("STATS", "true!", TAIL_BOOL),
    /* ints */
    BAD("VERBOSE", "3", TAIL_INT),
    BAD("VERBOSE", "-1", TAIL_INT),
    BAD("VERBOSE", "1x", TAIL_INT),
    BAD("VERBOSE", " ", TAIL_INT),
    BAD("VERBOSE", "1.0", TAIL_INT),
    BAD("VERBOSE", "+1", TAIL_INT),
    BAD("VERBOSE", "99999999999999999999", TAIL_INT),
    BAD("VERBOSE", "4294967297", TAIL_INT),
    BAD("VERBOSE", "18446744073709551617", TAIL_INT), /* 2^64 + 1: would wrap to 1 */
    BAD("VERBOSE", "0x1", TAIL_INT),
    BAD("VERBOSE", "one", TAIL_INT),
    BAD("VERBOSE", "2 2", TAIL_INT),
    BAD("VERBOSE", "yes", TAIL_INT),
    /* sizes */
    BAD("CAP", "8X", TAIL_CAP),
    BAD("CAP", "-5G", TAIL_CAP),
    BAD("CAP", "+5G", TAIL_CAP),
    BAD("CAP", "1.5", TAIL_CAP),
    BAD("CAP", "1.5B", TAIL_CAP),
    BAD("CAP", "0.1 b", TAIL_CAP),
    BAD("CAP", "%", TAIL_CAP),
    BAD("CAP", "101%", TAIL_CAP),
    BAD("CAP", "100.0001%", TAIL_CAP),
    BAD("CAP", "0%", TAIL_CAP),
    BAD("CAP", "0.000%", TAIL_CAP),
    BAD("CAP", "-0%", TAIL_CAP),
    BAD("CAP", "-5%", TAIL_CAP),
    BAD("CAP", "1000%", TAIL_CAP),
    BAD("CAP", "75%%", TAIL_CAP),
    BAD("CAP", "%75", TAIL_CAP),
    BAD("CAP", "8G%", TAIL_CAP),
    BAD("CAP", "nan", TAIL_CAP),
    BAD("CAP", "NaN", TAIL_CAP),
    BAD("CAP", "inf", TAIL_CAP),
    BAD("CAP", "Infinity", TAIL_CAP),
    BAD("CAP", "1e3", TAIL_CAP),
    BAD("CAP", "1E9", TAIL_CAP),
    BAD("CAP", "18446744073709551616", TAIL_CAP),
    BAD("CAP", "99999999999999999999999", TAIL_CAP),
    BAD("CAP", "16777216T", TAIL_CAP),
    BAD("CAP", "17179869184G", TAIL_CAP),
    BAD("CAP", "18446744073709551.616KB", TAIL_CAP),
    BAD("CAP", "8 G B", TAIL_CAP),
    BAD("CAP", "8GG", TAIL_CAP),
    BAD("CAP", "8 GiBs", TAIL_CAP),
    BAD("CAP", "G8", TAIL_CAP),
    BAD("CAP", "G", TAIL_CAP),
    BAD("CAP", "   ", TAIL_CAP),
    BAD("CAP", ".5G", TAIL_CAP),
    BAD("CAP", "5.G", TAIL_CAP),
    BAD("CAP", "1,5G", TAIL_CAP),
    BAD("CAP", "1 000", TAIL_CAP),
    BAD("CAP", "0x10", TAIL_CAP),
    BAD("CAP", "8P", TAIL_CAP),
    BAD("CAP", "8PiB", TAIL_CAP),
    BAD("CAP", "none please", TAIL_CAP),
    BAD("CAP", "unlimited!", TAIL_CAP),
    BAD("CAP", "no", TAIL_CAP),
    BAD("CAP", "12 bytes", TAIL_CAP),
    /* the tracer's variables */
    BAD("REUSE", "later", TAIL_REUSE),
    BAD("REUSE", "ordered,completed", TAIL_REUSE),
    BAD("SYNC_FREE", "sometimes", TAIL_BOOL),
    BAD("BACKEND", "vmm", TAIL_BACKEND),
    BAD("BACKEND", "cuMemAlloc", TAIL_BACKEND),
    BAD("BACKEND", "pooled,classic", TAIL_BACKEND),
    BAD("BACKEND", "pool", TAIL_BACKEND),
    BAD("BACKEND", "   ", TAIL_BACKEND),
    BAD("HEADROOM", "1001", TAIL_HEADROOM),
    BAD("HEADROOM", "-1", TAIL_HEADROOM),
    BAD("HEADROOM", "25%", TAIL_HEADROOM),
    BAD("HEADROOM", "0.5", TAIL_HEADROOM),
    BAD("HEADROOM", "1e2", TAIL_HEADROOM),
    BAD("HEADROOM", "ten", TAIL_HEADROOM),
    BAD("HEADROOM", "+5", TAIL_HEADROOM),
    BAD("HEADROOM", "99999999999999999999", TAIL_HEADROOM),
    BAD("GROUP", "a/b", TAIL_GROUP),
    BAD("GROUP", "..", TAIL_GROUP),
    BAD("GROUP", ".hidden", TAIL_GROUP),
    BAD("GROUP", "two words", TAIL_GROUP),
    BAD("GROUP", "   ", TAIL_GROUP),
    BAD("GROUP", "caf\xc3\xa9", TAIL_GROUP),
    BAD_SHOWN("GROUP", "x1234567890123456789012345678901234567890123456789012345678901234",
              "x123456789012345678901234567890123456789012345678901234567890123...", TAIL_GROUP),
    BAD("TRACE_FORMAT", "json", TAIL_FORMAT),
    BAD("TRACE_CLOCK", "rdtsc", TAIL_CLOCK),
    BAD("TRACE_CLOCK", "tsc,monotonic", TAIL_CLOCK),
    BAD("TRACE_FORMAT", "chrome", TAIL_FORMAT),
    BAD("TRACE_FORMAT", "text,jsonl", TAIL_FORMAT),
    BAD("TRACE_FORMAT", "   ", TAIL_FORMAT),
    BAD_SHOWN("TRACE_FILE", "/tmp/x\n", "/tmp/x\\x0a", TAIL_FILE),
    BAD("TRACE_FILE", "   ", TAIL_FILE),
    BAD("TRACE_FILTER", "cuMem Alloc", TAIL_FILTER),
    BAD("TRACE_FILTER", "cuMemAlloc*,,cuMemFree*", TAIL_FILTER),
    BAD("TRACE_FILTER", ",cuMemAlloc", TAIL_FILTER),
    BAD("TRACE_FILTER", "cuMemAlloc,", TAIL_FILTER),
    BAD("TRACE_FILTER", "cu-Mem", TAIL_FILTER),
    BAD("TRACE_FILTER", "   ", TAIL_FILTER),
    BAD_SHOWN("CAP", "8G\n", "8G\\x0a", TAIL_CAP),
    BAD_SHOWN("CAP", "8\x1b[31mG", "8\\x1b[31mG", TAIL_CAP),
    /* a cap that cannot hold one allocation */
    BAD("CAP", "0", TAIL_CAP),
    BAD("CAP", "0.4K", TAIL_CAP),
    BAD("CAP", "2097151", TAIL_CAP),
    BAD("CAP", "1.99MiB", TAIL_CAP),
    BAD("HOST_CAP", "0", TAIL_HOST_CAP),
    BAD("HOST_CAP", "4095", TAIL_HOST_CAP),
    BAD("HOST_CAP", "lots", TAIL_HOST_CAP),
    BAD("HOST_RELEASE_THRESHOLD", "8X", TAIL_HOST_SIZE),
    BAD("HOST_RELEASE_THRESHOLD", "150%", TAIL_HOST_SIZE),
    BAD("TRACE_STACK", "17", TAIL_STACK),
    BAD("TRACE_STACK", "-1", TAIL_STACK),
    BAD("TRACE_STACK", "eight", TAIL_STACK),
    BAD("RELEASE_THRESHOLD", "lots", TAIL_SIZE),
    BAD("RELEASE_THRESHOLD", "1O0", TAIL_SIZE),
    BAD("RELEASE_THRESHOLD", "2^30", TAIL_SIZE),
    BAD("RELEASE_THRESHOLD", "1_000", TAIL_SIZE),
    BAD("RELEASE_THRESHOLD", "8MiB/s", TAIL_SIZE),
    BAD("RELEASE_THRESHOLD", "150%", TAIL_SIZE),
    BAD("RELEASE_THRESHOLD", "-1", TAIL_SIZE),
    BAD("RELEASE_THRESHOLD", "1.5.0G", TAIL_SIZE),
};

static void test_bad_values(void **state)
{
    (void)state;
    size_t n = sizeof bad_values / sizeof bad_values[0];
    assert_true(n >= 40);
    for (size_t i = 0; i < n; i++) {
        env_clear();
        env_set(bad_values[i].name, bad_values[i].value);
        reports r = {0};
        cs_options o;
        memset(&o, 0xa5, sizeof o);
        int bad = cs_options_load(&o, fake_getenv, collect, &r);
        if (bad != 1 || r.count != 1)
            fail_msg("%s='%s': %d bad, %d lines", bad_values[i].name, bad_values[i].value, bad,
                     r.count);
        assert_defaults(&o);
        assert_string_equal(r.line[0], bad_values[i].line);
    }
}

/* Just below and at 2^64: a fraction rounds down, so many nines still fit. */
static void test_size_overflow_boundary(void **state)
{
    (void)state;
    cs_size_spec s;
    assert_int_equal(cs_parse_size("16777215.9999999999999999999999T", false, &s), 0);
    assert_int_equal(s.bytes, UINT64_MAX);
    assert_int_equal(cs_parse_size("16777216T", false, &s), -1);
    assert_int_equal(cs_parse_size("16777216.0T", false, &s), -1);
    assert_int_equal(cs_parse_size("16384P", false, &s), -1);
    assert_int_equal(cs_parse_size("18446744073709551615.5K", false, &s), -1);
}

static void test_long_bad_value_is_cut(void **state)
{
    (void)state;
    char value[200];
    memset(value, 'x', sizeof value - 1);
    value[sizeof value - 1] = '\0';
    env_set("CACHESHIM_CAP", value);
    reports r = {0};
    cs_options o;
    assert_int_equal(cs_options_load(&o, fake_getenv, collect, &r), 1);
    assert_int_equal(r.count, 1);
    char expected[512];
    snprintf(expected, sizeof expected, "cacheshim: CACHESHIM_CAP='%.64s...' %s", value, TAIL_CAP);
    assert_string_equal(r.line[0], expected);

    /* 64 control characters: every one escaped, still one line */
    char ctl[70];
    memset(ctl, '\r', 64);
    ctl[64] = '\0';
    env_clear();
    env_set("CACHESHIM_VERBOSE", ctl);
    r.count = 0;
    assert_int_equal(cs_options_load(&o, fake_getenv, collect, &r), 1);
    assert_int_equal(strlen(r.line[0]), strlen("cacheshim: CACHESHIM_VERBOSE='' " TAIL_INT) + 64 * 4);
}

/* ---- one variable by name (cs_option_parse) and the shown value ------------------------- */

static void test_option_parse(void **state)
{
    (void)state;
    cs_options o, before;
    cs_options_load(&o, NULL, NULL, NULL);

    /* every bad value of the table above: -1 and nothing written */
    for (size_t i = 0; i < sizeof bad_values / sizeof bad_values[0]; i++) {
        memcpy(&before, &o, sizeof o);
        if (cs_option_parse(&o, bad_values[i].name, bad_values[i].value) != -1)
            fail_msg("%s='%s' parsed", bad_values[i].name, bad_values[i].value);
        assert_memory_equal(&o, &before, sizeof o);
    }
    /* empty is bad here (cs_options_load reads it as unset) */
    assert_int_equal(cs_option_parse(&o, "CACHESHIM_CAP", ""), -1);
    assert_memory_equal(&o, &before, sizeof o);

    /* good values land in their fields */
    assert_int_equal(cs_option_parse(&o, "CACHESHIM_CAP", "8G"), 0);
    assert_int_equal(o.cap.kind, CS_SIZE_BYTES);
    assert_int_equal(o.cap.bytes, 8 * GiB);
    assert_int_equal(cs_option_parse(&o, "CACHESHIM_RELEASE_THRESHOLD", "25%"), 0);
    assert_int_equal(o.release_threshold.kind, CS_SIZE_PERCENT);
    assert_int_equal(cs_option_parse(&o, "CACHESHIM_STATS", "yes"), 0);
    assert_true(o.stats);
    assert_int_equal(cs_option_parse(&o, "CACHESHIM_DISABLE", "1"), 0);
    assert_true(o.disable);
    assert_int_equal(cs_option_parse(&o, "CACHESHIM_VERBOSE", "2"), 0);
    assert_int_equal(o.verbose, 2);
    assert_int_equal(cs_option_parse(&o, "CACHESHIM_BACKEND", "classic"), 0);
    assert_int_equal(o.backend, 1);
    assert_int_equal(cs_option_parse(&o, "CACHESHIM_HEADROOM", "150"), 0);
    assert_int_equal(o.headroom, 150);
    assert_int_equal(cs_option_parse(&o, "CACHESHIM_TRACE_FORMAT", "perfetto"), 0);
    assert_int_equal(o.trace_format, CS_TRACE_PERFETTO);
    assert_int_equal(cs_option_parse(&o, "CACHESHIM_TRACE_CLOCK", " Monotonic "), 0);
    assert_int_equal(o.trace_clock, CS_TRACE_CLOCK_MONOTONIC);
    assert_int_equal(cs_option_parse(&o, "CACHESHIM_TRACE_CLOCK", "tsc"), 0);
    assert_int_equal(o.trace_clock, CS_TRACE_CLOCK_TSC);
    assert_int_equal(cs_option_parse(&o, "CACHESHIM_TRACE_FILE", "t.%p.jsonl"), 0);
    assert_string_equal(o.trace_file, "t.%p.jsonl");
    assert_int_equal(cs_option_parse(&o, "CACHESHIM_TRACE_FILTER", " cuMemAlloc* , cuInit"), 0);
    assert_string_equal(o.trace_filter, "cuMemAlloc*,cuInit");

    /* not in the table, or NULL arguments */
    memcpy(&before, &o, sizeof o);
    assert_int_equal(cs_option_parse(&o, "CACHESHIM_CAPS", "8G"), -2);
    assert_int_equal(cs_option_parse(&o, "cacheshim_cap", "8G"), -2);
    assert_int_equal(cs_option_parse(&o, NULL, "8G"), -1);
    assert_int_equal(cs_option_parse(&o, "CACHESHIM_CAP", NULL), -1);
    assert_int_equal(cs_option_parse(NULL, "CACHESHIM_CAP", "8G"), -1);
    assert_memory_equal(&o, &before, sizeof o);
}

static void test_value_show(void **state)
{
    (void)state;
    char buf[CS_VALUE_SHOWN_LEN];
    cs_value_show("8X", buf, sizeof buf);
    assert_string_equal(buf, "8X");
    cs_value_show(NULL, buf, sizeof buf);
    assert_string_equal(buf, "");
    cs_value_show("a\tb\x7f", buf, sizeof buf);
    assert_string_equal(buf, "a\\x09b\\x7f");

    char v[80];
    memset(v, 'y', sizeof v - 1);
    v[sizeof v - 1] = '\0';
    v[64] = '\0'; /* exactly 64 bytes: shown whole */
    cs_value_show(v, buf, sizeof buf);
    assert_string_equal(buf, v);
    v[64] = 'y'; /* 79: cut after 64 */
    cs_value_show(v, buf, sizeof buf);
    assert_int_equal(strlen(buf), 64 + 3);
    assert_string_equal(buf + 64, "...");

    /* 64 control characters then more: the longest result fits */
    memset(v, '\n', sizeof v - 1);
    cs_value_show(v, buf, sizeof buf);
    assert_int_equal(strlen(buf), 64 * 4 + 3);

    /* a buffer too small for the longest result is left alone */
    char small[CS_VALUE_SHOWN_LEN - 1];
    memset(small, 'q', sizeof small);
    cs_value_show("8X", small, sizeof small);
    assert_int_equal(small[0], 'q');
    cs_value_show("8X", NULL, sizeof buf); /* no crash */
}

/* CACHESHIM_DEBUG: off, or words of its list once each, in any order and case. */
static void test_debug_flags(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        int value; /* -1: bad */
    } cases[] = {
        {"off", 0},
        {" None ", 0},
        {"uaf", CS_DEBUG_UAF},
        {"uaf-report", CS_DEBUG_UAF_REPORT},
        {"leaks", CS_DEBUG_LEAKS},
        {"uaf,leaks", CS_DEBUG_UAF | CS_DEBUG_LEAKS},
        {" LEAKS , uaf-report ", CS_DEBUG_LEAKS | CS_DEBUG_UAF_REPORT},
        {"uaf,uaf", -1},
        {"uaf,", -1},
        {",uaf", -1},
        {"uaf,,leaks", -1},
        {"uaf leaks", -1},
        {"bogus", -1},
        {"off,uaf", -1},
        {"1", -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cs_options o;
        assert_int_equal(cs_options_load(&o, NULL, NULL, NULL), 0);
        o.debug = 99;
        int r = cs_option_parse(&o, "CACHESHIM_DEBUG", cases[i].text);
        if (cases[i].value < 0) {
            assert_int_equal(r, -1);
            assert_int_equal(o.debug, 99); /* left alone */
        } else {
            assert_int_equal(r, 0);
            assert_int_equal(o.debug, cases[i].value);
        }
    }
}

/* ---- printing ----------------------------------------------------------------------------------- */

/* The smallest caps accepted are one allocation's worth; the threshold may be anything. */
static void test_cap_minimum(void **state)
{
    (void)state;
    cs_options o;
    assert_int_equal(cs_option_parse(&o, "CACHESHIM_CAP", "2MiB"), 0);
    assert_int_equal(o.cap.bytes, 2 * MiB);
    assert_int_equal(cs_option_parse(&o, "CACHESHIM_CAP", "2097152"), 0);
    assert_int_equal(cs_option_parse(&o, "CACHESHIM_CAP", "0.001%"), 0);
    assert_int_equal(cs_option_parse(&o, "CACHESHIM_CAP", "0.4K"), -1);
    assert_int_equal(cs_option_parse(&o, "CACHESHIM_CAP", "0"), -1);
    assert_int_equal(o.cap.kind, CS_SIZE_PERCENT);  /* a refused value changes nothing */
    assert_int_equal(cs_option_parse(&o, "CACHESHIM_HOST_CAP", "4KiB"), 0);
    assert_int_equal(o.host_cap.bytes, 4096);
    assert_int_equal(cs_option_parse(&o, "CACHESHIM_HOST_CAP", "4095"), -1);
    assert_int_equal(cs_option_parse(&o, "CACHESHIM_RELEASE_THRESHOLD", "0"), 0);
    assert_int_equal(cs_option_parse(&o, "CACHESHIM_HOST_RELEASE_THRESHOLD", "0"), 0);
}

/* A cap in percent that comes to less than the least cap on a device is no cap there. */
static void test_cap_resolve(void **state)
{
    (void)state;
    cs_size_spec s;
    assert_int_equal(cs_parse_size("1%", true, &s), 0);
    assert_int_equal(cs_cap_resolve(&s, 1ull << 30, CS_MIN_CAP), 10737418);
    assert_int_equal(cs_cap_resolve(&s, 100ull << 20, CS_MIN_CAP), UINT64_MAX);  /* 1 MiB */
    assert_int_equal(cs_parse_size("none", true, &s), 0);
    assert_int_equal(cs_cap_resolve(&s, 1ull << 30, CS_MIN_CAP), UINT64_MAX);
    assert_int_equal(cs_parse_size("2M", true, &s), 0);
    assert_int_equal(cs_cap_resolve(&s, 1ull << 30, CS_MIN_CAP), 2 * MiB);
}

/* A threshold above the cap does nothing, and is said to, sizes resolved on the device. */
static void test_threshold_above_cap(void **state)
{
    (void)state;
    cs_options o;
    char line[512] = "untouched";
    assert_int_equal(cs_options_load(&o, NULL, NULL, NULL), 0);
    assert_false(cs_threshold_above_cap(&o.cap, &o.release_threshold, "CACHESHIM_CAP",
                                        "CACHESHIM_RELEASE_THRESHOLD", 16ull << 30, "device 0",
                                        line, sizeof line));
    assert_int_equal(cs_option_parse(&o, "CACHESHIM_CAP", "4G"), 0);
    assert_false(cs_threshold_above_cap(&o.cap, &o.release_threshold, "CACHESHIM_CAP",
                                        "CACHESHIM_RELEASE_THRESHOLD", 16ull << 30, "device 0",
                                        line, sizeof line));  /* no threshold: nothing to say */
    assert_int_equal(cs_option_parse(&o, "CACHESHIM_RELEASE_THRESHOLD", "4G"), 0);
    assert_false(cs_threshold_above_cap(&o.cap, &o.release_threshold, "CACHESHIM_CAP",
                                        "CACHESHIM_RELEASE_THRESHOLD", 16ull << 30, "device 0",
                                        line, sizeof line));  /* equal: fine */
    assert_string_equal(line, "untouched");
    assert_int_equal(cs_option_parse(&o, "CACHESHIM_RELEASE_THRESHOLD", "50%"), 0);
    assert_true(cs_threshold_above_cap(&o.cap, &o.release_threshold, "CACHESHIM_CAP",
                                       "CACHESHIM_RELEASE_THRESHOLD", 16ull << 30, "device 1",
                                       line, sizeof line));
    assert_string_equal(line, "cacheshim: CACHESHIM_RELEASE_THRESHOLD (50% of device memory) is "
                              "above CACHESHIM_CAP (4 GiB) for device 1: the cap gives idle "
                              "memory back first, and the threshold never acts");
    /* 50% of a 4 GiB device is below the cap */
    assert_false(cs_threshold_above_cap(&o.cap, &o.release_threshold, "CACHESHIM_CAP",
                                        "CACHESHIM_RELEASE_THRESHOLD", 4ull << 30, "device 1",
                                        line, sizeof line));
}

static void test_print_defaults(void **state)
{
    (void)state;
    cs_options o;
    assert_int_equal(cs_options_load(&o, fake_getenv, NULL, NULL), 0);
    reports r = {0};
    cs_options_print(&o, collect, &r);
    assert_int_equal(r.count, 19);
    assert_string_equal(r.line[0], "cacheshim: CACHESHIM_DISABLE = 0 (default)");
    assert_string_equal(r.line[1], "cacheshim: CACHESHIM_CAP = unlimited (default)");
    assert_string_equal(r.line[2], "cacheshim: CACHESHIM_RELEASE_THRESHOLD = unlimited (default)");
    assert_string_equal(r.line[3], "cacheshim: CACHESHIM_STATS = 0 (default)");
    assert_string_equal(r.line[4], "cacheshim: CACHESHIM_VERBOSE = 0 (default)");
    assert_string_equal(r.line[5], "cacheshim: CACHESHIM_REUSE = ordered (default)");
    assert_string_equal(r.line[6], "cacheshim: CACHESHIM_SYNC_FREE = 0 (default)");
    assert_string_equal(r.line[7], "cacheshim: CACHESHIM_BACKEND = pooled (default)");
    assert_string_equal(r.line[8], "cacheshim: CACHESHIM_HEADROOM = 10 (default)");
    assert_string_equal(r.line[9], "cacheshim: CACHESHIM_DEBUG = off (default)");
    assert_string_equal(r.line[10], "cacheshim: CACHESHIM_QUARANTINE = 256 MiB (default)");
    assert_string_equal(r.line[11], "cacheshim: CACHESHIM_GROUP = none (default)");
    assert_string_equal(r.line[12], "cacheshim: CACHESHIM_TRACE_FORMAT = text (default)");
    assert_string_equal(r.line[13], "cacheshim: CACHESHIM_TRACE_FILE = stderr (default)");
    assert_string_equal(r.line[14], "cacheshim: CACHESHIM_TRACE_FILTER = memory (default)");
    assert_string_equal(r.line[15], "cacheshim: CACHESHIM_HOST_CAP = unlimited (default)");
    assert_string_equal(r.line[16],
                        "cacheshim: CACHESHIM_HOST_RELEASE_THRESHOLD = unlimited (default)");
    assert_string_equal(r.line[17], "cacheshim: CACHESHIM_TRACE_STACK = 0 (default)");
}

static void test_print_set(void **state)
{
    (void)state;
    env_set("CACHESHIM_DISABLE", "yes");
    env_set("CACHESHIM_CAP", "8G");
    env_set("CACHESHIM_RELEASE_THRESHOLD", "12.5%");
    env_set("CACHESHIM_STATS", "off"); /* set, but to the default */
    env_set("CACHESHIM_VERBOSE", "2");
    env_set("CACHESHIM_REUSE", " Completed ");
    env_set("CACHESHIM_SYNC_FREE", "yes");
    env_set("CACHESHIM_BACKEND", " Classic ");
    env_set("CACHESHIM_HEADROOM", "025");
    env_set("CACHESHIM_DEBUG", " Leaks , UAF ");
    env_set("CACHESHIM_QUARANTINE", "1G");
    env_set("CACHESHIM_GROUP", " train-1.a_b ");
    env_set("CACHESHIM_TRACE_FORMAT", " Perfetto ");
    env_set("CACHESHIM_TRACE_FILE", " /tmp/trace.%p ");
    env_set("CACHESHIM_TRACE_FILTER", " cuMemAlloc* , cuLaunchKernel ");
    env_set("CACHESHIM_HOST_CAP", "1G");
    env_set("CACHESHIM_HOST_RELEASE_THRESHOLD", "256MiB");
    env_set("CACHESHIM_TRACE_STACK", " 8 ");
    cs_options o;
    assert_int_equal(cs_options_load(&o, fake_getenv, NULL, NULL), 0);
    reports r = {0};
    cs_options_print(&o, collect, &r);
    assert_int_equal(r.count, 19);
    assert_string_equal(r.line[0], "cacheshim: CACHESHIM_DISABLE = 1 (set)");
    assert_string_equal(r.line[1], "cacheshim: CACHESHIM_CAP = 8 GiB (set)");
    assert_string_equal(r.line[2],
                        "cacheshim: CACHESHIM_RELEASE_THRESHOLD = 12.5% of device memory (set)");
    assert_string_equal(r.line[3], "cacheshim: CACHESHIM_STATS = 0 (default)");
    assert_string_equal(r.line[4], "cacheshim: CACHESHIM_VERBOSE = 2 (set)");
    assert_string_equal(r.line[5], "cacheshim: CACHESHIM_REUSE = completed (set)");
    assert_string_equal(r.line[6], "cacheshim: CACHESHIM_SYNC_FREE = 1 (set)");
    assert_string_equal(r.line[7], "cacheshim: CACHESHIM_BACKEND = classic (set)");
    assert_string_equal(r.line[8], "cacheshim: CACHESHIM_HEADROOM = 25 (set)");
    assert_string_equal(r.line[9], "cacheshim: CACHESHIM_DEBUG = uaf,leaks (set)");
    assert_string_equal(r.line[10], "cacheshim: CACHESHIM_QUARANTINE = 1 GiB (set)");
    assert_string_equal(r.line[11], "cacheshim: CACHESHIM_GROUP = train-1.a_b (set)");
    assert_string_equal(r.line[12], "cacheshim: CACHESHIM_TRACE_FORMAT = perfetto (set)");
    assert_string_equal(r.line[13], "cacheshim: CACHESHIM_TRACE_FILE = /tmp/trace.%p (set)");
    assert_string_equal(r.line[14],
                        "cacheshim: CACHESHIM_TRACE_FILTER = cuMemAlloc*,cuLaunchKernel (set)");
    assert_string_equal(r.line[15], "cacheshim: CACHESHIM_HOST_CAP = 1 GiB (set)");
    assert_string_equal(r.line[16],
                        "cacheshim: CACHESHIM_HOST_RELEASE_THRESHOLD = 256 MiB (set)");
    assert_string_equal(r.line[17], "cacheshim: CACHESHIM_TRACE_STACK = 8 (set)");

    cs_options_print(NULL, collect, &r); /* nothing, no crash */
    cs_options_print(&o, NULL, NULL);
    assert_int_equal(r.count, 19);
}

/* ---- formatting ------------------------------------------------------------------------------- */

static void test_size_format(void **state)
{
    (void)state;
    static const struct {
        cs_size_spec spec;
        const char *text;
    } cases[] = {
        {{CS_SIZE_UNLIMITED, 0, 0.0}, "unlimited"},
        {{CS_SIZE_BYTES, 0, 0.0}, "0 B"},
        {{CS_SIZE_BYTES, 1, 0.0}, "1 B"},
        {{CS_SIZE_BYTES, 4096, 0.0}, "4 KiB"},
        {{CS_SIZE_BYTES, 4097, 0.0}, "4097 B"},
        {{CS_SIZE_BYTES, 8 * GiB, 0.0}, "8 GiB"},
        {{CS_SIZE_BYTES, 1536 * MiB, 0.0}, "1536 MiB"},
        {{CS_SIZE_BYTES, 512 * MiB, 0.0}, "512 MiB"},
        {{CS_SIZE_BYTES, 1500000000, 0.0}, "1500000000 B"},
        {{CS_SIZE_BYTES, 1000, 0.0}, "1000 B"},
        {{CS_SIZE_BYTES, 3 * TiB, 0.0}, "3 TiB"},
        {{CS_SIZE_BYTES, 1ull << 60, 0.0}, "1048576 TiB"},
        {{CS_SIZE_BYTES, UINT64_MAX, 0.0}, "18446744073709551615 B"},
        {{CS_SIZE_PERCENT, 0, 75.0}, "75% of device memory"},
        {{CS_SIZE_PERCENT, 0, 12.5}, "12.5% of device memory"},
        {{CS_SIZE_PERCENT, 0, 100.0}, "100% of device memory"},
        {{CS_SIZE_PERCENT, 0, 33.3}, "33.3% of device memory"},
        {{CS_SIZE_PERCENT, 0, 0.001}, "0.001% of device memory"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[64];
        cs_size_format(&cases[i].spec, buf, sizeof buf);
        assert_string_equal(buf, cases[i].text);
    }

    /* What is formatted parses back to the same bytes. */
    cs_size_spec s, back;
    char buf[64];
    assert_int_equal(cs_parse_size("1536MiB", false, &s), 0);
    cs_size_format(&s, buf, sizeof buf);
    assert_int_equal(cs_parse_size(buf, false, &back), 0);
    assert_int_equal(back.bytes, s.bytes);

    /* A short buffer is cut and terminated; a zero-length one is left alone. */
    char small[4] = "zzz";
    cs_size_spec big = {CS_SIZE_BYTES, 8 * GiB, 0.0};
    cs_size_format(&big, small, sizeof small);
    assert_string_equal(small, "8 G");
    cs_size_format(&big, small, 0);
    assert_string_equal(small, "8 G");
}

static void test_bytes_format(void **state)
{
    (void)state;
    static const struct {
        uint64_t bytes;
        const char *text;
    } cases[] = {
        {0, "0 B"},
        {1, "1 B"},
        {512, "512 B"},
        {1023, "1023 B"},
        {1024, "1.00 KiB"},
        {1536, "1.50 KiB"},
        {10239, "10.0 KiB"},          /* 9.999 KiB carries into a digit more */
        {102399, "100 KiB"},          /* 99.999 KiB */
        {1048575, "1.00 MiB"},        /* 1023.999 KiB */
        {39007437, "37.2 MiB"},
        {512 * MiB, "512 MiB"},
        {8 * GiB, "8.00 GiB"},
        {1500000000, "1.40 GiB"},
        {80 * GiB, "80.0 GiB"},
        {3 * TiB, "3.00 TiB"},
        {UINT64_MAX, "16.0 EiB"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[32];
        cs_bytes_format(cases[i].bytes, buf, sizeof buf);
        if (strcmp(buf, cases[i].text) != 0)
            fail_msg("%llu bytes: expected '%s', got '%s'", (unsigned long long)cases[i].bytes,
                     cases[i].text, buf);
    }
}

/* ---- resolving ------------------------------------------------------------------------------ */

static void test_resolve(void **state)
{
    (void)state;
    const uint64_t dev = 80 * GiB;
    cs_size_spec s;

    s = (cs_size_spec){CS_SIZE_UNLIMITED, 0, 0.0};
    assert_int_equal(cs_size_resolve(&s, dev), UINT64_MAX);
    assert_int_equal(cs_size_resolve(NULL, dev), UINT64_MAX);

    s = (cs_size_spec){CS_SIZE_BYTES, 8 * GiB, 0.0};
    assert_int_equal(cs_size_resolve(&s, dev), 8 * GiB);
    s.bytes = 0;
    assert_int_equal(cs_size_resolve(&s, dev), 0);
    s.bytes = 200 * GiB; /* more than the device: kept as written */
    assert_int_equal(cs_size_resolve(&s, dev), 200 * GiB);

    static const struct {
        const char *text;
        uint64_t total, bytes;
    } cases[] = {
        {"75%", 80 * GiB, 60 * GiB},
        {"12.5%", 80 * GiB, 10 * GiB},
        {"100%", 80 * GiB, 80 * GiB},
        {"50%", 80 * GiB, 40 * GiB},
        {"33.3%", 80 * GiB, 28604482191ull},  /* floor(85899345920 * 0.333) */
        {"0.5%", 80 * GiB, 429496729ull},     /* floor(429496729.6) */
        {"10.1%", 1000, 101},                 /* no binary-fraction error */
        {"0.000001%", 100000000, 1},
        {"75%", 0, 0},
        {"50%", UINT64_MAX, UINT64_MAX / 2},
        {"100%", UINT64_MAX, UINT64_MAX},
        {"99.999999%", UINT64_MAX, 18446743889242110877ull}, /* no overflow on huge totals */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(cs_parse_size(cases[i].text, true, &s), 0);
        uint64_t got = cs_size_resolve(&s, cases[i].total);
        if (got != cases[i].bytes)
            fail_msg("%s of %llu: expected %llu, got %llu", cases[i].text,
                     (unsigned long long)cases[i].total, (unsigned long long)cases[i].bytes,
                     (unsigned long long)got);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_table, setup),
        cmocka_unit_test_setup(test_fallback_text_is_the_default, setup),
        cmocka_unit_test_setup(test_defaults_when_nothing_set, setup),
        cmocka_unit_test_setup(test_each_variable_read_once, setup),
        cmocka_unit_test_setup(test_empty_is_unset, setup),
        cmocka_unit_test_setup(test_all_set, setup),
        cmocka_unit_test_setup(test_several_bad_values, setup),
        cmocka_unit_test_setup(test_good_bools, setup),
        cmocka_unit_test_setup(test_good_ints, setup),
        cmocka_unit_test_setup(test_good_backend_and_headroom, setup),
        cmocka_unit_test_setup(test_good_group, setup),
        cmocka_unit_test_setup(test_good_sizes, setup),
        cmocka_unit_test_setup(test_good_percents, setup),
        cmocka_unit_test_setup(test_unlimited_words, setup),
        cmocka_unit_test_setup(test_parse_size_bad_arguments, setup),
        cmocka_unit_test_setup(test_bad_values, setup),
        cmocka_unit_test_setup(test_size_overflow_boundary, setup),
        cmocka_unit_test_setup(test_long_bad_value_is_cut, setup),
        cmocka_unit_test_setup(test_option_parse, setup),
        cmocka_unit_test_setup(test_value_show, setup),
        cmocka_unit_test_setup(test_debug_flags, setup),
        cmocka_unit_test_setup(test_print_defaults, setup),
        cmocka_unit_test_setup(test_print_set, setup),
        cmocka_unit_test_setup(test_cap_minimum, setup),
        cmocka_unit_test_setup(test_cap_resolve, setup),
        cmocka_unit_test_setup(test_threshold_above_cap, setup),
        cmocka_unit_test_setup(test_size_format, setup),
        cmocka_unit_test_setup(test_bytes_format, setup),
        cmocka_unit_test_setup(test_resolve, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
