/* report_layers.c - the per-layer charts of `mixprec report`, one set per
 * run over its diagnostic steps: heatmaps of every tensor's underflow
 * fraction and amax relative to its format's range, and per weight the
 * relative error of its compute copy against the float32 master and the
 * update-to-weight ratio (a line per weight for a few weights, a heatmap
 * for many). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/report.h"

/* A line chart's legend stays readable (and its colours distinct: Okabe-Ito
 * has eight) up to this many weights; more become a heatmap. */
#define MAX_LINES 8

/* One figure of a set of tensors over a run's diagnostic steps. */
typedef struct {
    int nrows, ncols;
    char (*keys)[96];
    const char **rows; /* keys, as the charts take them */
    double *cols;      /* the diagnostic steps */
    double *v;         /* nrows x ncols; NAN: none */
    double lo, hi;     /* the smallest positive and the largest value (lo INFINITY: none) */
} grid;

/* A row's name: with kind NULL "layer kind suffix" (dense weight kernel),
 * else the tensor's own name (dense.kernel). */
static void tensor_key(json_t *layer, json_t *t, const char *kind, char *buf, size_t len)
{
    const char *tk = json_string_value(json_object_get(t, "kind"));
    const char *name = json_string_value(json_object_get(t, "name"));
    const char *ln = json_string_value(json_object_get(layer, "name"));
    const char *dot = name ? strrchr(name, '.') : NULL;
    if (kind)
        snprintf(buf, len, "%s", name ? name : "?");
    else
        snprintf(buf, len, "%s %s%s%s", ln ? ln : "?", tk ? tk : "?", dot ? " " : "",
                 dot ? dot + 1 : "");
}

/* kind NULL: every tensor but the updates; else only those of that kind.
 * Rows are those of the first diagnostics record. False: no diagnostics
 * record, or no memory. */
static bool grid_read(grid *g, const report_run *r, const char *kind, const char *field)
{
    memset(g, 0, sizeof *g);
    g->lo = INFINITY;
    int first = -1;
    for (int i = 0; i < r->nsteps; i++)
        if (r->steps[i].diag) g->ncols++, first = first < 0 ? i : first;
    if (!g->ncols) return false;
    json_t *l, *t;
    size_t i, j;
    json_array_foreach(r->steps[first].layers, i, l)
        json_array_foreach(json_object_get(l, "tensors"), j, t)
    {
        const char *tk = json_string_value(json_object_get(t, "kind"));
        if (kind ? !tk || strcmp(tk, kind) : tk && !strcmp(tk, "update")) continue;
        void *k = realloc(g->keys, (size_t)(g->nrows + 1) * sizeof *g->keys);
        if (!k) return false;
        g->keys = k;
        tensor_key(l, t, kind, g->keys[g->nrows++], sizeof g->keys[0]);
    }
    size_t nr = (size_t)(g->nrows ? g->nrows : 1), nc = (size_t)g->ncols;
    g->rows = malloc(nr * sizeof *g->rows);
    g->cols = malloc(nc * sizeof *g->cols);
    g->v = malloc(nr * nc * sizeof *g->v);
    if (!g->rows || !g->cols || !g->v) return false;
    for (int k = 0; k < g->nrows; k++) g->rows[k] = g->keys[k];
    for (size_t k = 0; k < nr * nc; k++) g->v[k] = NAN;
    for (int s = 0, c = 0; s < r->nsteps; s++) {
        if (!r->steps[s].diag) continue;
        g->cols[c] = r->steps[s].step;
        json_array_foreach(r->steps[s].layers, i, l)
            json_array_foreach(json_object_get(l, "tensors"), j, t)
        {
            char key[96];
            const char *tk = json_string_value(json_object_get(t, "kind"));
            if (kind && (!tk || strcmp(tk, kind))) continue;
            tensor_key(l, t, kind, key, sizeof key);
            json_t *x = json_object_get(t, field);
            for (int k = 0; k < g->nrows && json_is_number(x); k++)
                if (!strcmp(g->keys[k], key)) {
                    double v = json_number_value(x);
                    g->v[(size_t)k * nc + (size_t)c] = v;
                    if (v > 0) g->lo = fmin(g->lo, v);
                    g->hi = fmax(g->hi, v);
                    break;
                }
        }
        c++;
    }
    return true;
}

static void grid_free(grid *g)
{
    free(g->keys);
    free(g->rows);
    free(g->cols);
    free(g->v);
}

/* A log colour scale over whole decades around the grid's values, twelve at
 * most (a float32 layer in a float16 model would otherwise squash it; below
 * it: the darkest colour). */
static void decades(const grid *g, double *lo, double *hi)
{
    *hi = g->hi > 0 ? pow(10, ceil(log10(g->hi))) : 1;
    *lo = isfinite(g->lo) ? fmax(pow(10, floor(log10(g->lo))), *hi * 1e-12) : *hi * 1e-6;
    if (*hi <= *lo) *hi = *lo * 10;
}

void report_layer_heatmaps(FILE *f, const report_run *r)
{
    grid u, a;
    char title[300];
    bool ok = grid_read(&u, r, NULL, "underflow_frac");
    ok = grid_read(&a, r, NULL, "amax_rel") && ok;
    if (!u.ncols) {
        fputs("<p class=\"note\">No diagnostics records (train with --diagnostics N): no "
              "per-layer charts.</p>\n",
              f);
    } else if (ok) {
        snprintf(title, sizeof title, "%s: fraction of values that underflow in the compute dtype",
                 r->label);
        report_heatmap(f, title, "training step", "layer and tensor", u.rows, u.nrows, u.cols,
                       u.ncols, u.v, 1e-6, 1, "fraction flushed to zero or subnormal");
        snprintf(title, sizeof title, "%s: amax relative to the format's largest finite value",
                 r->label);
        double lo, hi;
        decades(&a, &lo, &hi);
        report_heatmap(f, title, "training step", "layer and tensor", a.rows, a.nrows, a.cols,
                       a.ncols, a.v, lo, hi, "amax / max finite of the tensor's compute dtype");
    }
    grid_free(&u);
    grid_free(&a);
}

/* One figure of every weight over time: lines (log axis when they span
 * decades) or, past MAX_LINES weights, a heatmap. */
static void weight_chart(FILE *f, const report_run *r, const char *kind, const char *field,
                         const char *what, const char *ylabel)
{
    grid g;
    char title[300];
    snprintf(title, sizeof title, "%s: %s", r->label, what);
    bool ok = grid_read(&g, r, kind, field);
    if (ok && g.nrows && g.nrows <= MAX_LINES) {
        report_series s[MAX_LINES];
        for (int k = 0; k < g.nrows; k++)
            s[k] = (report_series){
                g.rows[k], g.ncols, g.cols, g.v + (size_t)k * (size_t)g.ncols, k, .dashed = false};
        report_axes a = {title, "training step", ylabel, false, true};
        report_line_chart(f, &a, s, g.nrows);
    } else if (ok && g.nrows) {
        double lo, hi;
        decades(&g, &lo, &hi);
        report_heatmap(f, title, "training step", "weight", g.rows, g.nrows, g.cols, g.ncols, g.v,
                       lo, hi, ylabel);
    }
    grid_free(&g);
}

void report_weight_charts(FILE *f, const report_run *r)
{
    weight_chart(f, r, "weight", "rel_error", "compute copy against float32 master, per weight",
                 "relative error ‖w_copy − w‖ / ‖w‖");
    weight_chart(f, r, "update", "ratio", "update-to-weight ratio, per weight",
                 "‖Δw‖ / ‖w‖ per step (ratio)");
}
