/* cacheshim-report: the command line. See docs/report.md. */
#include "report.h"
#include "tool_args.h"
#include "trace_finish.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_SLICES 1000

static void usage(FILE *f)
{
    fputs("usage: " REPORT_NAME " [OPTIONS] TRACE\n"
          "Summary tables of a trace: calls by name and by caller, allocation sizes, bytes in\n"
          "use (peak and timeline), failed allocations; optionally an HTML page with a plot.\n"
          "TRACE: JSON Lines of libcacheaudit.so (CACHESHIM_TRACE_FORMAT=jsonl) or an\n"
          "allocation trace (a SIZE PTR NS / f PTR NS / e SIZE ERR NS); plain or gzipped.\n"
          "\n"
          "  --html FILE   also write a self-contained HTML page (tables and an SVG plot)\n"
          "  --slices N    rows of the timeline table, 1 to 1000 (default 10)\n"
          "  --help, --version\n"
          "Exit status: 0 ok, 1 internal failure (out of memory, output not writable),\n"
          "2 bad usage, unreadable file, unsupported format or malformed line.\n",
          f);
}

typedef struct {
    const char *trace, *html;
    size_t slices;
} args;

static int one_trace(args *a, const char *path)
{
    if (a->trace) {
        fprintf(stderr, REPORT_NAME ": one trace at a time: %s and %s (try --help)\n", a->trace,
                path);
        return 2;
    }
    a->trace = path;
    return 0;
}

/* 0 to go on, 2 for a usage error, -1 after --help or --version (exit 0). */
static int parse_args(int argc, char **argv, args *a)
{
    *a = (args){.slices = 10};
    for (int i = 1; i < argc; i++) {
        const char *v, *arg = argv[i];
        bool missing = false;
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            usage(stdout);
            return -1;
        } else if (!strcmp(arg, "--version")) {
            printf(REPORT_NAME " %s\n", REPORT_VERSION);
            return -1;
        } else if (!strcmp(arg, "--")) {
            while (++i < argc)
                if (one_trace(a, argv[i]))
                    return 2;
        } else if ((v = cs_tool_opt_value(argc, argv, &i, "--html", &missing))) {
            if (!*v) {
                fprintf(stderr, REPORT_NAME ": --html: bad value '' (expected a file name)\n");
                return 2;
            }
            a->html = v;
        } else if ((v = cs_tool_opt_value(argc, argv, &i, "--slices", &missing))) {
            char *end;
            errno = 0;
            long n = strtol(v, &end, 10);
            if (errno || end == v || *end || n < 1 || n > MAX_SLICES) {
                fprintf(stderr, REPORT_NAME ": --slices: bad value '%s' (expected a whole number "
                        "from 1 to %d)\n", v, MAX_SLICES);
                return 2;
            }
            a->slices = (size_t)n;
        } else if (missing) {
            fprintf(stderr, REPORT_NAME ": %s needs a value (try --help)\n", arg);
            return 2;
        } else if (arg[0] == '-' && arg[1]) {
            fprintf(stderr, REPORT_NAME ": unknown option %s (try --help)\n", arg);
            return 2;
        } else if (one_trace(a, arg)) {
            return 2;
        }
    }
    if (!a->trace) {
        usage(stderr);
        return 2;
    }
    return 0;
}

int main(int argc, char **argv)
{
    args a;
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc < 0 ? 0 : rc;
    rp_trace t;
    trace_finish(a.trace, REPORT_NAME);
    rc = rp_trace_load(&t, a.trace);
    if (rc)
        return rc;
    /* The page is opened before anything is printed: a path that cannot be written fails
     * the run at once. Never over the trace itself. */
    struct stat st_trace, st_html;
    if (a.html && stat(a.trace, &st_trace) == 0 && stat(a.html, &st_html) == 0 &&
        st_trace.st_dev == st_html.st_dev && st_trace.st_ino == st_html.st_ino) {
        fprintf(stderr, REPORT_NAME ": --html: %s is the trace itself\n", a.html);
        rp_trace_free(&t);
        return 2;
    }
    FILE *html = NULL;
    if (a.html && !(html = fopen(a.html, "w"))) {
        fprintf(stderr, REPORT_NAME ": %s: %s\n", a.html, strerror(errno));
        rp_trace_free(&t);
        return 1;
    }
    rp_summary s;
    rp_tables ts = {0};
    if (rp_summarize(&t, a.slices, RP_PLOT_COLUMNS, &s) == 0) {
        if (rp_sym_sites(&s) == 0 && rp_tables_build(&s, &ts) == 0) {
            if (rp_text_write(stdout, &ts)) {
                fprintf(stderr, REPORT_NAME ": writing the tables: %s\n", strerror(errno));
                rc = 1;
            }
            if (html && rp_html_write(html, &s, &ts)) {
                fprintf(stderr, REPORT_NAME ": %s: %s\n", a.html, strerror(errno));
                rc = 1;
            }
            rp_tables_free(&ts);
        } else {
            rc = -1;
        }
        rp_summary_free(&s);
    } else {
        rc = -1;
    }
    if (rc < 0) {
        fprintf(stderr, REPORT_NAME ": out of memory\n");
        rc = 1;
    }
    if (html && fclose(html) && rc == 0) {
        fprintf(stderr, REPORT_NAME ": %s: %s\n", a.html, strerror(errno));
        rc = 1;
    }
    rp_trace_free(&t);
    return rc;
}
