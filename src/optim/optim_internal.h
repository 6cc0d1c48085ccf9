/* optim_internal.h - helpers shared by the files of src/optim, not API. */
#ifndef MP_OPTIM_INTERNAL_H
#define MP_OPTIM_INTERNAL_H

#include "core/internal.h"

/* The factor global-norm clipping multiplies gradients by (1 when the norm is
 * within max_norm or not finite); the norm goes to *norm_out. */
float mp_clip_norm_factor(const mp_param *params, int n_params, float max_norm, float *norm_out);

/* Checks shared by the optimizer and the accumulator; sets the error. */
mp_status mp_params_validate(const char *who, const mp_param *params, int n_params);

#endif
