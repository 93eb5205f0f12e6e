/* The options of `cacheshim run` and `cacheshim trace`: one table, from which both the parser
 * and the help are made. Each option stands for one variable of the options table
 * (shim/cs_options.c), whose parser checks its value later (launch_env.c). */
#include "launch.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    const char *name;     /* "--cap" */
    char short_name;      /* 'o' for -o, or 0 */
    const char *metavar;  /* "SIZE"; NULL for a flag */
    const char *variable; /* the CACHESHIM_* variable it sets; NULL for --cache */
    bool trace_only;      /* an option of trace, unknown to run */
    bool of_the_cache;    /* an option of the cache: with trace, only together with --cache */
    const char *help;
} option_row;

static const option_row options[LOPT_COUNT] = {
    [LOPT_CAP] = {"--cap", 0, "SIZE", "CACHESHIM_CAP", false, true,
                  "hard ceiling per device on the bytes held, in use plus cached"},
    [LOPT_THRESHOLD] = {"--threshold", 0, "SIZE", "CACHESHIM_RELEASE_THRESHOLD", false, true,
                        "idle cached bytes kept per device; above it they go back"},
    [LOPT_GROUP] = {"--group", 0, "NAME", "CACHESHIM_GROUP", false, true,
                    "share the cap with this user's processes of the same group name"},
    [LOPT_STATS] = {"--stats", 0, NULL, "CACHESHIM_STATS", false, true,
                    "print the cache's statistics on stderr at exit"},
    [LOPT_VERBOSE] = {"--verbose", 0, "N", "CACHESHIM_VERBOSE", false, true,
                      "0 quiet; 1 configuration and failed allocations; 2 also releases"},
    [LOPT_DISABLE] = {"--disable", 0, NULL, "CACHESHIM_DISABLE", false, true,
                      "load the shim but forward every call to the driver untouched"},
    [LOPT_OUTPUT] = {"--output", 'o', "FILE", "CACHESHIM_TRACE_FILE", true, false,
                     "the trace file, created new (%p: the process id), or stderr;\n"
                     "default cacheshim-trace.PROGRAM.PID.EXT in the current directory"},
    [LOPT_FORMAT] = {"--format", 0, "FORMAT", "CACHESHIM_TRACE_FORMAT", true, false,
                     "text, jsonl (the default here) or perfetto"},
    [LOPT_FILTER] = {"--filter", 0, "CALLS", "CACHESHIM_TRACE_FILTER", true, false,
                     "memory (default), all, or names and globs: cuMemAlloc*,cuLaunch*"},
    [LOPT_CACHE] = {"--cache", 0, NULL, NULL, true, false,
                    "also load the cache (libcacheshim.so) and take its options:\n"
                    "--cap, --threshold, --group, --stats, --verbose, --disable as for run"},
    [LOPT_NO_BIND] = {"--no-bind", 0, NULL, NULL, false, true,
                      "preload the cache only (no libcacheshim.so in LD_AUDIT): libraries\n"
                      "loaded with RTLD_DEEPBIND or dlmopen then miss it"},
};

const char *launch_opt_variable(launch_opt o) { return options[o].variable; }
const char *launch_opt_name(launch_opt o) { return options[o].name; }

static bool known_to(launch_cmd cmd, const option_row *r)
{
    return cmd == LAUNCH_TRACE || !r->trace_only;
}

/* ---- help ------------------------------------------------------------------------------ */

static void print_option(FILE *f, const option_row *r)
{
    char left[64];
    if (r->short_name)
        snprintf(left, sizeof left, "-%c %s, %s %s", r->short_name, r->metavar, r->name,
                 r->metavar);
    else if (r->metavar)
        snprintf(left, sizeof left, "%s %s", r->name, r->metavar);
    else
        snprintf(left, sizeof left, "%s", r->name);
    if (r->variable)
        fprintf(f, "  %-24s (%s)\n", left, r->variable);
    else
        fprintf(f, "  %s\n", left);
    for (const char *s = r->help; *s;) {
        const char *nl = strchr(s, '\n');
        int n = nl ? (int)(nl - s) : (int)strlen(s);
        fprintf(f, "        %.*s\n", n, s);
        s += nl ? n + 1 : n;
    }
}

