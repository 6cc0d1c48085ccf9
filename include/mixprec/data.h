/* mixprec/data.h - datasets for training: IDX files (MNIST / Fashion-MNIST,
 * plain or gzip), CSV files, in-memory arrays; the Keras validation split,
 * reproducible per-epoch shuffling and batch gathering. Included by
 * mixprec.h.
 *
 * A dataset holds n samples of `dim` float32 features (row-major [n, dim])
 * and one int32 class label per sample in [0, classes) - or, for a text,
 * windows of `context` byte tokens each labelled with the next byte at every
 * position (a language model's data). It is immutable once built, so several
 * threads may read one dataset at a time. */
/* The whole API, in order: this part compiles when included alone. */
#include "../mixprec.h"

#ifndef MIXPREC_DATA_H
#define MIXPREC_DATA_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_dataset mp_dataset;

/* Largest number of classes a loader accepts (labels must be below it), so
 * a stray huge label cannot ask the model for a gigantic output layer. */
#define MP_DATASET_MAX_CLASSES (1 << 20)

/* ------------------------------------------------------------------- IDX */

/* One IDX array of unsigned bytes (IDX type code 0x08). */
typedef struct {
    int ndim;                  /* 1 .. MP_MAX_DIMS */
    int64_t dims[MP_MAX_DIMS]; /* each >= 1 */
    int64_t count;             /* product of dims */
    uint8_t *data;             /* count bytes, owned: mp_idx_release */
} mp_idx;

/* Read an IDX file, gzip-compressed or plain (detected from the content).
 * Checks the magic (two zero bytes, type 0x08, 1..MP_MAX_DIMS dims), every
 * dimension (non-zero, below 2^31, product at most 2^34 bytes) and that the
 * data length is exactly the product: a short file or trailing bytes are
 * MP_ERR_FORMAT, as are gzip stream errors (bad CRC, truncated stream).
 * A missing or unreadable file is MP_ERR_IO. Messages name the file. On
 * failure *out is left empty (data NULL). */
mp_status mp_idx_read(const char *path, mp_idx *out);
void mp_idx_release(mp_idx *idx);

/* A dataset from an images file (IDX uint8, >= 2 dims: [n, ...] flattened to
 * dim = product of the other dims, scaled by 1/255 into [0, 1]) and a labels
 * file (IDX uint8, 1 dim [n]). The counts must match. classes = max label+1. */
mp_status mp_dataset_load_idx(const char *images_path, const char *labels_path, mp_dataset **out);

/* ---------------------------------------------------------- Fashion-MNIST */

/* Where Debian's dataset-fashion-mnist package puts the files. */
#define MP_FASHION_MNIST_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"
/* Environment variable that overrides the default directory. */
#define MP_FASHION_MNIST_ENV "MIXPREC_FASHION_MNIST_DIR"

/* The directory mp_dataset_load_fashion_mnist uses for `dir`: dir itself if
 * non-NULL and non-empty, else $MIXPREC_FASHION_MNIST_DIR if set and
 * non-empty, else MP_FASHION_MNIST_DEFAULT_DIR. */
const char *mp_fashion_mnist_dir(const char *dir);

/* Fashion-MNIST (train: 60000 samples, test: 10000), 784 float32 features in
 * [0, 1], 10 classes, from <dir>/train-images-idx3-ubyte.gz and
 * train-labels-idx1-ubyte.gz (train) or t10k-* (test). Images must be
 * [n, 28, 28] and labels below 10. A missing file gets a message naming it and
 * the package that provides it. */
mp_status mp_dataset_load_fashion_mnist(const char *dir, bool train, mp_dataset **out);

/* ------------------------------------------------------------------- CSV */

typedef enum {
    MP_CSV_HEADER_AUTO = 0,    /* the first line is a header if any of its
                                * fields is not a number */
    MP_CSV_HEADER_NONE = 1,    /* every line is data */
    MP_CSV_HEADER_PRESENT = 2, /* the first line is a header, skipped */
} mp_csv_header;

typedef struct {
    /* Column holding the integer class label; negative counts from the end
     * (-1 = last column, the default). Every other column is a feature. */
    int label_column;
    mp_csv_header header;
    char separator; /* ',' by default */
} mp_csv_options;

mp_csv_options mp_csv_options_default(void);

/* Load a CSV file (plain or gzip) of numbers: one sample per line, the same
 * number of fields on every line (>= 2), features parsed as float32 in the C
 * locale, labels non-negative integers (written "3" or "3.0") below
 * MP_DATASET_MAX_CLASSES. Fields may be surrounded by blanks or double
 * quotes; blank lines are skipped; "\r\n" line ends are accepted. NaN or
 * infinite values, values beyond float32's range, empty or non-numeric
 * fields and wrong field counts are MP_ERR_FORMAT with the line and column
 * (1-based) in the message. opt NULL = mp_csv_options_default(). */
