/* The environment the program gets: the CACHESHIM_* variables, checked with the libraries' own
 * parser before anything runs; the libraries in LD_PRELOAD / LD_AUDIT; the trace file. */
#include "launch.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "launch_config.h"

/* ---- the CACHESHIM_* variables ------------------------------------------------------------ */

static int option_for(const char *variable)
{
    for (int o = 0; o < LOPT_COUNT; o++) {
        const char *v = launch_opt_variable((launch_opt)o);
        if (v && strcmp(v, variable) == 0)
            return o;
    }
    return -1;
}

/* Without --cache, trace loads only the tracer, which reads only its own variables. */
static bool read_by_the_libraries(const launch_args *a, const char *variable)
{
    if (a->cmd == LAUNCH_TRACE && !a->value[LOPT_CACHE])
        return strncmp(variable, "CACHESHIM_TRACE_", 16) == 0;
    return true;
}

int launch_apply(const launch_args *a, cs_options *opts)
{
    const char *value[LOPT_COUNT];
    memcpy(value, a->value, sizeof value);
    const char *env_format = secure_getenv("CACHESHIM_TRACE_FORMAT");
    if (a->cmd == LAUNCH_TRACE && !value[LOPT_FORMAT] && !(env_format && *env_format))
        value[LOPT_FORMAT] = "jsonl"; /* what cacheshim report reads */

    cs_options_load(opts, NULL, NULL, NULL); /* the defaults */
    size_t n;
    const cs_option_desc *table = cs_option_table(&n);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const char *name = table[i].name;
        if (!read_by_the_libraries(a, name))
            continue;
        int o = option_for(name);
        bool from_option = o >= 0 && value[o];
        const char *v = from_option ? value[o] : secure_getenv(name);
        if (!from_option && (!v || !*v))
            continue; /* unset or empty: the libraries use the default */
        if (cs_option_parse(opts, name, v) == 0)
            continue;
        bad++;
        char shown[CS_VALUE_SHOWN_LEN];
        cs_value_show(v, shown, sizeof shown);
        if (from_option)
            fprintf(stderr, "%s: %s='%s' is not valid: expected %s\n", a->who,
                    launch_opt_name((launch_opt)o), shown, table[i].accepted);
        else
            fprintf(stderr, "%s: %s='%s' in the environment is not valid: expected %s\n",
                    a->who, name, shown, table[i].accepted);
    }
    if (bad)
        return LAUNCH_USAGE;

    for (int o = 0; o < LOPT_COUNT; o++) {
        const char *var = launch_opt_variable((launch_opt)o);
        if (var && value[o] && setenv(var, value[o], 1) != 0) {
            fprintf(stderr, "%s: cannot set %s: %s\n", a->who, var, strerror(errno));
            return LAUNCH_SETUP;
        }
    }
    return 0;
}

/* ---- the libraries ------------------------------------------------------------------------- */

int launch_library(const launch_args *a, const char *self_dir, const char *var, const char *name,
                   const char *build_rel)
{
    const char *rel[2] = {CS_LIBDIR_FROM_BINDIR, build_rel};
    char tried[2][PATH_MAX], path[PATH_MAX];
    bool found = false;
    for (int i = 0; i < 2 && !found; i++) {
        int len = snprintf(tried[i], sizeof tried[i], "%s/%s/%s", self_dir, rel[i], name);
        if (len < 0 || (size_t)len >= sizeof tried[i]) {
            fprintf(stderr, "%s: the path of %s is too long\n", a->who, name);
            return LAUNCH_SETUP;
        }
        found = realpath(tried[i], path) != NULL && access(path, R_OK) == 0;
    }
    if (!found) {
        fprintf(stderr, "%s: no readable %s: looked for %s and %s\n", a->who, name, tried[0],
                tried[1]);
        return LAUNCH_SETUP;
    }
    /* ld.so splits LD_PRELOAD at colons and spaces, LD_AUDIT at colons. */
    if (strpbrk(path, strcmp(var, "LD_AUDIT") == 0 ? ":" : ": ")) {
        fprintf(stderr, "%s: cannot put %s in %s: its path contains a colon or a space\n",
                a->who, path, var);
        return LAUNCH_SETUP;
    }
    const char *old = getenv(var);
    size_t size = strlen(path) + (old ? strlen(old) : 0) + 2;
    char *value = malloc(size);
    if (!value) {
        fprintf(stderr, "%s: out of memory\n", a->who);
        return LAUNCH_SETUP;
    }
    if (old && *old)
        snprintf(value, size, "%s:%s", path, old);
    else
        snprintf(value, size, "%s", path);
    int rc = setenv(var, value, 1);
    int err = errno;
    free(value);
    if (rc != 0) {
        fprintf(stderr, "%s: cannot set %s: %s\n", a->who, var, strerror(err));
        return LAUNCH_SETUP;
    }
    return 0;
}

