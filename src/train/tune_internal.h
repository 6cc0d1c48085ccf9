/* tune_internal.h - what the two halves of automatic per-layer precision
 * share (tune.c measures and chooses, tune_config.c reads and writes the
 * model file and prints the table). Not part of the API. */
#ifndef MP_TUNE_INTERNAL_H
#define MP_TUNE_INTERNAL_H

#include "core/internal.h"

/* The default error budget (mixprec/tune.h, README "Automatic per-layer
 * precision"). */
#define MP_TUNE_DEFAULT_BUDGET 0.08

/* Sums of one tensor under one candidate, along one axis. */
typedef struct {
    double err2, norm2;       /* sum (q - x)^2, sum x^2 */
    int64_t nonzero, flushed; /* x != 0; of those, q == 0 */
    bool nonfinite;           /* x had inf or NaN */
} tune_acc;

/* Quantize rows x cols x under f as role and add its sums: acc[0] and
 * acc[1] for MX blocks along axis 0 and 1 (the same sums in both for the
 * other formats). fp8 scales by the larger of x's amax and *amax_hist,
 * which it then updates (NULL: x's own amax). */
mp_status mp_tune_measure(mp_tune_format f, mp_tune_role role, int64_t rows, int64_t cols,
                          const float *x, float *amax_hist, tune_acc acc[2]);
void mp_tune_acc_add(tune_acc *to, const tune_acc *a);
/* The relative error and flushed fraction of the worse axis (NaN wins). */
void mp_tune_acc_result(const tune_acc acc[2], double *rel, double *flush);

/* The layers of m with a kernel (model order): their indices into idx and
 * their rows (name, kind, shape, eligible formats); returns their count. */
int mp_tune_find_layers(const mp_model *m, const mp_tune_options *o, int *idx, mp_tune_layer *rows);
/* Run the probe on the float32 model m and fill the rows' errors and
 * choices. */
mp_status mp_tune_probe(mp_model *m, const mp_dataset *data, const mp_tune_options *o, int n,
                        const int *idx, mp_tune_layer *rows, int64_t *samples, double *loss);
/* The MX element format name written for an MX candidate ("mxfp6_e2m3"). */
const char *mp_tune_mx_name(mp_tune_format f);
bool mp_tune_is_mx(mp_tune_format f);
/* Whether the layer named `name` has a float8 GEMM path. */
bool mp_tune_layer_float8(const mp_model *m, const char *name);

#endif
