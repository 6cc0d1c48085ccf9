/* add.c - Add: the elementwise sum of two or more inputs of one shape (the
 * residual connection), in the compute dtype; each input gets the output's
 * gradient. A relu Activation that is its only consumer is fused
 * (mp_layer.relu_fused): the last sum is written rectified, and backward
 * hands on the gradient times relu's derivative. */
#include <string.h>

#include "kernels/ops.h"
#include "nn/layer.h"

static mp_status add_build(mp_model *m, mp_layer *l)
{
    const mp_layer *a = mp_layer_csrc(m, l, 0);
    for (int j = 1; j < l->ninputs; j++) {
        const mp_layer *b = mp_layer_csrc(m, l, j);
        if (a->ndim != b->ndim || memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof(int64_t))) {
            char s1[96], s2[96];
            return mp_set_error(MP_ERR_INVALID, "add '%s': shapes %s and %s differ", l->name,
                                mp_shape_str(a->ndim, a->shape, s1, sizeof s1),
                                mp_shape_str(b->ndim, b->shape, s2, sizeof s2));
        }
    }
    return MP_OK;
}

static size_t add_saved_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    (void)m;
    return arena_bytes((size_t)layer_numel(l, batch) * mp_dtype_size(l->policy.compute));
}

static mp_status add_forward(mp_model *m, mp_layer *l, bool training)
{
    (void)training;
    mp_dtype ct = l->policy.compute;
    mp_tensor a, b;
    size_t mark = mp_arena_mark(m->tmp);
    if (mp_layer_input_compute(m, l, 0, false, &a) || mp_layer_input_compute(m, l, 1, false, &b))
        return MP_ERR_NOMEM;
    if (mp_layer_alloc(m, l, m->act, ct, &l->out)) return mp_layer_nomem(l, "its output");
    size_t n = (size_t)mp_tensor_numel(&l->out);
    /* the last sum rectified when a relu is fused */
    (l->relu_fused && l->ninputs == 2 ? mp_op_add_relu : mp_op_add)(a.data, ct, b.data, ct,
                                                                    l->out.data, ct, n);
    for (int j = 2; j < l->ninputs; j++) { /* one rounding per term, left to right */
        mp_arena_release(m->tmp, mark);
        if (mp_layer_input_compute(m, l, j, false, &b)) return MP_ERR_NOMEM;
        (l->relu_fused && j == l->ninputs - 1 ? mp_op_add_relu : mp_op_add)(l->out.data, ct, b.data,
                                                                            ct, l->out.data, ct, n);
    }
    return MP_OK;
}

static mp_status add_backward(mp_model *m, mp_layer *l, bool accumulate)
{
    (void)accumulate;
    mp_status s = MP_OK;
    const mp_tensor *g = &l->grad;
    mp_tensor t;
    if (l->relu_fused) { /* the relu's gradient times its derivative at our output */
        t = l->grad;     /* in place when it is ours, else in the budget of ours */
        if (l->grad_shared && mp_layer_alloc(m, l, m->ws, l->grad.dtype, &t))
            return mp_layer_nomem(l, "its gradient");
        mp_op_activation_grad(MP_ACT_RELU, l->out.data, l->out.dtype, g->data, g->dtype, t.data,
                              t.dtype, (size_t)mp_tensor_numel(&l->out));
        g = &t;
    }
    for (int j = 0; j < l->ninputs && !s; j++) s = mp_layer_pass_grad(m, l, j, g);
    return s;
}

const mp_layer_ops mp_add_ops = {
    .class_name = "Add",
    .base_name = "add",
    .min_inputs = 2,
    .max_inputs = -1,
    .build = add_build,
    .forward = add_forward,
    .backward = add_backward,
    .saved_bytes = add_saved_bytes,
    .fuses_relu = true,
};

mp_node mp_add_n(mp_model *m, int n, const mp_node *inputs, const mp_layer_options *o)
{
    return mp_layer_create(m, &mp_add_ops, inputs, n, NULL, o);
}

mp_node mp_add(mp_model *m, mp_node a, mp_node b, const mp_layer_options *o)
{
    mp_node in[2] = {a, b};
    return mp_add_n(m, 2, in, o);
}
