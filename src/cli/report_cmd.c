/* report_cmd.c - `mixprec report DIR [DIR...] -o report.html`: one
 * self-contained HTML page (inline SVG, no scripts, nothing fetched)
 * comparing training runs from their run directories: loss and accuracy,
 * the loss scale with skipped steps, the per-layer charts (report_layers.c),
 * memory by category, time per step and each model's precision plan. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/report.h"

static const char *const mem_labels[REPORT_MEM] = {
    "weights", "master weights", "gradients", "optimizer", "activations", "workspace", "other"};

/* a count as an allocation size (at least 1, never a negative int's wrap) */
#define RUNS(n) ((size_t)((n) > 0 ? (n) : 1))

static void usage(FILE *f)
{
    fprintf(f, "usage: mixprec report DIR [DIR...] -o report.html\n"
               "  DIR   a run directory (mixprec train --run-dir DIR [--diagnostics N])\n"
               "  -o    the HTML file to write (one file: inline SVG, no scripts, no network)\n"
               "exit status: 0 every run read in full, 1 a report of what was readable (the page\n"
               "and stderr say what was not), 2 usage or the page could not be written\n");
}

typedef struct {
    double *x, *y;
    int n;
} pts;

static void push(pts *p, double x, double y)
{
    double *nx = realloc(p->x, (size_t)(p->n + 1) * sizeof *nx);
    if (!nx) return;
    p->x = nx;
    double *ny = realloc(p->y, (size_t)(p->n + 1) * sizeof *ny);
    if (!ny) return;
    p->y = ny;
    p->x[p->n] = x;
    p->y[p->n++] = y;
}

static void pts_free(pts *p, int n)
{
    for (int i = 0; i < n; i++) free(p[i].x), free(p[i].y);
}

/* x of an epoch's end: its step, else the epoch number */
static double epoch_x(const report_epoch *e) { return isfinite(e->step) ? e->step : e->epoch; }

/* Loss or accuracy: per run the training figure at diagnostic steps (or the
 * epoch means without a log) and validation at epoch ends. */
static void curves(FILE *f, report_run *runs, int nr, bool loss)
{
    pts *p = calloc(RUNS(nr) * 3, sizeof *p);
    report_series *s = calloc(RUNS(nr) * 3, sizeof *s);
    char(*names)[200] = calloc(RUNS(nr) * 2, sizeof *names);
    int ns = 0;
    for (int r = 0; r < nr && p && s && names; r++) {
        pts *tr = &p[3 * r], *va = &p[3 * r + 1];
        for (int i = 0; i < runs[r].nsteps; i++) {
            const report_step *st = &runs[r].steps[i];
            double v = loss ? st->loss : st->accuracy;
            if (st->diag && isfinite(v)) push(tr, st->step, v);
        }
        bool per_step = tr->n > 0;
        for (int i = 0; i < runs[r].nepochs; i++) {
            const report_epoch *e = &runs[r].epochs[i];
            double t = loss ? e->loss : e->accuracy, v = loss ? e->val_loss : e->val_accuracy;
            if (!per_step && isfinite(t)) push(tr, epoch_x(e), t);
            if (isfinite(v)) push(va, epoch_x(e), v);
        }
        snprintf(names[2 * r], 200, "%s train%s", runs[r].label, per_step ? "" : " (epoch mean)");
        snprintf(names[2 * r + 1], 200, "%s validation", runs[r].label);
        s[ns++] = (report_series){names[2 * r], tr->n, tr->x, tr->y, r, .markers_only = false};
        if (va->n) {
            s[ns++] = (report_series){names[2 * r + 1], va->n, va->x, va->y, r, .dashed = true};
            s[ns++] = (report_series){NULL, va->n, va->x, va->y, r, .markers_only = true};
        }
    }
    report_axes a = {loss ? "Loss (train and validation)" : "Accuracy (train and validation)",
                     "training step (validation at epoch ends)",
                     loss ? "loss (cross-entropy, nats)" : "accuracy (fraction correct)", false,
                     loss};
    report_line_chart(f, &a, s, ns);
    pts_free(p, nr * 3);
    free(p);
    free(s);
    free(names);
}

static void loss_scale_chart(FILE *f, report_run *runs, int nr)
{
    pts *p = calloc(RUNS(nr) * 2, sizeof *p);
    report_series *s = calloc(RUNS(nr), sizeof *s);
    for (int r = 0; r < nr && p && s; r++) {
        pts *line = &p[2 * r], *mk = &p[2 * r + 1];
        for (int i = 0; i < runs[r].nsteps; i++) {
            const report_step *st = &runs[r].steps[i];
            if (!isfinite(st->loss_scale)) continue;
            push(line, st->step, st->loss_scale);
            if (isfinite(st->next_scale)) push(line, st->step + 1, st->next_scale);
            if (st->skipped) push(mk, st->step, st->loss_scale);
        }
        s[r] = (report_series){runs[r].label, line->n,         line->x,         line->y,        r,
                               .step = true,  .mark_x = mk->x, .mark_y = mk->y, .nmarks = mk->n};
    }
    report_axes a = {"Loss scale (skipped steps marked)", "training step",
                     "loss scale (log scale; 1: no scaling)", true, false};
    report_line_chart(f, &a, s, nr);
    pts_free(p, nr * 2);
    free(p);
    free(s);
}

