/* test_text.c - language-model pieces: text datasets (windows and their
 * next-byte labels read back against the bytes written, the split by bytes
 * with non-overlapping validation windows, directories read in name order
 * without indexes, links or hidden files, gzip, refusals naming the value),
 * Keras steps_per_epoch (an epoch of P steps walks the same batches as
 * plain passes: the weights match bit for bit, across pass boundaries), the
 * PositionEmbedding layer (forward exact: one rounding of an exact sum;
 * backward against central differences of a float64 loss; a context longer
 * than the table refused), the sequence loss (the mean over every position
 * of -log p, from predict's outputs in float64) and incremental decoding (a
 * token at a time through the key/value cache gives the outputs of the full
 * causal forward, within the bound derived at check_decode). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common.h"

static char dir[256];

static void write_file(const char *name, const void *data, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static char *path_of(const char *name)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return path;
}

/* n bytes of every value, not UTF-8 (bytes are tokens, whatever they are) */
static uint8_t *bytes(size_t n, uint64_t seed)
{
    uint8_t *b = malloc(n);
    test_rng r = {seed};
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)test_rng_u32(&r);
    return b;
}

static void check_windows(const mp_dataset *ds, const uint8_t *text, int64_t first, int64_t stride,
                          int64_t t)
{
    int64_t n = mp_dataset_count(ds);
    assert_int_equal(mp_dataset_dim(ds), t);
    assert_int_equal(mp_dataset_label_dim(ds), t);
    assert_int_equal(mp_dataset_classes(ds), 256);
    float *x = malloc((size_t)(n * t) * sizeof *x);
    int32_t *y = malloc((size_t)(n * t) * sizeof *y);
    int64_t *idx = malloc((size_t)n * sizeof *idx);
    for (int64_t i = 0; i < n; i++) idx[i] = n - 1 - i; /* any order */
    assert_int_equal(mp_dataset_gather(ds, idx, n, x, y), MP_OK);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < t; j++) {
            int64_t o = first + idx[i] * stride + j;
            assert_true(x[i * t + j] == (float)text[o]);
            assert_int_equal(y[i * t + j], text[o + 1]);
        }
    free(x);
    free(y);
    free(idx);
}

static void test_text_dataset(void **state)
{
    (void)state;
    const size_t len = 1000;
    const int64_t t = 16;
    uint8_t *text = bytes(len, 1);
    write_file("t.bin", text, len);
    mp_dataset *ds, *tr, *va;
    assert_int_equal(mp_dataset_load_text(path_of("t.bin"), t, &ds), MP_OK);
    int64_t got_len;
    assert_non_null(mp_dataset_text(ds, &got_len));
    assert_int_equal(got_len, len);
    assert_int_equal(mp_dataset_count(ds), (int64_t)len - t); /* windows at 0..len-t-1 */
    assert_null(mp_dataset_features(ds));
    check_windows(ds, text, 0, 1, t);
    /* split: the first floor(1000 * 0.75) = 750 bytes train (windows every
     * byte), the last 250 validate in windows every t bytes */
    assert_int_equal(mp_dataset_split(ds, 0.25, &tr, &va), MP_OK);
    assert_int_equal(mp_dataset_count(tr), 750 - t);
    check_windows(tr, text, 0, 1, t);
    assert_int_equal(mp_dataset_count(va), (250 - t - 1) / t + 1);
    check_windows(va, text, 750, t, t);
    /* the fingerprint follows the bytes and the windowing */
    mp_dataset *other;
    assert_int_equal(mp_dataset_load_text(path_of("t.bin"), t + 1, &other), MP_OK);
    assert_true(mp_dataset_fingerprint(other) != mp_dataset_fingerprint(ds));
    assert_true(mp_dataset_fingerprint(tr) != mp_dataset_fingerprint(ds));
    mp_dataset_free(other);
    mp_dataset_free(ds);
    mp_dataset_free(tr);
    mp_dataset_free(va);
    /* gzip reads as the plain bytes */
    gzFile g = gzopen(path_of("t.gz"), "wb");
    assert_non_null(g);
    assert_int_equal(gzwrite(g, text, (unsigned)len), (int)len);
    gzclose(g);
    assert_int_equal(mp_dataset_load_text(path_of("t.gz"), t, &ds), MP_OK);
    check_windows(ds, text, 0, 1, t);
    mp_dataset_free(ds);
    free(text);
}

