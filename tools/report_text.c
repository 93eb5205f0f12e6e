/* The tables on a terminal: a title, the note wrapped to 100 columns, the columns aligned
 * (numbers to the right). Names come from the trace: control characters are shown as '?'
 * so a trace cannot move the terminal's cursor. */
#include "report.h"

#include <string.h>

#define WRAP 100

/* Display width: UTF-8 continuation bytes take no column. */
static size_t width(const char *s)
{
    size_t w = 0;
    for (; *s; s++)
        w += ((unsigned char)*s & 0xc0) != 0x80;
    return w;
}

static void put_clean(FILE *f, const char *s)
{
    for (; *s; s++)
        fputc((unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s, f);
}

static void put_cell(FILE *f, const char *s, size_t w, bool right, bool last)
{
    size_t pad = w - width(s);
    if (right)
        fprintf(f, "%*s", (int)pad, "");
    put_clean(f, s);
    if (!right && !last)
        fprintf(f, "%*s", (int)pad, "");
}

static void put_note(FILE *f, const char *note)
{
    size_t col = 0;
    while (*note) {
        size_t n = strcspn(note, " ");
        if (col && col + 1 + n > WRAP - 2) {
            fputc('\n', f);
            col = 0;
        }
        fputs(col ? " " : "  ", f);
        fwrite(note, 1, n, f);
        col += n + (col ? 1 : 2);
        note += n;
        note += strspn(note, " ");
    }
    fputc('\n', f);
}

static void put_table(FILE *f, const rp_table *t)
{
    size_t w[RP_MAXCOLS] = {0};
    bool head = false;
    for (int c = 0; c < t->ncols; c++) {
        w[c] = width(t->head[c]);
        head |= t->head[c][0] != '\0';
        for (size_t r = 0; r < t->nrows; r++) {
            size_t k = width(t->cell[r * (size_t)t->ncols + (size_t)c]);
            if (k > w[c])
                w[c] = k;
        }
    }
    fprintf(f, "%s\n", t->title);
    if (t->note)
        put_note(f, t->note);
    if (!t->nrows)
        return;
    if (head) {
        for (int c = 0; c < t->ncols; c++) {
            fputs("  ", f);
            put_cell(f, t->head[c], w[c], t->right >> c & 1, c + 1 == t->ncols);
        }
        fputc('\n', f);
        for (int c = 0; c < t->ncols; c++) {
            fputs("  ", f);
            for (size_t k = 0; k < w[c]; k++)
                fputc('-', f);
        }
        fputc('\n', f);
    }
    for (size_t r = 0; r < t->nrows; r++) {
        for (int c = 0; c < t->ncols; c++) {
            fputs("  ", f);
            put_cell(f, t->cell[r * (size_t)t->ncols + (size_t)c], w[c], t->right >> c & 1,
                     c + 1 == t->ncols);
        }
        fputc('\n', f);
    }
}

int rp_text_write(FILE *f, const rp_tables *ts)
{
    for (size_t i = 0; i < ts->n; i++) {
        if (i)
            fputc('\n', f);
        put_table(f, &ts->t[i]);
    }
    return fflush(f) == 0 && !ferror(f) ? 0 : -1;
}
