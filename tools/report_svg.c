/* The plot of bytes in use over time, as inline SVG: one step line per library whose calls
 * allocate (the highest value of each pixel column, so no peak falls between pixels), the
 * peak of each marked and labelled, axes with units. Plain SVG, no scripts and no external
 * fonts. Attributes data-* carry the exact numbers and the scales, so a test can check the
 * drawing against the trace (tools/test_report.py). */
#include "report.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

/* The plot area is PW x PH; above it one legend line per library (the top margin grows with
 * them), the axes' labels around it. */
enum { W = RP_PLOT_COLUMNS + 120, ML = 90, MR = 30, MB = 60, PH = 320, LEGEND_LINE = 18 };
enum { PW = W - ML - MR };
#define CHAR_W 6.6 /* about the width of a 12 px sans-serif character, to keep labels apart */

static const char *colour(int lib)
{
    switch (lib) {
    case RP_LIB_SHIM: return "#d62728";
    case RP_LIB_RUNTIME: return "#2ca02c";
    default: return "#1f77b4";
    }
}

/* A 1-2-5 step giving at most about six ticks up to max. */
double rp_nice_step(double max)
{
    if (max <= 0)
        return 1;
    double raw = max / 5, p = pow(10, floor(log10(raw))), m = raw / p;
    return p * (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10);
}

rp_unit rp_bytes_unit(uint64_t max)
{
    static const rp_unit u[] = {{1, "B"}, {1024.0, "KiB"}, {1048576.0, "MiB"},
                             {1073741824.0, "GiB"}, {1099511627776.0, "TiB"}};
    int k = 0;
    while (k < 4 && (double)max >= u[k + 1].div)
        k++;
    return u[k];
}

rp_unit rp_time_unit(uint64_t span)
{
    if (span >= 10000000000u)
        return (rp_unit){1e9, "s"};
    if (span >= 10000000u)
        return (rp_unit){1e6, "ms"};
    if (span >= 10000u)
        return (rp_unit){1e3, "µs"};
    return (rp_unit){1, "ns"};
}

/* Peak labels beside their markers, moved a line further (step) while one would overlap a
 * label already placed. */
typedef struct {
    double x0, x1, y;
} label_box;

static double place_label(label_box *placed, int n, double x0, double x1, double y, double step)
{
    for (bool moved = true; moved;) {
        moved = false;
        for (int i = 0; i < n; i++)
            if (x0 < placed[i].x1 && placed[i].x0 < x1 && y > placed[i].y - 14 &&
                y < placed[i].y + 14) {
                y += step;
                moved = true;
            }
    }
    placed[n] = (label_box){x0, x1, y};
    return y;
}

