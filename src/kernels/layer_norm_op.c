/* layer_norm_op.c - layer normalisation's kernels (mp_op_layer_norm and its
 * gradient, ops.h): each row's mean and variance in float64 from the
 * float32 values, normalised in float32 and rounded once to the output
 * dtype; the parameter gradients as column sums in float64, each thread a
 * strip of columns summed over the rows in order (the same bits for any
 * thread count). */
#include <math.h>
#include <string.h>

#include "kernels/ops.h"
#include "kernels/ops_io.h"

/* One row into layer norm's parameter gradients: dg += dy * x_hat, db += dy. */
MP_SIMD_CLONES static void add_norm_row(double *restrict dg, double *restrict db,
                                        const float *restrict x, const float *restrict dy,
                                        float mean, float rstd, int64_t w)
{
#pragma omp simd
    for (int64_t c = 0; c < w; c++) {
        float h = (x[c] - mean) * rstd;
        dg[c] += (double)dy[c] * h;
        db[c] += dy[c];
    }
}

/* Row statistics in float64, in LANES interleaved partial sums (element c
 * goes to lane c % LANES) added up in lane order at the end: a fixed order,
 * so the same bits on every run and thread count, and loops the compiler
 * vectorizes (one running sum would chain every add on the last). */
#define LANES 8

/* The body of a row statistic: eight named lanes (so they stay in
 * registers and the adds vectorize), element i to lane i % 8, the tail
 * too, then the lanes added in order. */
#define LANE_SUM(n, T)                                                                             \
    double a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;                         \
    int64_t c = 0;                                                                                 \
    for (; c + LANES <= (n); c += LANES) {                                                         \
        a0 += T(c);                                                                                \
        a1 += T(c + 1);                                                                            \
        a2 += T(c + 2);                                                                            \
        a3 += T(c + 3);                                                                            \
        a4 += T(c + 4);                                                                            \
        a5 += T(c + 5);                                                                            \
        a6 += T(c + 6);                                                                            \
        a7 += T(c + 7);                                                                            \
    }                                                                                              \
    double *lane[LANES] = {&a0, &a1, &a2, &a3, &a4, &a5, &a6, &a7};                                \
    for (int j = 0; c + j < (n); j++) *lane[j] += T(c + j);                                        \
    return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7

MP_SIMD_CLONES static double row_sum(const float *x, int64_t n)
{
#define T(i) (double)x[i]
    LANE_SUM(n, T);
#undef T
}

MP_SIMD_CLONES static double row_dot(const float *x, const float *y, int64_t n)
{
#define T(i) (double)x[i] * y[i]
    LANE_SUM(n, T);
#undef T
}

MP_SIMD_CLONES static double row_sq_dev(const float *x, double mu, int64_t n)
{
#define T(i) ((double)x[i] - mu) * ((double)x[i] - mu)
    LANE_SUM(n, T);
#undef T
}

/* The elementwise parts of layer norm, in every vector width (the same
 * arithmetic element by element, so the same bits). o may be x. */
MP_SIMD_CLONES static void norm_row(const float *x, float m, float rs, const float *gamma,
                                    const float *beta, float *o, int64_t n)
{
#pragma omp simd
    for (int64_t c = 0; c < n; c++) o[c] = (x[c] - m) * rs * gamma[c] + beta[c];
}

/* x_hat and the gradient w.r.t. the normalised value, gamma * dy. */
MP_SIMD_CLONES static void norm_grad_in(const float *restrict x, const float *restrict dy, float m,
                                        float rs, const float *restrict gamma, float *restrict xh,
                                        float *restrict g, int64_t n)
{
#pragma omp simd
    for (int64_t c = 0; c < n; c++) {
        xh[c] = (x[c] - m) * rs;
        g[c] = dy[c] * gamma[c];
    }
}

/* dx = rstd (g - mean(g) - x_hat mean(g x_hat)); o may be g. */
MP_SIMD_CLONES static void norm_grad_out(const float *g, const float *xh, float rs, float md,
                                         float mdx, float *o, int64_t n)
{
#pragma omp simd
    for (int64_t c = 0; c < n; c++) o[c] = rs * (g[c] - md - xh[c] * mdx);
}

