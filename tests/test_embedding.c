/* test_embedding.c - the Embedding layer: forward copies table rows bit for
 * bit (float32 master, bfloat16 compute copy), backward scatter-adds the
 * output gradient into the float32 table gradient (against float32 sums in
 * the same order bit for bit and a float64 reference within its rounding
 * bound, accumulate adding), ids outside the table fail and change nothing,
 * float inputs are refused (and int32 inputs elsewhere), a small token model
 * learns, and its configuration and checkpoints round-trip exactly. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

enum { V = 13, DIM = 6, T = 5, BATCH = 4 };

/* Input(int32, [T]) -> Embedding(V, DIM) named "tok_emb", built. */
static mp_model *table_model(const char *policy, mp_node *emb)
{
    mp_model *m = mp_model_new_with_policy(3, policy);
    assert_non_null(m);
    mp_node x = mp_input_ex(m, 1, (int64_t[]){T}, MP_I32, NULL);
    *emb = mp_embedding(m, x, V, DIM, &(mp_layer_options){.name = "tok_emb"});
    assert_true(*emb >= 0);
    assert_int_equal(mp_model_build(m, *emb, BATCH), MP_OK);
    return m;
}

/* ids with repeats (17 draws over 13 rows, some rows never drawn) */
static void fill_ids(int32_t *ids, int64_t n, uint64_t seed)
{
    test_rng r = {seed};
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(test_rng_u32(&r) % 9); /* rows 0..8 */
}

/* ---------------------------------------------------------------- forward */

static void test_forward_copies_rows(void **state)
{
    (void)state;
    const char *policies[] = {"float32", "mixed_bfloat16", "bfloat16"};
    for (int pi = 0; pi < 3; pi++) {
        mp_node e;
        mp_model *m = table_model(policies[pi], &e);
        mp_model_param *p = mp_model_get_param(m, 0);
        assert_string_equal(p->name, "tok_emb.embeddings");
        if (pi == 2) { /* pure bfloat16: the table itself is bfloat16, no master */
            assert_null(p->master);
            assert_int_equal(p->weight_dtype, MP_BF16);
            int32_t ids[BATCH * T];
            fill_ids(ids, BATCH * T, 12);
            mp_tensor x;
            mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){BATCH, T}, ids);
            const mp_tensor *y;
            assert_int_equal(mp_model_forward(m, &x, false, &y), MP_OK);
            assert_int_equal(y->dtype, MP_BF16);
            for (int i = 0; i < BATCH * T; i++)
                assert_memory_equal((const uint16_t *)y->data + i * DIM,
                                    (const uint16_t *)p->weight + ids[i] * DIM,
                                    DIM * sizeof(uint16_t));
            mp_model_free(m);
            continue;
        }
        assert_int_equal(p->role, MP_ROLE_EMBEDDINGS);
        assert_int_equal(p->ndim, 2);
        assert_int_equal(p->shape[0], V);
        assert_int_equal(p->shape[1], DIM);
        assert_non_null(p->master);
        /* Keras's "uniform": U(-0.05, 0.05), not all equal */
        for (int64_t j = 0; j < p->n; j++) assert_true(fabsf(p->master[j]) <= 0.05f);
        assert_true(p->master[0] != p->master[1]);
        int32_t ids[BATCH * T];
        fill_ids(ids, BATCH * T, 11);
        ids[3] = V - 1; /* the last row too */
        mp_tensor x;
        mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){BATCH, T}, ids);
        const mp_tensor *y;
        assert_int_equal(mp_model_forward(m, &x, false, &y), MP_OK);
        assert_int_equal(y->ndim, 3);
        assert_int_equal(y->shape[0], BATCH);
        assert_int_equal(y->shape[1], T);
        assert_int_equal(y->shape[2], DIM);
        if (pi == 0) {
            assert_int_equal(y->dtype, MP_F32);
            for (int i = 0; i < BATCH * T; i++)
                assert_memory_equal((const float *)y->data + i * DIM, p->master + ids[i] * DIM,
                                    DIM * sizeof(float));
        } else {
            /* exactly the bfloat16 compute copy of the rows (round to nearest
             * even of the master, as the copy is made) */
            assert_int_equal(y->dtype, MP_BF16);
            assert_int_equal(p->weight_dtype, MP_BF16);
            uint16_t want[DIM];
            for (int i = 0; i < BATCH * T; i++) {
                mp_convert(want, MP_BF16, p->master + ids[i] * DIM, MP_F32, DIM);
                assert_memory_equal((const uint16_t *)y->data + i * DIM, want, sizeof want);
            }
        }
        /* the plan's saved bytes are what the forward took */
        size_t planned = 0;
        for (int i = 0; i < mp_model_num_layers(m); i++) {
            mp_layer_info li;
            assert_int_equal(mp_model_layer_info(m, i, BATCH, &li), MP_OK);
            planned += li.saved_bytes;
            if (i == e) {
                assert_string_equal(li.type, "Embedding");
                assert_int_equal(li.params, V * DIM);
            }
        }
        assert_int_equal(planned, mp_model_activation_bytes(m));
        FILE *f = tmpfile();
        assert_int_equal(mp_model_summary(m, BATCH, f), MP_OK);
        rewind(f);
        char buf[4096];
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        buf[len] = 0;
        fclose(f);
        assert_non_null(strstr(buf, "tok_emb (Embedding)"));
        mp_model_free(m);
    }
}

