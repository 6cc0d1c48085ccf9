/* tune.c - automatic per-layer precision (mixprec/tune.h): the candidates'
 * quantizers and the error they give a tensor, the choice rule, and the
 * probe - a float32 model run forward and backward on a few batches while
 * every layer with a kernel has its activation, kernels and output
 * gradient measured under each candidate. The JSON in and out, the table
 * and the file writing are in tune_config.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn/layer.h"
#include "train/train_internal.h"
#include "train/tune_internal.h"

/* ------------------------------------------------------------ formats */

static const char *const format_names[MP_TUNE_FORMAT_COUNT] = {
    "float32", "bfloat16", "float16", "fp8", "mxfp8", "mxfp6", "mxfp4"};

const char *mp_tune_format_name(mp_tune_format f)
{
    return (unsigned)f < MP_TUNE_FORMAT_COUNT ? format_names[f] : "unknown";
}

mp_status mp_tune_format_from_name(const char *name, mp_tune_format *out)
{
    for (int f = 0; name && f < MP_TUNE_FORMAT_COUNT; f++)
        if (!strcmp(name, format_names[f])) {
            *out = (mp_tune_format)f;
            return MP_OK;
        }
    return mp_set_error(MP_ERR_INVALID,
                        "unknown candidate format '%s' (expected float32, bfloat16, float16, fp8, "
                        "mxfp8, mxfp6 or mxfp4)",
                        name ? name : "(null)");
}

mp_status mp_tune_formats_from_list(const char *list, unsigned *mask)
{
    unsigned m = 0;
    const char *p = list ? list : "";
    char name[32];
    for (;;) {
        size_t n = strcspn(p, ",");
        if (n >= sizeof name) n = sizeof name - 1;
        memcpy(name, p, n);
        name[n] = 0;
        mp_tune_format f;
        if (mp_tune_format_from_name(name, &f)) return MP_ERR_INVALID;
        m |= 1u << f;
        p += strcspn(p, ",");
        if (!*p++) break;
    }
    *mask = m;
    return MP_OK;
}

double mp_tune_format_bytes(mp_tune_format f)
{
    static const double bytes[MP_TUNE_FORMAT_COUNT] = {
        4.0, 2.0, 2.0, 1.0, 1.0 + 1.0 / 32, 0.75 + 1.0 / 32, 0.5 + 1.0 / 32};
    return (unsigned)f < MP_TUNE_FORMAT_COUNT ? bytes[f] : NAN;
}

/* The MX element format a candidate gives a role. */
static mp_mx_format mx_format(mp_tune_format f, mp_tune_role role)
{
    if (role == MP_TUNE_GRADIENT) return MP_MXFP8_E5M2;
    return f == MP_TUNE_MXFP8 ? MP_MXFP8_E4M3 : f == MP_TUNE_MXFP6 ? MP_MXFP6_E2M3 : MP_MXFP4_E2M1;
}

const char *mp_tune_mx_name(mp_tune_format f) { return mp_mx_format_name(mx_format(f, 0)); }

static bool is_mx(mp_tune_format f) { return f >= MP_TUNE_MXFP8 && f <= MP_TUNE_MXFP4; }

/* ---------------------------------------------------- one tensor's error */

/* q (the quantized values, each divided by div) against x. */
static void accumulate(const float *x, const float *q, double div, size_t n, tune_acc *a)
{
    for (size_t i = 0; i < n; i++) {
        double v = x[i], w = (double)q[i] / div;
        if (!isfinite(v)) {
            a->nonfinite = true;
            continue;
        }
        a->err2 += (w - v) * (w - v);
        a->norm2 += v * v;
        if (v != 0.0) {
            a->nonzero++;
            a->flushed += w == 0.0;
        }
    }
}

