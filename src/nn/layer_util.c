/* layer_util.c - what every layer kind shares: arena tensors shaped like a
 * layer, inputs cast to the compute dtype, gradients handed to inputs, and
 * reading settings from JSON with errors that name the field. */
#include <math.h>
#include <string.h>

#include "kernels/ops.h"
#include "nn/layer.h"

mp_status mp_layer_nomem(const mp_layer *l, const char *what)
{
    return mp_set_error(MP_ERR_NOMEM, "layer '%s': cannot allocate %s (%s)", l->name, what,
                        mp_last_error());
}

mp_status mp_layer_alloc(mp_model *m, const mp_layer *shape_of, mp_arena *a, mp_dtype t,
                         mp_tensor *out)
{
    int64_t shape[MP_MAX_DIMS];
    shape[0] = m->batch;
    memcpy(shape + 1, shape_of->shape, (size_t)shape_of->ndim * sizeof(int64_t));
    return mp_tensor_from_arena(out, a, t, shape_of->ndim + 1, shape);
}

mp_status mp_layer_alloc_output(mp_model *m, mp_layer *l, mp_dtype t)
{
    if (mp_layer_alloc(m, l, l->out_dropped ? m->ws : m->act, t, &l->out))
        return mp_layer_nomem(l, "its output");
    return MP_OK;
}

size_t mp_layer_output_saved_bytes(const mp_layer *l, int64_t n, mp_dtype t, bool sign)
{
    if (!l->out_dropped) return arena_bytes((size_t)n * mp_dtype_size(t));
    return sign && l->sign_from < 0 ? arena_bytes(((size_t)n + 7) / 8) : 0;
}

mp_status mp_layer_keep_sign(mp_model *m, mp_layer *l)
{
    size_t n = (size_t)mp_tensor_numel(&l->out);
    l->sign_bits = NULL;
    l->sign_codes = NULL; /* the consumer's forward, after this one, sets them */
    if (l->sign_from >= 0) return MP_OK;
    if (!(l->sign_bits = mp_arena_alloc(m->act, (n + 7) / 8)))
        return mp_layer_nomem(l, "its sign mask");
    mp_op_positive_mask(l->out.data, l->out.dtype, l->sign_bits, n);
    return MP_OK;
}

mp_status mp_layer_sign_grad(const mp_layer *l, const mp_tensor *dy, mp_tensor *dx)
{
    size_t n = (size_t)mp_tensor_numel(dx);
    if (l->sign_bits) {
        mp_op_mask_grad(l->sign_bits, dy->data, dy->dtype, dx->data, dx->dtype, n);
    } else if (l->sign_codes) {
        mp_op_code_mask_grad(l->sign_codes, l->sign_type, dy->data, dy->dtype, dx->data, dx->dtype,
                             n);
    } else {
        return mp_set_error(MP_ERR_INVALID, "layer '%s': backward without its output's sign",
                            l->name);
    }
    return MP_OK;
}

mp_status mp_layer_input_compute(mp_model *m, mp_layer *l, int j, bool keep, mp_tensor *out)
{
    const mp_layer *src = mp_layer_csrc(m, l, j);
    mp_dtype c = l->policy.compute;
    if (!(keep && mp_layer_input_is_data(m, l, j)) && src->out.dtype == c) {
        *out = src->out;
        out->owns_data = false;
        return MP_OK;
    }
    if (mp_layer_alloc(m, src, keep ? m->act : m->tmp, c, out))
        return mp_layer_nomem(l, "an input copy");
    mp_convert(out->data, c, src->out.data, src->out.dtype, (size_t)mp_tensor_numel(out));
    return MP_OK;
}

size_t mp_layer_kept_input_bytes(const mp_model *m, const mp_layer *l, int j, int64_t batch)
{
    /* a view of the producer's output (already in the activation arena)
     * unless it is user data or in another dtype */
    const mp_layer *src = mp_layer_csrc(m, l, j);
    if (!mp_layer_input_is_data(m, l, j) && src->out_dtype == l->policy.compute) return 0;
    return arena_bytes((size_t)layer_numel(src, batch) * mp_dtype_size(l->policy.compute));
}

