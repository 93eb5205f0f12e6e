/* cacheshim: the launcher. `cacheshim run|trace [OPTIONS] [--] PROGRAM [ARGS...]` sets up the
 * environment and becomes PROGRAM (exec: same pid, so its exit status and signals are the
 * launcher's); `cacheshim report|replay ...` runs the sibling tool cacheshim-report|replay.
 * See docs/cli.md. */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ca_recover.h"
#include "launch.h"
#include "launch_config.h"

static void usage(FILE *f)
{
    fputs("usage: " LAUNCH_NAME " COMMAND [OPTIONS] [--] PROGRAM [ARGS...]\n"
          "       " LAUNCH_NAME " report|replay [ARGS...]\n"
          "       " LAUNCH_NAME " status [--dir DIR] [GROUP...]\n"
          "       " LAUNCH_NAME " finish TRACE...\n"
          "       " LAUNCH_NAME " --help | --version\n"
          "\n"
          "Commands:\n"
          "  run      run PROGRAM with the caching allocator (libcacheshim.so)\n"
          "  trace    run PROGRAM with the driver-call tracer (libcacheaudit.so as LD_AUDIT)\n"
          "  report   summarise a trace (runs cacheshim-report)\n"
          "  replay   replay allocation traces through the cache, offline (runs cacheshim-replay)\n"
          "  status   list the groups of processes sharing a cap (CACHESHIM_GROUP), their members\n"
          "           and bytes per device\n"
          "  finish   finish the trace of a process that was killed (SIGKILL): the calls it\n"
          "           left in TRACE.pending formatted into TRACE (report and replay do it too)\n"
          "\n"
          "'" LAUNCH_NAME " COMMAND --help' describes each command; see also cacheshim(1).\n",
          f);
}

/* cacheshim finish TRACE...: 0 when every trace is finished (or was), 1 when one could not
 * be (its process still writes, or its pending file cannot be used). */
static int finish_main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fputs("usage: " LAUNCH_NAME " finish TRACE...\n"
              "Formats the calls that a traced process killed by SIGKILL left in TRACE.pending\n"
              "into TRACE and finishes the file. See docs/tracing.md.\n",
              argc < 2 ? stderr : stdout);
        return argc < 2 ? LAUNCH_USAGE : launch_flush_stdout(0);
    }
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        char msg[9000];
        if (access(argv[i], F_OK) != 0) {
            char shown[CS_VALUE_SHOWN_LEN];
            cs_value_show(argv[i], shown, sizeof shown);
            fprintf(stderr, LAUNCH_NAME ": '%s': %s\n", shown, strerror(errno));
            rc = 1;
            continue;
        }
        int got = ca_recover(argv[i], msg, sizeof msg);
        if (got == CA_RECOVER_NONE)
            printf("%s: nothing to finish\n", argv[i]);
        else if (got == CA_RECOVER_DONE)
            printf("%s\n", msg);
        else
            fprintf(stderr, LAUNCH_NAME ": %s\n", msg);
        if (got == CA_RECOVER_BUSY || got == CA_RECOVER_ERROR)
            rc = 1;
    }
    return launch_flush_stdout(rc);
}

int launch_flush_stdout(int status)
{
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, LAUNCH_NAME ": cannot write to standard output: %s\n", strerror(errno));
        return LAUNCH_SETUP;
    }
    return status;
}

static int launch(launch_cmd cmd, int argc, char **argv)
{
    launch_args a;
    int rc = launch_parse(cmd, argc, argv, &a);
    if (rc != LAUNCH_GO)
        return rc;
    cs_options opts;
    if ((rc = launch_apply(&a, &opts)) != 0)
        return rc;
    char dir[PATH_MAX];
    if ((rc = launch_self_dir(dir, sizeof dir)) != 0)
        return rc;
    bool cache = cmd == LAUNCH_RUN || a.value[LOPT_CACHE];
    if (cmd == LAUNCH_TRACE) {
        rc = launch_library(&a, dir, "LD_AUDIT", "libcacheaudit.so", CS_AUDIT_FROM_TOOLS);
        if (rc == 0)
            rc = launch_trace_output(&a, &opts);
        if (rc != 0)
            return rc;
    }
    /* The cache at binding time (LD_AUDIT: every library, deep-bound and dlmopen'ed ones
     * too), ahead of the tracer so that the tracer sees the cache's answers, and preloaded,
     * the preloaded copy then serving cacheshim.h's functions (the audit module redirects it
     * to itself). --no-bind preloads only. A sanitized build only preloads: the audit module
     * cannot run sanitized. */
    if (cache) {
        if (CS_BIND_HOOKS && !a.value[LOPT_NO_BIND])
            rc = launch_library(&a, dir, "LD_AUDIT", "libcacheshim.so", CS_SHIM_FROM_TOOLS);
        if (rc == 0)
            rc = launch_library(&a, dir, "LD_PRELOAD", "libcacheshim.so", CS_SHIM_FROM_TOOLS);
        if (rc != 0)
            return rc;
    }
    return launch_exec(&a);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return LAUNCH_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return launch_flush_stdout(0);
    }
    if (strcmp(cmd, "--version") == 0) {
        printf(LAUNCH_NAME " %s\n", CS_VERSION);
        return launch_flush_stdout(0);
    }
    if (strcmp(cmd, "run") == 0)
        return launch(LAUNCH_RUN, argc - 1, argv + 1);
    if (strcmp(cmd, "trace") == 0)
        return launch(LAUNCH_TRACE, argc - 1, argv + 1);
    if (strcmp(cmd, "status") == 0)
        return status_main(argc - 1, argv + 1);
    if (strcmp(cmd, "finish") == 0)
        return finish_main(argc - 1, argv + 1);
    if (strcmp(cmd, "report") == 0 || strcmp(cmd, "replay") == 0) {
        char dir[PATH_MAX];
        int rc = launch_self_dir(dir, sizeof dir);
        return rc != 0 ? rc : launch_dispatch(dir, argv + 1);
    }
    char shown[CS_VALUE_SHOWN_LEN];
    cs_value_show(cmd, shown, sizeof shown);
    fprintf(stderr, LAUNCH_NAME ": unknown %s '%s' (try: " LAUNCH_NAME " --help)\n",
            cmd[0] == '-' ? "option" : "command", shown);
    return LAUNCH_USAGE;
}
