/* gemm_rows.c - the GEMM driver's way for a C of few rows (a decoder's
 * step: one position through each weight layer; a batch of one or two):
 * each row of C is its row of A passed once over B's rows where they lie
 * (gemm_impl.kernel_row), any float type along n (widened as loaded), instead
 * of register tiles MR rows high, all but one or two of them padding. Every
 * element is the sum the tiles give it (in order along k, one FMA per
 * product, from zero), and the same epilogue writes it: the same bits
 * either way. Threads split the columns where B is big enough to pay for
 * a fork. */
#include <string.h>

#include "kernels/gemm_internal.h"

enum {
    CHUNK = 256, /* columns per kernel call: a C chunk the epilogue then writes */
    /* B's bytes from which the columns are split between threads. Zen 3, 2
     * threads against one, medians of 31-41 calls alternating in one
     * process, microseconds: bfloat16 1x128x256 (64 KiB) 1.78 -> 1.89,
     * 1x384x128 (96 KiB) 2.47 -> 2.31, 1x256x256 4.99 -> 3.86, 1x1024x256
     * 18.4 -> 11.2, 1x4096x1024 451 -> 254; float32 1x256x64 (64 KiB) 1.14
     * -> 1.52, 1x256x128 2.36 -> 2.05. */
    SPLIT_BYTES = 96 << 10,
};

bool mp_gemm_rows_take(const gemm_impl *im, int64_t m, int64_t n, int64_t k, const gemm_operand *a,
                       const gemm_operand *b, const gemm_epilogue *e)
{
    return im->kernel_row && im->fmt == GEMM_FMT_F32 && k > 0 && m <= im->row_max &&
           n >= 2 * im->nr && !e->trans && !a->gather && !b->gather && b->sw == 1 &&
           (b->type == MP_F32 || b->type == MP_BF16 || b->type == MP_F16 || b->type == MP_F8E4M3 ||
            b->type == MP_F8E5M2);
}

/* Row i of A in float32: where it lies, or widened into buf. */
static const float *a_row(const gemm_operand *a, int64_t i, int64_t k, float *buf)
{
    const char *p = (const char *)a->base + (size_t)(i * a->sw) * mp_dtype_size(a->type);
    if (a->type == MP_F32 && a->sd == 1) return (const float *)p;
    if (a->sd == 1)
        mp_convert(buf, MP_F32, p, a->type, (size_t)k);
    else
        mp_gemm_pack_generic(a, i, 1, 0, k, 1, GEMM_FMT_F32, buf);
    return buf;
}

/* Columns [j0, j1) of every row; false if out of memory. */
static bool rows_range(const gemm_impl *im, int64_t m, int64_t k, const gemm_operand *a,
                       const gemm_operand *b, const gemm_epilogue *e, atomic_int *nonfinite,
                       int64_t j0, int64_t j1)
{
    const bool direct = e->c_type == MP_F32 && e->alpha == 1.0f && e->beta == 0.0f && !e->bias &&
                        e->act == MP_ACT_NONE;
    const bool check = nonfinite && e->c_type == MP_F32 && (direct || !im->epilogue_checks);
    const bool in_place = a->type == MP_F32 && a->sd == 1;
    float *buf = in_place ? NULL : mp_scratch(0, (size_t)k * sizeof(float));
    if (!in_place && !buf) return false;
    const size_t bsz = mp_dtype_size(b->type);
    /* the epilogue may read a full vector past a short last tile */
    _Alignas(64) float t[CHUNK + 64];
    for (int64_t i = 0; i < m; i++) {
        const float *ar = a_row(a, i, k, buf);
        for (int64_t j = j0; j < j1; j += CHUNK) {
            const int64_t nr = min64(CHUNK, j1 - j);
            float *c = direct ? (float *)e->c + i * e->ldc + j : t;
            im->kernel_row(k, ar, (const char *)b->base + (size_t)j * bsz, b->sd, b->type, c, nr);
            if (!direct)
                for (int64_t jj = 0; jj < nr; jj += im->nr)
                    im->epilogue(e, t + jj, CHUNK, i, j + jj, 1, min64(im->nr, nr - jj));
            if (check && !atomic_load_explicit(nonfinite, memory_order_relaxed) &&
                mp_gemm_any_nonfinite((const float *)e->c + i * e->ldc + j, nr))
                atomic_store_explicit(nonfinite, 1, memory_order_relaxed);
        }
    }
    return true;
}

mp_status mp_gemm_rows(const gemm_impl *im, int64_t m, int64_t n, int64_t k, const gemm_operand *a,
                       const gemm_operand *b, const gemm_epilogue *e, atomic_int *nonfinite)
{
    int nt = mp_num_threads();
    /* a fork costs a few microseconds: worth it where B takes longer to
     * stream (units of 64 columns, the kernel's pass) */
    const int64_t units = cdiv(n, 64);
    if ((double)n * (double)k * (double)mp_dtype_size(b->type) < SPLIT_BYTES) nt = 1;
    if ((int64_t)nt > units) nt = (int)units;
    bool ok = true;
    /* one range of units per thread (a smaller team, inside a parallel
     * region, runs them in turn) */
#pragma omp parallel for num_threads(nt) schedule(static) reduction(&& : ok) if (nt > 1)
    for (int t = 0; t < nt; t++) {
        const int64_t u0 = units * t / nt, u1 = units * (t + 1) / nt;
        ok = rows_range(im, m, k, a, b, e, nonfinite, u0 * 64, min64(u1 * 64, n)) && ok;
    }
    if (!ok) return mp_set_error(MP_ERR_NOMEM, "mp_gemm: cannot allocate a row of A");
    return MP_OK;
}
