/* The readers' messages on stderr would flood the fuzzer's log: while a harness runs, stderr
 * is /dev/null. */
#ifndef FUZZ_QUIET_H
#define FUZZ_QUIET_H

#include <stdio.h>
#include <stdlib.h>

/* /dev/null, opened once; stderr points at it until fuzz_loud. */
static inline FILE *fuzz_quiet(FILE **saved)
{
    static FILE *null_out;
    if (!null_out && !(null_out = fopen("/dev/null", "w")))
        abort();
    *saved = stderr;
    stderr = null_out;
    return null_out;
}

static inline void fuzz_loud(FILE *saved) { stderr = saved; }

#endif
