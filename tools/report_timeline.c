/* The memory timeline, as inline SVG, drawn like PyTorch's memory snapshot viewer: each
 * allocation of the program's library a band from its allocation to its free, stacked in
 * allocation order (a free lets the bands above it down), coloured by allocation; all its
 * bytes in use as a grey area behind them (what the bands leave uncovered is the allocations
 * not drawn one by one); the driver's reserved bytes as a dashed line beside. Only the
 * RP_MAX_BANDS largest allocations (by bytes times lifetime, the area they cover) get a band
 * of their own, so a trace of a million allocations gives a page of about the same size: the
 * grey area, taken per pixel column, holds the rest. Plain SVG, no scripts; each band's
 * <title> is its tooltip. */
#include "report.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { W = RP_PLOT_COLUMNS + 120, ML = 90, MR = 30, MB = 60, PH = 360, LEGEND_LINE = 18 };
enum { PW = W - ML - MR, MT = 14 + 3 * LEGEND_LINE };

static const char *const palette[] = {
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22",
    "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2",
    "#dbdb8d", "#9edae5", "#393b79", "#637939",
};

typedef struct {
    double x;
    uint64_t off;   /* bytes below the band from x on */
} vertex;

typedef struct {
    vertex *v;
    size_t n, cap;
    double x_end;
} shape;

typedef struct {
    uint64_t t;
    uint32_t band;
    bool start;
} change;

static const rp_band *g_bands; /* for the comparator */
static uint64_t g_t_last;

/* Bytes times nanoseconds: how much of the picture a band covers. */
static double area(const rp_band *b)
{
    uint64_t end = b->end == UINT64_MAX ? g_t_last : b->end;
    return (double)b->size * (double)(end > b->start ? end - b->start : 0);
}

static int by_area(const void *a, const void *b)
{
    const rp_band *x = &g_bands[*(const uint32_t *)a], *y = &g_bands[*(const uint32_t *)b];
    double ax = area(x), ay = area(y);
    if (ax != ay)
        return ax > ay ? -1 : 1;
    return *(const uint32_t *)a < *(const uint32_t *)b ? -1 : 1;
}

static int by_time(const void *a, const void *b)
{
    const change *x = a, *y = b;
    if (x->t != y->t)
        return x->t < y->t ? -1 : 1;
    if (x->start != y->start) /* frees first: their memory is gone when the next comes */
        return x->start ? 1 : -1;
    return x->band < y->band ? -1 : x->band > y->band;
}

static bool add_vertex(shape *s, double x, uint64_t off)
{
    if (s->n && x - s->v[s->n - 1].x < 0.5) { /* the same pixel: the later offset */
        s->v[s->n - 1].off = off;
        return true;
    }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 4;
        vertex *v = realloc(s->v, cap * sizeof *v);
        if (!v)
            return false;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (vertex){x, off};
    return true;
}

typedef struct {
    uint64_t t0, span;
    double ytop; /* bytes at the top of the plot */
} scale;

static double xof(const scale *c, uint64_t t)
{
    return ML + (c->span ? (double)(t - c->t0) / (double)c->span * PW : 0);
}

static double yof(const scale *c, uint64_t bytes)
{
    return MT + PH - (double)bytes / c->ytop * PH;
}

