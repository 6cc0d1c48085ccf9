/* report_svg.c - the charts of `mixprec report` as inline SVG: line charts
 * (linear or log axes with ticks and labels, a legend), heatmaps on a log
 * colour scale and grouped bars. Colours are Okabe-Ito's (colour-blind
 * safe); the heatmap ramp is viridis. No scripts: a browser draws it as is. */
#include <math.h>
#include <string.h>

#include "cli/report.h"

#define W 940
#define H 340
#define ML 78 /* margins: room for tick labels and axis titles */
#define MR 330
#define MT 34
#define MB 52

static const char *const okabe_ito[] = {"#0072B2", "#D55E00", "#009E73", "#E69F00",
                                        "#CC79A7", "#56B4E9", "#F0E442", "#000000"};

const char *report_colour(int i) { return okabe_ito[(i % 8 + 8) % 8]; }

void report_escape(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else if (*s == '&')
            fputs("&amp;", f);
        else if (*s == '"')
            fputs("&quot;", f);
        else
            fputc(*s, f);
    }
}

/* kind (data-chart): line, heatmap or bars; with the classes of the data
 * marks (series, point, skip, cell, bar, scale), what tests/browser_check.js
 * checks in a browser. */
static void open_svg(FILE *f, int w, int h, const char *kind, const char *title)
{
    fprintf(f,
            "<svg data-chart=\"%s\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" role=\"img\" font-family=\"sans-serif\" font-size=\"12\">"
            "<title>",
            kind, w, h, w, h);
    report_escape(f, title);
    fprintf(f, "</title><text x=\"%d\" y=\"20\" font-size=\"14\" font-weight=\"bold\">", ML);
    report_escape(f, title);
    fputs("</text>\n", f);
}

/* 1, 2, 5 x 10^k steps: about n ticks over [lo, hi]. */
static double nice_step(double lo, double hi, int n)
{
    double raw = (hi - lo) / n, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

static void fmt_tick(char *buf, size_t len, double v, bool logy)
{
    if (logy)
        snprintf(buf, len, "%g", v);
    else if (fabs(v) < 1e-12)
        snprintf(buf, len, "0");
    else
        snprintf(buf, len, "%.4g", v);
}

typedef struct {
    double x0, x1, y0, y1;
    bool logy;
    int w, h;
} frame;

static double px(const frame *fr, double x)
{
    return ML + (x - fr->x0) / (fr->x1 - fr->x0 ? fr->x1 - fr->x0 : 1) * (fr->w - ML - MR);
}

static double py(const frame *fr, double y)
{
    double v = fr->logy ? log10(y) : y, a = fr->logy ? log10(fr->y0) : fr->y0,
           b = fr->logy ? log10(fr->y1) : fr->y1;
    return fr->h - MB - (v - a) / (b - a ? b - a : 1) * (fr->h - MT - MB);
}

static void yticks(FILE *f, const frame *fr)
{
    int x0 = ML, x1 = fr->w - MR;
    char buf[32];
    double st;
    if (fr->logy) {
        for (double d = floor(log10(fr->y0)); d <= ceil(log10(fr->y1)); d++) {
            double t = pow(10, d);
            if (t < fr->y0 * 0.999 || t > fr->y1 * 1.001) continue;
            fmt_tick(buf, sizeof buf, t, true);
            fprintf(f,
                    "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                    "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                    x0, py(fr, t), x1, py(fr, t), x0 - 6, py(fr, t) + 4, buf);
        }
    } else {
        st = nice_step(fr->y0, fr->y1, 5);
        for (double t = ceil(fr->y0 / st) * st; t <= fr->y1 + st * 1e-9; t += st) {
            fmt_tick(buf, sizeof buf, t, false);
            fprintf(f,
                    "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                    "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                    x0, py(fr, t), x1, py(fr, t), x0 - 6, py(fr, t) + 4, buf);
        }
    }
}

static void axes(FILE *f, const frame *fr, const char *xlabel, const char *ylabel)
{
    int x0 = ML, x1 = fr->w - MR, y0 = fr->h - MB, y1 = MT;
    fprintf(f,
            "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#444\"/>\n",
            x0, y1, x1 - x0, y0 - y1);
    char buf[32];
    double st = nice_step(fr->x0, fr->x1, 6);
    for (double t = ceil(fr->x0 / st) * st; t <= fr->x1 + st * 1e-9; t += st) {
        fmt_tick(buf, sizeof buf, t, false);
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#444\"/>"
                "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n",
                px(fr, t), y0, px(fr, t), y0 + 5, px(fr, t), y0 + 18, buf);
    }
    yticks(f, fr);
    fprintf(f, "<text class=\"xlabel\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">", (x0 + x1) / 2,
            fr->h - 12);
    report_escape(f, xlabel);
    fprintf(f,
            "</text><text class=\"ylabel\" transform=\"translate(16 %d) rotate(-90)\" "
            "text-anchor=\"middle\">",
            (y0 + y1) / 2);
    report_escape(f, ylabel);
    fputs("</text>\n", f);
}

