/* test_safetensors.c - safetensors round trips, hostile files (each must be
 * refused with a message, never read out of bounds), atomic replacement, and
 * model weights saved and loaded bit for bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

static char dir[64];

static int setup(void **state)
{
    (void)state;
    return test_scratch_dir(dir, sizeof dir, "mp_st");
}

static int teardown(void **state)
{
    (void)state;
    return test_remove_tree(dir);
}

static const char *path_of(const char *name)
{
    static char p[128];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return p;
}

/* A raw file: 8-byte little-endian header length, header, data. */
static void write_raw(const char *path, const char *header, uint64_t claimed_len, const void *data,
                      size_t dlen)
{
    FILE *f = fopen(path, "wb");
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)(claimed_len >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite(header, 1, strlen(header), f);
    if (dlen) fwrite(data, 1, dlen, f);
    fclose(f);
}

static void test_round_trip(void **state)
{
    (void)state;
    float a[6] = {1, -2, 3.5f, 0, -0.0f, 1e-30f};
    uint16_t b[4] = {mp_f32_to_bf16(1.5f), mp_f32_to_bf16(-3), 0x7F80, 0};
    uint8_t c[3] = {mp_f32_to_e4m3(448), mp_f32_to_e4m3(-0.5f), 0};
    mp_named_tensor t[3] = {
        {"a.kernel", MP_F32, 2, {2, 3}, a},
        {"b", MP_BF16, 1, {4}, b},
        {"c", MP_F8E4M3, 1, {3}, c},
    };
    const char *k[] = {"format", "note"}, *v[] = {"pt", "hello \"json\""};
    const char *p = path_of("rt.safetensors");
    assert_int_equal(mp_safetensors_write(p, t, 3, k, v, 2), MP_OK);
    mp_safetensors *f;
    assert_int_equal(mp_safetensors_read(p, &f), MP_OK);
    assert_int_equal(mp_safetensors_count(f), 3);
    const mp_named_tensor *ra = mp_safetensors_find(f, "a.kernel");
    assert_non_null(ra);
    assert_int_equal(ra->dtype, MP_F32);
    assert_int_equal(ra->shape[1], 3);
    assert_memory_equal(ra->data, a, sizeof a);
    assert_memory_equal(mp_safetensors_find(f, "b")->data, b, sizeof b);
    assert_memory_equal(mp_safetensors_find(f, "c")->data, c, sizeof c);
    assert_string_equal(mp_safetensors_metadata(f, "note"), "hello \"json\"");
    assert_null(mp_safetensors_metadata(f, "nope"));
    assert_null(mp_safetensors_find(f, "zzz"));
    mp_safetensors_free(f);
    /* header length is a multiple of 8 (padded with spaces) */
    FILE *fp = fopen(p, "rb");
    uint8_t len8[8];
    assert_int_equal(fread(len8, 1, 8, fp), 8);
    fclose(fp);
    assert_int_equal(len8[0] % 8, 0);
}

static void expect_refused(const char *name, const char *header, uint64_t claimed, const void *data,
                           size_t dlen, const char *needle)
{
    const char *p = path_of(name);
    write_raw(p, header, claimed, data, dlen);
    mp_safetensors *f = (mp_safetensors *)1;
    mp_status s = mp_safetensors_read(p, &f);
    if (s == MP_OK) fail_msg("%s: accepted", name);
    assert_null(f);
    if (!strstr(mp_last_error(), needle))
        fail_msg("%s: message '%s' lacks '%s'", name, mp_last_error(), needle);
}