mp_status mp_tune_measure(mp_tune_format f, mp_tune_role role, int64_t rows, int64_t cols,
                          const float *x, float *amax_hist, tune_acc acc[2])
{
    size_t n = (size_t)(rows * cols);
    if (f == MP_TUNE_FLOAT32 || n == 0) {
        accumulate(x, x, 1.0, n, &acc[0]);
        accumulate(x, x, 1.0, n, &acc[1]);
        return MP_OK;
    }
    float *q = malloc(n * sizeof *q);
    void *codes = malloc(n * 2);
    if (!q || !codes) {
        free(q);
        free(codes);
        return mp_set_error(MP_ERR_NOMEM, "tune-precision: out of memory for a %lldx%lld tensor",
                            (long long)rows, (long long)cols);
    }
    mp_status s = MP_OK;
    if (f == MP_TUNE_BFLOAT16 || f == MP_TUNE_FLOAT16) {
        mp_dtype t = f == MP_TUNE_BFLOAT16 ? MP_BF16 : MP_F16;
        mp_convert(codes, t, x, MP_F32, n);
        mp_convert(q, MP_F32, codes, t, n);
        accumulate(x, q, 1.0, n, &acc[0]);
        acc[1] = acc[0];
    } else if (f == MP_TUNE_FP8) { /* the largest amax so far: delayed scaling's max */
        mp_dtype t = role == MP_TUNE_GRADIENT ? MP_F8E5M2 : MP_F8E4M3;
        float amax = mp_float8_amax(x, MP_F32, n);
        if (amax_hist) {
            if (isfinite(amax) && amax < *amax_hist) amax = *amax_hist;
            *amax_hist = amax;
        }
        float scale = mp_float8_scale(amax, 1.0f, t, 0);
        mp_float8_quantize(codes, t, x, MP_F32, n, scale);
        mp_convert(q, MP_F32, codes, t, n);
        accumulate(x, q, (double)scale, n, &acc[0]);
        acc[1] = acc[0];
    } else {
        for (int axis = 0; axis < 2 && !s; axis++) {
            s = mp_mx_quantize_2d(mx_format(f, role), MP_MX_BLOCK, rows, cols, axis, x, q, MP_F32);
            if (!s) accumulate(x, q, 1.0, n, &acc[axis]);
        }
    }
    free(q);
    free(codes);
    return s;
}

/* One accumulator's figures. */
static void acc_result(const tune_acc *a, double *rel, double *flush)
{
    if (a->nonfinite) {
        *rel = *flush = NAN;
        return;
    }
    *rel = a->norm2 > 0 ? sqrt(a->err2 / a->norm2) : 0.0;
    *flush = a->nonzero ? (double)a->flushed / (double)a->nonzero : 0.0;
}

/* The worse of the two axes (NaN wins). */
void mp_tune_acc_result(const tune_acc acc[2], double *rel, double *flush)
{
    double r[2], fl[2];
    acc_result(&acc[0], &r[0], &fl[0]);
    acc_result(&acc[1], &r[1], &fl[1]);
    *rel = isnan(r[0]) || r[0] >= r[1] ? r[0] : r[1];
    *flush = isnan(fl[0]) || fl[0] >= fl[1] ? fl[0] : fl[1];
}

mp_status mp_tune_tensor_error(mp_tune_format f, mp_tune_role role, int64_t rows, int64_t cols,
                               const float *x, double *rel, double *flush)
{
    if ((unsigned)f >= MP_TUNE_FORMAT_COUNT)
        return mp_set_error(MP_ERR_INVALID, "tune-precision: format %d is not a candidate", (int)f);
    if ((unsigned)role >= MP_TUNE_ROLES)
        return mp_set_error(MP_ERR_INVALID, "tune-precision: role %d is not a tensor role",
                            (int)role);
    if (rows < 0 || cols < 0 || (rows * cols > 0 && !x))
        return mp_set_error(MP_ERR_INVALID, "tune-precision: a %lldx%lld tensor without data",
                            (long long)rows, (long long)cols);
    tune_acc acc[2];
    memset(acc, 0, sizeof acc);
    mp_status s = mp_tune_measure(f, role, rows, cols, x, NULL, acc);
    if (s) return s;
    double r, fl;
    mp_tune_acc_result(acc, &r, &fl);
    if (rel) *rel = r;
    if (flush) *flush = fl;
    return MP_OK;
}