mp_status mp_layer_input_grad(mp_model *m, mp_layer *l, int j, mp_tensor *dx, bool *direct)
{
    mp_layer *src = mp_layer_src(m, l, j);
    *direct = !src->has_grad && src->out_dtype == l->policy.compute;
    mp_tensor *t = *direct ? &src->grad : dx;
    if (mp_layer_alloc(m, src, *direct ? m->ws : m->tmp, l->policy.compute, t))
        return mp_layer_nomem(l, "an input gradient");
    if (*direct) {
        src->has_grad = true;
        *dx = *t;
    }
    return MP_OK;
}

mp_status mp_layer_input_grad_done(mp_model *m, mp_layer *l, int j, const mp_tensor *dx,
                                   bool direct)
{
    return direct ? MP_OK : mp_model_add_grad(m, l->inputs[j], dx->data, dx->dtype);
}

mp_status mp_layer_pass_grad(mp_model *m, mp_layer *l, int j, const mp_tensor *g)
{
    if (mp_layer_input_is_data(m, l, j)) return MP_OK;
    return mp_model_share_grad(m, l->inputs[j], g);
}

/* ----------------------------------------------------------- JSON fields */

mp_status mp_json_int_field(const json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return mp_set_error(MP_ERR_FORMAT, "'%s' must be an integer in %lld..%lld", key,
                            (long long)lo, (long long)hi);
    *out = json_integer_value(v);
    return MP_OK;
}

mp_status mp_json_float_field(const json_t *o, const char *key, double lo, bool lo_open, double hi,
                              float *out)
{
    const json_t *v = json_object_get(o, key);
    double x = json_is_number(v) ? json_number_value(v) : NAN;
    if (!(x >= lo && x <= hi) || (lo_open && x == lo))
        return mp_set_error(MP_ERR_FORMAT, "'%s' must be a number in %s%g, %g]", key,
                            lo_open ? "(" : "[", lo, hi);
    *out = (float)x;
    return MP_OK;
}

mp_status mp_json_bool_opt(const json_t *o, const char *key, bool *out)
{
    const json_t *v = json_object_get(o, key);
    if (!v) return MP_OK;
    if (!json_is_boolean(v)) return mp_set_error(MP_ERR_FORMAT, "'%s' must be true or false", key);
    *out = json_is_true(v);
    return MP_OK;
}

mp_status mp_json_activation_field(const json_t *o, const char *key, mp_activation *out)
{
    const char *name = json_string_value(json_object_get(o, key));
    if (!name) return mp_set_error(MP_ERR_FORMAT, "'%s' must be an activation name", key);
    if (mp_activation_from_name(name, out))
        return mp_set_error(MP_ERR_FORMAT, "'%s': %s", key, mp_last_error());
    return MP_OK;
}

mp_status mp_json_shape_field(const json_t *o, const char *key, int64_t lo, int64_t hi, int *ndim,
                              int64_t *shape)
{
    const json_t *sh = json_object_get(o, key);
    size_t n = json_array_size(sh);
    if (!json_is_array(sh) || n < 1 || n > MP_MAX_DIMS - 1)
        return mp_set_error(MP_ERR_FORMAT, "'%s' must be a list of 1 to %d dimensions", key,
                            MP_MAX_DIMS - 1);
    for (size_t d = 0; d < n; d++) {
        const json_t *e = json_array_get(sh, d);
        if (!json_is_integer(e) || json_integer_value(e) < lo || json_integer_value(e) > hi ||
            json_integer_value(e) == 0)
            return mp_set_error(MP_ERR_FORMAT, "'%s': dimension %zu must be an integer in 1..%lld",
                                key, d, (long long)hi);
        shape[d] = json_integer_value(e);
    }
    *ndim = (int)n;
    return MP_OK;
}

json_t *mp_json_shape(int ndim, const int64_t *shape)
{
    json_t *a = json_array();
    for (int d = 0; d < ndim; d++) json_array_append_new(a, json_integer(shape[d]));
    return a;
}

mp_status mp_layer_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void *a,
                        mp_dtype at, int64_t lda, const void *b, mp_dtype bt, int64_t ldb,
                        float beta, void *c, mp_dtype ct, int64_t ldc, const float *bias)
{
    mp_gemm_args g = mp_gemm_args_default();
    g.trans_a = trans_a, g.trans_b = trans_b;
    g.m = m, g.n = n, g.k = k;
    g.a = a, g.a_type = at, g.lda = lda;
    g.b = b, g.b_type = bt, g.ldb = ldb;
    g.beta = beta;
    g.c = c, g.c_type = ct, g.ldc = ldc;
    g.bias = bias;
    return mp_gemm_ex(&g);
}
