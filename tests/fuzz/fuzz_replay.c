/* libFuzzer harness: cacheshim-replay's reader of allocation traces (tools/replay_trace.c
 * over tools/trace_input.c): a SIZE PTR NS, f PTR NS, e SIZE ERR NS lines. (Its JSON Lines
 * input is cacheshim-report's reader: fuzz_report.) */
#include "fuzz_quiet.h"
#include "replay.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    FILE *saved;
    fuzz_quiet(&saved);
    replay_trace t = {.path = "fuzz"};
    tr_input in;
    tr_open_mem(&in, data, size, "fuzz", REPLAY_NAME);
    replay_trace_read(&t, &in);
    tr_close(&in);
    replay_trace_free(&t);
    fuzz_loud(saved);
    return 0;
}