void rp_svg_write(FILE *f, const rp_summary *s)
{
    uint64_t top = 0, span = s->t_last - s->t_first;
    int nseries = 0;
    for (int l = 0; l < RP_NLIB; l++) {
        if (!s->series[l].present)
            continue;
        nseries++;
        if (s->series[l].peak > top)
            top = s->series[l].peak;
    }
    const int MT = 14 + LEGEND_LINE * (nseries ? nseries : 1), H = MT + PH + MB;
    rp_unit yu = rp_bytes_unit(top), xu = rp_time_unit(span);
    double ystep = rp_nice_step((double)top / yu.div);
    if (yu.div == 1 && ystep < 1)
        ystep = 1;
    double ymax = ceil((double)top / yu.div / ystep) * ystep; /* axis top, in yu */
    if (ymax <= 0)
        ymax = ystep;
    double xmax = (double)span / xu.div, xstep = rp_nice_step(xmax > 0 ? xmax : 1);
    double ytop_bytes = ymax * yu.div;
    char t0[32];
    rp_fmt_seconds(s->t_first, t0, sizeof t0);

    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"plot\" width=\"%d\" "
               "height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\" "
               "data-t-first-ns=\"%" PRIu64 "\" data-t-last-ns=\"%" PRIu64 "\" "
               "data-y-max-bytes=\"%.0f\" data-left=\"%d\" data-top=\"%d\" data-width=\"%d\" "
               "data-height=\"%d\">\n",
            W, H, W, H, s->t_first, s->t_last, ytop_bytes, ML, MT, PW, PH);
    fprintf(f, "<title>Bytes in use over time</title>\n"
               "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n",
            W, H);

    /* Grid and axes. */
    fprintf(f, "<g class=\"y-axis\" font-size=\"12\" text-anchor=\"end\">\n");
    for (int i = 0; i * ystep <= ymax * (1 + 1e-9); i++) {
        double y = MT + PH - i * ystep / ymax * PH;
        fprintf(f, "<line x1=\"%d\" y1=\"%.2f\" x2=\"%d\" y2=\"%.2f\" stroke=\"#dddddd\"/>"
                   "<text x=\"%d\" y=\"%.2f\" class=\"tick\">%g</text>\n",
                ML, y, ML + PW, y, ML - 6, y + 4, i * ystep);
    }
    fprintf(f, "<text class=\"axis-title\" transform=\"translate(20 %d) rotate(-90)\" "
               "text-anchor=\"middle\" font-size=\"13\">bytes in use (%s)</text>\n</g>\n",
            MT + PH / 2, yu.name);
    fprintf(f, "<g class=\"x-axis\" font-size=\"12\" text-anchor=\"middle\">\n");
    for (int i = 0; i * xstep <= xmax * (1 + 1e-9) || i == 0; i++) {
        double x = ML + (xmax > 0 ? i * xstep / xmax * PW : 0);
        fprintf(f, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"#666666\"/>"
                   "<text x=\"%.2f\" y=\"%d\" class=\"tick\">%g</text>\n",
                x, MT + PH, x, MT + PH + 5, x, MT + PH + 19, i * xstep);
    }
    fprintf(f, "<text class=\"axis-title\" x=\"%d\" y=\"%d\" font-size=\"13\">time (%s) "
               "after the first event, at %s s</text>\n</g>\n",
            ML + PW / 2, H - 14, xu.name, t0);
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
               "stroke=\"#666666\"/>\n", ML, MT, PW, PH);

    /* One step line per library with its legend line above the plot, then the peaks on top. */
    int shown = 0;
    for (int l = 0; l < RP_NLIB; l++) {
        const rp_series *r = &s->series[l];
        if (!r->present)
            continue;
        double colw = (double)PW / (double)s->ncols;
        fprintf(f, "<path class=\"series\" data-lib=\"%s\" data-peak-bytes=\"%" PRIu64 "\" "
                   "data-peak-ns=\"%" PRIu64 "\" fill=\"none\" stroke=\"%s\" "
                   "stroke-width=\"1.5\" d=\"",
                rp_lib_name(l), r->peak, r->peak_t, colour(l));
        for (size_t c = 0; c < s->ncols; c++) {
            double y = MT + PH - (double)r->col_max[c] / ytop_bytes * PH;
            double x1 = ML + (double)(c + 1) * colw;
            if (c == 0)
                fprintf(f, "M%d %.2f H%.2f", ML, y, x1);
            else
                fprintf(f, " V%.2f H%.2f", y, x1);
        }
        fprintf(f, "\"/>\n");
        int ly = 14 + LEGEND_LINE * shown;
        fprintf(f, "<g class=\"legend\" font-size=\"12\"><line x1=\"%d\" y1=\"%d\" x2=\"%d\" "
                   "y2=\"%d\" stroke=\"%s\" stroke-width=\"3\"/><text x=\"%d\" y=\"%d\">%s: "
                   "%s</text></g>\n",
                ML, ly, ML + 22, ly, colour(l), ML + 28, ly + 4, rp_lib_name(l),
                rp_series_meaning(l));
        shown++;
    }
    label_box placed[RP_NLIB];
    int nplaced = 0;
    for (int l = 0; l < RP_NLIB; l++) {
        const rp_series *r = &s->series[l];
        if (!r->present || !r->peak)
            continue;
        double x = ML + (span ? (double)(r->peak_t - s->t_first) / (double)span * PW : 0);
        double y = MT + PH - (double)r->peak / ytop_bytes * PH;
        char b[32], at[32], text[96];
        rp_fmt_bytes(r->peak, b, sizeof b);
        rp_fmt_seconds(r->peak_t, at, sizeof at);
        snprintf(text, sizeof text, "%s peak %s at %s s", rp_lib_name(l), b, at);
        double w = CHAR_W * (double)strlen(text);
        bool left = x > ML + PW * 0.6; /* the label on the side with room */
        double x0 = left ? x - 8 - w : x + 8, x1 = left ? x - 8 : x + 8 + w;
        bool below = y - 6 < MT + 14; /* near the top: under the marker, away from the legend */
        double ly = place_label(placed, nplaced++, x0, x1, below ? y + 16 : y - 6,
                                below ? 14 : -14);
        fprintf(f, "<circle class=\"peak\" data-lib=\"%s\" data-peak-bytes=\"%" PRIu64 "\" "
                   "cx=\"%.2f\" cy=\"%.2f\" r=\"4\" fill=\"%s\" stroke=\"#000000\"/>"
                   "<text class=\"peak-label\" x=\"%.2f\" y=\"%.2f\" font-size=\"12\" "
                   "text-anchor=\"%s\" stroke=\"#ffffff\" stroke-width=\"3\" "
                   "paint-order=\"stroke\">%s</text>\n",
                rp_lib_name(l), r->peak, x, y, colour(l), left ? x1 : x0, ly,
                left ? "end" : "start", text);
    }
    if (!shown)
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"14\">no "
                   "allocations or frees in the trace</text>\n", ML + PW / 2, MT + PH / 2);
    fprintf(f, "</svg>\n");
}