static void test_hostile_files(void **state)
{
    (void)state;
    uint8_t d[64] = {0};
    const char *ok = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    expect_refused("short", "", 0, NULL, 0, "header length");
    expect_refused("huge_len", ok, (uint64_t)1 << 40, d, 8, "header length");
    expect_refused("len_past_end", ok, strlen(ok) + 100, d, 8, "header length");
    expect_refused("not_json", "{\"x\":", 5, NULL, 0, "not valid JSON");
    expect_refused("not_object", "[1,2]", 5, NULL, 0, "not a JSON object");
    const char *dup = "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"x\":{"
                      "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}";
    expect_refused("duplicate", dup, strlen(dup), d, 8,
                   "not valid JSON"); /* jansson: duplicate object key */
    const char *dt = "{\"x\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}";
    expect_refused("dtype", dt, strlen(dt), d, 8, "unsupported dtype 'F64'");
    const char *mis = "{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}";
    expect_refused("size_mismatch", mis, strlen(mis), d, 8, "needs 12");
    const char *past = "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
    expect_refused("past_end", past, strlen(past), d, 8, "ends at byte 16");
    const char *ovl = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"y\":{"
                      "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}";
    expect_refused("overlap", ovl, strlen(ovl), d, 8, "overlaps");
    const char *gap = "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}";
    expect_refused("gap", gap, strlen(gap), d, 8, "gap");
    expect_refused("trailing", ok, strlen(ok), d, 12, "after the last tensor");
    const char *neg = "{\"x\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,8]}}";
    expect_refused("negative_dim", neg, strlen(neg), d, 8, "bad shape");
    const char *big = "{\"x\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,"
                      "4611686018427387904],\"data_offsets\":[0,8]}}";
    expect_refused("overflow_shape", big, strlen(big), d, 8, "needs");
    const char *badoff = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}";
    expect_refused("reversed_offsets", badoff, strlen(badoff), d, 8, "bad data_offsets");
    const char *meta = "{\"__metadata__\":{\"k\":1},\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_"
                       "offsets\":[0,8]}}";
    expect_refused("metadata_type", meta, strlen(meta), d, 8, "not a string");
    const char *fields = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2]}}";
    expect_refused("missing_offsets", fields, strlen(fields), d, 8,
                   "needs dtype, shape and data_offsets");
    mp_safetensors *f;
    assert_int_equal(mp_safetensors_read(path_of("does_not_exist"), &f), MP_ERR_IO);
    assert_non_null(strstr(mp_last_error(), "does_not_exist"));
    assert_int_equal(mp_safetensors_read(dir, &f), MP_ERR_IO); /* a directory */
    /* every truncation of a valid file is refused cleanly */
    float a[5] = {1, 2, 3, 4, 5};
    mp_named_tensor t = {"w", MP_F32, 1, {5}, a};
    const char *p = path_of("whole");
    assert_int_equal(mp_safetensors_write(p, &t, 1, NULL, NULL, 0), MP_OK);
    struct stat st;
    stat(p, &st);
    for (off_t len = 0; len < st.st_size; len++) {
        assert_int_equal(truncate(p, len), 0);
        assert_int_not_equal(mp_safetensors_read(p, &f), MP_OK);
        assert_int_equal(mp_safetensors_write(p, &t, 1, NULL, NULL, 0), MP_OK);
    }
}

static void test_atomic_replace(void **state)
{
    (void)state;
    float a[2] = {1, 2}, b[2] = {3, 4};
    mp_named_tensor t = {"w", MP_F32, 1, {2}, a};
    const char *p = path_of("atomic.safetensors");
    assert_int_equal(mp_safetensors_write(p, &t, 1, NULL, NULL, 0), MP_OK);
    /* a bad request fails before touching the file */
    mp_named_tensor bad[2] = {{"w", MP_F32, 1, {2}, b}, {"w", MP_F32, 1, {2}, b}};
    assert_int_equal(mp_safetensors_write(p, bad, 2, NULL, NULL, 0), MP_ERR_INVALID);
    mp_safetensors *f;
    assert_int_equal(mp_safetensors_read(p, &f), MP_OK);
    assert_memory_equal(mp_safetensors_find(f, "w")->data, a, sizeof a);
    mp_safetensors_free(f);
    /* an unwritable directory: an error naming the file (a failure at each
     * step of the write, with the temporaries it leaves behind, is covered
     * in test_checkpoint.c) */
    assert_int_equal(
        mp_safetensors_write("/nonexistent_dir_mp/x.safetensors", &t, 1, NULL, NULL, 0), MP_ERR_IO);
    assert_non_null(strstr(mp_last_error(), "x.safetensors"));
}

static mp_model *mlp(const char *policy, int64_t hidden)
{
    mp_set_global_policy(policy);
    mp_model *m = mp_model_new(5);
    mp_node x = mp_input(m, 1, (int64_t[]){12}, NULL);
    x = mp_dense(m, x, hidden, MP_ACT_RELU, NULL);
    x = mp_layer_norm(m, x, 1e-3f, NULL);
    x = mp_dense(m, x, 4, MP_ACT_NONE, NULL);
    mp_set_global_policy("float32");
    assert_int_equal(mp_model_build(m, x, 8), MP_OK);
    return m;
}

