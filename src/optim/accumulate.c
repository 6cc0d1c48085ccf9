/* accumulate.c - gradient accumulation over a window of micro-batches. The
 * sums live in buffers of their own because the backward pass overwrites the
 * parameters' gradients on every micro-batch. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim_internal.h"

struct mp_grad_accumulator {
    int n_params;
    mp_param *params;
    float **sums;
    int window, count;
    float scale; /* loss scale of the window's first micro-batch */
};

mp_grad_accumulator *mp_grad_accumulator_new(const mp_param *params, int n_params, int window)
{
    if (mp_params_validate("grad accumulator", params, n_params) != MP_OK) return NULL;
    if (window < 1) {
        mp_set_error(MP_ERR_INVALID, "grad accumulator: window %d must be >= 1", window);
        return NULL;
    }
    mp_grad_accumulator *a = calloc(1, sizeof *a);
    size_t np = n_params > 0 ? (size_t)n_params : 1;
    if (a) {
        a->params = calloc(np, sizeof *a->params);
        a->sums = calloc(np, sizeof *a->sums);
    }
    if (!a || !a->params || !a->sums) {
        mp_grad_accumulator_free(a);
        mp_set_error(MP_ERR_NOMEM, "grad accumulator: out of memory");
        return NULL;
    }
    a->n_params = n_params;
    a->window = window;
    for (int i = 0; i < n_params; i++) {
        a->params[i] = params[i];
        a->params[i].name = NULL; /* not kept: the caller's string may go */
        if (!params[i].grad) continue;
        size_t bytes = (size_t)params[i].n * sizeof(float);
        a->sums[i] = mp_alloc(bytes ? bytes : 1, MP_MEM_GRADS);
        if (!a->sums[i]) {
            mp_grad_accumulator_free(a);
            return NULL;
        }
    }
    return a;
}

void mp_grad_accumulator_free(mp_grad_accumulator *a)
{
    if (!a) return;
    if (a->sums)
        for (int i = 0; i < a->n_params; i++) mp_free(a->sums[i]);
    free(a->sums);
    free(a->params);
    free(a);
}

mp_status mp_grad_accumulator_add(mp_grad_accumulator *a, float loss_scale)
{
    if (!a) return mp_set_error(MP_ERR_INVALID, "grad accumulator: NULL");
    if (!(loss_scale > 0.0f) || !isfinite(loss_scale))
        return mp_set_error(MP_ERR_INVALID,
                            "grad accumulator: loss scale %g must be finite and > 0",
                            (double)loss_scale);
    if (a->count == a->window)
        return mp_set_error(MP_ERR_INVALID,
                            "grad accumulator: window of %d micro-batches is full (call finish)",
                            a->window);
    if (a->count > 0 && loss_scale != a->scale)
        return mp_set_error(MP_ERR_INVALID,
                            "grad accumulator: loss scale changed inside a window (%g, then %g); "
                            "update the scaler only once per window",
                            (double)a->scale, (double)loss_scale);
    for (int i = 0; i < a->n_params; i++) {
        const float *g = a->params[i].grad;
        float *s = a->sums[i];
        if (!g) continue;
        if (a->count == 0)
            memcpy(s, g, (size_t)a->params[i].n * sizeof(float));
        else
            for (int64_t j = 0; j < a->params[i].n; j++) s[j] += g[j];
    }
    if (a->count == 0) a->scale = loss_scale;
    a->count++;
    return MP_OK;
}

int mp_grad_accumulator_count(const mp_grad_accumulator *a) { return a ? a->count : 0; }

bool mp_grad_accumulator_ready(const mp_grad_accumulator *a) { return a && a->count == a->window; }

mp_status mp_grad_accumulator_finish(mp_grad_accumulator *a)
{
    if (!a) return mp_set_error(MP_ERR_INVALID, "grad accumulator: NULL");
    if (a->count == 0)
        return mp_set_error(MP_ERR_INVALID, "grad accumulator: finish with no micro-batch added");
    const float cnt = (float)a->count;
    for (int i = 0; i < a->n_params; i++) {
        float *g = a->params[i].grad;
        const float *s = a->sums[i];
        if (!g) continue;
        for (int64_t j = 0; j < a->params[i].n; j++) g[j] = s[j] / cnt;
    }
    a->count = 0;
    return MP_OK;
}
