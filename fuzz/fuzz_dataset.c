/* fuzz_dataset.c - the dataset loaders under a fuzzer. The loaders take
 * paths, so one input becomes files in a scratch directory (fuzz_files.h),
 * plain or gzip-compressed as the input says, and goes through the public
 * loader as a user's file would:
 *   byte 0   bits 0-1: the loader
 *              0 mp_dataset_load_csv   the payload is the CSV file
 *              1 mp_dataset_load_idx   the payload cut in two at the offset
 *                                      bytes 1-2 give (little-endian, modulo
 *                                      its length + 1): images, then labels
 *              2 mp_idx_read           the payload is one IDX file
 *              3 mp_dataset_load_text  the payload is the text
 *            bit 2: gzip the (first) file; bit 3: gzip the labels file
 *   byte 1   CSV: the label column (bit 7 set: -1 - bits 0-2, else bits
 *            0-2); text: the context - 1
 *   byte 2   CSV: bits 0-1 the header mode (3: not a mode, refused), bits
 *            2-4 the separator (, ; tab space | : and two unusable ones);
 *            text: bit 0 asks for a context out of range
 *   byte 3+  the payload (a payload that is itself a gzip stream reaches
 *            zlib's error paths).
 * Any input must come back as MP_OK or an error status with a message, no
 * crash, leak or undefined behaviour. An accepted input must keep what the
 * loader promises (mixprec/data.h), or the target aborts:
 *   CSV   counts and dims agree with the text, labels in [0, classes),
 *         classes = max label + 1, features finite; written back as CSV
 *         and loaded again it gives the same samples;
 *   IDX   accepted exactly when the plain bytes are a well-formed IDX file
 *         (an independent check of the header and length); a dataset has
 *         the images' count, features byte / 255 and the labels as they are;
 *   text  accepted exactly when the text is long enough; its bytes come
 *         back unchanged and its windows are the text shifted by one.
 *
 * Built two ways: with -DMP_LIBFUZZER as a libFuzzer target (make fuzz
 * FUZZ_TARGET=dataset, mk/fuzz.mk), and #included by
 * tests/test_fuzz_dataset.c, which runs tests/fuzz/dataset/ in make test. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mixprec.h"

#define FUZZ_NAME "fuzz_dataset"
#include "fuzz_files.h"

/* Run one input through a loader; FUZZ_LOADED or FUZZ_REFUSED. */
int mp_fuzz_dataset_one(const uint8_t *data, size_t size);

/* Samples x dim up to which an accepted CSV is written back and reloaded. */
#define FUZZ_ROUND_TRIP_ELEMS 4096

/* The refusal of a loader: an error with a message, nothing handed out. */
static int fuzz_refused(mp_status s, const mp_dataset *ds)
{
    FUZZ_CHECK(fuzz_refused_well(s) && ds == NULL);
    return FUZZ_REFUSED;
}

/* What every accepted feature-and-label dataset keeps. */
static void fuzz_check_arrays(const mp_dataset *ds)
{
    int64_t n = mp_dataset_count(ds), dim = mp_dataset_dim(ds);
    int32_t classes = mp_dataset_classes(ds);
    const float *x = mp_dataset_features(ds);
    const int32_t *y = mp_dataset_labels(ds);
    FUZZ_CHECK(n >= 1 && dim >= 1 && x && y && mp_dataset_label_dim(ds) == 1);
    FUZZ_CHECK(classes >= 1 && classes <= MP_DATASET_MAX_CLASSES);
    for (int64_t i = 0; i < n * dim; i++) FUZZ_CHECK(isfinite(x[i]));
    for (int64_t i = 0; i < n; i++) FUZZ_CHECK(y[i] >= 0 && y[i] < classes);
    /* the last sample gathered as training gathers it */
    float *row = malloc((size_t)dim * sizeof *row);
    FUZZ_CHECK(row != NULL);
    int64_t last = n - 1;
    int32_t label = -1;
    FUZZ_CHECK(mp_dataset_gather(ds, &last, 1, row, &label) == MP_OK);
    FUZZ_CHECK(!memcmp(row, x + last * dim, (size_t)dim * sizeof *row) && label == y[last]);
    free(row);
    (void)mp_dataset_fingerprint(ds);
}