static void test_text_directory(void **state)
{
    (void)state;
    char sub[600];
    snprintf(sub, sizeof sub, "%s/corpus", dir);
    assert_int_equal(mkdir(sub, 0777), 0);
    write_file("corpus/b", "BBBB", 4);
    write_file("corpus/a", "AAAAAA", 6);
    write_file("corpus/a.dat", "index", 5);  /* a fortune index: left out */
    write_file("corpus/.hidden", "hhhh", 4); /* left out */
    char link[700], target[700];
    snprintf(link, sizeof link, "%s/a.u8", sub);
    snprintf(target, sizeof target, "%s/a", sub);
    assert_int_equal(symlink(target, link), 0); /* a link: left out */
    mp_dataset *ds;
    assert_int_equal(mp_dataset_load_text(sub, 3, &ds), MP_OK);
    int64_t n;
    const uint8_t *b = mp_dataset_text(ds, &n);
    assert_int_equal(n, 10);
    assert_memory_equal(b, "AAAAAABBBB", 10);
    mp_dataset_free(ds);
}

static void test_text_refusals(void **state)
{
    (void)state;
    mp_dataset *ds = (mp_dataset *)1;
    write_file("empty", "", 0);
    assert_int_equal(mp_dataset_load_text(path_of("empty"), 4, &ds), MP_ERR_FORMAT);
    assert_null(ds);
    assert_non_null(strstr(mp_last_error(), "empty"));
    write_file("short", "abcd", 4);
    assert_int_equal(mp_dataset_load_text(path_of("short"), 4, &ds), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "4 bytes"));
    assert_non_null(strstr(mp_last_error(), "context + 1 = 5"));
    assert_int_equal(mp_dataset_load_text(path_of("short"), 3, &ds), MP_OK); /* 5 - 1: fits */
    assert_int_equal(mp_dataset_count(ds), 1);
    mp_dataset *tr, *va;
    assert_int_equal(mp_dataset_split(ds, 0.5, &tr, &va), MP_ERR_INVALID); /* 2 bytes each */
    assert_null(tr);
    mp_dataset_free(ds);
    assert_int_equal(mp_dataset_load_text(path_of("short"), 0, &ds), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "context 0"));
    assert_int_equal(mp_dataset_load_text(path_of("missing"), 4, &ds), MP_ERR_IO);
    assert_non_null(strstr(mp_last_error(), "missing"));
}

/* ------------------------------------------------- a small language model */

enum { T = 8, E = 16, V = 256 };

static mp_model *lm(const char *policy, int64_t t, int64_t batch, bool attention)
{
    mp_model *m = mp_model_new_with_policy(5, policy);
    mp_node x = mp_input_ex(m, 1, (int64_t[]){t}, MP_I32, &(mp_layer_options){.name = "ids"});
    x = mp_embedding(m, x, V, E, NULL);
    x = mp_position_embedding(m, x, T, NULL);
    if (attention) {
        mp_multi_head_attention_options a = mp_multi_head_attention_options_default(2, 8);
        mp_node h = mp_layer_norm(m, x, 1e-5f, NULL);
        x = mp_add(m, x, mp_multi_head_attention(m, h, &a, NULL), NULL);
        x = mp_dense(m, mp_layer_norm(m, x, 1e-5f, NULL), 32, MP_ACT_GELU_TANH, NULL);
    }
    x = mp_dense(m, x, V, MP_ACT_NONE, NULL);
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
    assert_true(x >= 0);
    assert_int_equal(mp_model_build(m, x, batch), MP_OK);
    return m;
}

