/* data_parallel.c - a training loop of your own on several processes: each
 * rank takes its shard of every global batch (mp_dist_shard), and
 * mp_model_train_step_shard sums the gradients over the ranks while
 * backward runs. Random two-class data; every rank prints the same loss
 * (only rank 0 does), and the weights stay the same bits on every rank.
 *   usage: mpirun -np 2 build/examples/data_parallel [STEPS] [GLOBAL_BATCH]
 * (default 50, 256; also runs as one process without mpirun). */
#include <stdio.h>
#include <stdlib.h>

#include "mixprec.h"

int main(int argc, char **argv)
{
    if (mp_dist_launched() && mp_dist_init(&argc, &argv)) {
        fprintf(stderr, "data_parallel: %s\n", mp_last_error());
        return 1;
    }
    int rank = mp_dist_rank(), size = mp_dist_size();
    int steps = argc > 1 ? atoi(argv[1]) : 50;
    int64_t global = argc > 2 ? atoll(argv[2]) : 256;
    int64_t lo, hi; /* this rank's rows of every global batch */
    mp_dist_shard(global, rank, size, &lo, &hi);

    mp_set_global_policy("mixed_bfloat16");
    mp_model *m = mp_model_new(3);
    mp_node x = mp_input(m, 1, (int64_t[]){16}, NULL);
    x = mp_dense(m, x, 64, MP_ACT_RELU, NULL);
    x = mp_dense(m, x, 2, MP_ACT_NONE, NULL);
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
    if (mp_model_build(m, x, hi - lo > 0 ? hi - lo : 1) || mp_model_compile(m, NULL)) goto fail;

    float *xs = malloc(sizeof(float) * (size_t)global * 16);
    int32_t *ys = malloc(sizeof(int32_t) * (size_t)global);
    uint64_t seed = 12345;
    for (int s = 0; s < steps; s++) {
        /* the same global batch on every rank (here: drawn from one seed) */
        for (int64_t i = 0; i < global; i++) {
            ys[i] = (int32_t)(i % 2);
            for (int j = 0; j < 16; j++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                double u = (double)(seed >> 11) * 0x1p-53;
                xs[i * 16 + j] = (float)(u - 0.5 + (ys[i] ? 0.3 : -0.3) * (j < 4));
            }
        }
        mp_tensor shard;
        mp_tensor_wrap(&shard, MP_F32, 2, (int64_t[]){hi - lo, 16}, xs + lo * 16);
        mp_shard_options o = mp_shard_options_default(global, lo);
        mp_step_result r;
        if (mp_model_train_step_shard(m, &shard, ys + lo, NULL, &o, &r)) goto fail;
        if (rank == 0 && (s % 10 == 0 || s == steps - 1))
            printf("step %3d  loss %.4f  accuracy %.3f  (%d ranks)\n", s, (double)r.loss,
                   (double)r.correct / (double)global, size);
    }
    free(xs);
    free(ys);
    mp_model_free(m);
    return mp_dist_exit(0);
fail:
    fprintf(stderr, "data_parallel: rank %d: %s\n", rank, mp_last_error());
    return mp_dist_exit(1);
}
