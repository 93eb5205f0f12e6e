#include "tool_args.h"

#include <string.h>

const char *cs_tool_opt_value(int argc, char **argv, int *i, const char *opt, bool *missing)
{
    size_t n = strlen(opt);
    if (strncmp(argv[*i], opt, n))
        return NULL;
    if (argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (argv[*i][n])
        return NULL;
    if (*i + 1 >= argc) {
        *missing = true;
        return NULL;
    }
    return argv[++*i];
}