static void usage(FILE *f, launch_cmd cmd)
{
    if (cmd == LAUNCH_RUN)
        fputs("usage: " LAUNCH_NAME " run [OPTIONS] [--] PROGRAM [ARGS...]\n"
              "Runs PROGRAM with the caching allocator: libcacheshim.so in LD_AUDIT (every\n"
              "library's driver calls, deep-bound and dlmopen'ed ones too) and in LD_PRELOAD,\n"
              "ahead of what they hold (a sanitized build: LD_PRELOAD only), and each option\n"
              "as its variable.\n",
              f);
    else
        fputs("usage: " LAUNCH_NAME " trace [OPTIONS] [--] PROGRAM [ARGS...]\n"
              "Runs PROGRAM with the driver-call tracer: libcacheaudit.so in LD_AUDIT. Nothing\n"
              "is cached or changed unless --cache is given.\n",
              f);
    fputs("\nOptions:\n", f);
    for (int i = 0; i < LOPT_COUNT; i++) {
        const option_row *r = &options[i];
        if (!known_to(cmd, r) || (cmd == LAUNCH_TRACE && r->of_the_cache))
            continue;
        print_option(f, r);
    }
    fputs("  -h, --help\n", f);
    if (cmd == LAUNCH_RUN)
        fputs("\nSIZE: 8G, 512MiB, 1.5GB, 4096 (bytes), 75% (of device memory), or none.\n",
              f);
    fputs("Options override the same variables in the environment; a bad value in either\n"
          "stops the launcher before PROGRAM runs.\n"
          "Exit status: PROGRAM's own; 2 bad usage or value; 125 a library of cacheshim is\n"
          "missing; 126 PROGRAM cannot be executed; 127 PROGRAM not found.\n",
          f);
}

/* ---- parsing ----------------------------------------------------------------------------- */

/* The row arg names (--cap, --cap=V, -o, -oV), with where an attached value starts. */
static int find_option(launch_cmd cmd, const char *arg, const char **attached)
{
    *attached = NULL;
    for (int i = 0; i < LOPT_COUNT; i++) {
        const option_row *r = &options[i];
        if (!known_to(cmd, r))
            continue;
        size_t n = strlen(r->name);
        if (strncmp(arg, r->name, n) == 0 && (arg[n] == '\0' || arg[n] == '=')) {
            if (arg[n] == '=')
                *attached = arg + n + 1;
            return i;
        }
        if (r->short_name && arg[0] == '-' && arg[1] == r->short_name) {
            if (arg[2] != '\0')
                *attached = arg + 2;
            return i;
        }
    }
    return -1;
}

int launch_parse(launch_cmd cmd, int argc, char **argv, launch_args *out)
{
    memset(out, 0, sizeof *out);
    out->cmd = cmd;
    out->who = cmd == LAUNCH_RUN ? LAUNCH_NAME " run" : LAUNCH_NAME " trace";
    const char *who = out->who;
    int i = 1;
    for (; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--") == 0) {
            i++;
            break;
        }
        if (arg[0] != '-' || arg[1] == '\0')
            break; /* PROGRAM: what follows is its own */
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            usage(stdout, cmd);
            return launch_flush_stdout(0);
        }
        const char *attached;
        int o = find_option(cmd, arg, &attached);
        if (o < 0) {
            char shown[CS_VALUE_SHOWN_LEN];
            cs_value_show(arg, shown, sizeof shown);
            fprintf(stderr, "%s: unknown option '%s' (try: %s --help)\n", who, shown, who);
            return LAUNCH_USAGE;
        }
        const option_row *r = &options[o];
        if (!r->metavar) {
            if (attached) {
                fprintf(stderr, "%s: %s takes no value (try: %s --help)\n", who, r->name, who);
                return LAUNCH_USAGE;
            }
            out->value[o] = "1";
        } else if (attached) {
            out->value[o] = attached;
        } else if (i + 1 < argc) {
            out->value[o] = argv[++i];
        } else {
            fprintf(stderr, "%s: %s needs a value (try: %s --help)\n", who, arg, who);
            return LAUNCH_USAGE;
        }
    }
    if (i >= argc) {
        fprintf(stderr, "%s: no program to run (try: %s --help)\n", who, who);
        return LAUNCH_USAGE;
    }
    out->program = argv + i;

    if (cmd == LAUNCH_TRACE && !out->value[LOPT_CACHE]) {
        for (int o = 0; o < LOPT_COUNT; o++) {
            if (out->value[o] && options[o].of_the_cache) {
                fprintf(stderr, "%s: %s is an option of the cache: add --cache to load it\n",
                        who, options[o].name);
                return LAUNCH_USAGE;
            }
        }
    }
    return LAUNCH_GO;
}
