/* models.c - the models `mixprec train --model NAME` and `mixprec demo
 * --model NAME` know by name, built with the C API (the same networks as
 * the files under examples/): "resnet20", the CIFAR-style ResNet-20 for
 * 28x28x1 images. */
#include <string.h>

#include "cli/cli.h"

static mp_node conv_bn(mp_model *m, mp_node x, int64_t filters, int64_t k, int64_t stride)
{
    mp_conv2d_options c = mp_conv2d_options_default(filters, k, k);
    c.strides[0] = c.strides[1] = stride;
    c.padding = MP_PADDING_SAME;
    c.use_bias = false; /* BatchNormalization's beta takes its place */
    mp_batch_norm_options bn = mp_batch_norm_options_default();
    bn.momentum = 0.9f;
    bn.epsilon = 1e-5f;
    return mp_batch_norm(m, mp_conv2d(m, x, &c, NULL), &bn, NULL);
}

static mp_node basic_block(mp_model *m, mp_node x, int64_t filters, int64_t stride)
{
    mp_node y = mp_activation_layer(m, conv_bn(m, x, filters, 3, stride), MP_ACT_RELU, NULL);
    y = conv_bn(m, y, filters, 3, 1);
    mp_node shortcut = stride == 1 ? x : conv_bn(m, x, filters, 1, stride);
    return mp_activation_layer(m, mp_add(m, shortcut, y, NULL), MP_ACT_RELU, NULL);
}

static mp_node resnet20(mp_model *m)
{
    mp_node x = mp_input(m, 3, (int64_t[]){28, 28, 1}, &(mp_layer_options){.name = "image"});
    x = mp_activation_layer(m, conv_bn(m, x, 16, 3, 1), MP_ACT_RELU, NULL);
    for (int stage = 0; stage < 3; stage++)
        for (int b = 0; b < 3; b++) x = basic_block(m, x, 16 << stage, stage > 0 && b == 0 ? 2 : 1);
    x = mp_dense(m, mp_global_average_pooling2d(m, x, NULL), 10, MP_ACT_NONE, NULL);
    return mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
}

bool mp_cli_is_builtin_model(const char *name) { return name && !strcmp(name, "resnet20"); }

mp_status mp_cli_builtin_model(const char *name, const char *policy, uint64_t seed,
                               int64_t max_batch, mp_model **out)
{
    *out = NULL;
    if (!mp_cli_is_builtin_model(name)) return MP_ERR_INVALID; /* callers ask first */
    mp_model *m = mp_model_new_with_policy(seed, policy);
    if (!m) return MP_ERR_INVALID; /* an unknown policy, said in mp_last_error() */
    mp_status s = mp_model_build(m, resnet20(m), max_batch);
    if (s) {
        mp_model_free(m);
        return s;
    }
    *out = m;
    return MP_OK;
}