/* The bands' shapes: the chosen allocations stacked in allocation order. */
static int layout(const rp_summary *s, const scale *c, const uint32_t *chosen, size_t n,
                  shape *shapes)
{
    change *ch = malloc(2 * n * sizeof *ch);
    uint32_t *stack = malloc(n * sizeof *stack);
    uint64_t *off = malloc(n * sizeof *off);
    int rc = ch && stack && off ? 0 : -1;
    size_t nch = 0, depth = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const rp_band *b = &s->bands[chosen[i]];
        if (b->end == b->start) /* freed as it came: nothing to draw */
            continue;
        ch[nch++] = (change){b->start, (uint32_t)i, true};
        if (b->end != UINT64_MAX)
            ch[nch++] = (change){b->end, (uint32_t)i, false};
        shapes[i].x_end = xof(c, b->end == UINT64_MAX ? s->t_last : b->end);
    }
    if (!rc)
        qsort(ch, nch, sizeof *ch, by_time);
    uint64_t top = 0;
    for (size_t k = 0; k < nch && !rc; k++) {
        uint32_t i = ch[k].band;
        uint64_t size = s->bands[chosen[i]].size;
        double x = xof(c, ch[k].t);
        if (ch[k].start) {
            off[i] = top;
            top += size;
            stack[depth++] = i;
            rc = add_vertex(&shapes[i], x, off[i]) ? 0 : -1;
            continue;
        }
        size_t at = 0;
        while (at < depth && stack[at] != i)
            at++;
        if (at == depth) /* not started: its free came first (fuzz_report found this) */
            continue;
        for (size_t j = at + 1; j < depth && !rc; j++) {
            off[stack[j]] -= size;
            rc = add_vertex(&shapes[stack[j]], x, off[stack[j]]) ? 0 : -1;
            stack[j - 1] = stack[j];
        }
        depth--;
        top -= size;
    }
    free(ch);
    free(stack);
    free(off);
    return rc;
}

static void band_path(FILE *f, const scale *c, const shape *sh, uint64_t size)
{
    if (!sh->n)
        return;
    const vertex *v = sh->v;
    size_t k = sh->n - 1;
    fprintf(f, "M%.1f %.1f", v[0].x, yof(c, v[0].off + size));
    for (size_t j = 1; j <= k; j++)
        fprintf(f, "H%.1fV%.1f", v[j].x, yof(c, v[j].off + size));
    fprintf(f, "H%.1fV%.1f", sh->x_end > v[k].x ? sh->x_end : v[k].x + 0.5, yof(c, v[k].off));
    for (size_t j = k; j >= 1; j--)
        fprintf(f, "H%.1fV%.1f", v[j].x, yof(c, v[j - 1].off));
    fprintf(f, "H%.1fZ", v[0].x);
}

/* A step line over the plot columns: the highest value of each. */
static void column_path(FILE *f, const rp_summary *s, const scale *c, const uint64_t *col,
                        bool area)
{
    double w = (double)PW / (double)s->ncols;
    if (area)
        fprintf(f, "M%d %d", ML, MT + PH);
    for (size_t i = 0; i < s->ncols; i++)
        fprintf(f, "%s%.1f H%.1f", i || area ? " V" : "M90 ", yof(c, col[i]),
                ML + (double)(i + 1) * w);
    if (area)
        fprintf(f, " V%d Z", MT + PH);
}

static const char *prog_meaning(int lib)
{
    switch (lib) {
    case RP_LIB_SHIM: return "what the program asked of the cache";
    case RP_LIB_RUNTIME: return "what the program asked of cudart";
    case RP_LIB_TRACE: return "the a lines of the allocation trace";
    default: return "what the process got from the driver";
    }
}

/* The program's scope entries (cacheshim.h) as shaded intervals behind the bands, from the end
 * of the begin call to the start of the end call (the end of the trace when still open):
 * nested ones shade deeper. At most RP_MAX_BANDS, the first ones. */
static void scope_marks(FILE *f, const rp_summary *s, const scale *c)
{
    if (s->nscope_entries == 0)
        return;
    fputs("<g class=\"scopes\" fill=\"#ff7f0e\" fill-opacity=\"0.12\">\n", f);
    for (size_t i = 0; i < s->nscope_entries && i < RP_MAX_BANDS; i++) {
        const rp_scope_entry *x = &s->scope_entries[i];
        uint64_t end = x->end != UINT64_MAX ? x->end : s->t_last;
        double x0 = xof(c, x->start), x1 = xof(c, end > x->start ? end : x->start);
        char t0[32], t1[32] = "still open", bytes[32];
        rp_fmt_seconds(x->start, t0, sizeof t0);
        if (x->end != UINT64_MAX)
            rp_fmt_seconds(x->end, t1, sizeof t1);
        rp_fmt_bytes(x->bytes, bytes, sizeof bytes);
        const char *name = rp_str(s->trace, x->name);
        fputs("<rect class=\"scope\" data-scope=\"", f);
        rp_put_escaped(f, name);
        fprintf(f, "\" x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\"><title>scope ", x0,
                MT, x1 - x0 > 0.5 ? x1 - x0 : 0.5, PH);
        rp_put_escaped(f, name);
        fprintf(f, " (thread %" PRId64 "), %s s to %s%s: %" PRIu64 " allocations, %s</title>"
                   "</rect>\n", x->tid, t0, t1, x->end != UINT64_MAX ? " s" : "", x->allocs,
                bytes);
    }
    fputs("</g>\n", f);
}

