/* gemm_cols.c - the GEMM driver's way for a C of few columns and many rows
 * (a classifier's logits for a batch: fc3's forward, 1024x10x4096) where A
 * lies along k: 16 rows of C at a time from A's rows where they lie, B
 * widened to float32 once (kc rows of 16 floats: 256 KiB for fc3), by the
 * impl's column kernel (gemm_impl.kernel_cols: vectors along the rows of
 * C, not along its few columns), then the impl's epilogue (which reports
 * non-finite values as it stores them). Every element
 * is the sum the tiles give it (in order along k, from zero, one FMA per
 * product), so the bits are the tiles'. Threads split the blocks of 16
 * rows, each block the same work whatever the split. */
#include "kernels/gemm_internal.h"

/* ROWS: C's rows per kernel call. MIN_K: the depth from which the column
 * kernel beats the tiles (A's rows in place, 8 at a time) with B packed
 * and the blocks' results put in place through the epilogue; 2 threads,
 * Intel Xeon family 6 model 167, medians of 41-101 calls, ms, tiles /
 * columns: 1024x10 at depth 16 0.009 / 0.011, 64 0.020 / 0.022, 96 0.029
 * / 0.025, 128 0.035 / 0.030, 4096 0.565 / 0.46 (fc3's forward); 4096x10x64
 * 0.047 / 0.045 (from 96 on, faster in both); 1024 rows, depth 4096, 1 column 0.63 / 0.35, 4 0.64 /
 * 0.37, 8 0.59 / 0.43, 12 0.60 / 0.53; 16x10x4096 0.077 / 0.042. */
enum { ROWS = 16, MIN_K = 96 };
/* B's packed rows (64 bytes a depth) within 16 MiB; deeper products stay
 * on the tiles, which block the depth. */
#define MAX_K ((int64_t)1 << 18)

bool mp_gemm_cols_take(const gemm_impl *im, int64_t m, int64_t n, int64_t k, const gemm_operand *a,
                       const gemm_operand *b, const gemm_epilogue *e)
{
    return im->kernel_cols && im->epilogue_checks && k >= MIN_K && k <= MAX_K &&
           n <= MP_GEMM_COLS_MAX && m >= ROWS && !e->trans && !a->gather && !b->gather &&
           a->sd == 1 && mp_gemm_widens(a->type) && mp_gemm_widens(b->type);
}

mp_status mp_gemm_cols(const gemm_impl *im, int64_t m, int64_t n, int64_t k, const gemm_operand *a,
                       const gemm_operand *b, const gemm_epilogue *e)
{
    float *bp = mp_scratch(1, (size_t)(k * MP_GEMM_COLS_LDB) * sizeof(float));
    if (!bp) return mp_set_error(MP_ERR_NOMEM, "mp_gemm: cannot allocate B's columns");
    im->pack(b, 0, n, 0, k, MP_GEMM_COLS_LDB, bp); /* one panel: row d at bp + d LDB */
    const int64_t blocks = cdiv(m, ROWS);
    const size_t asz = mp_dtype_size(a->type);
    int nt = mp_num_threads();
    if (2.0 * (double)m * (double)n * (double)k < MP_GEMM_FORK_FLOPS) nt = 1;
    if ((int64_t)nt > blocks) nt = (int)blocks;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int t = 0; t < nt; t++) {
        /* the epilogue may read a full vector past a short last row */
        _Alignas(64) float tile[ROWS * MP_GEMM_COLS_MAX + 16];
        for (int64_t u = blocks * t / nt; u < blocks * (t + 1) / nt; u++) {
            const int64_t i0 = u * ROWS, rows = min64(ROWS, m - i0);
            im->kernel_cols(k, (const char *)a->base + (size_t)(i0 * a->sw) * asz, a->sw, a->type,
                            (int)rows, bp, (int)n, tile, MP_GEMM_COLS_MAX);
            im->epilogue(e, tile, MP_GEMM_COLS_MAX, i0, 0, rows, n); /* checks as it stores */
        }
    }
    return MP_OK;
}
