/* Where the launcher lies, and becoming the program or a sibling tool (exec: the same
 * process, so exit status and signals are the program's own). */
#include "launch.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int launch_self_dir(char *dir, size_t len)
{
    ssize_t n = readlink("/proc/self/exe", dir, len);
    if (n < 0) {
        fprintf(stderr, LAUNCH_NAME ": cannot find its own executable: /proc/self/exe: %s\n",
                strerror(errno));
        return LAUNCH_SETUP;
    }
    if ((size_t)n >= len) {
        fprintf(stderr, LAUNCH_NAME ": the path of its own executable is too long\n");
        return LAUNCH_SETUP;
    }
    dir[n] = '\0';
    char *slash = strrchr(dir, '/'); /* the kernel gives an absolute path */
    if (!slash) {
        fprintf(stderr, LAUNCH_NAME ": /proc/self/exe is not an absolute path: %s\n", dir);
        return LAUNCH_SETUP;
    }
    slash[slash == dir ? 1 : 0] = '\0';
    return 0;
}

int launch_exec(const launch_args *a)
{
    const char *prog = a->program[0];
    execvp(prog, a->program);
    int err = errno;
    char shown[CS_VALUE_SHOWN_LEN];
    cs_value_show(prog, shown, sizeof shown);
    if (err == ENOENT && !strchr(prog, '/')) {
        fprintf(stderr, "%s: '%s': not found in PATH\n", a->who, shown);
        return LAUNCH_NOT_FOUND;
    }
    fprintf(stderr, "%s: cannot run '%s': %s\n", a->who, shown, strerror(err));
    return err == ENOENT ? LAUNCH_NOT_FOUND : LAUNCH_CANNOT_EXEC;
}

int launch_dispatch(const char *self_dir, char **argv)
{
    const char *tool = argv[0];
    char path[PATH_MAX];
    int n = snprintf(path, sizeof path, "%s/" LAUNCH_NAME "-%s", self_dir, tool);
    if (n < 0 || (size_t)n >= sizeof path) {
        fprintf(stderr, LAUNCH_NAME ": the path of " LAUNCH_NAME "-%s is too long\n", tool);
        return LAUNCH_SETUP;
    }
    argv[0] = path;
    execv(path, argv);
    int err = errno;
    if (err == ENOENT) {
        fprintf(stderr, LAUNCH_NAME ": '%s' is not available: %s does not exist\n", tool, path);
        return LAUNCH_NOT_FOUND;
    }
    fprintf(stderr, LAUNCH_NAME ": cannot run %s: %s\n", path, strerror(err));
    return LAUNCH_CANNOT_EXEC;
}
