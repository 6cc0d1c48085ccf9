/* dataset.c - the in-memory dataset: shared immutable storage with views for
 * the Keras validation split, reproducible per-epoch orders and batch
 * gathering. Two kinds of storage: feature rows with one label each, or a
 * byte text whose samples are windows (inputs text[o, o+T), labels
 * text[o+1, o+T+1)) made on the fly. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "io/io_internal.h"

/* Storage is reference counted so that split views can outlive the dataset
 * they came from (fit frees its input before its views, callers may not). */
typedef struct {
    atomic_long refs;
    float *x;
    int32_t *y;
    uint8_t *text; /* a text dataset's bytes (x and y NULL) */
} storage;

struct mp_dataset {
    storage *st;
    const float *x;
    const int32_t *y;
    int64_t n, dim;
    int32_t classes;
    /* text: this view's bytes, and windows of dim tokens every stride bytes */
    const uint8_t *text;
    int64_t text_len, stride;
};

static void storage_unref(storage *st)
{
    if (!st) return;
    if (atomic_fetch_sub(&st->refs, 1) == 1) {
        mp_free(st->x);
        mp_free(st->y);
        free(st->text);
        free(st);
    }
}

static mp_status make_view(storage *st, int64_t first, int64_t n, int64_t dim, int32_t classes,
                           mp_dataset **out)
{
    mp_dataset *d = calloc(1, sizeof *d);
    if (!d) return mp_set_error(MP_ERR_NOMEM, "dataset: out of memory");
    atomic_fetch_add(&st->refs, 1);
    d->st = st;
    d->x = st->x + first * dim;
    d->y = st->y + first;
    d->n = n;
    d->dim = dim;
    d->classes = classes;
    *out = d;
    return MP_OK;
}

mp_status mp_dataset_adopt(float *x, int32_t *y, int64_t n, int64_t dim, int32_t classes,
                           mp_dataset **out)
{
    *out = NULL;
    storage *st = calloc(1, sizeof *st);
    if (!st) {
        mp_free(x);
        mp_free(y);
        return mp_set_error(MP_ERR_NOMEM, "dataset: out of memory");
    }
    atomic_init(&st->refs, 0);
    st->x = x;
    st->y = y;
    mp_status s = make_view(st, 0, n, dim, classes, out);
    if (s) {
        mp_free(x);
        mp_free(y);
        free(st);
    }
    return s;
}

/* Windows of `context` tokens starting every `stride` bytes of
 * st->text[first, first + len): window w reads [o, o + context + 1) with
 * o = first + w * stride. */
static mp_status make_text_view(storage *st, int64_t first, int64_t len, int64_t context,
                                int64_t stride, mp_dataset **out)
{
    if (len < context + 1)
        return mp_set_error(MP_ERR_INVALID,
                            "a text of %lld bytes holds no window of %lld tokens (that needs "
                            "context + 1 = %lld bytes)",
                            (long long)len, (long long)context, (long long)context + 1);
    mp_dataset *d = calloc(1, sizeof *d);
    if (!d) return mp_set_error(MP_ERR_NOMEM, "dataset: out of memory");
    atomic_fetch_add(&st->refs, 1);
    d->st = st;
    d->text = st->text + first;
    d->text_len = len;
    d->stride = stride;
    d->dim = context;
    d->n = (len - context - 1) / stride + 1;
    d->classes = 256;
    *out = d;
    return MP_OK;
}

mp_status mp_dataset_adopt_text(uint8_t *text, int64_t len, int64_t context, mp_dataset **out)
{
    *out = NULL;
    storage *st = calloc(1, sizeof *st);
    if (!st) {
        free(text);
        return mp_set_error(MP_ERR_NOMEM, "dataset: out of memory");
    }
    atomic_init(&st->refs, 0);
    st->text = text;
    mp_status s = make_text_view(st, 0, len, context, 1, out);
    if (s) {
        free(text);
        free(st);
    }
    return s;
}