static void compile(mp_model *m)
{
    mp_compile_options co = mp_compile_options_default();
    co.optimizer = mp_optimizer_config_default(MP_OPTIMIZER_ADAMW);
    co.optimizer.learning_rate = 1e-2f;
    assert_int_equal(mp_model_compile(m, &co), MP_OK);
}

static void assert_same_weights(mp_model *a, mp_model *b)
{
    for (int i = 0; i < mp_model_num_params(a); i++) {
        mp_model_param *p = mp_model_get_param(a, i), *q = mp_model_get_param(b, i);
        assert_memory_equal(p->master, q->master, (size_t)p->n * sizeof(float));
    }
}

static void test_steps_per_epoch(void **state)
{
    (void)state;
    uint8_t *text = bytes(8 * 4 + T, 2); /* 32 windows: 4 batches of 8 a pass */
    write_file("spe.bin", text, 8 * 4 + T);
    free(text);
    mp_dataset *ds;
    assert_int_equal(mp_dataset_load_text(path_of("spe.bin"), T, &ds), MP_OK);
    assert_int_equal(mp_dataset_count(ds), 32);
    /* 3 epochs of 3 steps cross passes 0 -> 1 -> 2 mid-epoch; the same as 9
     * steps of plain passes */
    mp_model *a = lm("float32", T, 8, false), *b = lm("float32", T, 8, false);
    compile(a);
    compile(b);
    mp_fit_options o = mp_fit_options_default();
    o.batch_size = 8;
    o.verbose = 0;
    o.seed = 11;
    o.epochs = 3;
    o.steps_per_epoch = 3;
    mp_history h;
    assert_int_equal(mp_model_fit(a, ds, &o, &h), MP_OK);
    assert_int_equal(h.count, 3);
    for (int e = 0; e < 3; e++) {
        assert_int_equal(h.epochs[e].steps, 3);
        /* accuracy counts positions: 3 batches of 8 windows of T labels */
        assert_true(h.epochs[e].accuracy >= 0 && h.epochs[e].accuracy <= 1);
    }
    mp_history_free(&h);
    o.steps_per_epoch = 0;
    o.max_steps = 9;
    assert_int_equal(mp_model_fit(b, ds, &o, NULL), MP_OK);
    assert_same_weights(a, b);
    mp_model_free(a);
    mp_model_free(b);
    mp_dataset_free(ds);
}

/* A language model's fit resumes exactly: 7 steps in epochs of 3 (across a
 * pass boundary of the text's windows and mid-epoch), with a checkpoint at
 * step 4, rebuilt from the file alone and continued, ends with the weights,
 * optimizer slots and history of the 7 steps run straight. */