static void legend_entry(FILE *f, const frame *fr, int i, const char *name, const char *colour,
                         bool dashed, bool marker)
{
    int x = fr->w - MR + 14, y = MT + 8 + 18 * i;
    if (marker)
        fprintf(f, "<path d=\"M%d %d l8 8 m0 -8 l-8 8\" stroke=\"%s\" stroke-width=\"2\"/>", x + 6,
                y - 4, colour);
    else
        fprintf(
            f,
            "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2.5\"%s/>",
            x, y, x + 22, y, colour, dashed ? " stroke-dasharray=\"6 3\"" : "");
    fprintf(f, "<text class=\"legend\" x=\"%d\" y=\"%d\">", x + 28, y + 4);
    report_escape(f, name);
    fputs("</text>\n", f);
}

void report_line_chart(FILE *f, const report_axes *a, const report_series *s, int ns)
{
    frame fr = {INFINITY, -INFINITY, INFINITY, -INFINITY, a->logy, W, H};
    double ypos = INFINITY;
    for (int i = 0; i < ns; i++)
        for (int k = 0; k < s[i].n; k++) {
            if (!isfinite(s[i].x[k]) || !isfinite(s[i].y[k])) continue;
            fr.x0 = fmin(fr.x0, s[i].x[k]), fr.x1 = fmax(fr.x1, s[i].x[k]);
            fr.y0 = fmin(fr.y0, s[i].y[k]), fr.y1 = fmax(fr.y1, s[i].y[k]);
            if (s[i].y[k] > 0) ypos = fmin(ypos, s[i].y[k]);
        }
    open_svg(f, W, H, "line", a->title);
    if (!isfinite(fr.x0)) {
        fprintf(f, "<text x=\"%d\" y=\"%d\">no data</text></svg>\n", ML, H / 2);
        return;
    }
    if (a->auto_log && ypos < INFINITY && fr.y0 > 0 && fr.y1 / ypos > 100) fr.logy = true;
    if (fr.logy) {
        fr.y0 = pow(10, floor(log10(ypos))), fr.y1 = pow(10, ceil(log10(fr.y1)));
        if (fr.y1 <= fr.y0) fr.y1 = fr.y0 * 10;
    } else {
        double pad = (fr.y1 - fr.y0) * 0.05 + (fr.y1 == fr.y0 ? fabs(fr.y0) * 0.1 + 1e-3 : 0);
        fr.y0 -= pad, fr.y1 += pad;
    }
    if (fr.x1 == fr.x0) fr.x0 -= 1, fr.x1 += 1;
    char ylabel[300]; /* a log axis chosen here says so */
    snprintf(ylabel, sizeof ylabel, "%s%s", a->ylabel, fr.logy && !a->logy ? " (log scale)" : "");
    axes(f, &fr, a->xlabel, ylabel);
    int nleg = 0;
    for (int i = 0; i < ns; i++) {
        const char *c = report_colour(s[i].colour);
        if (s[i].markers_only) {
            for (int k = 0; k < s[i].n; k++)
                if (isfinite(s[i].y[k]) && (!fr.logy || s[i].y[k] > 0))
                    fprintf(f,
                            "<circle class=\"point\" cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"/>",
                            px(&fr, s[i].x[k]), py(&fr, s[i].y[k]), c);
        } else {
            fprintf(f,
                    "<path class=\"series\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s d=\"",
                    c, s[i].dashed ? " stroke-dasharray=\"6 3\"" : "");
            bool pen = false;
            double lasty = 0;
            for (int k = 0; k < s[i].n; k++) {
                double y = s[i].y[k];
                if (!isfinite(y) || (fr.logy && y <= 0)) {
                    pen = false;
                    continue;
                }
                if (pen && s[i].step) fprintf(f, "L%.1f %.1f", px(&fr, s[i].x[k]), py(&fr, lasty));
                fprintf(f, "%c%.1f %.1f", pen ? 'L' : 'M', px(&fr, s[i].x[k]), py(&fr, y));
                pen = true, lasty = y;
            }
            fputs("\"/>\n", f);
        }
        if (s[i].name) legend_entry(f, &fr, nleg++, s[i].name, c, s[i].dashed, false);
        for (int k = 0; k < s[i].nmarks; k++)
            if (!fr.logy || s[i].mark_y[k] > 0)
                fprintf(f,
                        "<path class=\"skip\" d=\"M%.1f %.1f l8 8 m0 -8 l-8 8\" stroke=\"%s\" "
                        "stroke-width=\"2\"/>",
                        px(&fr, s[i].mark_x[k]) - 4, py(&fr, s[i].mark_y[k]) - 4, c);
        if (s[i].nmarks) legend_entry(f, &fr, nleg++, "skipped step", c, false, true);
    }
    fputs("</svg>\n", f);
}