mp_status mp_dataset_from_arrays(const float *x, const int32_t *y, int64_t n, int64_t dim,
                                 int32_t classes, mp_dataset **out)
{
    if (!out) return mp_set_error(MP_ERR_INVALID, "mp_dataset_from_arrays: out is NULL");
    *out = NULL;
    if (!x || !y) return mp_set_error(MP_ERR_INVALID, "mp_dataset_from_arrays: x or y is NULL");
    if (n < 1 || dim < 1)
        return mp_set_error(MP_ERR_INVALID,
                            "mp_dataset_from_arrays: need n >= 1 and dim >= 1 (got n=%lld, "
                            "dim=%lld)",
                            (long long)n, (long long)dim);
    if (classes < 0 || classes > MP_DATASET_MAX_CLASSES)
        return mp_set_error(MP_ERR_INVALID, "mp_dataset_from_arrays: classes %d out of range",
                            (int)classes);
    if ((uint64_t)n > SIZE_MAX / sizeof(float) / (uint64_t)dim)
        return mp_set_error(MP_ERR_INVALID, "mp_dataset_from_arrays: %lld x %lld is too large",
                            (long long)n, (long long)dim);
    int32_t maxl = -1;
    for (int64_t i = 0; i < n; i++) {
        if (y[i] < 0 || y[i] >= (classes ? classes : MP_DATASET_MAX_CLASSES))
            return mp_set_error(MP_ERR_INVALID,
                                "mp_dataset_from_arrays: label %d of sample %lld is outside "
                                "[0, %d)",
                                (int)y[i], (long long)i,
                                (int)(classes ? classes : MP_DATASET_MAX_CLASSES));
        if (y[i] > maxl) maxl = y[i];
    }
    size_t nx = (size_t)n * (size_t)dim;
    for (size_t i = 0; i < nx; i++) {
        if (!isfinite(x[i]))
            return mp_set_error(MP_ERR_INVALID,
                                "mp_dataset_from_arrays: feature %lld of sample %lld is %s; "
                                "NaN or infinite data cannot be trained on",
                                (long long)(i % (size_t)dim), (long long)(i / (size_t)dim),
                                isnan(x[i]) ? "NaN" : "infinite");
    }
    float *cx = mp_alloc(nx * sizeof(float), MP_MEM_OTHER);
    int32_t *cy = mp_alloc((size_t)n * sizeof(int32_t), MP_MEM_OTHER);
    if (!cx || !cy) {
        mp_free(cx);
        mp_free(cy);
        return mp_set_error(MP_ERR_NOMEM, "mp_dataset_from_arrays: out of memory for %lld samples",
                            (long long)n);
    }
    memcpy(cx, x, nx * sizeof(float));
    memcpy(cy, y, (size_t)n * sizeof(int32_t));
    return mp_dataset_adopt(cx, cy, n, dim, classes ? classes : maxl + 1, out);
}

void mp_dataset_free(mp_dataset *ds)
{
    if (!ds) return;
    storage_unref(ds->st);
    free(ds);
}

int64_t mp_dataset_count(const mp_dataset *ds) { return ds ? ds->n : 0; }
int64_t mp_dataset_dim(const mp_dataset *ds) { return ds ? ds->dim : 0; }
int32_t mp_dataset_classes(const mp_dataset *ds) { return ds ? ds->classes : 0; }
const float *mp_dataset_features(const mp_dataset *ds) { return ds ? ds->x : NULL; }
const int32_t *mp_dataset_labels(const mp_dataset *ds) { return ds ? ds->y : NULL; }
int64_t mp_dataset_label_dim(const mp_dataset *ds) { return !ds ? 0 : ds->text ? ds->dim : 1; }
const uint8_t *mp_dataset_text(const mp_dataset *ds, int64_t *len)
{
    if (len) *len = ds && ds->text ? ds->text_len : 0;
    return ds ? ds->text : NULL;
}

uint64_t mp_dataset_fingerprint(const mp_dataset *ds)
{
    if (!ds) return 0;
    uint64_t h[4] = {1, 2, 3, 4}; /* four independent lanes */
    if (ds->text) {
        int64_t i = 0, len = ds->text_len;
        for (; i + 4 <= len; i += 4)
            for (int l = 0; l < 4; l++) h[l] = mp_mix64(h[l] ^ ds->text[i + l]);
        for (; i < len; i++) h[0] = mp_mix64(h[0] ^ ds->text[i]);
        h[1] = mp_mix64(h[1] ^ (uint64_t)ds->dim);
        h[2] = mp_mix64(h[2] ^ (uint64_t)ds->stride);
        h[3] = mp_mix64(h[3] ^ 0x74657874u); /* "text": never equal to a feature dataset's */
    } else {
        int64_t nx = ds->n * ds->dim, i = 0;
        const uint32_t *x = (const uint32_t *)ds->x, *y = (const uint32_t *)ds->y;
        for (; i + 4 <= nx; i += 4)
            for (int l = 0; l < 4; l++) h[l] = mp_mix64(h[l] ^ x[i + l]);
        for (; i < nx; i++) h[0] = mp_mix64(h[0] ^ x[i]);
        for (i = 0; i < ds->n; i++) h[1] = mp_mix64(h[1] ^ y[i]);
    }
    return mp_mix64(h[0] ^ mp_mix64(h[1] ^ mp_mix64(h[2] ^ mp_mix64(h[3] ^ (uint64_t)ds->n))));
}

/* A text splits by bytes: the first floor(len * (1 - fraction)) train (in
 * windows every ds->stride bytes), the rest validate in windows that tile it
 * without overlap (each byte is predicted once). */
static mp_status split_text(const mp_dataset *ds, double fraction, mp_dataset **train,
                            mp_dataset **val)
{
    int64_t first = ds->text - ds->st->text;
    if (fraction == 0.0)
        return make_text_view(ds->st, first, ds->text_len, ds->dim, ds->stride, train);
    double keep = 1.0 - fraction;
    double at = floor((double)ds->text_len * keep);
    int64_t split_at = (int64_t)at;
    mp_status s = make_text_view(ds->st, first, split_at, ds->dim, ds->stride, train);
    if (!s)
        s = make_text_view(ds->st, first + split_at, ds->text_len - split_at, ds->dim, ds->dim,
                           val);
    if (s) {
        mp_dataset_free(*train);
        *train = NULL;
        return mp_set_error(MP_ERR_INVALID, "validation_split=%g of a text of %lld bytes: %s",
                            fraction, (long long)ds->text_len, mp_last_error());
    }
    return MP_OK;
}