static void test_text_resume(void **state)
{
    (void)state;
    /* 44 bytes: the first 33 train (25 windows: passes of 5 batches of 6),
     * the last 11 validate (one window) */
    uint8_t *text = bytes(44, 12);
    write_file("resume.bin", text, 44);
    free(text);
    mp_dataset *ds;
    assert_int_equal(mp_dataset_load_text(path_of("resume.bin"), T, &ds), MP_OK);
    mp_fit_options o = mp_fit_options_default();
    o.batch_size = 6;
    o.verbose = 0;
    o.seed = 3;
    o.epochs = 3;
    o.steps_per_epoch = 3;
    o.validation_split = 0.25;
    o.max_steps = 7;
    mp_model *straight = lm("mixed_bfloat16", T, 6, true);
    compile(straight);
    mp_history hs;
    assert_int_equal(mp_model_fit(straight, ds, &o, &hs), MP_OK);
    mp_model *first = lm("mixed_bfloat16", T, 6, true);
    compile(first);
    char ck[600];
    snprintf(ck, sizeof ck, "%s/lmck", dir);
    o.max_steps = 4;
    o.checkpoint_dir = ck;
    assert_int_equal(mp_model_fit(first, ds, &o, NULL), MP_OK);
    char path[700];
    snprintf(path, sizeof path, "%s/ckpt-%08d.safetensors", ck, 4);
    mp_model *resumed;
    mp_fit_state st;
    assert_int_equal(mp_model_from_checkpoint(path, 6, &resumed, &st), MP_OK);
    assert_int_equal(st.steps, 4);
    assert_int_equal(st.steps_per_epoch, 3);
    o.max_steps = 7;
    o.checkpoint_dir = NULL;
    o.resume = &st;
    mp_history hr;
    assert_int_equal(mp_model_fit(resumed, ds, &o, &hr), MP_OK);
    assert_same_weights(straight, resumed);
    mp_optimizer *oa = mp_model_optimizer(straight), *ob = mp_model_optimizer(resumed);
    for (int i = 0; i < mp_model_num_params(straight); i++)
        for (int k = 0; k < mp_optimizer_num_slots(oa); k++) {
            int64_t n;
            float *x = mp_optimizer_slot(oa, i, k, &n), *y = mp_optimizer_slot(ob, i, k, NULL);
            assert_memory_equal(x, y, (size_t)n * sizeof *x);
        }
    assert_int_equal(hs.count, hr.count);
    for (int e = 0; e < hs.count; e++) {
        assert_true(hs.epochs[e].loss == hr.epochs[e].loss);
        assert_true(hs.epochs[e].val_loss == hr.epochs[e].val_loss);
    }
    /* another epoch length is refused, naming both */
    o.steps_per_epoch = 2;
    mp_model *again;
    mp_fit_state st2;
    assert_int_equal(mp_model_from_checkpoint(path, 6, &again, &st2), MP_OK);
    o.resume = &st2;
    assert_int_equal(mp_model_fit(again, ds, &o, NULL), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "steps per epoch 3"));
    mp_history_free(&hs);
    mp_history_free(&hr);
    mp_fit_state_free(&st);
    mp_fit_state_free(&st2);
    mp_model_free(straight);
    mp_model_free(first);
    mp_model_free(resumed);
    mp_model_free(again);
    mp_dataset_free(ds);
}

/* The sequence loss is the mean over every position of -log p(label). */
static void test_sequence_loss(void **state)
{
    (void)state;
    mp_model *m = lm("float32", T, 4, true);
    compile(m);
    int32_t ids[4 * T], labels[4 * T];
    float xf[4 * T];
    test_rng r = {3};
    for (int i = 0; i < 4 * T; i++) {
        ids[i] = (int32_t)(test_rng_u32(&r) % V);
        labels[i] = (int32_t)(test_rng_u32(&r) % V);
        xf[i] = (float)ids[i];
    }
    float *p = malloc(4 * T * V * sizeof *p);
    assert_int_equal(mp_model_predict(m, xf, 4, 4, p), MP_OK); /* ids as float features */
    double want = 0;
    for (int i = 0; i < 4 * T; i++) want -= log((double)p[i * V + labels[i]]);
    want /= 4 * T;
    mp_tensor x;
    mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){4, T}, ids);
    mp_step_result res;
    assert_int_equal(mp_model_test_step(m, &x, labels, NULL, &res), MP_OK);
    /* the loss re-derives the probabilities from the kept logits; float32
     * probabilities differ by a few ulp: 1e-5 relative covers it */
    assert_true(fabs(res.loss - want) <= 1e-5 * want);
    free(p);
    mp_model_free(m);
}