/* Peak bytes per category (MiB) of the last diagnostics record, else the plan. */
static void memory_chart(FILE *f, report_run *runs, int nr)
{
    double *v = malloc(RUNS(nr) * REPORT_MEM * sizeof *v);
    const char **names = malloc(RUNS(nr) * sizeof *names);
    if (!v || !names) goto out;
    static const char *const plan_keys[REPORT_MEM] = {
        "weights",     "master_weights", "gradients", "optimizer_state",
        "activations", "workspace",      NULL};
    fputs("<table><tr><th>run</th><th>source</th>", f);
    for (int c = 0; c < REPORT_MEM; c++) fprintf(f, "<th>%s (MiB)</th>", mem_labels[c]);
    fputs("</tr>\n", f);
    for (int r = 0; r < nr; r++) {
        names[r] = runs[r].label;
        const report_step *last = NULL;
        for (int i = 0; i < runs[r].nsteps; i++)
            if (runs[r].steps[i].diag) last = &runs[r].steps[i];
        json_t *plan = json_object_get(runs[r].plan, "memory_plan");
        for (int c = 0; c < REPORT_MEM; c++) {
            double b = last ? last->mem_peak[c]
                       : plan && plan_keys[c]
                           ? json_number_value(json_object_get(plan, plan_keys[c]))
                           : NAN;
            v[r * REPORT_MEM + c] = b / (1024.0 * 1024.0);
        }
        fputs("<tr><td>", f);
        report_escape(f, runs[r].label);
        fprintf(f, "</td><td>%s</td>",
                last   ? "measured peak"
                : plan ? "planned (no diagnostics)"
                       : "none");
        for (int c = 0; c < REPORT_MEM; c++) fprintf(f, "<td>%.2f</td>", v[r * REPORT_MEM + c]);
        fputs("</tr>\n", f);
    }
    fputs("</table>\n", f);
    report_bar_chart(f, "Memory by category (peak)", "memory (MiB)", mem_labels, REPORT_MEM, names,
                     nr, v);
out:
    free(v);
    free(names);
}

static void time_chart(FILE *f, report_run *runs, int nr)
{
    pts *p = calloc(RUNS(nr), sizeof *p);
    report_series *s = calloc(RUNS(nr), sizeof *s);
    for (int r = 0; r < nr && p && s; r++) {
        for (int i = 0; i < runs[r].nsteps; i++)
            if (runs[r].steps[i].diag && isfinite(runs[r].steps[i].step_ms))
                push(&p[r], runs[r].steps[i].step, runs[r].steps[i].step_ms);
        s[r] = (report_series){runs[r].label, p[r].n, p[r].x, p[r].y, r, .dashed = false};
    }
    report_axes a = {"Time per training step (diagnostic steps, diagnostics excluded)",
                     "training step", "time per step (ms)", false, true};
    report_line_chart(f, &a, s, nr);
    fputs("<table><tr><th>run</th><th>epoch</th><th>ms/step (epoch mean)</th></tr>\n", f);
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < runs[r].nepochs; i++) {
            fputs("<tr><td>", f);
            report_escape(f, runs[r].label);
            fprintf(f, "</td><td>%d</td><td>%.2f</td></tr>\n", runs[r].epochs[i].epoch,
                    runs[r].epochs[i].ms_per_step);
        }
    fputs("</table>\n", f);
    pts_free(p, nr);
    free(p);
    free(s);
}

static void plan_table(FILE *f, const report_run *r)
{
    json_t *layers = json_object_get(r->plan, "layers"), *l;
    if (!layers) {
        fputs("<p class=\"note\">No precision plan (plan.json missing).</p>\n", f);
        return;
    }
    fputs("<table><tr><th>layer</th><th>class</th><th>policy</th><th>compute dtype</th>"
          "<th>output dtype</th><th>params</th><th>param bytes</th><th>saved bytes</th></tr>\n",
          f);
    size_t i;
    const char *keys[5] = {"name", "class", "policy", "compute_dtype", "output_dtype"};
    json_array_foreach(layers, i, l)
    {
        fputs("<tr>", f);
        for (int k = 0; k < 5; k++) {
            fputs("<td>", f);
            report_escape(f, json_string_value(json_object_get(l, keys[k])));
            fputs("</td>", f);
        }
        fprintf(f, "<td>%lld</td><td>%lld</td><td>%lld</td></tr>\n",
                (long long)json_integer_value(json_object_get(l, "params")),
                (long long)json_integer_value(json_object_get(l, "param_bytes")),
                (long long)json_integer_value(json_object_get(l, "saved_bytes")));
    }
    fputs("</table>\n", f);
}

