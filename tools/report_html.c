/* The report as one self-contained HTML page: inline style, the plot as inline SVG, the same
 * tables as the text output. No scripts, no external resources. Every string from the trace
 * (file name, call names, result names) is escaped, and bytes that are not UTF-8 become
 * U+FFFD, so the page is well-formed whatever the trace holds. */
#include "report.h"

#include <string.h>

#include "cs_options.h"

void rp_put_escaped(FILE *f, const char *text)
{
    const unsigned char *s = (const unsigned char *)text;
    while (*s) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&#39;", f); break;
        default:
            if (*s < 0x80) {
                if (*s < 0x20 || *s == 0x7f)
                    fputs("&#xFFFD;", f);
                else
                    fputc(*s, f);
            } else {
                int n = cs_utf8_len(s);
                if (!n) {
                    fputs("&#xFFFD;", f);
                    n = 1;
                } else {
                    fwrite(s, 1, (size_t)n, f);
                }
                s += n;
                continue;
            }
        }
        s++;
    }
}

static const char style[] =
    "body { font-family: sans-serif; margin: 24px 32px; color: #222222; background: #ffffff; }\n"
    "h1 { font-size: 20px; margin-bottom: 4px; }\n"
    "h2 { font-size: 16px; margin: 28px 0 6px 0; }\n"
    "p.note { font-size: 13px; color: #555555; max-width: 62em; margin: 0 0 8px 0; }\n"
    "p.sub { font-size: 13px; color: #555555; margin-top: 0; }\n"
    "table { border-collapse: collapse; font-size: 13px; }\n"
    "th, td { padding: 3px 10px; border-bottom: 1px solid #dddddd; text-align: left; "
    "white-space: nowrap; }\n"
    "th { background: #f3f3f3; }\n"
    ".num { text-align: right; font-variant-numeric: tabular-nums; }\n"
    "svg.plot { border: 1px solid #dddddd; font-family: sans-serif; }\n";

static void put_table(FILE *f, const rp_table *t)
{
    bool head = false;
    for (int c = 0; c < t->ncols; c++)
        head |= t->head[c][0] != '\0';
    fprintf(f, "<section id=\"%s\">\n<h2>", t->id);
    rp_put_escaped(f, t->title);
    fputs("</h2>\n", f);
    if (t->note) {
        fputs("<p class=\"note\">", f);
        rp_put_escaped(f, t->note);
        fputs("</p>\n", f);
    }
    if (t->nrows) {
        fprintf(f, "<table class=\"report\" data-table=\"%s\">\n", t->id);
        if (head) {
            fputs("<thead><tr>", f);
            for (int c = 0; c < t->ncols; c++) {
                fputs(t->right >> c & 1 ? "<th class=\"num\">" : "<th>", f);
                rp_put_escaped(f, t->head[c]);
                fputs("</th>", f);
            }
            fputs("</tr></thead>\n", f);
        }
        fputs("<tbody>\n", f);
        for (size_t r = 0; r < t->nrows; r++) {
            fputs("<tr>", f);
            for (int c = 0; c < t->ncols; c++) {
                fputs(t->right >> c & 1 ? "<td class=\"num\">" : "<td>", f);
                rp_put_escaped(f, t->cell[r * (size_t)t->ncols + (size_t)c]);
                fputs("</td>", f);
            }
            fputs("</tr>\n", f);
        }
        fputs("</tbody>\n</table>\n", f);
    }
    fputs("</section>\n", f);
}

int rp_html_write(FILE *f, const rp_summary *s, const rp_tables *ts)
{
    fputs("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
          "<meta name=\"generator\" content=\"" REPORT_NAME " " REPORT_VERSION "\">\n"
          "<title>cacheshim report: ", f);
    rp_put_escaped(f, s->trace->path);
    fprintf(f, "</title>\n<style>\n%s</style>\n</head>\n<body>\n<h1>cacheshim report</h1>\n"
               "<p class=\"sub\">", style);
    rp_put_escaped(f, s->trace->path);
    fputs(" &#8212; " REPORT_NAME " " REPORT_VERSION "</p>\n", f);
    /* The trace's own table first, then the plot, then the rest. */
    for (size_t i = 0; i < ts->n; i++) {
        put_table(f, &ts->t[i]);
        if (i == 0) {
            fputs("<section id=\"plot\">\n<h2>Bytes in use over time</h2>\n", f);
            rp_svg_write(f, s);
            fputs("</section>\n<section id=\"memory-timeline\">\n<h2>Memory timeline</h2>\n",
                  f);
            if (rp_timeline_write(f, s))
                return -1;
            fputs("</section>\n", f);
        }
    }
    fputs("</body>\n</html>\n", f);
    return fflush(f) == 0 && !ferror(f) ? 0 : -1;
}
