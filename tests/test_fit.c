/* test_fit.c - fit / evaluate / predict: learning a generated problem in
 * every policy, validation split semantics, early stopping, max_steps, the
 * history CSV and the progress output on a terminal and off it. */
#include <fcntl.h>
#include <math.h>
#include <pty.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

/* Three Gaussian blobs in 8 dimensions, centres 3 apart, sd 0.5: a nearest-
 * centre rule is right for all but a negligible fraction (the margin is 3
 * standard deviations), so a small MLP must reach 95% accuracy. */
static mp_dataset *blobs(int64_t n, uint64_t seed)
{
    float *x = malloc((size_t)n * 8 * sizeof *x);
    int32_t *y = malloc((size_t)n * sizeof *y);
    test_rng r = {seed};
    for (int64_t i = 0; i < n; i++) {
        int32_t c = (int32_t)(test_rng_u32(&r) % 3);
        y[i] = c;
        for (int j = 0; j < 8; j++) {
            /* Box-Muller */
            double u1 = test_rng_uniform(&r, 1e-12, 1), u2 = test_rng_uniform(&r, 0, 1);
            double g = sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
            x[i * 8 + j] = (float)((j == c ? 3.0 : 0.0) + 0.5 * g);
        }
    }
    mp_dataset *ds;
    assert_int_equal(mp_dataset_from_arrays(x, y, n, 8, 3, &ds), MP_OK);
    free(x);
    free(y);
    return ds;
}

static mp_model *mlp(const char *policy, int64_t batch)
{
    mp_set_global_policy(policy);
    mp_model *m = mp_model_new(3);
    mp_node x = mp_input(m, 1, (int64_t[]){8}, NULL);
    x = mp_dense(m, x, 32, MP_ACT_RELU, NULL);
    x = mp_dense(m, x, 3, MP_ACT_NONE, NULL);
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
    mp_set_global_policy("float32");
    assert_int_equal(mp_model_build(m, x, batch), MP_OK);
    mp_compile_options co = mp_compile_options_default();
    co.optimizer.learning_rate = 1e-2f;
    assert_int_equal(mp_model_compile(m, &co), MP_OK);
    return m;
}

static void test_learns_in_every_policy(void **state)
{
    (void)state;
    mp_dataset *train = blobs(600, 1), *test = blobs(300, 2);
    const char *policies[] = {"float32", "mixed_float16", "mixed_bfloat16", "float16", "bfloat16"};
    for (int p = 0; p < 5; p++) {
        mp_model *m = mlp(policies[p], 32);
        mp_fit_options fo = mp_fit_options_default();
        fo.epochs = 8;
        fo.verbose = 0;
        mp_history h;
        assert_int_equal(mp_model_fit(m, train, &fo, &h), MP_OK);
        assert_int_equal(h.count, 8);
        assert_int_equal(h.epochs[0].steps, 19); /* ceil(600 / 32): the last partial batch counts */
        assert_true(h.epochs[7].loss < h.epochs[0].loss);
        double loss, acc;
        assert_int_equal(mp_model_evaluate(m, test, 32, &loss, &acc), MP_OK);
        if (acc < 0.95) fail_msg("%s: test accuracy %.3f < 0.95", policies[p], acc);
        /* predict agrees with evaluate's argmax */
        float *out = malloc(300 * 3 * sizeof *out);
        assert_int_equal(mp_model_predict(m, mp_dataset_features(test), 300, 32, out), MP_OK);
        int64_t correct = 0;
        for (int i = 0; i < 300; i++) {
            int best = 0;
            for (int c = 1; c < 3; c++)
                if (out[i * 3 + c] > out[i * 3 + best]) best = c;
            correct += best == mp_dataset_labels(test)[i];
        }
        assert_true(fabs((double)correct / 300 - acc) < 1e-12);
        free(out);
        mp_history_free(&h);
        mp_model_free(m);
    }
    mp_dataset_free(train);
    mp_dataset_free(test);
}

/* validation_split takes the last fraction before shuffling (Keras): the
 * reported val_loss equals evaluate() on exactly those samples. */
static void test_validation_split(void **state)
{
    (void)state;
    mp_dataset *all = blobs(100, 3);
    mp_model *m = mlp("float32", 16);
    mp_fit_options fo = mp_fit_options_default();
    fo.epochs = 2;
    fo.batch_size = 16;
    fo.validation_split = 0.25;
    fo.verbose = 0;
    mp_history h;
    assert_int_equal(mp_model_fit(m, all, &fo, &h), MP_OK);
    assert_true(h.epochs[1].has_validation);
    assert_int_equal(h.epochs[0].steps, 5); /* 75 training samples in batches of 16 */
    mp_dataset *last;
    assert_int_equal(mp_dataset_from_arrays(mp_dataset_features(all) + 75 * 8,
                                            mp_dataset_labels(all) + 75, 25, 8, 3, &last),
                     MP_OK);
    double loss, acc;
    assert_int_equal(mp_model_evaluate(m, last, 16, &loss, &acc), MP_OK);
    assert_true(loss == h.epochs[1].val_loss);
    assert_true(acc == h.epochs[1].val_accuracy);
    mp_history_free(&h);
    mp_dataset_free(last);
    mp_dataset_free(all);
    /* more validation than training samples, fewer training samples than a
     * batch: validation batches must still fit the shared index buffer */
    all = blobs(30, 6);
    fo.validation_split = 0.6;
    assert_int_equal(mp_model_fit(m, all, &fo, &h), MP_OK);
    assert_int_equal(h.epochs[0].steps, 1); /* 12 training samples, one partial batch */
    assert_true(h.epochs[0].has_validation && isfinite(h.epochs[0].val_loss));
    mp_history_free(&h);
    mp_dataset_free(all);
    mp_model_free(m);
}

