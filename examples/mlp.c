/* mlp.c - the seed model in C: Input(784) -> Dense(4096, relu) ->
 * Dense(4096, relu) -> Dense(10) -> Activation(softmax, float32) under a
 * mixed policy, one forward and backward pass on random data, and the
 * precision plan.   usage: mlp [POLICY] [BATCH]   (default mixed_float16, 256) */
#include <stdio.h>
#include <stdlib.h>

#include "mixprec.h"

int main(int argc, char **argv)
{
    const char *policy = argc > 1 ? argv[1] : "mixed_float16";
    int64_t batch = argc > 2 ? atoll(argv[2]) : 256;
    if (mp_set_global_policy(policy) || batch < 1) {
        fprintf(stderr, "mlp: %s\n", batch < 1 ? "batch must be >= 1" : mp_last_error());
        return 2;
    }
    mp_model *m = mp_model_new(42);
    mp_node x = mp_input(m, 1, (int64_t[]){784}, NULL);
    x = mp_dense(m, x, 4096, MP_ACT_RELU, NULL);
    x = mp_dense(m, x, 4096, MP_ACT_RELU, NULL);
    x = mp_dense(m, x, 10, MP_ACT_NONE, NULL);
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
    if (mp_model_build(m, x, batch)) {
        fprintf(stderr, "mlp: %s\n", mp_last_error());
        return 1;
    }
    mp_model_summary(m, batch, stdout);

    mp_tensor in;
    mp_tensor_init(&in, MP_F32, 2, (int64_t[]){batch, 784}, MP_MEM_OTHER);
    int32_t *labels = malloc((size_t)batch * sizeof *labels);
    for (int64_t i = 0; i < batch * 784; i++) ((float *)in.data)[i] = (float)rand() / RAND_MAX;
    for (int64_t i = 0; i < batch; i++) labels[i] = rand() % 10;

    const mp_tensor *probs;
    float loss;
    mp_loss_spec spec = {.kind = MP_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY, .labels = labels};
    if (mp_model_forward(m, &in, true, &probs) ||
        mp_model_loss_backward(m, &spec, 1.0f, false, &loss)) {
        fprintf(stderr, "mlp: %s\n", mp_last_error());
        return 1;
    }
    printf("\npolicy %s: output %s, loss %.4f, activations %zu bytes in the arena\n", policy,
           mp_dtype_name(probs->dtype), (double)loss, mp_model_activation_bytes(m));
    mp_tensor_release(&in);
    free(labels);
    mp_model_free(m);
    return 0;
}