static void test_position_embedding(void **state)
{
    (void)state;
    /* forward: x + P[t] with one rounding of an exact sum (two floats of
     * like magnitude sum exactly in float64; bfloat16 values in float32) */
    const char *policies[] = {"float32", "mixed_bfloat16"};
    for (int k = 0; k < 2; k++) {
        mp_model *m = mp_model_new_with_policy(9, policies[k]);
        mp_node x = mp_input(m, 2, (int64_t[]){T - 2, E}, NULL);
        mp_node y = mp_position_embedding(m, x, T, &(mp_layer_options){.name = "pe"});
        assert_int_equal(mp_model_build(m, y, 3), MP_OK);
        mp_model_param *p = mp_model_get_param(m, 0);
        assert_string_equal(p->name, "pe.embeddings");
        assert_int_equal(p->n, T * E);
        float xv[3 * (T - 2) * E], out[3 * (T - 2) * E];
        test_rng r = {k};
        for (int i = 0; i < 3 * (T - 2) * E; i++) xv[i] = (float)test_rng_uniform(&r, -1, 1);
        assert_int_equal(mp_model_predict(m, xv, 3, 3, out), MP_OK);
        for (int b = 0; b < 3; b++)
            for (int t = 0; t < T - 2; t++)
                for (int j = 0; j < E; j++) {
                    int i = (b * (T - 2) + t) * E + j;
                    float pv, xr = xv[i];
                    mp_convert(&pv, MP_F32,
                               (const char *)p->weight +
                                   (size_t)(t * E + j) * mp_dtype_size(p->weight_dtype),
                               p->weight_dtype, 1);
                    if (k) xr = mp_bf16_to_f32(mp_f32_to_bf16(xr));
                    float want = (float)((double)xr + (double)pv);
                    if (k) want = mp_bf16_to_f32(mp_f32_to_bf16(want));
                    assert_true(out[i] == want);
                }
        mp_model_free(m);
    }
    /* a context longer than the table */
    mp_model *m = mp_model_new_with_policy(9, "float32");
    mp_node x = mp_input(m, 2, (int64_t[]){T + 1, E}, NULL);
    assert_true(mp_position_embedding(m, x, T, NULL) < 0);
    assert_non_null(strstr(mp_last_error(), "context of 9 positions"));
    assert_non_null(strstr(mp_last_error(), "sequence_length 8"));
    mp_model_free(m);
}

/* Backward: the table's gradient against central differences of the
 * float64 loss (the mean of y^2 over the output, which is quadratic in each
 * table entry, so the central difference has no truncation error; the
 * float32 outputs (|y| < 2) squared and summed in float64 leave about
 * 2^-23 * 4 / (2 h) at h = 1/16; the test allows 1e-5 absolute plus 1e-5
 * relative). The Dense in front makes the gradient to x flow too. */
static void test_position_embedding_gradient(void **state)
{
    (void)state;
    mp_model *m = mp_model_new_with_policy(9, "float32");
    mp_node x = mp_input(m, 2, (int64_t[]){T, E}, NULL);
    mp_node h = mp_dense(m, x, E, MP_ACT_NONE, NULL);
    mp_node y = mp_position_embedding(m, h, T, NULL);
    assert_int_equal(mp_model_build(m, y, 3), MP_OK);
    static float xv[3 * T * E], zero[3 * T * E];
    test_rng r = {4};
    for (int i = 0; i < 3 * T * E; i++) xv[i] = (float)test_rng_uniform(&r, -0.5, 0.5);
    mp_tensor xt, target;
    mp_tensor_wrap(&xt, MP_F32, 3, (int64_t[]){3, T, E}, xv);
    mp_tensor_wrap(&target, MP_F32, 3, (int64_t[]){3, T, E}, zero);
    const mp_tensor *out;
    assert_int_equal(mp_model_forward(m, &xt, true, &out), MP_OK);
    mp_loss_spec spec = {MP_LOSS_MEAN_SQUARED_ERROR, false, NULL, &target, 0};
    float loss;
    assert_int_equal(mp_model_loss_backward(m, &spec, 1.0f, false, &loss), MP_OK);
    mp_model_param *P = mp_model_get_param(m, 2);
    assert_int_equal(P->n, T * E);
    float *grad = malloc((size_t)P->n * sizeof *grad);
    memcpy(grad, P->grad, (size_t)P->n * sizeof *grad);
    const double step = 1.0 / 16;
    for (int64_t k = 0; k < P->n; k += 7) {
        double l[2];
        float keep = P->master[k];
        for (int s = 0; s < 2; s++) {
            P->master[k] = keep + (float)(s ? step : -step);
            mp_model_mark_masters_changed(m);
            assert_int_equal(mp_model_forward(m, &xt, false, &out), MP_OK);
            double acc = 0;
            const float *yv = out->data;
            for (int i = 0; i < 3 * T * E; i++) acc += (double)yv[i] * yv[i];
            l[s] = acc / (3 * T * E);
        }
        P->master[k] = keep;
        mp_model_mark_masters_changed(m);
        double fd = (l[1] - l[0]) / (2 * step);
        assert_true(fabs(fd - grad[k]) <= 1e-5 + 1e-5 * fabs(fd));
    }
    free(grad);
    mp_model_free(m);
}

