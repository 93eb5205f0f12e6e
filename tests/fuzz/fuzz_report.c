/* libFuzzer harness: cacheshim-report's reader of traces (JSON Lines of libcacheaudit.so or
 * the allocation format, tools/report_read.c, report_json.c, trace_input.c), then everything
 * the report computes and writes from what it read: the summary, the tables, the text and
 * the HTML page with its plot and memory timeline (to a memory stream). Call sites are not
 * symbolized here: that opens the files the trace names. */
#include "fuzz_quiet.h"
#include "report.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    FILE *saved, *null_out = fuzz_quiet(&saved);
    rp_trace t;
    if (rp_trace_load_mem(&t, "fuzz", data, size) == 0) {
        rp_summary s;
        if (rp_summarize(&t, 7, RP_PLOT_COLUMNS, &s) == 0) {
            rp_tables ts;
            if (rp_tables_build(&s, &ts) == 0) {
                rp_text_write(null_out, &ts);
                rp_html_write(null_out, &s, &ts);
                rp_tables_free(&ts);
            }
            rp_summary_free(&s);
        }
        rp_trace_free(&t);
    }
    fuzz_loud(saved);
    return 0;
}