/* A payload that is itself a gzip stream: zlib decides what it holds. */
static bool fuzz_is_gzip(const uint8_t *p, size_t n)
{
    return n >= 2 && p[0] == 0x1f && p[1] == 0x8b;
}

/* ---------------------------------------------------------------- CSV */

/* The dataset written back as plain CSV (no header, label last) and read
 * again: the same samples, bit for bit (%.9g round-trips a float). */
static void fuzz_csv_round_trip(const mp_dataset *ds)
{
    int64_t n = mp_dataset_count(ds), dim = mp_dataset_dim(ds);
    if (n * dim > FUZZ_ROUND_TRIP_ELEMS) return;
    const float *x = mp_dataset_features(ds);
    const int32_t *y = mp_dataset_labels(ds);
    size_t cap = (size_t)(n * (dim + 1)) * 24 + 1, len = 0;
    char *text = malloc(cap);
    FUZZ_CHECK(text != NULL);
    for (int64_t i = 0; i < n; i++) {
        for (int64_t j = 0; j < dim; j++)
            len += (size_t)snprintf(text + len, cap - len, "%.9g,", (double)x[i * dim + j]);
        len += (size_t)snprintf(text + len, cap - len, "%d\n", (int)y[i]);
    }
    char path[128];
    fuzz_write(fuzz_path(path, sizeof path, "again.csv"), text, len, false);
    free(text);
    mp_csv_options o = mp_csv_options_default();
    o.header = MP_CSV_HEADER_NONE;
    mp_dataset *again = NULL;
    FUZZ_CHECK(mp_dataset_load_csv(path, &o, &again) == MP_OK);
    FUZZ_CHECK(mp_dataset_count(again) == n && mp_dataset_dim(again) == dim);
    FUZZ_CHECK(mp_dataset_classes(again) == mp_dataset_classes(ds));
    FUZZ_CHECK(!memcmp(mp_dataset_features(again), x, (size_t)(n * dim) * sizeof *x));
    FUZZ_CHECK(!memcmp(mp_dataset_labels(again), y, (size_t)n * sizeof *y));
    mp_dataset_free(again);
}

static int fuzz_csv(const uint8_t *p, size_t n, uint8_t b0, uint8_t b1, uint8_t b2)
{
    static const char seps[8] = {',', ';', '\t', ' ', '|', ':', '\0', '"'};
    mp_csv_options o = mp_csv_options_default();
    o.label_column = b1 & 0x80 ? -1 - (b1 & 7) : b1 & 7;
    o.header = (mp_csv_header)(b2 & 3);
    o.separator = seps[(b2 >> 2) & 7];
    char path[128];
    fuzz_write(fuzz_path(path, sizeof path, "data.csv"), p, n, b0 & 4);
    mp_dataset *ds = (mp_dataset *)&ds; /* must be reset to NULL on failure */
    mp_status s = mp_dataset_load_csv(path, &o, &ds);
    if (s != MP_OK) return fuzz_refused(s, ds);
    FUZZ_CHECK(ds != NULL && (b2 & 3) != 3 && o.separator != '\0' && o.separator != '"');
    fuzz_check_arrays(ds);
    /* as many samples as lines at most (of the text, when it is not the
     * payload's own gzip stream) */
    int64_t lines = 1;
    for (size_t i = 0; i < n; i++) lines += p[i] == '\n';
    FUZZ_CHECK(fuzz_is_gzip(p, n) || mp_dataset_count(ds) <= lines);
    int32_t maxl = 0;
    for (int64_t i = 0; i < mp_dataset_count(ds); i++)
        if (mp_dataset_labels(ds)[i] > maxl) maxl = mp_dataset_labels(ds)[i];
    FUZZ_CHECK(mp_dataset_classes(ds) == maxl + 1);
    fuzz_csv_round_trip(ds);
    mp_dataset_free(ds);
    return FUZZ_LOADED;
}

/* ---------------------------------------------------------------- IDX */

/* An independent reading of an IDX file's plain bytes: whether it is one
 * the loader must take, and its dimensions. */
