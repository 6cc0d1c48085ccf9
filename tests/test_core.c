/* test_core.c - memory accounting, the arena, tensors and error reporting:
 * exact figures for scripted sequences. */
#include <string.h>

#include "common.h"

static mp_mem_stats stats(void)
{
    mp_mem_stats s;
    mp_mem_get_stats(&s);
    return s;
}

static void test_accounting_script(void **state)
{
    (void)state;
    mp_mem_stats s0 = stats();
    mp_mem_reset_peaks();

    void *w = mp_alloc(1000, MP_MEM_MASTER);
    void *g = mp_alloc(3000, MP_MEM_GRADS);
    assert_non_null(w);
    assert_non_null(g);
    assert_int_equal(((uintptr_t)w) % 64, 0);
    mp_mem_stats s = stats();
    assert_int_equal(s.current[MP_MEM_MASTER] - s0.current[MP_MEM_MASTER], 1000);
    assert_int_equal(s.current[MP_MEM_GRADS] - s0.current[MP_MEM_GRADS], 3000);
    assert_int_equal(s.total_current - s0.total_current, 4000);

    mp_arena *a = mp_arena_create(1 << 20, MP_MEM_ACTIVATIONS);
    assert_non_null(a);
    assert_int_equal(mp_arena_capacity(a), 1 << 20);
    void *p1 = mp_arena_alloc(a, 100); /* rounded to 128 */
    void *p2 = mp_arena_alloc(a, 64);
    assert_int_equal((char *)p2 - (char *)p1, 128);
    assert_int_equal(mp_arena_used(a), 192);
    size_t mark = mp_arena_mark(a);
    assert_non_null(mp_arena_alloc(a, 1000)); /* 1024 */
    s = stats();
    assert_int_equal(s.current[MP_MEM_ACTIVATIONS] - s0.current[MP_MEM_ACTIVATIONS], 1216);
    mp_arena_release(a, mark);
    assert_int_equal(mp_arena_used(a), 192);
    mp_free(g); /* total falls to 4000 - 3000 + 192 */
    mp_arena_reset(a);
    assert_non_null(mp_arena_alloc(a, 10)); /* 64 */
    assert_int_equal(mp_arena_peak(a), 1216);

    s = stats();
    assert_int_equal(s.current[MP_MEM_ACTIVATIONS] - s0.current[MP_MEM_ACTIVATIONS], 64);
    assert_int_equal(s.peak[MP_MEM_ACTIVATIONS] - s0.current[MP_MEM_ACTIVATIONS], 1216);
    assert_int_equal(s.peak[MP_MEM_GRADS] - s0.current[MP_MEM_GRADS], 3000);
    assert_int_equal(s.current[MP_MEM_GRADS], s0.current[MP_MEM_GRADS]);
    /* the peak of the sum: 1000 + 3000 + 1216 at the moment of the 1000-byte arena piece */
    assert_int_equal(s.total_peak - s0.total_current, 5216);

    mp_arena_destroy(a);
    mp_free(w);
    s = stats();
    assert_int_equal(s.total_current, s0.total_current);
    assert_string_equal(mp_mem_category_name(MP_MEM_OPTIMIZER), "optimizer_state");
}

static void test_arena_exhaustion_and_huge(void **state)
{
    (void)state;
    mp_arena *a = mp_arena_create(256, MP_MEM_WORKSPACE);
    assert_non_null(mp_arena_alloc(a, 200));
    assert_null(mp_arena_alloc(a, 100));
    assert_non_null(strstr(mp_last_error(), "arena"));
    assert_null(mp_arena_alloc(a, SIZE_MAX - 10)); /* no wrap-around */
    assert_int_equal(mp_arena_used(a), 256);
    mp_arena_destroy(a);
    /* a large arena goes through mmap + MADV_HUGEPAGE and is usable */
    a = mp_arena_create(8u << 20, MP_MEM_WORKSPACE);
    char *p = mp_arena_alloc(a, 8u << 20);
    assert_non_null(p);
    memset(p, 1, 8u << 20);
    mp_arena_destroy(a);
    assert_null(mp_arena_create(64, (mp_mem_category)99));
}

static void test_tensor(void **state)
{
    (void)state;
    mp_tensor t, u;
    int64_t shape[] = {3, 5};
    assert_int_equal(mp_tensor_init(&t, MP_F32, 2, shape, MP_MEM_MASTER), MP_OK);
    assert_int_equal(mp_tensor_numel(&t), 15);
    assert_int_equal(mp_tensor_bytes(&t), 60);
    float *d = t.data;
    for (int i = 0; i < 15; i++) assert_true(d[i] == 0.0f);
    for (int i = 0; i < 15; i++) d[i] = (float)i + 0.5f;
    int64_t flat[] = {15};
    assert_int_equal(mp_tensor_init(&u, MP_BF16, 1, flat, MP_MEM_WEIGHTS), MP_OK);
    assert_int_equal(mp_tensor_convert(&u, &t), MP_OK);
    assert_int_equal(((uint16_t *)u.data)[3], mp_f32_to_bf16(3.5f));
    char buf[64];
    assert_string_equal(mp_tensor_describe(&t, buf, sizeof buf), "float32[3, 5]");
    int64_t other[] = {4};
    mp_tensor v;
    assert_int_equal(mp_tensor_init(&v, MP_F16, 1, other, MP_MEM_OTHER), MP_OK);
    assert_int_equal(mp_tensor_convert(&v, &t), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "float32[3, 5]"));
    mp_tensor_release(&v);
    mp_tensor_release(&u);
    mp_tensor_release(&t);
    assert_null(t.data);

    int64_t bad[] = {2, -1};
    assert_int_equal(mp_tensor_init(&t, MP_F32, 2, bad, MP_MEM_OTHER), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "negative"));
    assert_int_equal(mp_tensor_init(&t, MP_F32, 9, shape, MP_MEM_OTHER), MP_ERR_INVALID);
    int64_t huge[] = {INT64_MAX / 2, 4};
    assert_int_equal(mp_tensor_init(&t, MP_F32, 2, huge, MP_MEM_OTHER), MP_ERR_INVALID);
    assert_int_equal(mp_tensor_wrap(&t, MP_F32, 2, shape, NULL), MP_ERR_INVALID);

    mp_arena *a = mp_arena_create(1024, MP_MEM_ACTIVATIONS);
    assert_int_equal(mp_tensor_from_arena(&t, a, MP_F16, 2, shape), MP_OK);
    assert_int_equal(mp_arena_used(a), 64);
    int64_t big[] = {1000};
    assert_int_equal(mp_tensor_from_arena(&t, a, MP_F32, 1, big), MP_ERR_NOMEM);
    mp_arena_destroy(a);
}

static void test_errors(void **state)
{
    (void)state;
    mp_clear_error();
    assert_string_equal(mp_last_error(), "");
    assert_string_equal(mp_status_name(MP_ERR_FORMAT), "bad format");
    assert_null(mp_alloc(SIZE_MAX - 8, MP_MEM_OTHER));
    assert_non_null(strstr(mp_last_error(), "too large"));
    assert_true(mp_num_threads() >= 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accounting_script),
        cmocka_unit_test(test_arena_exhaustion_and_huge),
        cmocka_unit_test(test_tensor),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests_name("core", tests, NULL, NULL);
}
