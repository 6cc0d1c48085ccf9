/* gemm_pack.h - the GEMM driver's packing (gemm_pack.c): an operand's panels
 * by the kernel's packers or gathered by a convolution's geometry, and a
 * team's packing of the panels all its threads share. */
#ifndef MP_GEMM_PACK_H
#define MP_GEMM_PACK_H

#include "kernels/gemm_internal.h"

/* Threads that split only n all need the same packed A blocks: each packs
 * its share of the panels into one buffer (the first thread's) and all use
 * it, instead of every thread packing all of A. All threads then run the
 * same blocks of rows and depth and meet at a barrier before and after each
 * block is packed. */
typedef struct {
    char *_Atomic p;   /* the shared buffer (A, or B when b), set by thread 0 */
    atomic_int failed; /* a thread could not allocate: all return false */
    int64_t mc;        /* the row block of every thread */
    int nt;
    /* Threads that split only m all need the same packed B blocks: the
     * mirror image, each packing its share of each block's panels. Their
     * rows differ, so each runs nblk row blocks of mc (its last ones
     * possibly short or empty) and meets the others at every B block. */
    bool b;
    int64_t nblk;
} gemm_share;

/* Packs panels [w0, w0 + nw) x depths [d0, d0 + nd) of op for A (a_side)
 * or B on im: a strided operand by the kernel's packer, a gathered one
 * (implicit GEMM) by its geometry; false if out of memory. */
bool mp_gemm_pack_op(const gemm_impl *im, bool a_side, const gemm_operand *op, int64_t w0,
                     int64_t nw, int64_t d0, int64_t nd, int W, void *dst);
/* Thread tid's share of the W-wide panels of widths [w0, w0 + nw) and
 * depths [pc, pc + kb) of op, packed into the team's buffer buf, once
 * every thread is done with the block before (a barrier on each side:
 * called by every thread of the team's parallel region). */
void mp_gemm_pack_share(const gemm_impl *im, bool a_side, const gemm_operand *op, int W, int64_t w0,
                        int64_t nw, int64_t pc, int64_t kb, int64_t kpad, char *buf,
                        const gemm_share *sh, int tid);

#endif
