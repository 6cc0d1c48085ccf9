/* loss.c - losses in float32 with float64 sums, whatever the prediction's
 * dtype, and their gradients (times the loss scale) in the gradient's dtype.
 * Cross-entropies on probabilities follow Keras: probabilities are
 * renormalised and clipped to [1e-7, 1 - 1e-7]; from logits they use a
 * stable log-sum-exp. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

#define EPS 1e-7f

static const char *const loss_names[] = {"sparse_categorical_crossentropy",
                                         "categorical_crossentropy", "binary_crossentropy",
                                         "mean_squared_error"};

const char *mp_loss_name(mp_loss_kind k) { return (unsigned)k < 4 ? loss_names[k] : "unknown"; }

mp_status mp_loss_from_name(const char *name, mp_loss_kind *out)
{
    for (int i = 0; name && i < 4; i++)
        if (!strcmp(name, loss_names[i])) {
            *out = (mp_loss_kind)i;
            return MP_OK;
        }
    if (name && !strcmp(name, "mse")) {
        *out = MP_LOSS_MEAN_SQUARED_ERROR;
        return MP_OK;
    }
    return mp_set_error(MP_ERR_INVALID,
                        "unknown loss '%s' (expected sparse_categorical_crossentropy, "
                        "categorical_crossentropy, binary_crossentropy or mean_squared_error)",
                        name ? name : "(null)");
}

static float clampf(float x, float lo, float hi) { return x < lo ? lo : x > hi ? hi : x; }

/* One row of a categorical cross-entropy. t: target distribution (NULL for
 * sparse, label y). Writes dL/dpred (unscaled, for this row) into g; e:
 * cols doubles of scratch. From logits, each element's exp(p - max) is
 * taken once, kept in e for the softmax of the gradient, e / sum (gpt_mini's
 * 4096 x 256 logits: a second exp, of p - log-sum-exp, was half the loss's
 * time). */
static double ce_row(const float *p, const float *t, int32_t y, int64_t cols, bool logits, float *g,
                     double *e)
{
    double loss = 0;
    if (logits) {
        float mx = -INFINITY;
        for (int64_t c = 0; c < cols; c++) mx = p[c] > mx ? p[c] : mx;
        double se = 0;
        for (int64_t c = 0; c < cols; c++) {
            e[c] = exp((double)p[c] - mx);
            se += e[c];
        }
        double lse = log(se) + mx, tsum = 0;
        for (int64_t c = 0; c < cols; c++) {
            double tc = t ? t[c] : (c == y);
            tsum += tc;
            if (tc != 0) loss += tc * (lse - p[c]);
        }
        for (int64_t c = 0; c < cols; c++)
            g[c] = (float)(tsum * (e[c] / se) - (t ? t[c] : (c == y)));
        return loss;
    }
    double s = 0;
    for (int64_t c = 0; c < cols; c++) s += p[c];
    /* L = -sum t_c log(clip(q_c)), q = p / s; dL/dp_j = (dL/dq_j - sum_c dL/dq_c q_c) / s */
    double dot = 0;
    for (int64_t c = 0; c < cols; c++) {
        float q = (float)(p[c] / s), qc = clampf(q, EPS, 1.0f - EPS);
        double tc = t ? t[c] : (c == y);
        double dq = 0;
        if (tc != 0) {
            loss -= tc * log(qc);
            if (q == qc) dq = -tc / q;
        }
        g[c] = (float)dq;
        dot += dq * q;
    }
    for (int64_t c = 0; c < cols; c++) g[c] = (float)((g[c] - dot) / s);
    return loss;
}

/* Row r of the prediction (and of the target, unless sparse) in float32. */
static void load_row(const mp_loss_spec *spec, const mp_tensor *pred, size_t ps, int64_t r,
                     int64_t cols, float *p, float *t)
{
    mp_convert(p, MP_F32, (const char *)pred->data + (size_t)(r * cols) * ps, pred->dtype,
               (size_t)cols);
    if (spec->kind != MP_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY)
        mp_convert(t, MP_F32,
                   (const char *)spec->target->data +
                       (size_t)(r * cols) * mp_dtype_size(spec->target->dtype),
                   spec->target->dtype, (size_t)cols);
}

/* A categorical cross-entropy's row r: its loss, and its gradient in g. */
static double loss_row(const mp_loss_spec *spec, const mp_tensor *pred, size_t ps, int64_t r,
                       int64_t cols, float *p, float *t, float *g, double *e)
{
    load_row(spec, pred, ps, r, cols, p, t);
    if (spec->kind == MP_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY)
        return ce_row(p, NULL, spec->labels[r], cols, spec->from_logits, g, e);
    return ce_row(p, t, 0, cols, spec->from_logits, g, e);
}

/* Row r's gradient times k (the loss scale over the mean's count) into grad. */
static void store_grad(mp_tensor *grad, int64_t r, int64_t cols, float *g, float k)
{
    for (int64_t c = 0; c < cols; c++) g[c] *= k;
    mp_convert((char *)grad->data + (size_t)(r * cols) * mp_dtype_size(grad->dtype), grad->dtype, g,
               MP_F32, (size_t)cols);
}