static void page(FILE *f, report_run *runs, int nr)
{
    fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
          "<title>mixprec training report</title><style>"
          "body{font-family:sans-serif;max-width:1000px;margin:1em auto;color:#222}"
          "table{border-collapse:collapse;margin:0.5em 0;font-size:13px}"
          "td,th{border:1px solid #bbb;padding:2px 6px;text-align:right}"
          "td:first-child,th:first-child{text-align:left}"
          ".note{background:#fff4d6;border-left:4px solid #E69F00;padding:4px 8px}"
          "svg{display:block;margin:0.5em 0}</style></head><body>\n"
          "<h1>mixprec training report</h1>\n<ul>\n",
          f);
    for (int r = 0; r < nr; r++) {
        fputs("<li><span style=\"color:", f);
        fputs(report_colour(r), f);
        fputs("\">&#9632;</span> ", f);
        report_escape(f, runs[r].label);
        fputs(": ", f);
        report_escape(f, runs[r].dir);
        fputs(" (compute dtype ", f);
        report_escape(f, runs[r].compute);
        fprintf(f, ", %d epochs, %d records)</li>\n", runs[r].nepochs, runs[r].nsteps);
    }
    fputs("</ul>\n", f);
    for (int r = 0; r < nr; r++) {
        for (int k = 0; k < runs[r].nnotes; k++) {
            fputs("<p class=\"note\">Note (", f);
            report_escape(f, runs[r].label);
            fputs("): ", f);
            report_escape(f, runs[r].notes[k]);
            fputs("</p>\n", f);
        }
    }
    fputs("<h2>Loss</h2>\n", f);
    curves(f, runs, nr, true);
    fputs("<h2>Accuracy</h2>\n", f);
    curves(f, runs, nr, false);
    fputs("<h2>Loss scale</h2>\n", f);
    loss_scale_chart(f, runs, nr);
    fputs("<h2>Numerics per layer</h2>\n<p>Each row is a tensor of a layer: its output "
          "activation, a weight's compute copy, its gradient (float32, unscaled) and the "
          "gradient reaching the output (in its dtype, multiplied by the loss scale). Values "
          "count as underflow when nonzero and rounded to zero or to a subnormal.</p>\n",
          f);
    for (int r = 0; r < nr; r++) report_layer_heatmaps(f, &runs[r]);
    fputs("<h2>Weights: rounding and updates</h2>\n<p>Per weight, the relative error of the "
          "compute copy the layer multiplies with against its float32 master (0 where the "
          "layer computes in float32: the copy is the master), and the size of each step's "
          "update against the weight (Adam's updates are about the learning rate; a ratio "
          "far below the copy's relative error is an update the copy cannot show).</p>\n",
          f);
    for (int r = 0; r < nr; r++) report_weight_charts(f, &runs[r]);
    fputs("<h2>Memory</h2>\n", f);
    memory_chart(f, runs, nr);
    fputs("<h2>Time per step</h2>\n", f);
    time_chart(f, runs, nr);
    fputs("<h2>Precision plan</h2>\n", f);
    for (int r = 0; r < nr; r++) {
        fputs("<h3>", f);
        report_escape(f, runs[r].label);
        fputs("</h3>\n", f);
        plan_table(f, &runs[r]);
    }
    fputs("</body></html>\n", f);
}

int mp_cli_report(int argc, char **argv)
{
    const char *out = NULL;
    const char **dirs = calloc(RUNS(argc), sizeof *dirs);
    int nd = 0;
    if (!dirs) return 2;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            free(dirs);
            return 0;
        } else if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) {
            if (i + 1 == argc) break;
            out = argv[++i];
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "mixprec report: unknown option '%s'\n", argv[i]);
            free(dirs);
            return 2;
        } else {
            dirs[nd++] = argv[i];
        }
    }
    if (!out || !nd) {
        usage(stderr);
        free(dirs);
        return 2;
    }
    int rc = mp_cli_report_write(dirs, nd, out);
    free(dirs);
    return rc;
}

int mp_cli_report_write(const char *const *dirs, int nd, const char *out)
{
    report_run *runs = calloc(RUNS(nd), sizeof *runs);
    if (!runs) return 2;
    bool partial = false;
    for (int r = 0; r < nd; r++) {
        report_run_read(&runs[r], dirs[r], stderr);
        partial |= runs[r].partial;
    }
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    FILE *f = fopen(tmp, "w");
    int rc = partial ? 1 : 0;
    if (!f) {
        fprintf(stderr, "mixprec report: cannot write '%s'\n", tmp);
        rc = 2;
    } else {
        page(f, runs, nd);
        if (fclose(f) != 0 || rename(tmp, out) != 0) {
            fprintf(stderr, "mixprec report: cannot write '%s'\n", out);
            unlink(tmp);
            rc = 2;
        } else {
            printf("report: %s (%d run%s%s)\n", out, nd, nd > 1 ? "s" : "",
                   partial ? "; some files were missing or unreadable, see the notes" : "");
        }
    }
    for (int r = 0; r < nd; r++) report_run_free(&runs[r]);
    free(runs);
    return rc;
}