int rp_timeline_write(FILE *f, const rp_summary *s)
{
    const rp_series *prog = &s->series[s->prog_lib];
    const rp_series *res = s->reserved_lib >= 0 ? &s->series[s->reserved_lib] : NULL;
    uint64_t top = res && res->peak > prog->peak ? res->peak : prog->peak;
    scale c = {s->t_first, s->t_last - s->t_first, 0};
    rp_unit yu = rp_bytes_unit(top), xu = rp_time_unit(c.span);
    double ystep = rp_nice_step((double)top / yu.div);
    if (yu.div == 1 && ystep < 1)
        ystep = 1;
    double ymax = ceil((double)top / yu.div / ystep) * ystep;
    if (ymax <= 0)
        ymax = ystep;
    c.ytop = ymax * yu.div;

    size_t n = s->nbands < RP_MAX_BANDS ? s->nbands : RP_MAX_BANDS;
    uint32_t *order = malloc((s->nbands ? s->nbands : 1) * sizeof *order);
    shape *shapes = calloc(n ? n : 1, sizeof *shapes);
    int rc = order && shapes ? 0 : -1;
    if (!rc) {
        for (size_t i = 0; i < s->nbands; i++)
            order[i] = (uint32_t)i;
        g_bands = s->bands;
        g_t_last = s->t_last;
        qsort(order, s->nbands, sizeof *order, by_area); /* the largest get bands */
        rc = layout(s, &c, order, n, shapes);
    }
    if (rc) {
        free(order);
        free(shapes);
        return -1;
    }
    const int H = MT + PH + MB;
    fprintf(f, "<p class=\"note\">Each of the %zu largest (bytes &#215; lifetime) of the %zu "
               "allocations through %s (%s) is a band from its allocation to its free, "
               "stacked in allocation order: a free lets the bands above it down. Grey: all "
               "of %s's bytes in use (the highest of each pixel column); what the bands "
               "leave of it is the smaller allocations."
               "%s%s Hover a band for its size and times.</p>\n",
            n, s->nbands, rp_lib_name(s->prog_lib), prog_meaning(s->prog_lib),
            rp_lib_name(s->prog_lib),
            res ? " Dashed: the driver's reserved bytes, what the process held on the device."
                : "",
            s->nscope_entries ? " Shaded: the program's scopes (cacheshim.h), each entry from its "
                                "begin to its end; nested ones deeper." : "");
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"plot timeline\" width=\"%d\" "
               "height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\" data-bands=\"%zu\" "
               "data-allocations=\"%zu\" data-y-max-bytes=\"%.0f\">\n"
               "<title>Memory timeline</title>\n"
               "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n",
            W, H, W, H, n, s->nbands, c.ytop, W, H);
    fprintf(f, "<g font-size=\"12\" text-anchor=\"end\">\n");
    for (int i = 0; i * ystep <= ymax * (1 + 1e-9); i++) {
        double y = MT + PH - i * ystep / ymax * PH;
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#eeeeee\"/>"
                   "<text x=\"%d\" y=\"%.1f\">%g</text>\n", ML, y, ML + PW, y, ML - 6, y + 4,
                i * ystep);
    }
    fprintf(f, "<text transform=\"translate(20 %d) rotate(-90)\" text-anchor=\"middle\" "
               "font-size=\"13\">bytes (%s)</text>\n</g>\n", MT + PH / 2, yu.name);
    double xmax = (double)c.span / xu.div, xstep = rp_nice_step(xmax > 0 ? xmax : 1);
    fprintf(f, "<g font-size=\"12\" text-anchor=\"middle\">\n");
    for (int i = 0; i * xstep <= xmax * (1 + 1e-9) || i == 0; i++) {
        double x = ML + (xmax > 0 ? i * xstep / xmax * PW : 0);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#666666\"/>"
                   "<text x=\"%.1f\" y=\"%d\">%g</text>\n", x, MT + PH, x, MT + PH + 5, x,
                MT + PH + 19, i * xstep);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"13\">time (%s) after the first event</text>"
               "\n</g>\n", ML + PW / 2, H - 14, xu.name);

    scope_marks(f, s, &c);
    fprintf(f, "<path class=\"live-area\" data-lib=\"%s\" fill=\"#d0d0d0\" stroke=\"none\" d=\"",
            rp_lib_name(s->prog_lib));
    column_path(f, s, &c, prog->col_max, true);
    fputs("\"/>\n<g class=\"bands\" stroke=\"#ffffff\" stroke-width=\"0.3\">\n", f);
    for (size_t i = 0; i < n; i++) {
        const rp_band *b = &s->bands[order[i]];
        char size[32], t0[32], t1[32] = "not freed";
        rp_fmt_bytes(b->size, size, sizeof size);
        rp_fmt_seconds(b->start, t0, sizeof t0);
        if (b->end != UINT64_MAX)
            rp_fmt_seconds(b->end, t1, sizeof t1);
        fprintf(f, "<path class=\"band\" data-bytes=\"%" PRIu64 "\" fill=\"%s\" d=\"", b->size,
                palette[order[i] % (sizeof palette / sizeof palette[0])]);
        band_path(f, &c, &shapes[i], b->size);
        fprintf(f, "\"><title>%s, allocated at %s s, %s%s%s</title></path>\n", size, t0,
                b->end != UINT64_MAX ? "freed at " : "", t1, b->end != UINT64_MAX ? " s" : "");
        free(shapes[i].v);
    }
    fputs("</g>\n", f);
    if (res) {
        fprintf(f, "<path class=\"reserved\" data-lib=\"%s\" data-peak-bytes=\"%" PRIu64 "\" "
                   "fill=\"none\" stroke=\"#000000\" stroke-width=\"1.5\" "
                   "stroke-dasharray=\"5 3\" d=\"", rp_lib_name(s->reserved_lib), res->peak);
        column_path(f, s, &c, res->col_max, false);
        fputs("\"/>\n", f);
    }
    if (prog->peak) {
        double x = xof(&c, prog->peak_t);
        char b[32];
        rp_fmt_bytes(prog->peak, b, sizeof b);
        fprintf(f, "<line class=\"peak\" x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" "
                   "stroke=\"#d62728\" stroke-dasharray=\"2 2\"/>\n", x, MT, x, MT + PH);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" font-size=\"12\" text-anchor=\"%s\" fill=\"#d62728\">"
                   "peak %s</text>\n", x > ML + PW * 0.6 ? x - 4 : x + 4, MT + 12,
                x > ML + PW * 0.6 ? "end" : "start", b);
    }
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
               "stroke=\"#666666\"/>\n", ML, MT, PW, PH);
    fprintf(f, "<g font-size=\"12\"><rect x=\"%d\" y=\"8\" width=\"22\" height=\"10\" "
               "fill=\"#1f77b4\"/><text x=\"%d\" y=\"17\">%s: one band per allocation (the %zu "
               "largest)</text>\n", ML, ML + 28, rp_lib_name(s->prog_lib), n);
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"22\" height=\"10\" fill=\"#d0d0d0\"/><text "
               "x=\"%d\" y=\"%d\">%s: all bytes in use</text>\n", ML, 8 + LEGEND_LINE, ML + 28,
            17 + LEGEND_LINE, rp_lib_name(s->prog_lib));
    if (res)
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#000000\" "
                   "stroke-width=\"1.5\" stroke-dasharray=\"5 3\"/><text x=\"%d\" y=\"%d\">"
                   "driver: reserved (%s)</text>\n", ML, 13 + 2 * LEGEND_LINE, ML + 22,
                13 + 2 * LEGEND_LINE, ML + 28, 17 + 2 * LEGEND_LINE,
                rp_series_meaning(RP_LIB_DRIVER));
    fputs("</g>\n</svg>\n", f);
    free(order);
    free(shapes);
    return 0;
}