/* viridis at t in [0, 1] (nine anchors, linear between) */
static void viridis(double t, char *buf)
{
    static const int v[9][3] = {{68, 1, 84},    {71, 44, 122},  {59, 81, 139},
                                {44, 113, 142}, {33, 144, 141}, {39, 173, 129},
                                {92, 200, 99},  {170, 220, 50}, {253, 231, 37}};
    t = t < 0 ? 0 : t > 1 ? 1 : t;
    double p = t * 8;
    int i = (int)p < 8 ? (int)p : 7;
    double u = p - i;
    snprintf(buf, 8, "#%02x%02x%02x", (int)(v[i][0] + u * (v[i + 1][0] - v[i][0])),
             (int)(v[i][1] + u * (v[i + 1][1] - v[i][1])),
             (int)(v[i][2] + u * (v[i + 1][2] - v[i][2])));
}

void report_heatmap(FILE *f, const char *title, const char *xlabel, const char *ylabel,
                    const char *const *rows, int nrows, const double *cols, int ncols,
                    const double *v, double lo, double hi, const char *unit)
{
    const int lw = 200, cell_h = 14, top = 34, w = W, bar = 16;
    int plot_w = w - lw - 120, h = top + nrows * cell_h + 70;
    open_svg(f, w, h, "heatmap", title);
    double cw = ncols ? (double)plot_w / ncols : plot_w;
    char col[8];
    for (int r = 0; r < nrows; r++) {
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" font-size=\"10\">", lw - 4,
                top + r * cell_h + 11);
        report_escape(f, rows[r]);
        fputs("</text>", f);
        for (int c = 0; c < ncols; c++) {
            double x = v[(size_t)r * (size_t)ncols + (size_t)c];
            if (isnan(x)) continue;
            if (x <= 0)
                snprintf(col, sizeof col, "#ffffff");
            else
                viridis((log10(x) - log10(lo)) / (log10(hi) - log10(lo)), col);
            fprintf(
                f,
                "<rect class=\"cell\" x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\" "
                "stroke=\"#eee\" stroke-width=\"0.5\"><title>",
                lw + c * cw, top + r * cell_h, cw + 0.2, cell_h, col);
            report_escape(f, rows[r]);
            fprintf(f, " step %g: %.3g</title></rect>", cols[c], x);
        }
        fputc('\n', f);
    }
    int y0 = top + nrows * cell_h;
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#444\"/>",
            lw, top, plot_w, nrows * cell_h);
    for (int c = 0; c<ncols; c += ncols> 8 ? (ncols + 7) / 8 : 1)
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" font-size=\"10\">%g</text>",
                lw + (c + 0.5) * cw, y0 + 14, cols[c]);
    fprintf(f, "<text class=\"xlabel\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">", lw + plot_w / 2,
            y0 + 32);
    report_escape(f, xlabel);
    fprintf(f,
            "</text><text class=\"ylabel\" transform=\"translate(14 %d) rotate(-90)\" "
            "text-anchor=\"middle\">",
            top + nrows * cell_h / 2);
    report_escape(f, ylabel);
    fputs("</text>\n", f);
    /* the colour scale, by decade */
    int bx = lw + plot_w + 30, nd = (int)lround(log10(hi) - log10(lo));
    for (int i = 0; i < 32; i++) {
        viridis(1 - i / 31.0, col);
        fprintf(
            f,
            "<rect class=\"scale\" x=\"%d\" y=\"%.1f\" width=\"%d\" height=\"%.1f\" fill=\"%s\"/>",
            bx, top + i * (nrows * cell_h) / 32.0, bar, (nrows * cell_h) / 32.0 + 0.5, col);
    }
    for (int d = 0; d <= nd; d += nd > 6 ? 2 : 1)
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" font-size=\"10\">1e%d</text>", bx + bar + 4,
                top + (nrows * cell_h) * (1 - (double)d / (nd ? nd : 1)) + 4,
                (int)lround(log10(lo)) + d);
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"10\">%s (log scale; white: 0)</text></svg>\n",
            lw, y0 + 48, unit);
}