/* ids [batch, 2, 3] -> [batch, 2, 3, DIM], the rows in order. */
static void test_forward_nd_ids(void **state)
{
    (void)state;
    mp_model *m = mp_model_new(5);
    mp_node x = mp_input_ex(m, 2, (int64_t[]){2, 3}, MP_I32, NULL);
    mp_node e = mp_embedding(m, x, 7, 4, NULL);
    assert_int_equal(mp_model_build(m, e, 2), MP_OK);
    int32_t ids[12] = {6, 0, 1, 1, 5, 2, 3, 4, 6, 6, 0, 2};
    mp_tensor t;
    mp_tensor_wrap(&t, MP_I32, 3, (int64_t[]){2, 2, 3}, ids);
    const mp_tensor *y;
    assert_int_equal(mp_model_forward(m, &t, false, &y), MP_OK);
    assert_int_equal(y->ndim, 4);
    assert_memory_equal(y->shape, ((int64_t[]){2, 2, 3, 4}), 4 * sizeof(int64_t));
    const float *w = mp_model_get_param(m, 0)->master;
    for (int i = 0; i < 12; i++)
        assert_memory_equal((const float *)y->data + i * 4, w + ids[i] * 4, 4 * sizeof(float));
    mp_model_free(m);
}

/* --------------------------------------------------------------- backward */

/* The gradient the layer received, widened to float32. */
static void node_grad_f32(mp_model *m, mp_node e, float *out)
{
    const mp_tensor *g = mp_model_node_grad(m, e);
    assert_non_null(g);
    assert_int_equal(mp_tensor_numel(g), BATCH * T * DIM);
    mp_convert(out, MP_F32, g->data, g->dtype, BATCH * T * DIM);
}

/* Backward against two references. The layer sums in float32, in the order
 * of the ids: a float32 sum in the same order matches it bit for bit. A
 * float64 sum is (almost) exact; a float32 sum of k terms differs from the
 * exact one by at most (k - 1) u sum|terms| (u = 2^-24, the unit roundoff;
 * Higham's gamma_{k-1} bound, to first order), so we allow k u sum|terms|
 * per element, k the number of times its row was drawn (plus one for the
 * value already there when accumulating). Rows never drawn are exactly 0
 * (or keep their value when accumulating). */