/* A prefill takes a prompt's positions as the rows of one batch (each
 * weight layer one GEMM of them): its rows, and the steps after it, are
 * the full forward's bits (want: its T rows of V), as one step per
 * position gives them (check_decode). Chunks of 3 and 5, and 5 then three
 * steps; then what a prefill refuses. */
static void check_prefill(mp_model *dec, int32_t *ids, const float *want)
{
    const mp_tensor *y;
    mp_tensor x;
    assert_int_equal(mp_model_max_batch(dec), T); /* 128, or the context if shorter */
    for (int split = 3; split <= 5; split += 2) {
        assert_int_equal(mp_model_decode_reset(dec, T), MP_OK);
        for (int at = 0; at < T;) {
            const int n = at ? T - at : split;
            mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){n, 1}, &ids[at]);
            if (split == 5 && at) { /* after the prefill, one step at a time */
                mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){1, 1}, &ids[at]);
                assert_int_equal(mp_model_decode_step(dec, &x, &y), MP_OK);
                if (memcmp(y->data, want + at * V, V * sizeof(float)))
                    fail_msg("decode after a prefill: position %d differs", at);
                at++;
                continue;
            }
            assert_int_equal(mp_model_decode_prefill(dec, &x, &y), MP_OK);
            assert_int_equal(y->shape[0], n);
            for (int r = 0; r < n; r++)
                if (memcmp((const float *)y->data + r * V, want + (at + r) * V, V * sizeof(float)))
                    fail_msg("prefill of %d from %d: position %d differs", n, at, at + r);
            at += n;
        }
        assert_int_equal(mp_model_decode_position(dec), T);
    }
    /* past the context: nothing runs, the position stays */
    assert_int_equal(mp_model_decode_reset(dec, T), MP_OK);
    mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){5, 1}, ids);
    assert_int_equal(mp_model_decode_prefill(dec, &x, &y), MP_OK);
    assert_int_equal(mp_model_decode_prefill(dec, &x, &y), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "position 9 is past the context of 8"));
    assert_int_equal(mp_model_decode_position(dec), 5);
    /* caches for two sequences: a prefill fills one; a step takes at most two */
    assert_int_equal(mp_model_decode_reset_sequences(dec, T, 2), MP_OK);
    assert_int_equal(mp_model_decode_prefill(dec, &x, &y), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "a prefill fills one sequence; the caches hold 2"));
    mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){3, 1}, ids);
    assert_int_equal(mp_model_decode_step(dec, &x, &y), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "a batch of 3 sequences; the caches hold 2"));
    mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){2, 1}, ids);
    assert_int_equal(mp_model_decode_step(dec, &x, &y), MP_OK);
    assert_int_equal(mp_model_decode_reset_sequences(dec, T, 0), MP_ERR_INVALID);
    assert_int_equal(mp_model_decode_reset_sequences(dec, T, T + 1), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "9 sequences (1..8, the max_batch)"));
    /* a batch over max_batch */
    assert_int_equal(mp_model_decode_reset_sequences(dec, T, 1), MP_OK);
    int32_t many[T + 1] = {0};
    mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){T + 1, 1}, many);
    assert_int_equal(mp_model_decode_prefill(dec, &x, &y), MP_ERR_INVALID);
}

/* Decoding one token at a time through the cache gives the full causal
 * forward's bits: the attention row is the forward kernel's arithmetic for
 * that position in its order (test_attention checks it alone), and every
 * other layer works on each position's row alone, the dense layers through
 * GEMM, whose element sums run over k in order whatever the number of rows
 * (its C^T swap only exchanges the factors of each product). float32, as
 * the model is compiled here. */
