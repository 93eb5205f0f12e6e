/* Messages to the user: one line each, "cacheshim: " first, written with one write() so lines
 * from several threads or processes never interleave. */
#include "cs_shim.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

void cs_log(const char *fmt, ...)
{
    char line[1024];
    int n = snprintf(line, sizeof line, "cacheshim: ");
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        return;
    size_t len = (size_t)n + ((size_t)m < sizeof line - (size_t)n - 1 ? (size_t)m
                                                                       : sizeof line - (size_t)n - 2);
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;  /* nowhere better to report a failed write to stderr */
}
