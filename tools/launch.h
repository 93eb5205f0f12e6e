/* cacheshim, the launcher: what its parts share. See docs/cli.md.
 *
 *   cacheshim.c     the command line's first word: run, trace, report, replay, --help, --version
 *   launch_args.c   the options of run and trace, their help, and reading them
 *   launch_env.c    the environment the program gets: CACHESHIM_* checked and set, LD_PRELOAD
 *                   / LD_AUDIT, the trace file
 *   launch_exec.c   where the launcher lies, and the exec of the program or of a sibling tool
 *   status.c        cacheshim status: the groups of processes sharing a cap (cs_group.h)
 */
#ifndef LAUNCH_H
#define LAUNCH_H

#include <stdbool.h>
#include <stddef.h>

#include "cs_options.h"

#define LAUNCH_NAME "cacheshim"

/* Exit statuses of the launcher itself; a program it runs exits with its own. 125-127 as
 * env(1), nice(1) and the shell use them. */
enum {
    LAUNCH_USAGE = 2,         /* bad command line, or a bad CACHESHIM_* value */
    LAUNCH_SETUP = 125,       /* the launcher could not do its part: a library missing... */
    LAUNCH_CANNOT_EXEC = 126, /* the program (or a sibling tool) exists but cannot be run */
    LAUNCH_NOT_FOUND = 127,   /* the program (or a sibling tool) does not exist */
};

/* launch_parse's answer when the program should be run. */
#define LAUNCH_GO (-1)

typedef enum { LAUNCH_RUN, LAUNCH_TRACE } launch_cmd;

/* The options of run and trace; launch_args.c has their table. */
typedef enum {
    LOPT_CAP,
    LOPT_THRESHOLD,
    LOPT_GROUP,
    LOPT_STATS,
    LOPT_VERBOSE,
    LOPT_DISABLE,
    LOPT_OUTPUT,
    LOPT_FORMAT,
    LOPT_FILTER,
    LOPT_CACHE,
    LOPT_NO_BIND,
    LOPT_COUNT
} launch_opt;

typedef struct {
    launch_cmd cmd;
    const char *who;               /* "cacheshim run" or "cacheshim trace", for messages */
    const char *value[LOPT_COUNT]; /* as given on the command line ("1" for a flag); NULL: absent */
    char **program;                /* the program and its arguments, NULL-terminated */
} launch_args;

/* ---- status.c */

/* `cacheshim status [--dir DIR] [GROUP...]` (argv[0] is "status"): the exit status. */
int status_main(int argc, char **argv);

/* ---- cacheshim.c */

/* Writes out what went to stdout: status, or LAUNCH_SETUP after a message if that failed. */
int launch_flush_stdout(int status);

/* ---- launch_args.c */

/* Reads `cacheshim CMD [OPTIONS] [--] PROGRAM [ARGS...]` (argv[0] is CMD). Returns LAUNCH_GO,
 * or the status to exit with: 0 after --help, LAUNCH_USAGE after a message. */
int launch_parse(launch_cmd cmd, int argc, char **argv, launch_args *out);

/* The CACHESHIM_* variable an option sets, or NULL (--cache); its spelling for messages. */
const char *launch_opt_variable(launch_opt o);
const char *launch_opt_name(launch_opt o);

/* ---- launch_env.c */

/* Checks every variable of the options table as the program will see it (from an option, or
 * else from the environment), and only when all are good sets those the options give. trace
 * without --format (and no CACHESHIM_TRACE_FORMAT) gets jsonl. The effective values go into
 * opts. Returns 0, or an exit status after a message (one line per bad value). */
int launch_apply(const launch_args *a, cs_options *opts);

/* Puts the library NAME (libcacheshim.so, libcacheaudit.so) ahead of what the variable VAR
 * (LD_PRELOAD, LD_AUDIT) holds. The library is looked for relative to the launcher's
 * directory: installed (bindir to libdir), then in the build tree (build_rel). Returns 0 or
 * LAUNCH_SETUP after a message. */
int launch_library(const launch_args *a, const char *self_dir, const char *var, const char *name,
                   const char *build_rel);

/* trace: names the default trace file when none is given, refuses a file that exists, and
 * prints the line saying where the trace goes. Returns 0 or an exit status after a message. */
int launch_trace_output(const launch_args *a, cs_options *opts);

/* ---- launch_exec.c */

/* The directory of the launcher's own executable (/proc/self/exe, links resolved). Returns 0
 * or LAUNCH_SETUP after a message. */
int launch_self_dir(char *dir, size_t len);

/* Runs a->program in this process, PATH searched as a shell does. Returns only on failure:
 * LAUNCH_NOT_FOUND or LAUNCH_CANNOT_EXEC, after a message. */
int launch_exec(const launch_args *a);

/* `cacheshim TOOL ARGS...` (argv[0] is TOOL): runs SELF_DIR/cacheshim-TOOL with ARGS. Returns
 * only on failure, as launch_exec. */
int launch_dispatch(const char *self_dir, char **argv);

#endif