static void check_decode(const char *path, mp_model *full)
{
    mp_model *dec;
    int64_t context;
    assert_int_equal(mp_model_decoder_from_checkpoint(path, &dec, &context), MP_OK);
    assert_int_equal(context, T);
    int32_t ids[T];
    test_rng r = {8};
    for (int i = 0; i < T; i++) ids[i] = (int32_t)(test_rng_u32(&r) % V);
    mp_tensor x;
    mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){1, T}, ids);
    const mp_tensor *y;
    assert_int_equal(mp_model_forward(full, &x, false, &y), MP_OK);
    const float *want = y->data;
    for (int t = 0; t < T; t++) {
        const mp_tensor *yt;
        mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){1, 1}, &ids[t]);
        assert_int_equal(mp_model_decode_step(dec, &x, &yt), MP_OK);
        if (memcmp(yt->data, want + t * V, V * sizeof(float)))
            fail_msg("decode: position %d differs from the full forward's row", t);
    }
    assert_int_equal(mp_model_decode_position(dec), T);
    /* past the context */
    assert_int_equal(mp_model_decode_step(dec, &x, &y), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "context of 8"));
    /* a reset starts over and gives the same first output */
    assert_int_equal(mp_model_decode_reset(dec, T), MP_OK);
    mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){1, 1}, &ids[0]);
    assert_int_equal(mp_model_decode_step(dec, &x, &y), MP_OK);
    assert_memory_equal(y->data, want, V * sizeof(float));
    check_prefill(dec, ids, want);
    mp_model_free(dec);
}

static void test_decode(void **state)
{
    (void)state;
    mp_model *m = lm("float32", T, 1, true);
    compile(m);
    /* a few steps so the weights are not their initial values */
    int32_t ids[T], labels[T];
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < T; i++) ids[i] = (s * 7 + i * 13) % V, labels[i] = (i * 5 + s) % V;
        mp_tensor x;
        mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){1, T}, ids);
        mp_step_result r;
        assert_int_equal(mp_model_train_step(m, &x, labels, NULL, &r), MP_OK);
    }
    char *path = path_of("lm.safetensors");
    assert_int_equal(mp_model_save_checkpoint(m, path, NULL), MP_OK);
    check_decode(path, m);
    mp_model_free(m);
}

/* ReversibleEmbedding: logits x E^T from the Embedding's own table (one
 * parameter for both uses), and the table's gradient - the sum of the
 * Embedding's rows and the output projection's part - against central
 * differences of the mean -log p computed in float64 from predict's float32
 * probabilities, extrapolated from steps 1/64 and 1/128 (the h^4 term left
 * is below 1e-5 here; the probabilities' float32 rounding, about 2^-23 of
 * the loss, adds at most 5 * 2^-23 * 3 / (2/128) ~ 1.5e-4): 2e-4 absolute
 * plus 1e-3 relative. */
enum { TV = 24, TE = 8, TT = 4 };

static mp_model *tied_model(void)
{
    mp_model *m = mp_model_new_with_policy(21, "float32");
    mp_node x = mp_input_ex(m, 1, (int64_t[]){TT}, MP_I32, NULL);
    x = mp_embedding(m, x, TV, TE, &(mp_layer_options){.name = "emb"});
    x = mp_layer_norm(m, x, 1e-5f, NULL);
    x = mp_reversible_embedding(m, x, "emb", &(mp_layer_options){.name = "logits"});
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, NULL);
    assert_true(x >= 0);
    assert_int_equal(mp_model_build(m, x, 2), MP_OK);
    return m;
}

static double mean_nll(mp_model *m, const float *ids, const int32_t *labels)
{
    float p[2 * TT * TV];
    assert_int_equal(mp_model_predict(m, ids, 2, 2, p), MP_OK);
    double l = 0;
    for (int i = 0; i < 2 * TT; i++) l -= log((double)p[i * TV + labels[i]]);
    return l / (2 * TT);
}

