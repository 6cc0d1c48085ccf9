/* custom_loop.c - the seed's custom training loop in C: scaled loss, unscaled
 * gradients, apply gradients, on the seed MLP under mixed_float16 with random
 * data. The loss scale starts high on purpose (2^24) and grows every 25 good
 * steps, so the dynamic rules are visible: overflowing steps are skipped and
 * halve the scale, and the scale climbs back when gradients stay finite.
 *   usage: custom_loop [STEPS] [BATCH]   (default 120, 64) */
#include <stdio.h>
#include <stdlib.h>

#include "mixprec.h"

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 120;
    int64_t batch = argc > 2 ? atoll(argv[2]) : 64;
    mp_set_global_policy("mixed_float16");
    mp_model *m = mp_model_new(7);
    mp_node x = mp_input(m, 1, (int64_t[]){784}, NULL);
    x = mp_dense(m, x, 4096, MP_ACT_RELU, NULL);
    x = mp_dense(m, x, 4096, MP_ACT_RELU, NULL);
    x = mp_dense(m, x, 10, MP_ACT_NONE, NULL);
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
    if (mp_model_build(m, x, batch)) goto fail;

    int np = mp_model_num_params(m);
    mp_param *params = calloc((size_t)np, sizeof *params);
    mp_model_optim_params(m, params, np);
    mp_optimizer_config oc = mp_optimizer_config_default(MP_OPTIMIZER_SGD);
    oc.learning_rate = 0.05f;
    mp_optimizer *opt = mp_optimizer_new(&oc, params, np);
    mp_loss_scaler_config sc = mp_loss_scaler_config_keras();
    sc.initial_scale = 0x1p24f;
    sc.growth_interval = 25;
    mp_loss_scaler *scaler = mp_loss_scaler_new(&sc);
    if (!opt || !scaler) goto fail;

    /* a learnable task: the label is the quarter of the input's mean, split into 10 bins */
    mp_tensor in;
    mp_tensor_init(&in, MP_F32, 2, (int64_t[]){batch, 784}, MP_MEM_OTHER);
    int32_t *labels = malloc((size_t)batch * sizeof *labels);
    srand(1);
    printf("step   loss     scale        applied\n");
    for (int step = 0; step < steps; step++) {
        float *xv = in.data;
        for (int64_t i = 0; i < batch; i++) {
            int32_t c = rand() % 10;
            labels[i] = c;
            for (int j = 0; j < 784; j++)
                xv[i * 784 + j] = (float)rand() / RAND_MAX * 0.2f + 0.08f * (float)c;
        }
        const mp_tensor *probs;
        float loss;
        mp_loss_spec spec = {.kind = MP_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY, .labels = labels};
        /* scaled loss: the backward pass is seeded with d(loss * scale) */
        float scale = mp_loss_scaler_scale(scaler);
        if (mp_model_forward(m, &in, true, &probs)) goto fail;
        if (mp_model_loss_backward(m, &spec, scale, false, &loss)) goto fail;
        /* unscaled gradients, then apply (skipped on inf/NaN) */
        bool found_inf, applied;
        if (mp_loss_scaler_get_unscaled_gradients(scaler, opt, &found_inf)) goto fail;
        if (mp_loss_scaler_apply_gradients(scaler, opt, &applied)) goto fail;
        if (step % 5 == 0 || !applied)
            printf("%4d  %7.4f  %11.1f  %s\n", step, (double)loss, (double)scale,
                   applied ? "yes" : "no (inf/NaN: skipped)");
    }
    printf("final loss scale %.1f after %lld applied steps\n", (double)mp_loss_scaler_scale(scaler),
           (long long)mp_optimizer_step_count(opt));
    mp_tensor_release(&in);
    free(labels);
    free(params);
    mp_optimizer_free(opt);
    mp_loss_scaler_free(scaler);
    mp_model_free(m);
    return 0;
fail:
    fprintf(stderr, "custom_loop: %s\n", mp_last_error());
    return 1;
}
