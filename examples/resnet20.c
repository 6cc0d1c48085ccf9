/* resnet20.c - the CIFAR-style ResNet-20 in C (the model of
 * examples/resnet20.json): a 3x3 stem of 16 channels, three stages of
 * 16/32/64 channels with three basic blocks each (two 3x3 convolutions with
 * BatchNormalization; a 1x1 projection where a stage halves the image),
 * global average pooling and a float32 softmax. Trains a few epochs on
 * Fashion-MNIST.   usage: resnet20 [POLICY] [EPOCHS]   (default mixed_float16, 1) */
#include <stdio.h>
#include <stdlib.h>

#include "mixprec.h"

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

static mp_node block(mp_model *m, mp_node x, int64_t filters, int64_t stride)
{
    mp_node y = mp_activation_layer(m, conv_bn(m, x, filters, 3, stride), MP_ACT_RELU, NULL);
    y = conv_bn(m, y, filters, 3, 1);
    mp_node shortcut = stride == 1 ? x : conv_bn(m, x, filters, 1, stride);
    return mp_activation_layer(m, mp_add(m, shortcut, y, NULL), MP_ACT_RELU, NULL);
}

int main(int argc, char **argv)
{
    const char *policy = argc > 1 ? argv[1] : "mixed_float16";
    int epochs = argc > 2 ? atoi(argv[2]) : 1;
    mp_model *m = mp_model_new_with_policy(1, policy);
    if (!m || epochs < 1) {
        fprintf(stderr, "resnet20: %s\n", m ? "epochs must be >= 1" : mp_last_error());
        return 2;
    }
    mp_node x = mp_input(m, 3, (int64_t[]){28, 28, 1}, NULL);
    x = mp_activation_layer(m, conv_bn(m, x, 16, 3, 1), MP_ACT_RELU, NULL);
    for (int stage = 0; stage < 3; stage++)
        for (int b = 0; b < 3; b++) x = block(m, x, 16 << stage, stage > 0 && b == 0 ? 2 : 1);
    x = mp_dense(m, mp_global_average_pooling2d(m, x, NULL), 10, MP_ACT_NONE, NULL);
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
    mp_dataset *train = NULL, *test = NULL;
    if (mp_model_build(m, x, 128) || mp_model_compile(m, NULL) ||
        mp_dataset_load_fashion_mnist(NULL, true, &train) ||
        mp_dataset_load_fashion_mnist(NULL, false, &test)) {
        fprintf(stderr, "resnet20: %s\n", mp_last_error());
        mp_model_free(m);
        mp_dataset_free(train);
        return 1;
    }
    mp_model_summary(m, 128, stdout);
    mp_fit_options fo = mp_fit_options_default();
    fo.batch_size = 128;
    fo.epochs = epochs;
    double loss, acc;
    int rc = mp_model_fit(m, train, &fo, NULL) || mp_model_evaluate(m, test, 128, &loss, &acc);
    if (rc)
        fprintf(stderr, "resnet20: %s\n", mp_last_error());
    else
        printf("test: loss %.4f - accuracy %.4f (policy %s)\n", loss, acc, policy);
    mp_dataset_free(train);
    mp_dataset_free(test);
    mp_model_free(m);
    return rc;
}