/* ------------------------------------------------------------ the rule */

mp_tune_format mp_tune_choose(const double errors[MP_TUNE_FORMAT_COUNT], unsigned eligible,
                              double budget)
{
    /* cheapest first; at equal cost bfloat16 (the model's own policy, no
     * loss scaling needed) before float16, fp8 (no scale bytes) before MXFP8 */
    static const mp_tune_format order[MP_TUNE_FORMAT_COUNT] = {
        MP_TUNE_MXFP4,    MP_TUNE_MXFP6,   MP_TUNE_FP8,    MP_TUNE_MXFP8,
        MP_TUNE_BFLOAT16, MP_TUNE_FLOAT16, MP_TUNE_FLOAT32};
    for (int i = 0; i < MP_TUNE_FORMAT_COUNT; i++) {
        mp_tune_format f = order[i];
        if ((eligible & (1u << f)) && errors[f] <= budget) return f; /* false for NaN */
    }
    return MP_TUNE_FLOAT32;
}

/* ---------------------------------------------------------- options */

mp_tune_options mp_tune_options_default(void)
{
    return (mp_tune_options){.budget = MP_TUNE_DEFAULT_BUDGET,
                             .probe_batches = 4,
                             .batch_size = 32,
                             .seed = 1,
                             .candidates = MP_TUNE_ALL_FORMATS,
                             .keep_first_last = true,
                             .trainable_only = true,
                             .weights = NULL,
                             .from_logits = false};
}

mp_status mp_tune_options_validate(const mp_tune_options *o)
{
    if (!(o->budget > 0.0) || !isfinite(o->budget))
        return mp_set_error(MP_ERR_INVALID,
                            "tune-precision: budget %g must be a finite relative error > 0",
                            o->budget);
    if (o->probe_batches < 1 || o->probe_batches > 1000)
        return mp_set_error(MP_ERR_INVALID, "tune-precision: probe batches %d outside 1..1000",
                            o->probe_batches);
    if (o->batch_size < 1 || o->batch_size > (1 << 20))
        return mp_set_error(MP_ERR_INVALID, "tune-precision: batch size %lld outside 1..%d",
                            (long long)o->batch_size, 1 << 20);
    if (o->candidates & ~MP_TUNE_ALL_FORMATS)
        return mp_set_error(MP_ERR_INVALID, "tune-precision: candidate mask 0x%x names no format",
                            o->candidates);
    return MP_OK;
}

bool mp_tune_format_trainable(mp_tune_format f)
{
    if (!is_mx(f)) return (unsigned)f < MP_TUNE_FORMAT_COUNT;
    char text[512];
    snprintf(text, sizeof text,
             "{\"format\": \"mixprec.model\", \"version\": 2, \"policy\": \"mixed_bfloat16\", "
             "\"layers\": [{\"class_name\": \"InputLayer\", \"name\": \"x\", \"inputs\": [], "
             "\"shape\": [32]}, {\"class_name\": \"Dense\", \"name\": \"d\", \"inputs\": "
             "[\"x\"], \"units\": 32, \"mx\": \"%s\"}]}",
             mp_tune_mx_name(f));
    char saved[512];
    snprintf(saved, sizeof saved, "%s", mp_last_error()); /* a probe, not an error */
    mp_model *m = NULL;
    bool ok = mp_model_from_config(text, 1, INT64_MAX, &m) == MP_OK;
    mp_model_free(m);
    mp_set_error(MP_OK, "%s", saved);
    return ok;
}