static void test_early_stopping_max_steps_and_csv(void **state)
{
    (void)state;
    mp_dataset *ds = blobs(64, 4);
    /* learning rate ~0: the loss cannot improve by min_delta */
    mp_set_global_policy("float32");
    mp_model *m = mp_model_new(1);
    mp_node x = mp_dense(m, mp_input(m, 1, (int64_t[]){8}, NULL), 3, MP_ACT_NONE, NULL);
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, NULL);
    assert_int_equal(mp_model_build(m, x, 16), MP_OK);
    mp_compile_options co = mp_compile_options_default();
    co.optimizer.learning_rate = 1e-12f;
    assert_int_equal(mp_model_compile(m, &co), MP_OK);
    char path[] = "/tmp/mixprec_hist_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    mp_fit_options fo = mp_fit_options_default();
    fo.epochs = 10;
    fo.batch_size = 16;
    fo.patience = 2;
    fo.min_delta = 1e-3;
    fo.verbose = 0;
    fo.log_csv = path;
    mp_history h;
    assert_int_equal(mp_model_fit(m, ds, &fo, &h), MP_OK);
    assert_int_equal(h.count, 3); /* epoch 1 sets the best, 2 and 3 fail to improve */
    FILE *f = fopen(path, "r");
    char line[512];
    int lines = 0;
    assert_non_null(fgets(line, sizeof line, f));
    assert_non_null(strstr(
        line,
        "epoch,loss,accuracy,val_loss,val_accuracy,seconds,ms_per_step,loss_scale,skipped_steps"));
    while (fgets(line, sizeof line, f)) lines++;
    fclose(f);
    assert_int_equal(lines, 3);
    unlink(path);
    mp_history_free(&h);
    /* max_steps: 6 steps = one epoch of 4 and 2 of the next */
    fo = mp_fit_options_default();
    fo.epochs = 5;
    fo.batch_size = 16;
    fo.max_steps = 6;
    fo.verbose = 0;
    assert_int_equal(mp_model_fit(m, ds, &fo, &h), MP_OK);
    assert_int_equal(h.count, 2);
    assert_int_equal(h.epochs[1].steps, 2);
    mp_history_free(&h);
    /* bad options */
    fo.validation_split = 1.5;
    assert_int_equal(mp_model_fit(m, ds, &fo, NULL), MP_ERR_INVALID);
    fo.validation_split = 0;
    fo.batch_size = 17; /* above max_batch */
    assert_int_equal(mp_model_fit(m, ds, &fo, NULL), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "batch size 17"));
    mp_dataset_free(ds);
    mp_model_free(m);
}

static char *capture(FILE *f)
{
    static char buf[16384];
    fflush(f);
    rewind(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    return buf;
}

static void test_progress_output(void **state)
{
    (void)state;
    mp_dataset *ds = blobs(96, 5);
    mp_model *m = mlp("mixed_bfloat16", 32);
    mp_fit_options fo = mp_fit_options_default();
    fo.epochs = 2;
    fo.batch_size = 32;
    fo.validation_split = 1.0 / 3;
    /* not a terminal: plain lines, no carriage returns or escapes */
    FILE *f = tmpfile();
    fo.out = f;
    assert_int_equal(mp_model_fit(m, ds, &fo, NULL), MP_OK);
    char *s = capture(f);
    assert_non_null(strstr(s, "Epoch 1/2\n"));
    assert_non_null(strstr(s, "Epoch 2/2\n"));
    assert_non_null(strstr(s, "2/2 [==============================] - "));
    assert_non_null(strstr(s, "ms/step - loss: "));
    assert_non_null(strstr(s, " - val_accuracy: "));
    assert_null(strchr(s, '\r'));
    fclose(f);
    /* on a terminal (a pseudo-terminal here): redrawn in place */
    int master, slave;
    assert_int_equal(openpty(&master, &slave, NULL, NULL, NULL), 0);
    FILE *tty = fdopen(slave, "w");
    fo.out = tty;
    assert_int_equal(mp_model_fit(m, ds, &fo, NULL), MP_OK);
    fflush(tty);
    /* everything written is in the pty already; one read may return part */
    char buf[8192];
    size_t n = 0;
    fcntl(master, F_SETFL, fcntl(master, F_GETFL) | O_NONBLOCK);
    for (ssize_t r; n < sizeof buf - 1 && (r = read(master, buf + n, sizeof buf - 1 - n)) > 0;)
        n += (size_t)r;
    assert_true(n > 0);
    buf[n] = 0;
    assert_non_null(strchr(buf, '\r'));
    assert_non_null(strstr(buf, "\033[K"));
    assert_non_null(strstr(buf, "2/2 [=============================="));
    fclose(tty);
    close(master);
    /* quiet */
    f = tmpfile();
    fo.out = f;
    fo.verbose = 0;
    assert_int_equal(mp_model_fit(m, ds, &fo, NULL), MP_OK);
    assert_string_equal(capture(f), "");
    fclose(f);
    mp_dataset_free(ds);
    mp_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_learns_in_every_policy),
        cmocka_unit_test(test_validation_split),
        cmocka_unit_test(test_early_stopping_max_steps_and_csv),
        cmocka_unit_test(test_progress_output),
    };
    return cmocka_run_group_tests_name("fit", tests, NULL, NULL);
}