static void check_grad(const float *grad, const float *before, const int32_t *ids, const float *g,
                       const char *what)
{
    float f32[V * DIM];
    double f64[V * DIM], mag[V * DIM];
    int count[V] = {0};
    for (int j = 0; j < V * DIM; j++) {
        f32[j] = before ? before[j] : 0.0f;
        f64[j] = f32[j];
        mag[j] = fabs(f64[j]);
    }
    for (int i = 0; i < BATCH * T; i++) {
        count[ids[i]]++;
        for (int d = 0; d < DIM; d++) {
            f32[ids[i] * DIM + d] += g[i * DIM + d];
            f64[ids[i] * DIM + d] += g[i * DIM + d];
            mag[ids[i] * DIM + d] += fabs(g[i * DIM + d]);
        }
    }
    for (int j = 0; j < V * DIM; j++) {
        int k = count[j / DIM] + (before != NULL);
        double tol = k * 0x1p-24 * mag[j];
        if (f32_bits(grad[j]) != f32_bits(f32[j]))
            fail_msg("%s: grad[%d] = %.9g, float32 in order %.9g", what, j, (double)grad[j],
                     (double)f32[j]);
        if (fabs(grad[j] - f64[j]) > tol)
            fail_msg("%s: grad[%d] = %.9g, float64 %.17g (tolerance %.3g)", what, j,
                     (double)grad[j], f64[j], tol);
        if (count[j / DIM] == 0 && f32_bits(grad[j]) != f32_bits(before ? before[j] : 0.0f))
            fail_msg("%s: row %d was never drawn but changed", what, j / DIM);
    }
}

static void random_dy(mp_tensor *dy, uint64_t seed)
{
    assert_int_equal(mp_tensor_init(dy, MP_F32, 3, (int64_t[]){BATCH, T, DIM}, MP_MEM_OTHER),
                     MP_OK);
    test_rng r = {seed};
    for (int i = 0; i < BATCH * T * DIM; i++)
        ((float *)dy->data)[i] = (float)test_rng_uniform(&r, -2, 2);
}

static void test_backward_scatter_add(void **state)
{
    (void)state;
    const char *policies[] = {"float32", "mixed_bfloat16", "mixed_float16"};
    for (int pi = 0; pi < 3; pi++) {
        mp_node e;
        mp_model *m = table_model(policies[pi], &e);
        mp_model_param *p = mp_model_get_param(m, 0);
        int32_t ids[BATCH * T], ids2[BATCH * T];
        fill_ids(ids, BATCH * T, 21);
        fill_ids(ids2, BATCH * T, 22);
        ids2[0] = 12; /* a row the first batch never drew */
        mp_tensor x, x2, dy, dy2;
        mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){BATCH, T}, ids);
        mp_tensor_wrap(&x2, MP_I32, 2, (int64_t[]){BATCH, T}, ids2);
        random_dy(&dy, 31);
        random_dy(&dy2, 32);
        /* a dirty gradient: accumulate = false must clear every row */
        for (int64_t j = 0; j < p->n; j++) p->grad[j] = 7.0f;
        float g[BATCH * T * DIM], before[V * DIM];
        assert_int_equal(mp_model_forward(m, &x, true, NULL), MP_OK);
        /* the ids were copied: changing the caller's buffer before backward
         * does not move the gradient */
        int32_t saved[BATCH * T];
        memcpy(saved, ids, sizeof ids);
        for (int i = 0; i < BATCH * T; i++) ids[i] = (ids[i] + 5) % V;
        assert_int_equal(mp_model_backward(m, &dy, false), MP_OK);
        memcpy(ids, saved, sizeof ids);
        node_grad_f32(m, e, g); /* dy in the compute dtype, as the layer saw it */
        char what[64];
        snprintf(what, sizeof what, "%s, fresh", policies[pi]);
        check_grad(p->grad, NULL, ids, g, what);
        /* accumulate = true adds the next batch onto it */
        memcpy(before, p->grad, sizeof before);
        assert_int_equal(mp_model_forward(m, &x2, true, NULL), MP_OK);
        assert_int_equal(mp_model_backward(m, &dy2, true), MP_OK);
        node_grad_f32(m, e, g);
        snprintf(what, sizeof what, "%s, accumulated", policies[pi]);
        check_grad(p->grad, before, ids2, g, what);
        /* and accumulate = false starts over: the first batch's rows that
         * the second did not draw are zero again */
        assert_int_equal(mp_model_backward(m, &dy2, false), MP_OK);
        snprintf(what, sizeof what, "%s, again", policies[pi]);
        check_grad(p->grad, NULL, ids2, g, what);
        mp_tensor_release(&dy);
        mp_tensor_release(&dy2);
        mp_model_free(m);
    }
}

