/* Every generated wrapper compiles (this file links them all) and forwards: the generated
 * ca_wrappers_test.c calls each wrapper of both libraries (driver, shim) with a distinct
 * byte pattern in every argument; a stub in the real function's slot checks that it got
 * exactly those bytes, and the wrapper must return the stub's result. Every call is traced
 * ("all") and formatted as JSON Lines: one complete line per call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ca_format.h"
#include "ca_symbols.h"
#include "cs_options.h"

int ca_test_all_wrappers(int lib, int *called, int *intact);

int main(void)
{
    FILE *f = tmpfile();
    if (!f)
        return 1;
    ca_trace_init_fd(dup(fileno(f)), CS_TRACE_JSONL, "all", NULL);
    int failed = 0;
    for (int lib = CA_LIB_DRIVER; lib <= CA_LIB_SHIM; lib++) {
        int called = 0, intact = 0;
        int ok = ca_test_all_wrappers(lib, &called, &intact);
        printf("%s: %d wrappers, %d forwarded the call, %d the exact arguments, %d the result\n",
               lib == CA_LIB_DRIVER ? "driver" : "shim", CA_GEN_COUNT, called, intact, ok);
        failed |= ok != CA_GEN_COUNT || called != CA_GEN_COUNT || intact != CA_GEN_COUNT;
    }
    ca_trace_exit();
    rewind(f);
    char line[CA_REC_TEXT_MAX + 2];
    int lines = 0, whole = 0;
    while (fgets(line, sizeof line, f)) {
        size_t n = strlen(line);
        lines++;
        whole += n > 2 && line[0] == '{' && line[n - 2] == '}' && line[n - 1] == '\n';
    }
    printf("%d trace lines, %d complete, expected %d\n", lines, whole, 2 * CA_GEN_COUNT);
    failed |= lines != 2 * CA_GEN_COUNT || whole != lines;
    return failed;
}
