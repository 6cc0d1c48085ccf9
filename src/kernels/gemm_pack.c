/* gemm_pack.c - the GEMM driver's packing: an operand's panels by the
 * kernel's packers (A's by pack_a where its panels are laid out unlike B's)
 * or gathered by a convolution's geometry, and the packing a team of
 * threads shares (each thread its part of the panels, between barriers). */
#include <string.h>

#include "kernels/gemm_pack.h"

/* The packer of A's panels (a_side) or B's on im. */
static gemm_pack_fn packer(const gemm_impl *im, bool a_side)
{
    return a_side && im->pack_a ? im->pack_a : im->pack;
}

/* Packs a strided operand with the kernel's packer, a gathered one
 * (implicit GEMM) by its geometry; false if out of memory. An A whose
 * panels lie row by row (pack_a: GEMM_FMT_AMX) is gathered as panels of one
 * row, a B of sub-panels (sub_nr) as panels of those. */
bool mp_gemm_pack_op(const gemm_impl *im, bool a_side, const gemm_operand *op, int64_t w0,
                     int64_t nw, int64_t d0, int64_t nd, int W, void *dst)
{
    if (!op->gather) {
        packer(im, a_side)(op, w0, nw, d0, nd, W, dst);
        return true;
    }
    /* panels of one row (pack_a), or of sub_nr columns: packed in those,
     * the last panel's missing rows or columns zero */
    const int w = a_side ? (im->pack_a ? 1 : W) : im->sub_nr ? im->sub_nr : W;
    if (w == W) return mp_gemm_pack_gather(op, w0, nw, d0, nd, W, im->fmt, dst);
    const size_t line = (size_t)mp_gemm_kpad(im->fmt, nd) * (size_t)mp_gemm_fmt_bytes(im->fmt);
    const int64_t done = cdiv(nw, w) * w;
    if (!mp_gemm_pack_gather(op, w0, nw, d0, nd, w, im->fmt, dst)) return false;
    memset((char *)dst + (size_t)done * line, 0, (size_t)(cdiv(nw, W) * W - done) * line);
    return true;
}

/* Thread tid's share of the W-wide panels of widths [w0, w0 + nw) and
 * depths [pc, pc + kb) of op, packed into the team's buffer buf, once
 * every thread is done with the block before (a barrier on each side). */
void mp_gemm_pack_share(const gemm_impl *im, bool a_side, const gemm_operand *op, int W, int64_t w0,
                        int64_t nw, int64_t pc, int64_t kb, int64_t kpad, char *buf,
                        const gemm_share *sh, int tid)
{
    const size_t esz = (size_t)mp_gemm_fmt_bytes(im->fmt);
    const gemm_pack_fn fn = packer(im, a_side);
    const int64_t np = cdiv(nw, W), p0 = np * tid / sh->nt, p1 = np * (tid + 1) / sh->nt;
#pragma omp barrier
    /* One panel (a thin B: n = 10 of 48 columns): the threads split its
     * depth instead, in runs of 16 rows (bfloat16's pairs stay whole), each
     * packed where its rows lie in the panel. fc3 forward (1024x10x4096, 2
     * threads, Zen 5, medians of 101 calls alternating in one process):
     * float32 time x0.949 and x0.953, bfloat16 x0.975. */
    if (np == 1 && !mp_gemm_fmt_by_depth(im->fmt)) { /* not laid out by depth: one packs it */
        if (tid == 0) fn(op, w0, nw, pc, kb, W, buf);
    } else if (np == 1) {
        const int64_t d0 = kb * tid / sh->nt / 16 * 16,
                      d1 = tid == sh->nt - 1 ? kb : kb * (tid + 1) / sh->nt / 16 * 16;
        if (d1 > d0) fn(op, w0, nw, pc + d0, d1 - d0, W, buf + (size_t)(d0 * W) * esz);
    } else if (p1 > p0)
        fn(op, w0 + p0 * W, min64(nw, p1 * W) - p0 * W, pc, kb, W,
           buf + (size_t)p0 * (size_t)(W * kpad) * esz);
#pragma omp barrier
}