/* ------------------------------------------------------------ the probe */

/* The layers with a kernel: index and eligible formats. */
static int find_tuned(const mp_model *m, const mp_tune_options *o, int *idx, mp_tune_layer *rows)
{
    int n = 0;
    unsigned trainable = ~0u;
    for (int f = 0; o->trainable_only && f < MP_TUNE_FORMAT_COUNT; f++)
        if (!mp_tune_format_trainable((mp_tune_format)f)) trainable &= ~(1u << f);
    for (int i = 0; i < m->nlayers; i++) {
        const mp_layer *l = &m->layers[i];
        const mp_model_param *k = NULL;
        int64_t weights = 0;
        for (int j = 0; j < l->nparams; j++) {
            const mp_model_param *p = &m->params[l->param_first + j].p;
            if (p->role != MP_ROLE_KERNEL) continue;
            if (!k) k = p;
            weights += p->n;
        }
        if (!k || !l->reachable || l->ninputs < 1) continue;
        mp_tune_layer *r = &rows[n];
        memset(r, 0, sizeof *r);
        snprintf(r->name, sizeof r->name, "%s", l->name);
        snprintf(r->type, sizeof r->type, "%s", l->ops->class_name);
        int len = 0;
        for (int d = 0; d < k->ndim && len < (int)sizeof r->shape; d++)
            len += snprintf(r->shape + len, sizeof r->shape - (size_t)len, "%s%lld", d ? "x" : "",
                            (long long)k->shape[d]);
        r->weights = weights;
        /* fp8 and MX only where the kind's GEMMs take quantized operands */
        unsigned q = (1u << MP_TUNE_FP8) | (1u << MP_TUNE_MXFP8) | (1u << MP_TUNE_MXFP6) |
                     (1u << MP_TUNE_MXFP4);
        r->eligible = (o->candidates | 1u) & (l->ops->float8 ? ~0u : ~q) & trainable;
        idx[n++] = i;
    }
    /* the first and last that could go below 16 bits, as mixed_float8's plan */
    int first = -1, last = -1;
    for (int k = 0; k < n; k++)
        if (m->layers[idx[k]].ops->float8) {
            if (first < 0) first = k;
            last = k;
        }
    unsigned wide = (1u << MP_TUNE_FLOAT32) | (1u << MP_TUNE_BFLOAT16) | (1u << MP_TUNE_FLOAT16);
    if (first >= 0) {
        rows[first].first = rows[last].last = true;
        if (o->keep_first_last) {
            rows[first].eligible &= wide;
            rows[last].eligible &= wide;
        }
    }
    return n;
}

/* A tensor (any float dtype) as a float32 matrix over its last axis. */
static mp_status measure_tensor(const mp_tensor *t, mp_tune_role role, unsigned formats,
                                float *amax_hist, tune_acc acc[MP_TUNE_FORMAT_COUNT][2])
{
    int64_t n = mp_tensor_numel(t), cols = t->ndim ? t->shape[t->ndim - 1] : 1;
    if (n == 0) return MP_OK;
    float *wide = NULL;
    const float *x = t->data;
    if (t->dtype != MP_F32) {
        if (!(wide = malloc((size_t)n * sizeof *wide)))
            return mp_set_error(MP_ERR_NOMEM, "tune-precision: out of memory");
        mp_convert(wide, MP_F32, t->data, t->dtype, (size_t)n);
        x = wide;
    }
    mp_status s = MP_OK;
    for (int f = 0; f < MP_TUNE_FORMAT_COUNT && !s; f++)
        if (formats & (1u << f))
            s = mp_tune_measure((mp_tune_format)f, role, n / cols, cols, x, amax_hist, acc[f]);
    free(wide);
    return s;
}

