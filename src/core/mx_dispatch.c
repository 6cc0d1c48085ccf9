/* mx_dispatch.c - which path's MX kernels mp_mx_pack, mp_mx_unpack and
 * mp_mx_quantize_2d run, by measurement (measured.h), as conversions and
 * optimizer updates are chosen: packing, unpacking and fake quantization
 * along rows and down columns, each timed on this CPU on 16384 MXFP8 E4M3
 * values in cache (the layers quantize L1-sized tiles, nn/mx_quant.c).
 * Every path gives the scalar definition's bits (tests/test_mx.c), so the
 * choice is speed only. A forced path (MP_ISA, mp_isa_set) times nothing.
 * What timing in cache cannot see is a kernel's rate from memory: the
 * AVX-512 kernels' masked stores halved that on Zen 5 at the same rate in
 * cache (mx_avx512.c keeps its whole vectors unmasked). */
#include <stdlib.h>

#include "core/measured.h"
#include "mx_internal.h"

enum { SIDE = 128, TIMING_ELEMS = SIDE * SIDE };

static const char *const op_names[MP_MX_OPS] = {"mx-pack", "mx-unpack", "mx-rows", "mx-cols"};

static bool same_kernels(int op, mp_isa a, mp_isa b)
{
    (void)op; /* one table per path for every operation */
    return mp_mx_kernels_for(a) == mp_mx_kernels_for(b);
}

static void fill(mp_measured_group *g)
{
    g->nops = MP_MX_OPS;
    g->elements = TIMING_ELEMS;
    for (int o = 0; o < MP_MX_OPS; o++)
        mp_measured_fill_op(&g->op[o], op_names[o], o, same_kernels);
}

static float *t_in, *t_out;
static uint8_t *t_codes, *t_scales;

static bool setup(void)
{
    t_in = malloc(TIMING_ELEMS * sizeof *t_in);
    t_out = malloc(TIMING_ELEMS * sizeof *t_out);
    t_codes = malloc(TIMING_ELEMS);
    t_scales = malloc(TIMING_ELEMS / MP_MX_BLOCK);
    if (!t_in || !t_out || !t_codes || !t_scales) return false;
    uint64_t z = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < TIMING_ELEMS; i++) {
        z = mp_mix64(z + i);
        /* uniform in [-4, 4), a block's amax spread over a few binades */
        t_in[i] = (float)((double)(z >> 40) * 0x1p-21 - 4.0) / (float)(1 + (i / 32) % 7);
    }
    mp_mx_scalar_kernels.pack(MP_MXFP8_E4M3, t_in, TIMING_ELEMS, t_codes, t_scales);
    return true;
}

static void teardown(void)
{
    free(t_in);
    free(t_out);
    free(t_codes);
    free(t_scales);
    t_in = t_out = NULL;
    t_codes = t_scales = NULL;
}

static double time_op(int op, mp_isa isa)
{
    const mp_mx_kernels *k = mp_mx_kernels_for(isa);
    const mp_mx_format f = MP_MXFP8_E4M3;
    uint8_t codes[TIMING_ELEMS], scales[TIMING_ELEMS / MP_MX_BLOCK];
    const double t0 = mp_seconds();
    switch (op) {
    case MP_MX_OP_PACK: /* into its own buffers: the unpack's stay as setup left them */
        k->pack(f, t_in, TIMING_ELEMS, codes, scales);
        break;
    case MP_MX_OP_UNPACK:
        k->unpack(f, t_codes, t_scales, TIMING_ELEMS, t_out, MP_F32);
        break;
    case MP_MX_OP_ROWS:
        k->quantize_rows(f, t_in, SIDE, SIDE, t_out, MP_F32);
        break;
    default:
        k->quantize_cols(f, t_in, SIDE, SIDE, t_out, MP_F32);
        break;
    }
    return mp_seconds() - t0;
}

static const mp_measured_spec spec = {fill, setup, teardown, time_op};
static mp_measured_group group = {.file = "mx", .revision = 1};
static atomic_int state;

mp_isa mp_mx_path(mp_mx_op op)
{
    const mp_measured_group *g = mp_measured_get(&group, &state, &spec);
    if (!g || (unsigned)op >= MP_MX_OPS) return mp_isa_active();
    return g->op[op].isa[g->op[op].chosen];
}

void mp_mx_dispatch_print(FILE *out)
{
    mp_measured_print(out, mp_measured_get(&group, &state, &spec), "MX conversions");
}

void mp_mx_dispatch_reset(void) { mp_measured_reset(&state); }