/* Row r of mp_op_layer_norm, through xb and yb (cols floats each). */
static inline void layer_norm_row(const void *x, mp_dtype xt, const float *gamma, const float *beta,
                                  float eps, void *y, mp_dtype yt, float *mean, float *rstd,
                                  int64_t cols, float *xb, float *yb, int64_t r)
{
    const size_t off = (size_t)(r * cols);
    const float *xv = view(xb, x, xt, off, (size_t)cols);
    double mu = row_sum(xv, cols) / (double)cols, s2 = row_sq_dev(xv, mu, cols);
    float m = (float)mu, rs = (float)(1.0 / sqrt(s2 / (double)cols + (double)eps));
    mean[r] = m;
    rstd[r] = rs;
    float *o = out_at(yb, y, yt, off);
    norm_row(xv, m, rs, gamma, beta, o, cols);
    if (yt != MP_F32) store(y, yt, off, o, (size_t)cols);
}

void mp_op_layer_norm(const void *x, mp_dtype xt, const float *gamma, const float *beta, float eps,
                      void *y, mp_dtype yt, float *mean, float *rstd, int64_t rows, int64_t cols)
{
    if (rows * cols <= 65536) { /* a plain loop: see PAR_FOR */
        float *xb = mp_scratch(3, (size_t)cols * sizeof *xb),
              *yb = mp_scratch(4, (size_t)cols * sizeof *yb);
        for (int64_t r = 0; r < rows; r++)
            layer_norm_row(x, xt, gamma, beta, eps, y, yt, mean, rstd, cols, xb, yb, r);
        return;
    }
#pragma omp parallel
    {
        float *xb = mp_scratch(3, (size_t)cols * sizeof *xb),
              *yb = mp_scratch(4, (size_t)cols * sizeof *yb);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++)
            layer_norm_row(x, xt, gamma, beta, eps, y, yt, mean, rstd, cols, xb, yb, r);
    }
}

/* Two passes: rows in parallel for dx, then column strips in parallel for
 * dgamma and dbeta (x normalised again on the way, by the same formula). */
void mp_op_layer_norm_grad(const void *x, mp_dtype xt, const float *gamma, const float *mean,
                           const float *rstd, const void *dy, mp_dtype dyt, void *dx, mp_dtype dxt,
                           float *dgamma, float *dbeta, bool accumulate, int64_t rows, int64_t cols)
{
    const bool par = rows * cols > 65536;
#pragma omp parallel if (par)
    {
        float *xb = mp_scratch(3, (size_t)cols * sizeof *xb),
              *gb = mp_scratch(4, (size_t)cols * sizeof *gb),
              *xh = mp_scratch(5, (size_t)cols * sizeof *xh),
              *g = mp_scratch(6, (size_t)cols * sizeof *g);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const size_t off = (size_t)(r * cols);
            const float *xv = view(xb, x, xt, off, (size_t)cols),
                        *gv = view(gb, dy, dyt, off, (size_t)cols);
            norm_grad_in(xv, gv, mean[r], rstd[r], gamma, xh, g, cols);
            const double sum_d = row_sum(g, cols), sum_dx = row_dot(g, xh, cols);
            float md = (float)(sum_d / (double)cols), mdx = (float)(sum_dx / (double)cols);
            float *o = out_at(g, dx, dxt, off);
            norm_grad_out(g, xh, rstd[r], md, mdx, o, cols);
            if (dxt != MP_F32) store(dx, dxt, off, o, (size_t)cols);
        }
    }
#pragma omp parallel if (par)
    {
        int64_t c0, c1;
        mp_op_my_columns(cols, &c0, &c1);
        const int64_t w = c1 - c0;
        double *dg = mp_scratch(3, (size_t)cols * sizeof *dg),
               *db = mp_scratch(4, (size_t)cols * sizeof *db);
        float *xb = mp_scratch(5, (size_t)cols * sizeof *xb),
              *gb = mp_scratch(6, (size_t)cols * sizeof *gb);
        if (w > 0) {
            memset(dg, 0, (size_t)w * sizeof *dg);
            memset(db, 0, (size_t)w * sizeof *db);
            for (int64_t r = 0; r < rows; r++) {
                const size_t off = (size_t)(r * cols + c0), next = off + (size_t)cols;
                add_norm_row(dg, db, view_at(xb, x, xt, off, (size_t)w, next),
                             view_at(gb, dy, dyt, off, (size_t)w, next), mean[r], rstd[r], w);
            }
            for (int64_t c = 0; c < w; c++) {
                dgamma[c0 + c] = (float)((accumulate ? (double)dgamma[c0 + c] : 0.0) + dg[c]);
                dbeta[c0 + c] = (float)((accumulate ? (double)dbeta[c0 + c] : 0.0) + db[c]);
            }
        }
    }
}
