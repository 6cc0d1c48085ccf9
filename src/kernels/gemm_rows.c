/* gemm_rows.c - the GEMM driver's way for a C of few rows (a decoder's
 * step: one position through each weight layer; a batch of one or two):
 * each row of C is its row of A passed once over B's rows where they lie
 * (gemm_impl.kernel_row), any float type along n (widened as loaded), instead
 * of register tiles MR rows high, all but one or two of them padding. Every
 * element is the sum the tiles give it (in order along k, from zero: one
 * FMA per product in float32, one vdpbf16ps per pair of depths on the
 * bfloat16 path), and the same epilogue writes it: the same bits either
 * way (on the AMX path, one tdpbf16ps per tile of depth: gemm_amx.c). Threads split the columns
 * where B is big enough to pay for a fork. */
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
    const bool types = im->fmt == GEMM_FMT_F32
                           ? mp_gemm_widens(b->type)
                           : mp_gemm_bf16_like(a->type) && mp_gemm_bf16_like(b->type);
    return im->kernel_row && k > 0 && m <= im->row_max && n >= 2 * im->nr && !e->trans &&
           !a->gather && !b->gather && b->sw == 1 && types;
}

/* Columns [j0, j1) of every row of C from A's m rows in the impl's format
 * (row i at a + i * lda elements). */
static void rows_range(const gemm_impl *im, int64_t m, int64_t k, const char *a, int64_t lda,
                       const gemm_operand *b, const gemm_epilogue *e, atomic_int *nonfinite,
                       int64_t j0, int64_t j1)
{
    const bool direct = mp_gemm_accumulates_in_c(e);
    const bool check = nonfinite && e->c_type == MP_F32 && (direct || !im->epilogue_checks);
    const size_t bsz = mp_dtype_size(b->type), asz = im->fmt == GEMM_FMT_F32 ? 4 : 2;
    /* the epilogue may read a full vector past a short last tile */
    _Alignas(64) float t[CHUNK + 64];
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = j0; j < j1; j += CHUNK) {
            const int64_t nr = min64(CHUNK, j1 - j);
            float *c = direct ? (float *)e->c + i * e->ldc + j : t;
            im->kernel_row(k, a + (size_t)(i * lda) * asz, (const char *)b->base + (size_t)j * bsz,
                           b->sd, b->type, c, nr);
            if (!direct)
                for (int64_t jj = 0; jj < nr; jj += im->nr)
                    im->epilogue(e, t + jj, CHUNK, i, j + jj, 1, min64(im->nr, nr - jj));
            if (check && !atomic_load_explicit(nonfinite, memory_order_relaxed) &&
                mp_gemm_any_nonfinite((const float *)e->c + i * e->ldc + j, nr))
                atomic_store_explicit(nonfinite, 1, memory_order_relaxed);
        }
}

mp_status mp_gemm_rows(const gemm_impl *im, int64_t m, int64_t n, int64_t k, const gemm_operand *a,
                       const gemm_operand *b, const gemm_epilogue *e, atomic_int *nonfinite)
{
    /* A's rows in the impl's format: where they lie, or converted once here
     * for every thread (float32; bfloat16 pairs, a zero past an odd k, or
     * zeros to whole tiles of depth for AMX) */
    const char *ar = a->base;
    int64_t lda = a->sw;
    const bool bf16 = im->fmt != GEMM_FMT_F32;
    const int64_t kp = mp_gemm_kpad(im->fmt, k); /* AMX: whole tiles of depth */
    if (bf16 ? a->type != MP_BF16 || a->sd != 1 || kp != k : a->type != MP_F32 || a->sd != 1) {
        char *buf = mp_scratch(0, (size_t)(m * kp) * mp_gemm_fmt_bytes(im->fmt));
        if (!buf) return mp_set_error(MP_ERR_NOMEM, "mp_gemm: cannot allocate A's rows");
        const size_t asz = mp_dtype_size(a->type);
        for (int64_t i = 0; i < m; i++)
            if (!bf16 && a->sd == 1) /* along k: the vector conversion */
                mp_convert((float *)buf + i * k, MP_F32,
                           (const char *)a->base + (size_t)(i * a->sw) * asz, a->type, (size_t)k);
            else if (!bf16)
                mp_gemm_pack_generic(a, i, 1, 0, k, 1, im->fmt, (float *)buf + i * kp);
            else { /* pairs along the row, zeros to kp */
                uint16_t *row = (uint16_t *)buf + i * kp;
                mp_gemm_pack_generic(a, i, 1, 0, k, 1, GEMM_FMT_BF16, row);
                for (int64_t d = k + (k & 1); d < kp; d++) row[d] = 0;
            }
        ar = buf;
        lda = kp;
    }
    int nt = mp_num_threads();
    /* a fork costs a few microseconds: worth it where B takes longer to
     * stream. One range of units (64 columns, the kernel's pass) per
     * thread; a smaller team (inside a parallel region) runs them in turn. */
    const int64_t units = cdiv(n, 64);
    if ((double)n * (double)k * (double)mp_dtype_size(b->type) < SPLIT_BYTES) nt = 1;
    if ((int64_t)nt > units) nt = (int)units;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int t = 0; t < nt; t++) {
        const int64_t u0 = units * t / nt, u1 = units * (t + 1) / nt;
        rows_range(im, m, k, ar, lda, b, e, nonfinite, u0 * 64, min64(u1 * 64, n));
    }
    return MP_OK;
}