static void test_reversible_embedding(void **state)
{
    (void)state;
    mp_model *m = tied_model();
    assert_int_equal(mp_model_num_params(m), 3); /* the table, gamma, beta */
    mp_model_param *tab = mp_model_get_param(m, 0);
    assert_string_equal(tab->name, "emb.embeddings");
    int32_t ids[2 * TT] = {1, 5, 5, 23, 0, 7, 1, 12}, labels[2 * TT] = {5, 5, 23, 3, 7, 1, 12, 0};
    float fids[2 * TT];
    for (int i = 0; i < 2 * TT; i++) fids[i] = (float)ids[i];
    mp_compile_options co = mp_compile_options_default();
    assert_int_equal(mp_model_compile(m, &co), MP_OK);
    mp_tensor x;
    mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){2, TT}, ids);
    const mp_tensor *y;
    assert_int_equal(mp_model_forward(m, &x, true, &y), MP_OK);
    mp_loss_spec spec = {MP_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY, false, labels, NULL, 0};
    float loss;
    assert_int_equal(mp_model_loss_backward(m, &spec, 1.0f, false, &loss), MP_OK);
    float *grad = malloc((size_t)tab->n * sizeof *grad);
    memcpy(grad, tab->grad, (size_t)tab->n * sizeof *grad);
    int unused_rows_nonzero = 0;
    for (int64_t k = 0; k < tab->n; k++) {
        /* Richardson's extrapolation of central differences at h and h/2
         * cancels the h^2 term (layer norm over 8 values curves sharply) */
        float keep = tab->master[k];
        double d[2];
        for (int j = 0; j < 2; j++) {
            float h = j ? 1.0f / 128 : 1.0f / 64;
            double l[2];
            for (int s = 0; s < 2; s++) {
                tab->master[k] = keep + (s ? h : -h);
                mp_model_mark_masters_changed(m);
                l[s] = mean_nll(m, fids, labels);
            }
            d[j] = (l[1] - l[0]) / (2.0 * h);
        }
        tab->master[k] = keep;
        mp_model_mark_masters_changed(m);
        double fd = (4 * d[1] - d[0]) / 3;
        if (!(fabs(fd - grad[k]) <= 2e-4 + 1e-3 * fabs(fd)))
            fail_msg("d loss / d E[%lld] = %.7g, central difference %.7g", (long long)k,
                     (double)grad[k], fd);
        int64_t row = k / TE; /* rows no id reads get only the projection's part */
        unused_rows_nonzero += (row == 2 || row == 20) && grad[k] != 0.0f;
    }
    assert_true(unused_rows_nonzero > 0);
    free(grad);
    /* the configuration names the table; a model rebuilt from it is the same */
    char *json = mp_model_config_json(m);
    assert_non_null(strstr(json, "\"ReversibleEmbedding\""));
    mp_model *again;
    assert_int_equal(mp_model_from_config(json, 2, 1 << 20, &again), MP_OK);
    assert_int_equal(mp_model_num_params(again), 3);
    free(json);
    mp_model_free(again);
    mp_model_free(m);
    /* a name that is not an earlier Embedding */
    m = mp_model_new_with_policy(21, "float32");
    mp_node in = mp_input(m, 1, (int64_t[]){TE}, &(mp_layer_options){.name = "in"});
    mp_node d = mp_dense(m, in, TE, MP_ACT_NONE, &(mp_layer_options){.name = "d"});
    assert_true(mp_reversible_embedding(m, d, "d", NULL) < 0);
    assert_non_null(strstr(mp_last_error(), "'d' is not an earlier Embedding layer"));
    mp_model_free(m);
}

static int setup(void **state)
{
    (void)state;
    return test_scratch_dir(dir, sizeof dir, "mp_text");
}

static int teardown(void **state)
{
    (void)state;
    return test_remove_tree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_dataset),
        cmocka_unit_test(test_text_directory),
        cmocka_unit_test(test_text_refusals),
        cmocka_unit_test(test_steps_per_epoch),
        cmocka_unit_test(test_text_resume),
        cmocka_unit_test(test_sequence_loss),
        cmocka_unit_test(test_position_embedding),
        cmocka_unit_test(test_position_embedding_gradient),
        cmocka_unit_test(test_decode),
        cmocka_unit_test(test_reversible_embedding),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
