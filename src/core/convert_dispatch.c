/* convert_dispatch.c - which path's kernel mp_convert runs, by measurement
 * (measured.h): float32 to and from bfloat16, float16 and float8, each
 * direction timed apart on this CPU. Every path gives the same bits
 * (tests/test_dtype.c, make test-exhaustive), so the choice is speed only.
 * Pairs without float32 on either side, and a forced path, use the active
 * path as before. */
#include <stdlib.h>

#include "core/measured.h"

enum { OP_F32_BF16, OP_BF16_F32, OP_F32_F16, OP_F16_F32, OP_F32_FP8, OP_FP8_F32, NOPS };
enum { TIMING_ELEMS = 1 << 16 };

static const char *const op_names[NOPS] = {"f32->bf16", "bf16->f32", "f32->f16",
                                           "f16->f32",  "f32->fp8",  "fp8->f32"};

/* The kernel of op in a path's table, to tell distinct kernels apart. */
static void (*kernel_of(int op, mp_isa isa))(void)
{
    const mp_convert_kernels *k = mp_convert_kernels_for(isa);
    switch (op) {
    case OP_F32_BF16:
        return (void (*)(void))k->f32_to_bf16;
    case OP_BF16_F32:
        return (void (*)(void))k->bf16_to_f32;
    case OP_F32_F16:
        return (void (*)(void))k->f32_to_f16;
    case OP_F16_F32:
        return (void (*)(void))k->f16_to_f32;
    case OP_F32_FP8:
        return (void (*)(void))k->f32_to_fp8;
    default:
        return (void (*)(void))k->fp8_to_f32;
    }
}

static bool same_kernel(int op, mp_isa a, mp_isa b) { return kernel_of(op, a) == kernel_of(op, b); }

static void fill(mp_measured_group *g)
{
    g->nops = NOPS;
    g->elements = TIMING_ELEMS;
    for (int o = 0; o < NOPS; o++) mp_measured_fill_op(&g->op[o], op_names[o], o, same_kernel);
}

static float *t_f32;
static uint16_t *t_u16;
static uint8_t *t_u8;

static bool setup(void)
{
    t_f32 = malloc(TIMING_ELEMS * sizeof *t_f32);
    t_u16 = malloc(TIMING_ELEMS * sizeof *t_u16);
    t_u8 = malloc(TIMING_ELEMS);
    if (!t_f32 || !t_u16 || !t_u8) return false;
    uint64_t z = 0x5DEECE66Dull;
    for (size_t i = 0; i < TIMING_ELEMS; i++) {
        z = mp_mix64(z + i);
        t_f32[i] = (float)((double)(z >> 40) * 0x1p-21 - 4.0); /* uniform in [-4, 4) */
        t_u16[i] = (uint16_t)(0x3C00 + (z & 0x3FF)); /* [1, 2) in float16, normal in bf16 */
        t_u8[i] = (uint8_t)(z >> 8 & 0x77);          /* finite in both fp8 formats */
    }
    return true;
}

static void teardown(void)
{
    free(t_f32);
    free(t_u16);
    free(t_u8);
    t_f32 = NULL;
    t_u16 = NULL;
    t_u8 = NULL;
}

static volatile uint32_t sink;

static double time_op(int op, mp_isa isa)
{
    const mp_convert_kernels *k = mp_convert_kernels_for(isa);
    const double t0 = mp_seconds();
    switch (op) {
    case OP_F32_BF16:
        k->f32_to_bf16(t_u16 + 0, t_f32, TIMING_ELEMS);
        break;
    case OP_BF16_F32:
        k->bf16_to_f32(t_f32, t_u16, TIMING_ELEMS);
        break;
    case OP_F32_F16:
        k->f32_to_f16(t_u16, t_f32, TIMING_ELEMS);
        break;
    case OP_F16_F32:
        k->f16_to_f32(t_f32, t_u16, TIMING_ELEMS);
        break;
    case OP_F32_FP8:
        k->f32_to_fp8(t_u8, t_f32, TIMING_ELEMS, MP_F8E4M3, MP_OVERFLOW_SATURATE);
        break;
    default:
        k->fp8_to_f32(t_f32, t_u8, TIMING_ELEMS, MP_F8E4M3);
        break;
    }
    const double t = mp_seconds() - t0;
    sink = t_u16[op] ^ t_u8[op];
    /* the outputs feed the next op's inputs: keep them in range */
    if (op == OP_BF16_F32 || op == OP_F16_F32 || op == OP_FP8_F32)
        for (size_t i = 0; i < TIMING_ELEMS; i++)
            if (!(t_f32[i] > -4.0f && t_f32[i] < 4.0f)) t_f32[i] = 1.0f;
    if (op == OP_F32_BF16 || op == OP_F32_F16)
        for (size_t i = 0; i < TIMING_ELEMS; i++)
            t_u16[i] = (uint16_t)(0x3C00 + (t_u16[i] & 0x3FF));
    return t;
}

static const mp_measured_spec spec = {fill, setup, teardown, time_op};
static mp_measured_group group = {.file = "convert", .revision = 1};
static atomic_int state;

static int op_of(mp_dtype dst, mp_dtype src)
{
    if (src == MP_F32) {
        if (dst == MP_BF16) return OP_F32_BF16;
        if (dst == MP_F16) return OP_F32_F16;
        if (dst == MP_F8E4M3 || dst == MP_F8E5M2) return OP_F32_FP8;
    } else if (dst == MP_F32) {
        if (src == MP_BF16) return OP_BF16_F32;
        if (src == MP_F16) return OP_F16_F32;
        if (src == MP_F8E4M3 || src == MP_F8E5M2) return OP_FP8_F32;
    }
    return -1;
}

mp_isa mp_convert_path(mp_dtype dst, mp_dtype src)
{
    const int o = op_of(dst, src);
    if (o < 0) return mp_isa_active();
    const mp_measured_group *g = mp_measured_get(&group, &state, &spec);
    if (!g) return mp_isa_active();
    return g->op[o].isa[g->op[o].chosen];
}

void mp_convert_dispatch_print(FILE *out)
{
    mp_measured_print(out, mp_measured_get(&group, &state, &spec), "conversions");
}

void mp_convert_dispatch_reset(void) { mp_measured_reset(&state); }
