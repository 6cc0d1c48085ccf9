/* gemm_api.c - the public GEMM entry points (mixprec.h): the arguments'
 * defaults and checks, each bad argument refused with a message naming it,
 * and their translation into the driver's operands and epilogue (gemm.c). */
#include <stdatomic.h>
#include <string.h>

#include "kernels/gemm_internal.h"

mp_gemm_args mp_gemm_args_default(void)
{
    mp_gemm_args a;
    memset(&a, 0, sizeof a);
    a.alpha = 1.0f;
    a.beta = 0.0f;
    a.a_type = MP_F32;
    a.b_type = MP_F32;
    a.c_type = MP_F32;
    a.activation = MP_ACT_NONE;
    return a;
}

static mp_status validate(const mp_gemm_args *g)
{
    if (!g) return mp_set_error(MP_ERR_INVALID, "mp_gemm: NULL arguments");
    if (g->m < 0 || g->n < 0 || g->k < 0)
        return mp_set_error(MP_ERR_INVALID, "mp_gemm: negative size m=%lld n=%lld k=%lld",
                            (long long)g->m, (long long)g->n, (long long)g->k);
    if ((unsigned)g->a_type >= MP_DTYPE_COUNT || (unsigned)g->b_type >= MP_DTYPE_COUNT)
        return mp_set_error(MP_ERR_INVALID, "mp_gemm: unknown input dtype (a=%d, b=%d)",
                            (int)g->a_type, (int)g->b_type);
    if (g->c_type != MP_F32 && g->c_type != MP_BF16 && g->c_type != MP_F16)
        return mp_set_error(MP_ERR_INVALID,
                            "mp_gemm: output dtype %d unsupported (float32, bfloat16 or float16)",
                            (int)g->c_type);
    if (g->c_nonfinite && g->c_type != MP_F32)
        return mp_set_error(MP_ERR_INVALID,
                            "mp_gemm: c_nonfinite is reported for a float32 C only (c is dtype %d)",
                            (int)g->c_type);
    if ((unsigned)g->activation > MP_ACT_GELU_TANH)
        return mp_set_error(MP_ERR_INVALID, "mp_gemm: unknown activation %d", (int)g->activation);
    /* Rows and width of each operand as stored. */
    const int64_t ar = g->trans_a ? g->k : g->m, aw = g->trans_a ? g->m : g->k;
    const int64_t br = g->trans_b ? g->n : g->k, bw = g->trans_b ? g->k : g->n;
    struct {
        const char *name;
        int64_t rows, width, ld;
        const void *p;
    } ops[3] = {
        {"a", ar, aw, g->lda, g->a}, {"b", br, bw, g->ldb, g->b}, {"c", g->m, g->n, g->ldc, g->c}};
    for (int i = 0; i < 3; i++) {
        int64_t need = ops[i].width > 1 ? ops[i].width : 1;
        if (ops[i].ld < need)
            return mp_set_error(MP_ERR_INVALID,
                                "mp_gemm: ld%s=%lld is smaller than the row width %lld",
                                ops[i].name, (long long)ops[i].ld, (long long)need);
        if (ops[i].rows > 0 && ops[i].width > 0) {
            if (!ops[i].p) return mp_set_error(MP_ERR_INVALID, "mp_gemm: %s is NULL", ops[i].name);
            if (ops[i].rows - 1 > (INT64_MAX / 8 - ops[i].width) / ops[i].ld)
                return mp_set_error(MP_ERR_INVALID, "mp_gemm: %s is too large to address",
                                    ops[i].name);
        }
    }
    if (g->m > 0 && g->n > 0 && !g->c) return mp_set_error(MP_ERR_INVALID, "mp_gemm: c is NULL");
    return MP_OK;
}

mp_status mp_gemm_ex(const mp_gemm_args *g)
{
    mp_status st = validate(g);
    if (st != MP_OK) return st;
    if (g->m == 0 || g->n == 0) return MP_OK;

    gemm_operand a = {g->a, g->a_type, g->trans_a ? 1 : g->lda, g->trans_a ? g->lda : 1, NULL};
    gemm_operand b = {g->b, g->b_type, g->trans_b ? g->ldb : 1, g->trans_b ? 1 : g->ldb, NULL};
    atomic_int nonfinite;
    atomic_init(&nonfinite, 0);
    gemm_epilogue e = {g->alpha,      g->beta, g->c,
                       g->c_type,     g->ldc,  g->bias,
                       g->activation, false,   g->c_nonfinite ? &nonfinite : NULL};
    st = mp_gemm_run(g->m, g->n, g->k, &a, &b, &e);
    if (st == MP_OK && g->c_nonfinite && atomic_load(&nonfinite)) *g->c_nonfinite = true;
    return st;
}

void mp_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
             const void *a, mp_dtype a_type, int64_t lda, const void *b, mp_dtype b_type,
             int64_t ldb, float beta, void *c, mp_dtype c_type, int64_t ldc)
{
    mp_gemm_args g = mp_gemm_args_default();
    g.trans_a = trans_a;
    g.trans_b = trans_b;
    g.m = m;
    g.n = n;
    g.k = k;
    g.alpha = alpha;
    g.a = a;
    g.a_type = a_type;
    g.lda = lda;
    g.b = b;
    g.b_type = b_type;
    g.ldb = ldb;
    g.beta = beta;
    g.c = c;
    g.c_type = c_type;
    g.ldc = ldc;
    (void)mp_gemm_ex(&g); /* on bad arguments the error is set and C untouched */
}