static void test_model_weights(void **state)
{
    (void)state;
    const char *policies[] = {"float32", "mixed_bfloat16", "bfloat16"};
    for (int pi = 0; pi < 3; pi++) {
        mp_model *a = mlp(policies[pi], 16);
        /* move every parameter off its initial value so the load is visible
         * (under a pure policy the weights themselves: there is no master) */
        for (int i = 0; i < mp_model_num_params(a); i++) {
            mp_model_param *p = mp_model_get_param(a, i);
            float *v = malloc((size_t)p->n * sizeof *v);
            mp_convert(v, MP_F32, p->master ? (void *)p->master : p->weight,
                       p->master ? MP_F32 : p->weight_dtype, (size_t)p->n);
            for (int64_t j = 0; j < p->n; j++) v[j] += 0.25f + 0.01f * (float)(j % 7);
            mp_convert(p->master ? (void *)p->master : p->weight,
                       p->master ? MP_F32 : p->weight_dtype, v, MP_F32, (size_t)p->n);
            free(v);
        }
        mp_model_mark_masters_changed(a);
        const char *p = path_of("model.safetensors");
        assert_int_equal(mp_model_save_weights(a, p), MP_OK);
        mp_model *b = mlp(policies[pi], 16);
        assert_int_equal(mp_model_load_weights(b, p), MP_OK);
        mp_tensor x;
        mp_tensor_init(&x, MP_F32, 2, (int64_t[]){8, 12}, MP_MEM_OTHER);
        for (int i = 0; i < 96; i++) ((float *)x.data)[i] = (float)(i % 11) * 0.1f - 0.5f;
        const mp_tensor *ya, *yb;
        assert_int_equal(mp_model_forward(a, &x, false, &ya), MP_OK);
        float out[32];
        memcpy(out, ya->data, mp_tensor_bytes(ya));
        assert_int_equal(mp_model_forward(b, &x, false, &yb), MP_OK);
        assert_memory_equal(out, yb->data, mp_tensor_bytes(yb)); /* bit for bit */
        mp_tensor_release(&x);
        for (int i = 0; i < mp_model_num_params(a); i++) { /* and every parameter */
            mp_model_param *pa = mp_model_get_param(a, i), *pb = mp_model_get_param(b, i);
            if (pa->master)
                assert_memory_equal(pa->master, pb->master, (size_t)pa->n * sizeof(float));
            assert_memory_equal(pa->weight, pb->weight,
                                (size_t)pa->n * mp_dtype_size(pa->weight_dtype));
        }
        /* a different architecture is refused and left untouched */
        mp_model *c = mlp(policies[pi], 17);
        mp_model_param *c0 = mp_model_get_param(c, 0);
        size_t cbytes = (size_t)c0->n * mp_dtype_size(c0->weight_dtype);
        void *before = malloc(cbytes);
        memcpy(before, c0->weight, cbytes);
        assert_int_equal(mp_model_load_weights(c, p), MP_ERR_FORMAT);
        assert_non_null(strstr(mp_last_error(), "dense.kernel"));
        assert_memory_equal(c0->weight, before, cbytes);
        free(before);
        mp_model_free(a);
        mp_model_free(b);
        mp_model_free(c);
    }
    /* a missing tensor, then NaN in a file: reported, not loaded */
    float w[4] = {1, 2, 0, 0};
    mp_named_tensor t = {"dense.kernel", MP_F32, 2, {2, 2}, w};
    const char *p = path_of("nan.safetensors");
    assert_int_equal(mp_safetensors_write(p, &t, 1, NULL, NULL, 0), MP_OK);
    mp_set_global_policy("float32");
    mp_model *m = mp_model_new(1);
    mp_node x = mp_dense(m, mp_input(m, 1, (int64_t[]){2}, NULL), 2, MP_ACT_NONE, NULL);
    assert_int_equal(mp_model_build(m, x, 1), MP_OK);
    assert_int_equal(mp_model_load_weights(m, p), MP_ERR_FORMAT); /* no bias tensor */
    assert_non_null(strstr(mp_last_error(), "dense.bias"));
    float bias[2] = {0, 0};
    w[1] = NAN;
    mp_named_tensor two[2] = {t, {"dense.bias", MP_F32, 1, {2}, bias}};
    assert_int_equal(mp_safetensors_write(p, two, 2, NULL, NULL, 0), MP_OK);
    assert_int_equal(mp_model_load_weights(m, p), MP_ERR_FORMAT);
    assert_non_null(strstr(mp_last_error(), "non-finite"));
    mp_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_hostile_files),
        cmocka_unit_test(test_atomic_replace),
        cmocka_unit_test(test_model_weights),
    };
    return cmocka_run_group_tests_name("safetensors", tests, setup, teardown);
}