static bool fuzz_idx_valid(const uint8_t *p, size_t n, int *ndim, int64_t *dims, int64_t *count)
{
    if (n < 4 || p[0] || p[1] || p[2] != 0x08 || p[3] < 1 || p[3] > MP_MAX_DIMS) return false;
    *ndim = p[3];
    if (n < 4 + 4 * (size_t)*ndim) return false;
    *count = 1;
    for (int i = 0; i < *ndim; i++) {
        const uint8_t *q = p + 4 + 4 * i;
        dims[i] = (int64_t)q[0] << 24 | q[1] << 16 | q[2] << 8 | q[3];
        if (dims[i] == 0 || dims[i] > 0x7FFFFFFF) return false;
        *count *= dims[i]; /* dims below 2^31 and n bytes: stops before overflow */
        if (*count > (int64_t)n) return false;
    }
    return n == 4 + 4 * (size_t)*ndim + (size_t)*count;
}

static int fuzz_idx_one(const uint8_t *p, size_t n, bool gz)
{
    char path[128];
    fuzz_write(fuzz_path(path, sizeof path, "one-idx"), p, n, gz);
    mp_idx idx;
    memset(&idx, 0xA5, sizeof idx); /* must be emptied on failure */
    mp_status s = mp_idx_read(path, &idx);
    int ndim = 0;
    int64_t dims[MP_MAX_DIMS], count = 0;
    bool known = !fuzz_is_gzip(p, n), valid = known && fuzz_idx_valid(p, n, &ndim, dims, &count);
    if (s != MP_OK) {
        FUZZ_CHECK(fuzz_refused_well(s) && idx.data == NULL && idx.ndim == 0 && idx.count == 0);
        FUZZ_CHECK(!valid);
        return FUZZ_REFUSED;
    }
    FUZZ_CHECK(!known || valid);
    FUZZ_CHECK(idx.ndim >= 1 && idx.ndim <= MP_MAX_DIMS && idx.data != NULL);
    int64_t prod = 1;
    for (int i = 0; i < idx.ndim; i++) {
        FUZZ_CHECK(idx.dims[i] >= 1);
        prod *= idx.dims[i];
    }
    FUZZ_CHECK(prod == idx.count);
    if (known) {
        FUZZ_CHECK(idx.ndim == ndim && idx.count == count);
        FUZZ_CHECK(!memcmp(idx.dims, dims, (size_t)ndim * sizeof *dims));
        FUZZ_CHECK(!memcmp(idx.data, p + 4 + 4 * (size_t)ndim, (size_t)count));
    } else {
        volatile uint8_t sink = 0; /* every byte handed out is readable */
        for (int64_t i = 0; i < idx.count; i++) sink ^= idx.data[i];
        (void)sink;
    }
    mp_idx_release(&idx);
    FUZZ_CHECK(idx.data == NULL);
    return FUZZ_LOADED;
}

static int fuzz_idx_pair(const uint8_t *p, size_t n, uint8_t b0, uint8_t b1, uint8_t b2)
{
    size_t cut = ((size_t)b1 | (size_t)b2 << 8) % (n + 1);
    char ipath[128], lpath[128];
    fuzz_write(fuzz_path(ipath, sizeof ipath, "images-idx"), p, cut, b0 & 4);
    fuzz_write(fuzz_path(lpath, sizeof lpath, "labels-idx"), p + cut, n - cut, b0 & 8);
    mp_dataset *ds = (mp_dataset *)&ds;
    mp_status s = mp_dataset_load_idx(ipath, lpath, &ds);
    int ind = 0, lnd = 0;
    int64_t idims[MP_MAX_DIMS], ldims[MP_MAX_DIMS], icount = 0, lcount = 0;
    bool known = !fuzz_is_gzip(p, cut) && !fuzz_is_gzip(p + cut, n - cut);
    bool valid = known && fuzz_idx_valid(p, cut, &ind, idims, &icount) &&
                 fuzz_idx_valid(p + cut, n - cut, &lnd, ldims, &lcount) && ind >= 2 && lnd == 1 &&
                 idims[0] == ldims[0];
    if (s != MP_OK) {
        FUZZ_CHECK(!valid);
        return fuzz_refused(s, ds);
    }
    FUZZ_CHECK(ds != NULL && (!known || valid));
    fuzz_check_arrays(ds);
    int64_t count = mp_dataset_count(ds), dim = mp_dataset_dim(ds);
    const float *x = mp_dataset_features(ds);
    const int32_t *y = mp_dataset_labels(ds);
    int32_t maxl = 0;
    for (int64_t i = 0; i < count; i++) maxl = y[i] > maxl ? y[i] : maxl;
    FUZZ_CHECK(mp_dataset_classes(ds) == maxl + 1 && maxl <= 255);
    for (int64_t i = 0; i < count * dim; i++) FUZZ_CHECK(x[i] >= 0.0f && x[i] <= 1.0f);
    if (known) {
        FUZZ_CHECK(count == idims[0] && count * dim == icount);
        const uint8_t *im = p + 4 + 4 * (size_t)ind, *lb = p + cut + 8;
        for (int64_t i = 0; i < icount; i++) FUZZ_CHECK(x[i] == (float)im[i] / 255.0f);
        for (int64_t i = 0; i < count; i++) FUZZ_CHECK(y[i] == lb[i]);
    }
    mp_dataset_free(ds);
    return FUZZ_LOADED;
}