mp_status mp_dataset_load_csv(const char *path, const mp_csv_options *opt, mp_dataset **out);

/* ------------------------------------------------------------------ text */

/* Where Debian's fortunes package (fortunes, fortunes-min) puts its texts:
 * about 2.5 MB of English, the default corpus for language models. */
#define MP_FORTUNES_DIR "/usr/share/games/fortunes"

/* Largest context (tokens per window) a text dataset takes. */
#define MP_TEXT_MAX_CONTEXT (1 << 20)

/* Any text as bytes (vocabulary 256: UTF-8 or not, every byte is a token).
 * path is a file (plain or gzip) or a directory, whose regular files (not
 * symbolic links, not hidden, not ending in .dat - the fortune indexes) are
 * read in name order and concatenated. Sample w is the window starting at
 * byte w: features text[w, w + context) as float32 token ids, labels
 * text[w + 1, w + context + 1) (mp_dataset_label_dim = context), so there are
 * len - context samples, and a shuffled order draws random windows.
 * mp_dataset_split splits by bytes: the last fraction validates, in windows
 * that tile it without overlap. An empty file, a text shorter than
 * context + 1 bytes, a directory without files or a context outside
 * 1..MP_TEXT_MAX_CONTEXT is an error naming the value and the limit. The
 * features and labels pointers of a text dataset are NULL: use
 * mp_dataset_gather (or mp_dataset_text for the bytes). */
mp_status mp_dataset_load_text(const char *path, int64_t context, mp_dataset **out);
/* The bytes of a text dataset (NULL otherwise); *len (optional) their count. */
const uint8_t *mp_dataset_text(const mp_dataset *ds, int64_t *len);

/* --------------------------------------------------------------- dataset */

/* Copy n samples from memory: x is [n, dim] row-major, y has n labels in
 * [0, classes). classes 0 = max label + 1. Non-finite features are
 * MP_ERR_INVALID (NaN data gets a clear error, never silent training). */
mp_status mp_dataset_from_arrays(const float *x, const int32_t *y, int64_t n, int64_t dim,
                                 int32_t classes, mp_dataset **out);
/* Frees the handle; storage shared with views (mp_dataset_split) lives on
 * until the last of them is freed, in any order. NULL is a no-op. */
void mp_dataset_free(mp_dataset *ds);

int64_t mp_dataset_count(const mp_dataset *ds);
int64_t mp_dataset_dim(const mp_dataset *ds);
int32_t mp_dataset_classes(const mp_dataset *ds);
const float *mp_dataset_features(const mp_dataset *ds); /* [count, dim]; NULL: text */
const int32_t *mp_dataset_labels(const mp_dataset *ds); /* [count]; NULL: text */
/* Labels per sample: 1, or the context of a text dataset. */
int64_t mp_dataset_label_dim(const mp_dataset *ds);
/* A fingerprint of the samples (features and labels, or the text and its
 * windowing), so that a resumed fit can refuse other data. */
uint64_t mp_dataset_fingerprint(const mp_dataset *ds);

/* Keras validation_split: the first split_at = floor(n * (1.0 - fraction))
 * samples (computed in double exactly as Keras does) train, the rest
 * validate - the LAST fraction, taken before any shuffling. Both parts are
 * views sharing ds's storage, keep ds's number of classes, and are freed with
 * mp_dataset_free independently of ds. fraction must lie in [0, 1);
 * fraction 0 gives a view of everything as *train and NULL as *val. As in
 * Keras, a split that leaves either part empty is an error (MP_ERR_INVALID). */
mp_status mp_dataset_split(const mp_dataset *ds, double fraction, mp_dataset **train,
                           mp_dataset **val);

/* Number of batches of an epoch, the last partial one included:
 * ceil(count / batch_size); 0 if batch_size < 1. */
int64_t mp_dataset_batch_count(const mp_dataset *ds, int64_t batch_size);

/* The visiting order of an epoch into order[count]: 0..count-1 without
 * shuffle, else a Fisher-Yates permutation drawn from a counter-based
 * generator keyed by (seed, epoch) only - so any epoch can be recomputed
 * (resuming from a checkpoint) without replaying the earlier ones. The same
 * (seed, epoch, count) gives the same order on every machine. Batch b of the
 * epoch is order[b * batch_size ...] up to count. */
mp_status mp_dataset_order(const mp_dataset *ds, uint64_t epoch, uint64_t seed, bool shuffle,
                           int64_t *order);

/* Copy samples idx[0..count) into x ([count, dim]) and y ([count *
 * label_dim]; may be NULL). Any index outside [0, mp_dataset_count) is MP_ERR_INVALID and
 * nothing is promised about x and y then. */
mp_status mp_dataset_gather(const mp_dataset *ds, const int64_t *idx, int64_t count, float *x,
                            int32_t *y);

#ifdef __cplusplus
}
#endif

#endif /* MIXPREC_DATA_H */
