/* A sweep as a scatter plot in plain SVG: x = peak reserved memory, y = driver calls, one
 * labelled point per cap/threshold setting, one colour per trace. Self-contained (no scripts,
 * no external fonts or styles), so it opens in any browser and can be checked by an XML
 * parser: every point is a <circle class="point"> with data-series/data-label attributes and
 * a <text class="label"> next to it. */
#include "replay.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { W = 860, H = 580, ML = 90, MR = 200, MT = 50, MB = 70 };

static const char *const colours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                      "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};

static void put_escaped(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default:
            if ((unsigned char)*s >= 0x20)
                fputc(*s, f);
        }
    }
}

/* A 1-2-5 step giving about five ticks up to max. */
static double nice_step(double max)
{
    if (max <= 0)
        return 1;
    double raw = max / 5, p = pow(10, floor(log10(raw))), m = raw / p;
    return p * (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10);
}

static int series_index(const replay_point *pts, size_t i)
{
    int k = 0;
    for (size_t j = 0; j < i; j++) {
        bool seen = false;
        for (size_t q = 0; q < j; q++)
            seen |= !strcmp(pts[q].series, pts[j].series);
        if (!seen) {
            if (!strcmp(pts[j].series, pts[i].series))
                return k;
            k++;
        }
    }
    return k;
}

int replay_plot_svg(const char *path, const char *title, const replay_point *pts, size_t n)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    double xmax = 0, ymax = 0;
    for (size_t i = 0; i < n; i++) {
        xmax = fmax(xmax, pts[i].x);
        ymax = fmax(ymax, pts[i].y);
    }
    /* Bytes in MiB or GiB, whichever reads better. */
    double unit = xmax >= 4.0 * (1 << 30) ? (double)(1 << 30) : (double)(1 << 20);
    const char *uname = unit > (1 << 20) ? "GiB" : "MiB";
    double xs = nice_step(xmax / unit * 1.05), ys = nice_step(ymax * 1.05);
    double xtop = ceil(xmax / unit * 1.05 / xs) * xs, ytop = ceil(ymax * 1.05 / ys) * ys;
    if (xtop <= 0)
        xtop = xs;
    if (ytop <= 0)
        ytop = ys;
    const double pw = W - ML - MR, ph = H - MT - MB;
#define PX(v) (ML + (v) / unit / xtop * pw)
#define PY(v) (MT + ph - (v) / ytop * ph)

    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n",
            W, H, W, H);
    fprintf(f, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, H);
    fputs("<text class=\"title\" x=\"430\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">", f);
    put_escaped(f, title);
    fputs("</text>\n", f);

    /* Grid, ticks and axes. */
    fputs("<g class=\"axes\" stroke=\"#ccc\">\n", f);
    for (double v = 0; v <= xtop + xs / 2; v += xs)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>"
                   "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" stroke=\"none\">%g</text>\n",
                ML + v / xtop * pw, MT, ML + v / xtop * pw, H - MB, ML + v / xtop * pw,
                H - MB + 18, v);
    for (double v = 0; v <= ytop + ys / 2; v += ys)
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>"
                   "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" stroke=\"none\">%g</text>\n",
                ML, MT + ph - v / ytop * ph, W - MR, MT + ph - v / ytop * ph, ML - 6,
                MT + ph - v / ytop * ph + 4, v);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", ML, H - MB,
            W - MR, H - MB);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", ML, MT, ML,
            H - MB);
    fputs("</g>\n", f);
    fprintf(f, "<text class=\"xtitle\" x=\"%.0f\" y=\"%d\" text-anchor=\"middle\">"
               "peak reserved (%s)</text>\n",
            ML + pw / 2, H - 22, uname);
    fprintf(f, "<text class=\"ytitle\" x=\"20\" y=\"%.0f\" text-anchor=\"middle\" "
               "transform=\"rotate(-90 20 %.0f)\">driver calls (allocs + frees)</text>\n",
            MT + ph / 2, MT + ph / 2);

    /* Points with their labels, then the legend. */
    fputs("<g class=\"points\">\n", f);
    int nseries = 0;
    /* Settings that end in (nearly) the same place would print their labels on top of each
     * other: each label moves down a line until it clears every label already placed. */
    double *lx = calloc(n ? n : 1, sizeof *lx), *ly = calloc(n ? n : 1, sizeof *ly);
    if (!lx || !ly) {
        free(lx);
        free(ly);
        fclose(f);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        int s = series_index(pts, i);
        nseries = s + 1 > nseries ? s + 1 : nseries;
        const char *col = colours[s % (int)(sizeof colours / sizeof colours[0])];
        fprintf(f, "<circle class=\"point\" cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\" "
                   "data-series=\"",
                PX(pts[i].x), PY(pts[i].y), col);
        put_escaped(f, pts[i].series);
        fputs("\" data-label=\"", f);
        put_escaped(f, pts[i].label);
        fprintf(f, "\" data-x=\"%.0f\" data-y=\"%.0f\"><title>", pts[i].x, pts[i].y);
        put_escaped(f, pts[i].series);
        fputs(": ", f);
        put_escaped(f, pts[i].label);
        fputs("</title></circle>\n", f);
        lx[i] = PX(pts[i].x) + 6;
        ly[i] = PY(pts[i].y) - 6;
        for (size_t j = 0; j < i; j++)
            if (fabs(lx[j] - lx[i]) < 110 && fabs(ly[j] - ly[i]) < 11) {
                ly[i] = ly[j] + 11;
                j = (size_t)-1; /* look again from the first */
            }
        fprintf(f, "<text class=\"label\" x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"%s\">",
                lx[i], ly[i], col);
        put_escaped(f, pts[i].label);
        fputs("</text>\n", f);
    }
    free(lx);
    free(ly);
    fputs("</g>\n<g class=\"legend\">\n", f);
    for (int s = 0, y = MT + 10; s < nseries; s++, y += 18) {
        size_t i = 0;
        while (series_index(pts, i) != s)
            i++;
        fprintf(f, "<circle cx=\"%d\" cy=\"%d\" r=\"5\" fill=\"%s\"/><text x=\"%d\" y=\"%d\">",
                W - MR + 20, y, colours[s % (int)(sizeof colours / sizeof colours[0])],
                W - MR + 30, y + 4);
        put_escaped(f, pts[i].series);
        fputs("</text>\n", f);
    }
    fputs("</g>\n</svg>\n", f);
#undef PX
#undef PY
    bool bad = ferror(f) != 0;
    return fclose(f) == 0 && !bad ? 0 : -1;
}