/* ---- the trace file ------------------------------------------------------------------------ */

/* cacheshim-trace.PROGRAM.PID.EXT: PROGRAM's last path component, with what is not a
 * letter, digit, '.', '_', '+' or '-' as '_', at most 64 bytes. */
static void default_trace_name(const char *program, int format, char *out, size_t len)
{
    static const char *const ext[] = {[CS_TRACE_TEXT] = "txt", [CS_TRACE_JSONL] = "jsonl",
                                      [CS_TRACE_PERFETTO] = "json"};
    const char *base = strrchr(program, '/');
    base = base ? base + 1 : program;
    char name[65];
    size_t n = 0;
    for (; base[n] && n < sizeof name - 1; n++) {
        char c = base[n];
        bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '+' || c == '-';
        name[n] = keep ? c : '_';
    }
    name[n] = '\0';
    snprintf(out, len, "cacheshim-trace.%s.%d.%s", n ? name : "program", (int)getpid(),
             ext[format]);
}

/* %p as the tracer expands it (audit/ca_trace.c) in the process it starts in: this one,
 * since exec keeps the pid. */
static int expand_pid(const char *tmpl, char *out, size_t len)
{
    size_t o = 0;
    for (const char *s = tmpl; *s; s++) {
        char num[24];
        const char *piece = s;
        size_t n = 1;
        if (s[0] == '%' && s[1] == 'p') {
            n = (size_t)snprintf(num, sizeof num, "%d", (int)getpid());
            piece = num;
            s++;
        }
        if (o + n >= len)
            return -1;
        memcpy(out + o, piece, n);
        o += n;
    }
    out[o] = '\0';
    return 0;
}

/* The path as a shell word: as it is when only safe characters, else in single quotes. */
static void print_shell_word(const char *s)
{
    if (*s && strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                        "._+-/%,:=@") == strlen(s)) {
        fputs(s, stderr);
        return;
    }
    fputc('\'', stderr);
    for (; *s; s++) {
        if (*s == '\'')
            fputs("'\\''", stderr);
        else if ((unsigned char)*s < 0x20 || *s == 0x7f)
            fprintf(stderr, "\\x%02x", (unsigned char)*s); /* keeps the message one line */
        else
            fputc(*s, stderr);
    }
    fputc('\'', stderr);
}

int launch_trace_output(const launch_args *a, cs_options *opts)
{
    const char *env_file = secure_getenv("CACHESHIM_TRACE_FILE");
    if (!a->value[LOPT_OUTPUT] && !(env_file && *env_file)) {
        char name[128];
        default_trace_name(a->program[0], opts->trace_format, name, sizeof name);
        if (cs_option_parse(opts, "CACHESHIM_TRACE_FILE", name) != 0) {
            fprintf(stderr, "%s: internal error: the default trace file name %s is refused\n",
                    a->who, name); /* short and of safe characters: cannot happen */
            return LAUNCH_SETUP;
        }
        if (setenv("CACHESHIM_TRACE_FILE", name, 1) != 0) {
            fprintf(stderr, "%s: cannot set CACHESHIM_TRACE_FILE: %s\n", a->who,
                    strerror(errno));
            return LAUNCH_SETUP;
        }
    }
    if (opts->trace_file[0] == '\0') {
        fprintf(stderr, "%s: tracing to stderr\n", a->who);
        return 0;
    }
    char path[CS_TRACE_TEXT_MAX + 32];
    struct stat st;
    if (expand_pid(opts->trace_file, path, sizeof path) != 0) {
        fprintf(stderr, "%s: the trace file name is too long once %%p is expanded\n", a->who);
        return LAUNCH_USAGE;
    }
    if (lstat(path, &st) == 0) {
        fprintf(stderr, "%s: ", a->who);
        print_shell_word(path);
        fprintf(stderr, " exists; the tracer writes only new files: remove it or choose "
                        "another with -o\n");
        return LAUNCH_USAGE;
    }
    fprintf(stderr, "%s: tracing to ", a->who);
    print_shell_word(path);
    switch (opts->trace_format) {
    case CS_TRACE_JSONL:
        fputs("; summarise it with: " LAUNCH_NAME " report ", stderr);
        print_shell_word(path);
        fputc('\n', stderr);
        break;
    case CS_TRACE_PERFETTO:
        fputs("; open it in https://ui.perfetto.dev\n", stderr);
        break;
    default:
        fputs(" (text; " LAUNCH_NAME " report reads --format jsonl)\n", stderr);
        break;
    }
    return 0;
}
