/* The tools' side of ca_recover.h: which trace, and the one line that says what was done. */
#include "trace_finish.h"

#include <stdio.h>
#include <string.h>

#include "ca_recover.h"

int trace_finish(const char *path, const char *tool)
{
    char msg[9000];
    if (strcmp(path, "-") == 0)
        return 0;
    int rc = ca_recover(path, msg, sizeof msg);
    if (rc != CA_RECOVER_NONE)
        fprintf(stderr, "%s: %s\n", tool, msg);
    return rc == CA_RECOVER_ERROR;
}
