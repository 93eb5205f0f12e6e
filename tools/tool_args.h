/* Command-line helpers shared by cacheshim-replay and cacheshim-report. */
#ifndef CS_TOOL_ARGS_H
#define CS_TOOL_ARGS_H

#include <stdbool.h>

/* --opt VALUE or --opt=VALUE: the value, advancing *i past a separate VALUE; NULL if argv[*i]
 * is not opt, or (setting *missing) if it is opt with no VALUE after it. */
const char *cs_tool_opt_value(int argc, char **argv, int *i, const char *opt, bool *missing);

#endif