/* ----------------------------------------------------------------- errors */

static void test_ids_out_of_range(void **state)
{
    (void)state;
    mp_node e;
    mp_model *m = table_model("mixed_bfloat16", &e);
    mp_model_param *p = mp_model_get_param(m, 0);
    int32_t ids[BATCH * T];
    fill_ids(ids, BATCH * T, 41);
    mp_tensor x, dy;
    mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){BATCH, T}, ids);
    random_dy(&dy, 42);
    const mp_tensor *y;
    assert_int_equal(mp_model_forward(m, &x, true, &y), MP_OK);
    assert_int_equal(mp_model_backward(m, &dy, false), MP_OK);
    uint16_t out[BATCH * T * DIM], weight[V * DIM];
    float master[V * DIM], grad[V * DIM];
    memcpy(out, y->data, sizeof out);
    memcpy(weight, p->weight, sizeof weight);
    memcpy(master, p->master, sizeof master);
    memcpy(grad, p->grad, sizeof grad);
    const int32_t bad[2] = {-1, V};
    for (int b = 0; b < 2; b++) {
        int32_t ids_bad[BATCH * T];
        memcpy(ids_bad, ids, sizeof ids);
        ids_bad[BATCH * T - 2] = bad[b]; /* late: the rows before it are fine */
        mp_tensor xb;
        mp_tensor_wrap(&xb, MP_I32, 2, (int64_t[]){BATCH, T}, ids_bad);
        assert_int_equal(mp_model_forward(m, &xb, true, NULL), MP_ERR_INVALID);
        const char *msg = mp_last_error();
        char id[16];
        snprintf(id, sizeof id, "id %d", bad[b]);
        if (!strstr(msg, "tok_emb") || !strstr(msg, id) || !strstr(msg, "0..12") ||
            strchr(msg, '\n'))
            fail_msg("message: %s", msg);
        assert_memory_equal(p->weight, weight, sizeof weight);
        assert_memory_equal(p->master, master, sizeof master);
        assert_memory_equal(p->grad, grad, sizeof grad);
    }
    /* the model still works, and gives what it gave */
    assert_int_equal(mp_model_forward(m, &x, true, &y), MP_OK);
    assert_memory_equal(y->data, out, sizeof out);
    mp_tensor_release(&dy);
    mp_model_free(m);
}

static void test_refusals(void **state)
{
    (void)state;
    /* a float Input feeding an Embedding */
    mp_model *m = mp_model_new(1);
    mp_node x = mp_input(m, 1, (int64_t[]){T}, NULL);
    assert_int_equal(mp_embedding(m, x, V, DIM, NULL), -1);
    const char *msg = mp_last_error();
    if (!strstr(msg, "embedding") || !strstr(msg, "int32") || !strstr(msg, "float32"))
        fail_msg("message: %s", msg);
    assert_int_equal(mp_model_build(m, x, 1), MP_ERR_INVALID); /* sticky */
    mp_model_free(m);
    /* an int32 Input feeding a Dense */
    m = mp_model_new(1);
    x = mp_input_ex(m, 1, (int64_t[]){T}, MP_I32, NULL);
    assert_int_equal(mp_dense(m, x, 3, MP_ACT_NONE, NULL), -1);
    if (!strstr(mp_last_error(), "int32")) fail_msg("message: %s", mp_last_error());
    mp_model_free(m);
    /* bad sizes, each named */
    const int64_t dims[4][2] = {{0, 4}, {4, 0}, {((int64_t)1 << 26) + 1, 4}, {4, -3}};
    const char *field[4] = {"input_dim", "output_dim", "input_dim", "output_dim"};
    for (int i = 0; i < 4; i++) {
        m = mp_model_new(1);
        x = mp_input_ex(m, 1, (int64_t[]){T}, MP_I32, NULL);
        assert_int_equal(mp_embedding(m, x, dims[i][0], dims[i][1], NULL), -1);
        if (!strstr(mp_last_error(), field[i])) fail_msg("message: %s", mp_last_error());
        mp_model_free(m);
    }
    /* an Embedding output feeds float layers as usual; a second Embedding
     * on it is refused (it is not int32) */
    m = mp_model_new(1);
    x = mp_input_ex(m, 1, (int64_t[]){T}, MP_I32, NULL);
    mp_node e = mp_embedding(m, x, V, DIM, NULL);
    assert_true(mp_dense(m, e, 2, MP_ACT_NONE, NULL) >= 0);
    assert_int_equal(mp_embedding(m, e, V, DIM, NULL), -1);
    mp_model_free(m);
}