/* --------------------------------------------------------------- text */

static int fuzz_text(const uint8_t *p, size_t n, uint8_t b0, uint8_t b1, uint8_t b2)
{
    int64_t context = (int64_t)b1 + 1;
    if (b2 & 1) context = b1 & 1 ? MP_TEXT_MAX_CONTEXT + 1 : 0;
    char path[128];
    fuzz_write(fuzz_path(path, sizeof path, "text"), p, n, b0 & 4);
    mp_dataset *ds = (mp_dataset *)&ds;
    mp_status s = mp_dataset_load_text(path, context, &ds);
    bool known = !fuzz_is_gzip(p, n);
    bool valid = context >= 1 && context <= MP_TEXT_MAX_CONTEXT && (int64_t)n >= context + 1;
    if (s != MP_OK) {
        FUZZ_CHECK(!known || !valid);
        return fuzz_refused(s, ds);
    }
    FUZZ_CHECK(ds != NULL && (!known || valid));
    int64_t len = -1;
    const uint8_t *text = mp_dataset_text(ds, &len);
    FUZZ_CHECK(text != NULL && len >= context + 1);
    FUZZ_CHECK(!known || (len == (int64_t)n && !memcmp(text, p, n)));
    int64_t count = mp_dataset_count(ds);
    FUZZ_CHECK(count == len - context && mp_dataset_dim(ds) == context);
    FUZZ_CHECK(mp_dataset_label_dim(ds) == context && mp_dataset_classes(ds) == 256);
    FUZZ_CHECK(mp_dataset_features(ds) == NULL && mp_dataset_labels(ds) == NULL);
    /* the first and the last window: tokens, and the next byte as labels */
    float *x = malloc((size_t)context * sizeof *x);
    int32_t *y = malloc((size_t)context * sizeof *y);
    FUZZ_CHECK(x && y);
    int64_t which[2] = {0, count - 1};
    for (int w = 0; w < 2; w++) {
        FUZZ_CHECK(mp_dataset_gather(ds, &which[w], 1, x, y) == MP_OK);
        for (int64_t t = 0; t < context; t++)
            FUZZ_CHECK(x[t] == (float)text[which[w] + t] && y[t] == text[which[w] + t + 1]);
    }
    int64_t past = count;
    FUZZ_CHECK(mp_dataset_gather(ds, &past, 1, x, y) == MP_ERR_INVALID);
    free(x);
    free(y);
    mp_dataset_free(ds);
    return FUZZ_LOADED;
}

int mp_fuzz_dataset_one(const uint8_t *data, size_t size)
{
    uint8_t b[3] = {0, 0, 0};
    for (size_t i = 0; i < 3 && i < size; i++) b[i] = data[i];
    const uint8_t *p = size > 3 ? data + 3 : data + size;
    size_t n = size > 3 ? size - 3 : 0;
    switch (b[0] & 3) {
    case 0:
        return fuzz_csv(p, n, b[0], b[1], b[2]);
    case 1:
        return fuzz_idx_pair(p, n, b[0], b[1], b[2]);
    case 2:
        return fuzz_idx_one(p, n, b[0] & 4);
    default:
        return fuzz_text(p, n, b[0], b[1], b[2]);
    }
}

#ifdef MP_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mp_fuzz_dataset_one(data, size);
    return 0;
}
#endif
