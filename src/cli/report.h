/* report.h - `mixprec report`: what one run directory holds once read
 * (report_read.c), the SVG charts (report_svg.c), the per-layer charts
 * (report_layers.c) and the page (report_cmd.c). */
#ifndef MP_CLI_REPORT_H
#define MP_CLI_REPORT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>

#include "mixprec.h"

#define REPORT_MEM 7 /* memory categories, as mp_mem_category */

typedef struct {
    int epoch;
    double loss, accuracy, val_loss, val_accuracy; /* NAN: none */
    double ms_per_step, loss_scale;
    double step; /* training steps at its end (NAN: unknown) */
} report_epoch;

typedef struct {
    double step, loss, accuracy, loss_scale, next_scale, grad_norm, lr, step_ms;
    bool skipped, diag; /* diag: a full diagnostics record (else an event) */
    double mem_peak[REPORT_MEM];
    json_t *layers; /* the record's "layers" (diag only; owned by the run) */
} report_step;

typedef struct {
    const char *dir;
    char label[160];
    char policy[32], compute[32];
    json_t *formats; /* dtype name -> {max, ...} from the run record */
    json_t *plan;    /* plan.json (NULL: none) */
    int nepochs;
    report_epoch *epochs;
    int nsteps;
    report_step *steps;
    json_t *records; /* keeps the step records alive */
    int nnotes;
    char notes[16][320];
    bool partial; /* something was missing or unreadable */
} report_run;

/* Read what `dir` holds; problems become notes (and set partial), each also
 * printed to err. Never fails: a run with nothing readable is all notes. */
void report_run_read(report_run *r, const char *dir, FILE *err);
void report_run_free(report_run *r);
void report_note(report_run *r, FILE *err, const char *fmt, ...);

/* ------------------------------------------------------------- charts */

/* Okabe-Ito colours, colour-blind safe, for series i. */
const char *report_colour(int i);
void report_escape(FILE *f, const char *s);

typedef struct {
    const char *name; /* legend */
    int n;
    const double *x, *y; /* NAN y: a gap */
    int colour;
    bool dashed, markers_only, step; /* step: hold y until the next x */
    const double *mark_x, *mark_y;   /* extra cross markers (skipped steps) */
    int nmarks;
} report_series;

typedef struct {
    const char *title, *xlabel, *ylabel;
    bool logy; /* forced; else chosen when the values span > 2 decades */
    bool auto_log;
} report_axes;

void report_line_chart(FILE *f, const report_axes *a, const report_series *s, int ns);
/* rows x cols cells (NAN: no value), log10 colour scale from lo to hi. */
void report_heatmap(FILE *f, const char *title, const char *xlabel, const char *ylabel,
                    const char *const *rows, int nrows, const double *cols, int ncols,
                    const double *v, double lo, double hi, const char *unit);
/* Per run (report_layers.c): the heatmaps of its tensors' underflow and
 * amax (or a note when it has no diagnostics records), and its weights'
 * copy error and update-to-weight ratio over time. */
void report_layer_heatmaps(FILE *f, const report_run *r);
void report_weight_charts(FILE *f, const report_run *r);
/* Groups of bars (one group per category, one bar per run), values in MiB. */
void report_bar_chart(FILE *f, const char *title, const char *ylabel, const char *const *cats,
                      int ncats, const char *const *names, int nruns, const double *v);

#endif