/* ----------------------------------------------------- the token model */

enum { SEQ = 6, VOCAB = 20, WIDTH = 8, CLASSES = 4, TB = 32 };

/* Input(int32, [SEQ]) -> Embedding(VOCAB, WIDTH) -> Flatten -> Dense(4) ->
 * softmax (float32), compiled with Adam. */
static mp_model *token_model(const char *policy, bool compile)
{
    mp_model *m = mp_model_new_with_policy(17, policy);
    assert_non_null(m);
    mp_node x = mp_input_ex(m, 1, (int64_t[]){SEQ}, MP_I32, NULL);
    x = mp_embedding(m, x, VOCAB, WIDTH, NULL);
    x = mp_flatten(m, x, NULL);
    x = mp_dense(m, x, CLASSES, MP_ACT_NONE, NULL);
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
    assert_true(x >= 0);
    assert_int_equal(mp_model_build(m, x, TB), MP_OK);
    if (compile) {
        mp_compile_options co = mp_compile_options_default();
        co.optimizer.learning_rate = 1e-2f;
        assert_int_equal(mp_model_compile(m, &co), MP_OK);
    }
    return m;
}

/* Batch `step` of the toy task: random tokens, label = first token mod 4. */
static void token_batch(uint64_t step, int32_t *ids, int32_t *labels)
{
    test_rng r = {1000 + step};
    for (int i = 0; i < TB; i++) {
        for (int t = 0; t < SEQ; t++) ids[i * SEQ + t] = (int32_t)(test_rng_u32(&r) % VOCAB);
        labels[i] = ids[i * SEQ] % CLASSES;
    }
}

static void train_steps(mp_model *m, uint64_t from, uint64_t to)
{
    int32_t ids[TB * SEQ], labels[TB];
    mp_tensor x;
    mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){TB, SEQ}, ids);
    for (uint64_t s = from; s < to; s++) {
        token_batch(s, ids, labels);
        mp_step_result r;
        assert_int_equal(mp_model_train_step(m, &x, labels, NULL, &r), MP_OK);
        assert_true(r.applied);
    }
}

/* Mean loss over 4 held-out batches. */
static double eval_loss(mp_model *m)
{
    int32_t ids[TB * SEQ], labels[TB];
    mp_tensor x;
    mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){TB, SEQ}, ids);
    double sum = 0;
    for (uint64_t s = 0; s < 4; s++) {
        token_batch(1000000 + s, ids, labels);
        mp_step_result r;
        assert_int_equal(mp_model_test_step(m, &x, labels, NULL, &r), MP_OK);
        sum += r.loss;
    }
    return sum / 4;
}

/* The loss starts near ln 4 = 1.386 (a near-uniform softmax). 150 Adam
 * steps at lr 0.01 take it to about 0.015 in both policies (the task is an
 * exact lookup of the first token); with the table frozen at its
 * initialization the Dense alone only gets to about 1.32. We require a
 * tenth of the start: far from both. */
static void test_token_model_learns(void **state)
{
    (void)state;
    const char *policies[] = {"float32", "mixed_bfloat16"};
    for (int pi = 0; pi < 2; pi++) {
        mp_model *m = token_model(policies[pi], true);
        double before = eval_loss(m);
        assert_true(fabs(before - log(4.0)) < 0.1);
        train_steps(m, 0, 150);
        double after = eval_loss(m);
        if (!(after < 0.1 * before)) fail_msg("%s: loss %.4f -> %.4f", policies[pi], before, after);
        mp_model_free(m);
    }
}

/* ---------------------------------------------------- config and files */