/* Run the probe batches and fill the layers' errors. */
mp_status mp_tune_probe(mp_model *m, const mp_dataset *data, const mp_tune_options *o, int n,
                        const int *idx, mp_tune_layer *rows, int64_t *samples, double *loss)
{
    int64_t in_shape[MP_MAX_DIMS], dim = 1;
    int in_ndim = mp_model_input_shape(m, in_shape);
    for (int i = 0; i < in_ndim; i++) dim *= in_shape[i];
    if (dim != mp_dataset_dim(data))
        return mp_set_error(MP_ERR_INVALID,
                            "tune-precision: the data has %lld features per sample, the model's "
                            "input takes %lld",
                            (long long)mp_dataset_dim(data), (long long)dim);
    int64_t count = mp_dataset_count(data), bs = o->batch_size;
    int64_t total = (int64_t)o->probe_batches * bs < count ? (int64_t)o->probe_batches * bs : count;
    int64_t ldim = mp_dataset_label_dim(data);
    int64_t *order = malloc((size_t)(count > 0 ? count : 1) * sizeof *order);
    float *x = malloc((size_t)(bs * dim) * sizeof *x);
    int32_t *y = malloc((size_t)(bs * ldim) * sizeof *y);
    tune_acc(*acc)[MP_TUNE_FORMAT_COUNT][MP_TUNE_ROLES][2] = calloc((size_t)n, sizeof *acc);
    /* fp8: the largest amax of the activation and the gradient so far */
    float(*hist)[2] = calloc((size_t)n, sizeof *hist);
    mp_status s = MP_OK;
    if (!order || !x || !y || !acc || !hist) {
        s = mp_set_error(MP_ERR_NOMEM, "tune-precision: out of memory");
        goto done;
    }
    if (count < 1) {
        s = mp_set_error(MP_ERR_INVALID, "tune-precision: the data has no samples");
        goto done;
    }
    if ((s = mp_dataset_order(data, 0, o->seed, true, order))) goto done;
    bool ids = mp_model_input_dtype(m) == MP_I32;
    unsigned formats = MP_TUNE_ALL_FORMATS; /* measured everywhere, chosen where eligible */
    double loss_sum = 0;
    /* kernels: the same in every batch (no optimizer step) */
    for (int k = 0; k < n && !s; k++) {
        const mp_layer *l = &m->layers[idx[k]];
        for (int j = 0; j < l->nparams && !s; j++) {
            const mp_model_param *p = &m->params[l->param_first + j].p;
            if (p->role != MP_ROLE_KERNEL) continue;
            mp_tensor t;
            mp_tensor_wrap(&t, MP_F32, p->ndim, p->shape, p->master ? p->master : p->weight);
            if (!p->master) t.dtype = p->weight_dtype;
            tune_acc w[MP_TUNE_FORMAT_COUNT][2];
            memset(w, 0, sizeof w);
            if ((s = measure_tensor(&t, MP_TUNE_WEIGHT, formats, NULL, w))) break;
            for (int f = 0; f < MP_TUNE_FORMAT_COUNT; f++)
                for (int a = 0; a < 2; a++)
                    mp_tune_acc_add(&acc[k][f][MP_TUNE_WEIGHT][a], &w[f][a]);
        }
    }
    for (int64_t start = 0; start < total && !s; start += bs) {
        int64_t c = total - start < bs ? total - start : bs, shape[MP_MAX_DIMS];
        if ((s = mp_dataset_gather(data, order + start, c, x, y))) break;
        if (ids && (s = mp_features_to_ids(x, c * dim))) break;
        shape[0] = c;
        memcpy(shape + 1, in_shape, (size_t)in_ndim * sizeof *shape);
        mp_tensor t;
        mp_tensor_wrap(&t, ids ? MP_I32 : MP_F32, in_ndim + 1, shape, x);
        const mp_tensor *out;
        mp_loss_spec spec = {MP_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY, o->from_logits, y, NULL, 0};
        float l;
        if ((s = mp_model_forward(m, &t, true, &out)) ||
            (s = mp_model_loss_backward(m, &spec, 1.0f, false, &l)))
            break;
        if (!isfinite(l)) {
            s = mp_set_error(MP_ERR_INVALID,
                             "tune-precision: probe batch %lld has a non-finite float32 loss",
                             (long long)(start / bs + 1));
            break;
        }
        loss_sum += (double)l * (double)c;
        for (int k = 0; k < n && !s; k++) {
            const mp_layer *lay = &m->layers[idx[k]];
            const mp_tensor *a = mp_model_node_output(m, lay->inputs[0]);
            const mp_tensor *g = mp_model_node_grad(m, idx[k]);
            tune_acc r[MP_TUNE_FORMAT_COUNT][2];
            if (a) {
                memset(r, 0, sizeof r);
                if ((s = measure_tensor(a, MP_TUNE_ACTIVATION, formats, &hist[k][0], r))) break;
                for (int f = 0; f < MP_TUNE_FORMAT_COUNT; f++)
                    for (int ax = 0; ax < 2; ax++)
                        mp_tune_acc_add(&acc[k][f][MP_TUNE_ACTIVATION][ax], &r[f][ax]);
                if (start == 0) rows[k].acts = mp_tensor_numel(a) / c * bs;
            }
            if (g) {
                memset(r, 0, sizeof r);
                if ((s = measure_tensor(g, MP_TUNE_GRADIENT, formats, &hist[k][1], r))) break;
                for (int f = 0; f < MP_TUNE_FORMAT_COUNT; f++)
                    for (int ax = 0; ax < 2; ax++)
                        mp_tune_acc_add(&acc[k][f][MP_TUNE_GRADIENT][ax], &r[f][ax]);
            }
        }
    }
    if (s) goto done;
    *samples = total;
    *loss = loss_sum / (double)total;
    for (int k = 0; k < n; k++) {
        mp_tune_layer *r = &rows[k];
        for (int f = 0; f < MP_TUNE_FORMAT_COUNT; f++) {
            double worst = 0;
            bool nan = false;
            for (int role = 0; role < MP_TUNE_ROLES; role++) {
                double rel, fl;
                mp_tune_acc_result(acc[k][f][role], &rel, &fl);
                r->rel[f][role] = rel;
                r->flush[f][role] = fl;
                nan |= isnan(rel) || isnan(fl);
                if (rel > worst) worst = rel;
                if (fl > worst) worst = fl;
            }
            r->error[f] = nan ? NAN : worst;
        }
        if (isnan(r->error[MP_TUNE_FLOAT32])) {
            s = mp_set_error(MP_ERR_INVALID,
                             "tune-precision: layer '%s' has non-finite float32 values in the "
                             "probe",
                             r->name);
            goto done;
        }
        r->chosen = mp_tune_choose(r->error, r->eligible, o->budget);
        r->bytes_saved = (2.0 - mp_tune_format_bytes(r->chosen)) * (double)(r->weights + r->acts);
    }
done:
    free(order);
    free(x);
    free(y);
    free(acc);
    free(hist);
    return s;
}

void mp_tune_acc_add(tune_acc *to, const tune_acc *a)
{
    to->err2 += a->err2;
    to->norm2 += a->norm2;
    to->nonzero += a->nonzero;
    to->flushed += a->flushed;
    to->nonfinite |= a->nonfinite;
}

/* Used by tune_config.c: the tuned layers of a built model. */
int mp_tune_find_layers(const mp_model *m, const mp_tune_options *o, int *idx, mp_tune_layer *rows)
{
    return find_tuned(m, o, idx, rows);
}

bool mp_tune_is_mx(mp_tune_format f) { return is_mx(f); }

bool mp_tune_layer_float8(const mp_model *m, const char *name)
{
    for (int i = 0; i < m->nlayers; i++)
        if (!strcmp(m->layers[i].name, name)) return m->layers[i].ops->float8;
    return false;
}
