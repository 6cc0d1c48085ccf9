/* update_dispatch.c - which path's per-element rules the optimizer runs, by
 * measurement (core/measured.h): Adam/AdamW and SGD (with momentum), each
 * timed on this CPU on L1-sized chunks as optimizer.c calls them. The
 * AVX-512 rules give the scalar ones' bits (tests/test_optim.c), so the
 * choice is speed only. Also mp_kernel_dispatch_report: every measured
 * choice that is not a GEMM's, for mixprec info. */
#include <stdlib.h>

#include "core/measured.h"
#include "core/mx_internal.h"
#include "optim_internal.h"

enum { OP_ADAM, OP_SGD, NOPS };
enum { TIMING_ELEMS = 1 << 16 };

static void fill(mp_measured_group *g)
{
    static const char *const names[NOPS] = {"adam", "sgd"};
    g->nops = NOPS;
    g->elements = TIMING_ELEMS;
    for (int o = 0; o < NOPS; o++) {
        mp_measured_op *op = &g->op[o];
        op->name = names[o];
        op->n = 0;
        op->chosen = 0;
        if (mp_isa_supported(MP_ISA_AVX512)) op->isa[op->n++] = MP_ISA_AVX512;
        if (mp_isa_supported(MP_ISA_AVX2)) op->isa[op->n++] = MP_ISA_AVX2;
        op->isa[op->n++] = MP_ISA_SCALAR;
        for (int i = 0; i < op->n; i++) op->rate[i] = 0;
    }
}

static float *buf; /* w, g, m, v */

static bool setup(void)
{
    buf = malloc(4 * (size_t)TIMING_ELEMS * sizeof *buf);
    if (!buf) return false;
    uint64_t z = 0x2545F4914F6CDD1Dull;
    for (size_t i = 0; i < 4 * (size_t)TIMING_ELEMS; i++) {
        z = mp_mix64(z + i);
        float u = (float)((double)(z >> 40) * 0x1p-24); /* [0, 1) */
        /* weights and gradients in [-1, 1), moments in [0, 1e-3) */
        buf[i] = i < 2 * (size_t)TIMING_ELEMS ? 2 * u - 1 : 1e-3f * u;
    }
    return true;
}

static void teardown(void)
{
    free(buf);
    buf = NULL;
}

static double time_op(int op, mp_isa isa)
{
    mp_step_coefs c = {.lr = 1e-3f,
                       .gfactor = 1.0f,
                       .beta1 = 0.9f,
                       .one_minus_beta1 = 0.1f,
                       .beta2 = 0.999f,
                       .one_minus_beta2 = 0.001f,
                       .eps = 1e-7f,
                       .step_size = 1e-3f,
                       .sqrt_bc2 = 0.5f,
                       .decoupled_decay = 1.0f,
                       .momentum = 0.9f};
    mp_sgd_kernel sgd;
    mp_adam_kernel adam;
    mp_update_kernels_for(isa, &sgd, &adam);
    float *w = buf, *g = buf + TIMING_ELEMS, *m = g + TIMING_ELEMS, *v = m + TIMING_ELEMS;
    const double t0 = mp_seconds();
    for (int64_t off = 0; off < TIMING_ELEMS; off += MP_UPDATE_CHUNK) {
        if (op == OP_ADAM)
            adam(&c, false, w + off, g + off, m + off, v + off, MP_UPDATE_CHUNK);
        else
            sgd(&c, w + off, g + off, m + off, MP_UPDATE_CHUNK);
    }
    return mp_seconds() - t0;
}

static const mp_measured_spec spec = {fill, setup, teardown, time_op};
/* revision 2: the AVX-512 rules store whole vectors unmasked */
static mp_measured_group group = {.file = "update", .revision = 2};
static atomic_int state;

void mp_update_kernels_for(mp_isa isa, mp_sgd_kernel *sgd, mp_adam_kernel *adam)
{
    *sgd = mp_update_sgd_scalar;
    *adam = mp_update_adam_scalar;
#if MP_X86
    if (isa >= MP_ISA_AVX512) {
        *sgd = mp_update_sgd_avx512;
        *adam = mp_update_adam_avx512;
    } else if (isa == MP_ISA_AVX2) {
        *sgd = mp_update_sgd_avx2;
        *adam = mp_update_adam_avx2;
    }
#else
    (void)isa;
#endif
}

mp_isa mp_update_path(bool sgd)
{
    const mp_measured_group *g = mp_measured_get(&group, &state, &spec);
    if (!g) return mp_isa_active();
    const mp_measured_op *op = &g->op[sgd ? OP_SGD : OP_ADAM];
    return op->isa[op->chosen];
}

void mp_update_dispatch_reset(void) { mp_measured_reset(&state); }

mp_status mp_kernel_dispatch_report(FILE *out)
{
    if (!out) return mp_set_error(MP_ERR_INVALID, "mp_kernel_dispatch_report: NULL stream");
    mp_convert_dispatch_print(out);
    mp_mx_dispatch_print(out);
    mp_measured_print(out, mp_measured_get(&group, &state, &spec), "optimizer updates");
    return ferror(out) ? mp_set_error(MP_ERR_IO, "mp_kernel_dispatch_report: write failed") : MP_OK;
}