static void assert_same_params(mp_model *a, mp_model *b, const char *what)
{
    assert_int_equal(mp_model_num_params(a), mp_model_num_params(b));
    for (int i = 0; i < mp_model_num_params(a); i++) {
        mp_model_param *p = mp_model_get_param(a, i), *q = mp_model_get_param(b, i);
        assert_string_equal(p->name, q->name);
        assert_int_equal(p->weight_dtype, q->weight_dtype);
        if (memcmp(p->master, q->master, (size_t)p->n * sizeof(float)) ||
            memcmp(p->weight, q->weight, (size_t)p->n * mp_dtype_size(p->weight_dtype)))
            fail_msg("%s: parameter %s differs", what, p->name);
    }
}

static void test_config_round_trip(void **state)
{
    (void)state;
    mp_model *m = token_model("mixed_bfloat16", false);
    char *json = mp_model_config_json(m);
    assert_non_null(json);
    assert_non_null(strstr(json, "\"class_name\":\"Embedding\""));
    assert_non_null(strstr(json, "\"input_dim\":20"));
    assert_non_null(strstr(json, "\"output_dim\":8"));
    assert_non_null(strstr(json, "\"dtype\":\"int32\""));
    mp_model *b;
    assert_int_equal(mp_model_from_config(json, TB, 1 << 20, &b), MP_OK);
    char *again = mp_model_config_json(b);
    assert_string_equal(json, again);
    free(again);
    assert_int_equal(mp_model_num_layers(b), mp_model_num_layers(m));
    for (int i = 0; i < mp_model_num_layers(m); i++) {
        mp_layer_info u, v;
        assert_int_equal(mp_model_layer_info(m, i, TB, &u), MP_OK);
        assert_int_equal(mp_model_layer_info(b, i, TB, &v), MP_OK);
        assert_string_equal(u.name, v.name);
        assert_string_equal(u.type, v.type);
        assert_string_equal(u.policy.name, v.policy.name);
        assert_int_equal(u.output_dtype, v.output_dtype);
        assert_int_equal(u.ndim, v.ndim);
        assert_memory_equal(u.shape, v.shape, (size_t)u.ndim * sizeof(int64_t));
        assert_int_equal(u.params, v.params);
        assert_int_equal(u.saved_bytes, v.saved_bytes);
    }
    mp_layer_info in;
    assert_int_equal(mp_model_layer_info(b, 0, TB, &in), MP_OK);
    assert_int_equal(in.output_dtype, MP_I32);
    assert_same_params(m, b, "config round trip");
    /* the same outputs, bit for bit */
    int32_t ids[TB * SEQ], labels[TB];
    token_batch(5, ids, labels);
    mp_tensor x;
    mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){TB, SEQ}, ids);
    const mp_tensor *ya, *yb;
    assert_int_equal(mp_model_forward(m, &x, false, &ya), MP_OK);
    assert_int_equal(mp_model_forward(b, &x, false, &yb), MP_OK);
    assert_memory_equal(ya->data, yb->data, TB * CLASSES * sizeof(float));
    mp_model_free(b);
    /* bad settings are refused, naming the field */
    const char *edits[][3] = {{"\"output_dim\":8", "\"output_dim\":0", "output_dim"},
                              {"\"input_dim\":20", "\"input_dim\":-1", "input_dim"},
                              {"\"input_dim\":20", "\"input_dim\":\"20\"", "input_dim"},
                              {"\"output_dim\":8", "\"output_dim\":67108865", "output_dim"},
                              {",\"output_dim\":8", "", "output_dim"}, /* missing */
                              {"\"dtype\":\"int32\"", "\"dtype\":\"float32\"", "int32"}};
    for (int k = 0; k < 6; k++) {
        const char *at = strstr(json, edits[k][0]);
        assert_non_null(at);
        size_t pre = (size_t)(at - json), len = strlen(json) + 64;
        char *bad = malloc(len);
        snprintf(bad, len, "%.*s%s%s", (int)pre, json, edits[k][1], at + strlen(edits[k][0]));
        b = NULL;
        assert_int_not_equal(mp_model_from_config(bad, TB, 1 << 20, &b), MP_OK);
        assert_null(b);
        if (!strstr(mp_last_error(), edits[k][2]))
            fail_msg("edit %d: message: %s", k, mp_last_error());
        free(bad);
    }
    free(json);
    mp_model_free(m);
}