mp_status mp_loss_compute(const mp_loss_spec *spec, const mp_tensor *pred, float scale, float *loss,
                          mp_tensor *grad)
{
    if (!spec || !pred || !pred->data || pred->ndim < 1)
        return mp_set_error(MP_ERR_INVALID, "loss: missing prediction");
    if ((unsigned)spec->kind > MP_LOSS_MEAN_SQUARED_ERROR)
        return mp_set_error(MP_ERR_INVALID, "loss: unknown kind %d", (int)spec->kind);
    int64_t n = mp_tensor_numel(pred), cols = pred->shape[pred->ndim - 1];
    int64_t rows = cols ? n / cols : 0;
    char a[128], b[128];
    if (grad && (mp_tensor_numel(grad) != n || !grad->data))
        return mp_set_error(MP_ERR_INVALID, "loss: gradient %s does not match prediction %s",
                            mp_tensor_describe(grad, a, sizeof a),
                            mp_tensor_describe(pred, b, sizeof b));
    bool sparse = spec->kind == MP_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY;
    if (sparse) {
        if (!spec->labels)
            return mp_set_error(MP_ERR_INVALID, "loss %s: no labels", mp_loss_name(spec->kind));
        for (int64_t r = 0; r < rows; r++)
            if (spec->labels[r] < 0 || spec->labels[r] >= cols)
                return mp_set_error(
                    MP_ERR_INVALID, "loss %s: label %d of sample %lld outside [0, %lld)",
                    mp_loss_name(spec->kind), (int)spec->labels[r], (long long)r, (long long)cols);
    } else if (!spec->target || mp_tensor_numel(spec->target) != n || !spec->target->data) {
        return mp_set_error(MP_ERR_INVALID, "loss %s: target %s does not match prediction %s",
                            mp_loss_name(spec->kind),
                            spec->target ? mp_tensor_describe(spec->target, a, sizeof a) : "(none)",
                            mp_tensor_describe(pred, b, sizeof b));
    }
    size_t ps = mp_dtype_size(pred->dtype);
    /* mean over samples for the categorical losses, over elements otherwise */
    double mean_rows = spec->mean_rows > 0 ? (double)spec->mean_rows : (double)rows;
    const bool categorical = spec->kind <= MP_LOSS_CATEGORICAL_CROSSENTROPY;
    double denom = categorical ? mean_rows : mean_rows * (double)cols;
    const float k = (float)((double)scale / denom);
    double total = 0;
    if (categorical) {
        /* A row's loss is one term of the total: rows run in parallel
         * (gpt_mini's 4096 x 256 logits took 16 ms on one thread, two
         * float64 exps an element) and the terms are added in row order,
         * the sum one loop over the rows gives. */
        double *terms = rows > 0 ? mp_scratch(9, (size_t)rows * sizeof *terms) : NULL;
        if (rows > 0 && !terms) return mp_set_error(MP_ERR_NOMEM, "loss: out of memory");
        int failed = 0;
#pragma omp parallel if (rows * cols >= 65536)
        {
            float *p = mp_scratch(3, (size_t)cols * sizeof *p),
                  *t = mp_scratch(4, (size_t)cols * sizeof *t),
                  *g = mp_scratch(5, (size_t)cols * sizeof *g);
            double *e = mp_scratch(6, (size_t)cols * sizeof *e);
            if (!p || !t || !g || !e) {
#pragma omp atomic write
                failed = 1;
            }
#pragma omp for schedule(static)
            for (int64_t r = 0; r < rows; r++) {
                if (!p || !t || !g || !e) continue;
                terms[r] = loss_row(spec, pred, ps, r, cols, p, t, g, e);
                if (grad) store_grad(grad, r, cols, g, k);
            }
        }
        if (failed) return mp_set_error(MP_ERR_NOMEM, "loss: out of memory");
        for (int64_t r = 0; r < rows; r++) total += terms[r];
    } else {
        /* every element is a term, summed in order across rows */
        float *p = mp_scratch(3, (size_t)cols * sizeof *p),
              *t = mp_scratch(4, (size_t)cols * sizeof *t);
        float *g = mp_scratch(5, (size_t)cols * sizeof *g);
        if (!p || !t || !g) return mp_set_error(MP_ERR_NOMEM, "loss: out of memory");
        for (int64_t r = 0; r < rows; r++) {
            load_row(spec, pred, ps, r, cols, p, t);
            if (spec->kind == MP_LOSS_BINARY_CROSSENTROPY) {
                for (int64_t c = 0; c < cols; c++) {
                    if (spec->from_logits) {
                        double z = p[c];
                        total += (z > 0 ? z : 0) - z * t[c] + log1p(exp(-fabs(z)));
                        g[c] = (float)(1.0 / (1.0 + exp(-z)) - t[c]);
                    } else {
                        float q = clampf(p[c], EPS, 1.0f - EPS);
                        total -= t[c] * log(q) + (1.0 - t[c]) * log(1.0 - q);
                        g[c] = q == p[c] ? (float)(((double)q - t[c]) / ((double)q * (1.0 - q)))
                                         : 0.0f;
                    }
                }
            } else { /* MP_LOSS_MEAN_SQUARED_ERROR */
                for (int64_t c = 0; c < cols; c++) {
                    double d = (double)p[c] - t[c];
                    total += d * d;
                    g[c] = (float)(2.0 * d);
                }
            }
            if (grad) store_grad(grad, r, cols, g, k);
        }
    }
    if (loss) *loss = (float)(total / denom);
    return MP_OK;
}
