/* clip.c - gradient clipping by global norm and by value. The norm is summed
 * in float64 so that it does not depend on tensor order or size in any way
 * that matters to float32 (each square of a float is exact in double). */
#include <math.h>

#include "optim_internal.h"

static double sum_squares(const mp_param *params, int n_params)
{
    double sum = 0.0;
    for (int i = 0; i < n_params; i++) {
        const float *g = params[i].grad;
        if (!g) continue;
        for (int64_t j = 0; j < params[i].n; j++) sum += (double)g[j] * (double)g[j];
    }
    return sum;
}

float mp_grad_global_norm(const mp_param *params, int n_params)
{
    if (n_params <= 0 || !params) return 0.0f;
    return (float)sqrt(sum_squares(params, n_params));
}

float mp_clip_norm_factor(const mp_param *params, int n_params, float max_norm, float *norm_out)
{
    double norm = sqrt(sum_squares(params, n_params));
    if (norm_out) *norm_out = (float)norm;
    /* A non-finite norm means the step is broken anyway; scaling by 0 or NaN
     * would only hide where the inf came from. */
    if (!isfinite(norm) || norm <= (double)max_norm) return 1.0f;
    return (float)((double)max_norm / norm);
}

mp_status mp_clip_grad_norm(const mp_param *params, int n_params, float max_norm, float *norm_out)
{
    if (n_params < 0 || (n_params > 0 && !params))
        return mp_set_error(MP_ERR_INVALID, "mp_clip_grad_norm: bad parameter list");
    if (!(max_norm > 0.0f) || !isfinite(max_norm))
        return mp_set_error(MP_ERR_INVALID, "mp_clip_grad_norm: max_norm %g must be finite and > 0",
                            (double)max_norm);
    float f = mp_clip_norm_factor(params, n_params, max_norm, norm_out);
    if (f == 1.0f) return MP_OK;
    for (int i = 0; i < n_params; i++) {
        float *g = params[i].grad;
        if (!g) continue;
        for (int64_t j = 0; j < params[i].n; j++) g[j] *= f;
    }
    return MP_OK;
}

mp_status mp_clip_grad_value(const mp_param *params, int n_params, float clip_value)
{
    if (n_params < 0 || (n_params > 0 && !params))
        return mp_set_error(MP_ERR_INVALID, "mp_clip_grad_value: bad parameter list");
    if (!(clip_value > 0.0f))
        return mp_set_error(MP_ERR_INVALID, "mp_clip_grad_value: clip_value %g must be > 0",
                            (double)clip_value);
    for (int i = 0; i < n_params; i++) {
        float *g = params[i].grad;
        if (!g) continue;
        /* Comparisons, not fminf/fmaxf, which would turn NaN into the bound. */
        for (int64_t j = 0; j < params[i].n; j++) {
            if (g[j] > clip_value)
                g[j] = clip_value;
            else if (g[j] < -clip_value)
                g[j] = -clip_value;
        }
    }
    return MP_OK;
}
