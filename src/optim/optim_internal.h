/* optim_internal.h - helpers shared by the files of src/optim, not API. */
#ifndef MP_OPTIM_INTERNAL_H
#define MP_OPTIM_INTERNAL_H

#include "core/internal.h"

/* The factor global-norm clipping multiplies gradients by (1 when the norm is
 * within max_norm or not finite); the norm goes to *norm_out. */
float mp_clip_norm_factor(const mp_param *params, int n_params, float max_norm, float *norm_out);

/* Coefficients of one optimizer step, the same for every element. */
typedef struct {
    float lr, gfactor, clip_value;
    float weight_decay, momentum;
    bool nesterov;
    float beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
    float step_size, sqrt_bc2, decoupled_decay;
} mp_step_coefs;

/* Per-element update rules on n float32 values (w updated in place). The
 * SIMD versions perform the same IEEE operations in the same order, so they
 * give the same bits as the scalar ones. buf / m, v: optimizer state. */
typedef void (*mp_sgd_kernel)(const mp_step_coefs *c, float *w, const float *g, float *buf,
                              int64_t n);
typedef void (*mp_adam_kernel)(const mp_step_coefs *c, bool decoupled, float *w, const float *g,
                               float *m, float *v, int64_t n);
void mp_update_sgd_scalar(const mp_step_coefs *c, float *w, const float *g, float *buf, int64_t n);
void mp_update_adam_scalar(const mp_step_coefs *c, bool decoupled, float *w, const float *g,
                           float *m, float *v, int64_t n);
/* The path whose update kernels the optimizer uses for SGD (sgd true) or
 * Adam/AdamW: measured once per process (update_dispatch.c), the active
 * path when forced. Floats per kernel call: CHUNK. */
mp_isa mp_update_path(bool sgd);
/* Forget the measured choice (tests). */
void mp_update_dispatch_reset(void);
enum { MP_UPDATE_CHUNK = 512 };
/* The update kernels of a path (the scalar ones where it has none). */
void mp_update_kernels_for(mp_isa isa, mp_sgd_kernel *sgd, mp_adam_kernel *adam);
#if MP_X86
void mp_update_sgd_avx2(const mp_step_coefs *c, float *w, const float *g, float *buf, int64_t n);
void mp_update_adam_avx2(const mp_step_coefs *c, bool decoupled, float *w, const float *g, float *m,
                         float *v, int64_t n);
void mp_update_sgd_avx512(const mp_step_coefs *c, float *w, const float *g, float *buf, int64_t n);
void mp_update_adam_avx512(const mp_step_coefs *c, bool decoupled, float *w, const float *g,
                           float *m, float *v, int64_t n);
#endif

/* Checks shared by the optimizer and the accumulator; sets the error. */
mp_status mp_params_validate(const char *who, const mp_param *params, int n_params);

/* A function the update calls on each chunk of a parameter's master right
 * after updating it, while the chunk is still in cache: w = master + off,
 * len floats, on OpenMP thread `thread` (chunks run in parallel). For a
 * compute form other than a plain conversion into `weight`: a float8
 * layer's quantized kernel (nn/fp8_model.c). Called only for parameters
 * with a master, on this shard's part; fn NULL removes it. */
typedef struct {
    void (*fn)(void *ctx, int thread, const float *w, int64_t off, int64_t len);
    void *ctx;
} mp_update_hook;
mp_status mp_optimizer_set_update_hook(mp_optimizer *o, int index, mp_update_hook hook);

/* Ask the next mp_optimizer_step to gather, in its one pass, per parameter
 * i with a master: weights[i], the master after the step against its copy
 * and the master before it (mp_numerics_compute's figures with copy and
 * before, target the weight dtype), and grads[i], the gradient the step
 * used. Parameters without a master (or frozen) are left as they were. The
 * request holds for one step; NULL arrays withdraw it. */
void mp_optimizer_collect_numerics(mp_optimizer *o, mp_numerics *weights, mp_numerics *grads);

#endif