void report_bar_chart(FILE *f, const char *title, const char *ylabel, const char *const *cats,
                      int ncats, const char *const *names, int nruns, const double *v)
{
    frame fr = {0, ncats, 0, 0, false, W, H};
    double minpos = INFINITY;
    for (int i = 0; i < ncats * nruns; i++)
        if (isfinite(v[i])) {
            fr.y1 = fmax(fr.y1, v[i]);
            if (v[i] > 0) minpos = fmin(minpos, v[i]);
        }
    if (fr.y1 <= 0) fr.y1 = 1;
    if (minpos < INFINITY && fr.y1 / minpos > 100) { /* spans decades: log axis */
        fr.logy = true;
        fr.y0 = pow(10, floor(log10(minpos)));
        fr.y1 = pow(10, ceil(log10(fr.y1)));
    } else {
        fr.y1 *= 1.08;
    }
    open_svg(f, W, H, "bars", title);
    int x0 = ML, x1 = W - MR, y0 = H - MB;
    fprintf(f,
            "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#444\"/>\n",
            x0, MT, x1 - x0, y0 - MT);
    yticks(f, &fr);
    double gw = (double)(x1 - x0) / ncats, bw = gw * 0.8 / (nruns ? nruns : 1);
    for (int c = 0; c < ncats; c++) {
        for (int r = 0; r < nruns; r++) {
            double val = v[r * ncats + c];
            if (!isfinite(val) || (fr.logy && val <= 0)) continue;
            double bx = x0 + c * gw + gw * 0.1 + r * bw;
            fprintf(f,
                    "<rect class=\"bar\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                    "fill=\"%s\">"
                    "<title>",
                    bx, py(&fr, val), bw, y0 - py(&fr, val), report_colour(r));
            report_escape(f, cats[c]);
            fprintf(f, ": %.1f</title></rect>", val);
        }
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" font-size=\"10\">",
                x0 + (c + 0.5) * gw, y0 + 16);
        report_escape(f, cats[c]);
        fputs("</text>\n", f);
    }
    fprintf(f,
            "<text class=\"xlabel\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">memory "
            "category</text>",
            (x0 + x1) / 2, H - 12);
    fprintf(f,
            "<text class=\"ylabel\" transform=\"translate(16 %d) rotate(-90)\" "
            "text-anchor=\"middle\">",
            (y0 + MT) / 2);
    report_escape(f, ylabel);
    fputs(fr.logy ? " (log scale)</text>\n" : "</text>\n", f);
    for (int r = 0; r < nruns; r++)
        legend_entry(f, &fr, r, names[r], report_colour(r), false, false);
    fputs("</svg>\n", f);
}