/* Optimizer state, step counts and parameters of two models, bit for bit.
 * A load refreshes compute copies lazily, at the next forward: one
 * inference forward each (which moves no counter) brings them up to date. */
static void assert_same_training(mp_model *a, mp_model *b, const char *what)
{
    int32_t ids[TB * SEQ], labels[TB];
    token_batch(7, ids, labels);
    mp_tensor x;
    mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){TB, SEQ}, ids);
    const mp_tensor *ya, *yb;
    assert_int_equal(mp_model_forward(a, &x, false, &ya), MP_OK);
    assert_int_equal(mp_model_forward(b, &x, false, &yb), MP_OK);
    if (memcmp(ya->data, yb->data, TB * CLASSES * sizeof(float)))
        fail_msg("%s: outputs differ", what);
    assert_same_params(a, b, what);
    mp_optimizer *oa = mp_model_optimizer(a), *ob = mp_model_optimizer(b);
    assert_int_equal(mp_optimizer_step_count(oa), mp_optimizer_step_count(ob));
    assert_int_equal(mp_optimizer_num_slots(oa), mp_optimizer_num_slots(ob));
    for (int i = 0; i < mp_model_num_params(a); i++)
        for (int k = 0; k < mp_optimizer_num_slots(oa); k++) {
            int64_t n;
            float *u = mp_optimizer_slot(oa, i, k, &n), *v = mp_optimizer_slot(ob, i, k, NULL);
            if (memcmp(u, v, (size_t)n * sizeof *u))
                fail_msg("%s: optimizer slot %d of parameter %d differs", what, k, i);
        }
    assert_int_equal(mp_model_steps_applied(a), mp_model_steps_applied(b));
}

/* 40 steps straight = 20 steps, checkpoint, load into a fresh model (and
 * rebuild one from the file alone), 20 more. */
static void test_checkpoint_resumes_exactly(void **state)
{
    (void)state;
    const char *policies[] = {"float32", "mixed_bfloat16"};
    for (int pi = 0; pi < 2; pi++) {
        char dir[64], path[128];
        assert_int_equal(test_scratch_dir(dir, sizeof dir, "mp_emb"), 0);
        snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
        mp_model *straight = token_model(policies[pi], true);
        train_steps(straight, 0, 40);
        mp_model *first = token_model(policies[pi], true);
        train_steps(first, 0, 20);
        assert_int_equal(mp_model_save_checkpoint(first, path, NULL), MP_OK);
        /* into a built, uncompiled model: compiled from the file */
        mp_model *loaded = token_model(policies[pi], false);
        assert_int_equal(mp_model_load_checkpoint(loaded, path, NULL), MP_OK);
        assert_same_training(first, loaded, "after load");
        mp_model *rebuilt;
        assert_int_equal(mp_model_from_checkpoint(path, TB, &rebuilt, NULL), MP_OK);
        assert_same_training(first, rebuilt, "after rebuild");
        train_steps(loaded, 20, 40);
        train_steps(rebuilt, 20, 40);
        char what[64];
        snprintf(what, sizeof what, "%s, loaded", policies[pi]);
        assert_same_training(straight, loaded, what);
        snprintf(what, sizeof what, "%s, rebuilt", policies[pi]);
        assert_same_training(straight, rebuilt, what);
        mp_model_free(straight);
        mp_model_free(first);
        mp_model_free(loaded);
        mp_model_free(rebuilt);
        test_remove_tree(dir);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_copies_rows),
        cmocka_unit_test(test_forward_nd_ids),
        cmocka_unit_test(test_backward_scatter_add),
        cmocka_unit_test(test_ids_out_of_range),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_token_model_learns),
        cmocka_unit_test(test_config_round_trip),
        cmocka_unit_test(test_checkpoint_resumes_exactly),
    };
    return cmocka_run_group_tests_name("embedding", tests, NULL, NULL);
}