mp_status mp_dataset_split(const mp_dataset *ds, double fraction, mp_dataset **train,
                           mp_dataset **val)
{
    if (train) *train = NULL;
    if (val) *val = NULL;
    if (!ds || !train || !val)
        return mp_set_error(MP_ERR_INVALID, "mp_dataset_split: NULL argument");
    if (!(fraction >= 0.0 && fraction < 1.0))
        return mp_set_error(MP_ERR_INVALID, "validation_split must be in [0, 1), got %g", fraction);
    if (ds->text) return split_text(ds, fraction, train, val);
    int64_t first = ds->y - ds->st->y; /* where this view starts in storage */
    if (fraction == 0.0) return make_view(ds->st, first, ds->n, ds->dim, ds->classes, train);
    /* Two statements, as Keras evaluates floor(n * (1.0 - split)) in double:
     * no contraction into an fma may change the rounding. */
    double keep = 1.0 - fraction;
    double at = floor((double)ds->n * keep);
    int64_t split_at = (int64_t)at;
    if (split_at <= 0 || split_at >= ds->n)
        return mp_set_error(MP_ERR_INVALID,
                            "the data has %lld samples, which is not enough to split into a "
                            "training and a validation set with validation_split=%g",
                            (long long)ds->n, fraction);
    mp_status s = make_view(ds->st, first, split_at, ds->dim, ds->classes, train);
    if (s) return s;
    s = make_view(ds->st, first + split_at, ds->n - split_at, ds->dim, ds->classes, val);
    if (s) {
        mp_dataset_free(*train);
        *train = NULL;
    }
    return s;
}

int64_t mp_dataset_batch_count(const mp_dataset *ds, int64_t batch_size)
{
    if (!ds || batch_size < 1) return 0;
    return ds->n / batch_size + (ds->n % batch_size != 0);
}

/* A counter through splitmix64's bijective finaliser: distinct counters
 * never collide, and any draw can be recomputed from (key, counter). */
typedef struct {
    uint64_t key, ctr;
} order_rng;

static uint64_t rng_next(order_rng *r)
{
    r->ctr += 0x9E3779B97F4A7C15ull;
    return mp_mix64(r->key + r->ctr);
}

/* Uniform in [0, bound) without modulo bias: reject the few draws below
 * 2^64 mod bound. */
static uint64_t rng_below(order_rng *r, uint64_t bound)
{
    uint64_t threshold = (0 - bound) % bound;
    for (;;) {
        uint64_t v = rng_next(r);
        if (v >= threshold) return v % bound;
    }
}

mp_status mp_dataset_order(const mp_dataset *ds, uint64_t epoch, uint64_t seed, bool shuffle,
                           int64_t *order)
{
    if (!ds || !order) return mp_set_error(MP_ERR_INVALID, "mp_dataset_order: NULL argument");
    int64_t n = ds->n;
    for (int64_t i = 0; i < n; i++) order[i] = i;
    if (!shuffle) return MP_OK;
    /* The key mixes seed and epoch through separate mixers so that nearby
     * (seed, epoch) pairs give unrelated streams. */
    order_rng r = {.key = mp_mix64(seed ^ 0x6D69787072656331ull) ^
                          mp_mix64(~epoch * 0xD1B54A32D192ED03ull),
                   .ctr = 0};
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)rng_below(&r, (uint64_t)i + 1);
        int64_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    return MP_OK;
}

mp_status mp_dataset_gather(const mp_dataset *ds, const int64_t *idx, int64_t count, float *x,
                            int32_t *y)
{
    if (!ds || (count > 0 && (!idx || !x)))
        return mp_set_error(MP_ERR_INVALID, "mp_dataset_gather: NULL argument");
    if (count < 0)
        return mp_set_error(MP_ERR_INVALID, "mp_dataset_gather: negative count %lld",
                            (long long)count);
    size_t row = (size_t)ds->dim * sizeof(float);
    for (int64_t i = 0; i < count; i++) {
        int64_t k = idx[i];
        if (k < 0 || k >= ds->n)
            return mp_set_error(MP_ERR_INVALID,
                                "mp_dataset_gather: index %lld (position %lld) is outside a "
                                "dataset of %lld samples",
                                (long long)k, (long long)i, (long long)ds->n);
        if (ds->text) { /* window k: tokens and their next tokens */
            const uint8_t *w = ds->text + k * ds->stride;
            for (int64_t t = 0; t < ds->dim; t++) x[i * ds->dim + t] = (float)w[t];
            if (y)
                for (int64_t t = 0; t < ds->dim; t++) y[i * ds->dim + t] = w[t + 1];
            continue;
        }
        memcpy(x + i * ds->dim, ds->x + k * ds->dim, row);
        if (y) y[i] = ds->y[k];
    }
    return MP_OK;
}
