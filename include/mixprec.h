/* mixprec.h - the one public header of libmixprec, a C11 library for
 * mixed-precision neural-network training (see shared/DESIGN.md). */
#ifndef MIXPREC_H
#define MIXPREC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MP_VERSION_MAJOR 0
#define MP_VERSION_MINOR 1
#define MP_VERSION_PATCH 0
#define MP_VERSION_STRING "0.1.0"

/* ------------------------------------------------------------------ errors */

/* Status codes. Functions that can fail on user input return one of these and
 * leave a message for mp_last_error(). */
typedef enum {
    MP_OK = 0,
    MP_ERR_INVALID = 1,     /* bad argument, shape or name */
    MP_ERR_NOMEM = 2,       /* allocation failed or arena exhausted */
    MP_ERR_IO = 3,          /* file missing, unreadable or unwritable */
    MP_ERR_FORMAT = 4,      /* corrupt or unsupported file content */
    MP_ERR_UNSUPPORTED = 5, /* valid request this build or CPU cannot do */
} mp_status;

/* The message of the most recent failure in this thread ("" if none). */
const char *mp_last_error(void);
void mp_clear_error(void);
const char *mp_status_name(mp_status s);

/* ----------------------------------------------------------------- dtypes */

typedef enum {
    MP_F32 = 0,
    MP_F16 = 1,
    MP_BF16 = 2,
    MP_F8E4M3 = 3, /* OCP FP8 E4M3 ("fn"): bias 7, no inf, NaN = S.1111.111 */
    MP_F8E5M2 = 4, /* OCP FP8 E5M2: IEEE-like, bias 15 */
    /* Integer data (token ids, class indices as inputs): not a conversion
     * format; only layers that read integers take it. */
    MP_I32 = 32,
} mp_dtype;
#define MP_DTYPE_COUNT 5 /* the floating formats, 0 .. 4 */

const char *mp_dtype_name(mp_dtype t); /* "float32", "float16", ... */
size_t mp_dtype_size(mp_dtype t);      /* bytes per element */
/* Parse "float32"/"f32", "float16"/"f16", "bfloat16"/"bf16",
 * "float8_e4m3"/"e4m3", "float8_e5m2"/"e5m2". */
mp_status mp_dtype_from_name(const char *name, mp_dtype *out);

/* Facts of a format, as exact float32 values. */
typedef struct {
    int bits;          /* storage width */
    int mantissa_bits; /* explicit fraction bits */
    int exponent_bits;
    int exponent_bias;
    bool has_inf;
    float epsilon;       /* distance from 1 to the next larger value */
    float max;           /* largest finite value */
    float min_normal;    /* smallest positive normal */
    float min_subnormal; /* smallest positive subnormal */
    float unit_roundoff; /* epsilon / 2: relative error bound of RNE */
} mp_dtype_info;

void mp_dtype_get_info(mp_dtype t, mp_dtype_info *info);

/* Scalar conversions. Encoding is round-to-nearest-even with subnormals kept.
 * f16/bf16: overflow -> +-inf, NaN -> quiet NaN with the same sign.
 * fp8 (these scalar forms saturate): finite overflow -> +-max, +-inf ->
 * +-inf (E5M2) or NaN (E4M3), NaN -> NaN. Decoding is exact. */
uint16_t mp_f32_to_bf16(float x);
uint16_t mp_f32_to_f16(float x);
uint8_t mp_f32_to_e4m3(float x);
uint8_t mp_f32_to_e5m2(float x);
float mp_bf16_to_f32(uint16_t h);
float mp_f16_to_f32(uint16_t h);
float mp_e4m3_to_f32(uint8_t b);
float mp_e5m2_to_f32(uint8_t b);

/* How an fp8 cast treats values beyond the format's largest finite value. */
typedef enum {
    /* Default: finite overflow saturates to +-max; infinity stays infinite in
     * E5M2 and becomes NaN in E4M3 (never hidden as a finite number). */
    MP_OVERFLOW_SATURATE = 0,
    /* PyTorch's casts: E4M3 -> NaN, E5M2 -> +-inf for anything that rounds
     * past max. */
    MP_OVERFLOW_NONSAT = 1,
} mp_overflow;

uint8_t mp_f32_to_e4m3_ex(float x, mp_overflow ov);
uint8_t mp_f32_to_e5m2_ex(float x, mp_overflow ov);

/* Bulk conversion between any two dtypes (n elements, no overlap unless
 * dst == src with equal types). Uses the fastest bit-exact path of this CPU.
 * fp8 targets saturate (MP_OVERFLOW_SATURATE). The MX block formats, whose
 * scales travel beside the codes, have their own calls (mixprec/mx.h). */
void mp_convert(void *dst, mp_dtype dst_type, const void *src, mp_dtype src_type, size_t n);
/* As mp_convert, with the fp8 overflow behaviour chosen. */
void mp_convert_ex(void *dst, mp_dtype dst_type, const void *src, mp_dtype src_type, size_t n,
                   mp_overflow ov);
/* Stochastic rounding f32 -> bf16/f16/E4M3/E5M2 (dst_type F32 copies). Each
 * element rounds to one of its two neighbours with probabilities that make
 * the expected value equal the input (inside the format's range). The random
 * bits come from a counter-based generator keyed by (seed, element index),
 * so results do not depend on threads or chunking. Values beyond max, inf
 * and NaN are cast as by mp_convert. */
void mp_convert_stochastic(void *dst, mp_dtype dst_type, const float *src, size_t n, uint64_t seed);
/* As above for a slice that starts at element `offset` of a longer array:
 * the result equals that slice of the whole-array call. */
void mp_convert_stochastic_at(void *dst, mp_dtype dst_type, const float *src, size_t n,
                              uint64_t seed, uint64_t offset);

/* -------------------------------------------------------------------- cpu */

typedef enum {
    MP_ISA_SCALAR = 0,     /* portable C, runs anywhere */
    MP_ISA_AVX2 = 1,       /* AVX2 + FMA + F16C (256-bit vectors) */
    MP_ISA_AVX512 = 2,     /* AVX-512 F/BW/VL/DQ + F16C + FMA */
    MP_ISA_AVX512BF16 = 3, /* the above + AVX512_BF16 (vdpbf16ps) */
    /* The above + AMX-BF16 tiles (tdpbf16ps), where the OS lets this
     * process use them (Linux: arch_prctl, asked once). The tiles serve
     * GEMM only: every other kernel of this path is avx512bf16's. */
    MP_ISA_AMX = 4,
} mp_isa;
#define MP_ISA_COUNT 5

typedef struct {
    char vendor[13];
    char brand[49];
    bool sse2, avx, avx2, fma, f16c;
    bool avx512f, avx512bw, avx512vl, avx512dq, avx512_bf16, avx512_fp16, amx_bf16, amx_tile;
    bool os_avx512; /* XCR0 enables opmask and ZMM state */
    /* XCR0 enables the tile state and the OS granted this process the tile
     * data (Linux: ARCH_REQ_XCOMP_PERM, asked once at detection) */
    bool os_amx;
} mp_cpu_features;

const mp_cpu_features *mp_cpu(void);
/* Best ISA this CPU and OS support. */
mp_isa mp_isa_best(void);
/* ISA in use: mp_isa_best(), or MP_ISA from the environment (scalar, avx2,
 * avx512, avx512bf16, amx) read once, or the last mp_isa_set(). */
mp_isa mp_isa_active(void);
/* Force a path; MP_ERR_UNSUPPORTED if this CPU cannot run it. */
mp_status mp_isa_set(mp_isa isa);
const char *mp_isa_name(mp_isa isa);
mp_status mp_isa_from_name(const char *name, mp_isa *out);
bool mp_isa_supported(mp_isa isa);

/* ------------------------------------------------------- memory accounting */

typedef enum {
    MP_MEM_WEIGHTS = 0, /* low-precision working copies of parameters */
    MP_MEM_MASTER = 1,  /* float32 master weights */
    MP_MEM_GRADS = 2,
    MP_MEM_OPTIMIZER = 3, /* optimizer state (moments) */
    MP_MEM_ACTIVATIONS = 4,
    MP_MEM_WORKSPACE = 5,
    MP_MEM_OTHER = 6,
} mp_mem_category;
#define MP_MEM_CATEGORY_COUNT 7

typedef struct {
    size_t current[MP_MEM_CATEGORY_COUNT];
    size_t peak[MP_MEM_CATEGORY_COUNT];
    size_t total_current;
    size_t total_peak; /* peak of the sum, not the sum of peaks */
} mp_mem_stats;

const char *mp_mem_category_name(mp_mem_category c);
void mp_mem_get_stats(mp_mem_stats *out);
/* Restart peaks at the current figures. */
void mp_mem_reset_peaks(void);

/* Tracked allocation: 64-byte aligned, large blocks on huge pages where the
 * OS allows. NULL (with mp_last_error) on failure. */
void *mp_alloc(size_t bytes, mp_mem_category cat);
void mp_free(void *p);

/* An arena: one region reserved once, handed out in 64-byte aligned pieces,
 * reset each step. Accounting charges the bytes in use (not the capacity) to
 * the arena's category, so per-step peaks are exact. */
typedef struct mp_arena mp_arena;
mp_arena *mp_arena_create(size_t capacity, mp_mem_category cat);
void mp_arena_destroy(mp_arena *a);
void *mp_arena_alloc(mp_arena *a, size_t bytes); /* NULL + error if full */
void mp_arena_reset(mp_arena *a);
size_t mp_arena_used(const mp_arena *a);
size_t mp_arena_peak(const mp_arena *a);
size_t mp_arena_capacity(const mp_arena *a);
/* A mark to roll back to (frees everything allocated after it). */
size_t mp_arena_mark(const mp_arena *a);
void mp_arena_release(mp_arena *a, size_t mark);

/* ----------------------------------------------------------------- tensor */

#define MP_MAX_DIMS 8

typedef struct {
    mp_dtype dtype;
    int ndim;
    int64_t shape[MP_MAX_DIMS];
    void *data;
    bool owns_data;
    mp_mem_category category;
} mp_tensor;

/* Allocate a zeroed, owned tensor. */
mp_status mp_tensor_init(mp_tensor *t, mp_dtype dtype, int ndim, const int64_t *shape,
                         mp_mem_category cat);
/* Wrap existing storage (not owned). */
mp_status mp_tensor_wrap(mp_tensor *t, mp_dtype dtype, int ndim, const int64_t *shape, void *data);
/* Allocate from an arena (not owned, freed by the arena's reset). */
mp_status mp_tensor_from_arena(mp_tensor *t, mp_arena *a, mp_dtype dtype, int ndim,
                               const int64_t *shape);
void mp_tensor_release(mp_tensor *t);
int64_t mp_tensor_numel(const mp_tensor *t);
size_t mp_tensor_bytes(const mp_tensor *t);
/* Convert src into dst (same number of elements; shapes may differ). */
mp_status mp_tensor_convert(mp_tensor *dst, const mp_tensor *src);
/* "float32[2, 3]" into buf. */
const char *mp_tensor_describe(const mp_tensor *t, char *buf, size_t len);

/* ------------------------------------------------------------------- gemm */

/* C = alpha * op(A) * op(B) + beta * C, row-major, op(A) m x k, op(B) k x n.
 * A, B in any dtype; C in F32, BF16 or F16. Products and sums in float32,
 * the result rounded to C's dtype once (RNE). beta == 0 ignores C's contents. */
void mp_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
             const void *a, mp_dtype a_type, int64_t lda, const void *b, mp_dtype b_type,
             int64_t ldb, float beta, void *c, mp_dtype c_type, int64_t ldc);

/* Activations. The GEMM epilogue fuses NONE..GELU_TANH; layers take all. */
typedef enum {
    MP_ACT_NONE = 0, /* linear */
    MP_ACT_RELU = 1,
    MP_ACT_GELU = 2,      /* erf form */
    MP_ACT_GELU_TANH = 3, /* tanh approximation */
    MP_ACT_SIGMOID = 4,
    MP_ACT_TANH = 5,
    MP_ACT_SOFTMAX = 6, /* over the last axis, computed in float32 */
} mp_activation;

typedef struct {
    bool trans_a, trans_b;
    int64_t m, n, k;
    float alpha;
    const void *a;
    mp_dtype a_type;
    int64_t lda;
    const void *b;
    mp_dtype b_type;
    int64_t ldb;
    float beta;
    void *c;
    mp_dtype c_type;
    int64_t ldc;
    const float *bias;        /* per-column (length n) or NULL */
    mp_activation activation; /* applied after alpha*AB + beta*C + bias */
    /* NULL, or set to true when a value of C as stored is not finite (NaN
     * or +-inf, an overflowing sum included), left as it was otherwise;
     * float32 C only. Each tile is read back while it is still in L1, so a
     * caller that must know (a gradient about to be applied) need not scan
     * C again from memory. */
    bool *c_nonfinite;
} mp_gemm_args;

mp_gemm_args mp_gemm_args_default(void);
/* Validates arguments (MP_ERR_INVALID with a message on bad shapes/strides). */
mp_status mp_gemm_ex(const mp_gemm_args *args);

/* How mp_gemm picks its kernel. CPU feature flags say which kernels can run;
 * where an input-type pair has more than one (bf16 or fp8 times bf16 or fp8
 * with AVX512_BF16: vdpbf16ps, or exact widening to float32 and FMA), they
 * are timed on that pair once per process, on its first use (about 15 ms),
 * and the faster is kept. The result is cached per CPU model, version, thread
 * count and pair in $XDG_CACHE_HOME/mixprec (else ~/.cache/mixprec;
 * MP_DISPATCH_CACHE=DIR moves it, MP_DISPATCH_CACHE=0 turns it off). Where
 * the AMX tiles win, a product less deep than one tile (k < 32) still runs
 * on the FMA kernel: the tiles would pad its depth. A forced
 * path (MP_ISA, mp_isa_set) times nothing. Every kernel accumulates in
 * float32 within the same error bound: the choice changes speed, not
 * accuracy (though not the last bits: pin MP_ISA where runs in different
 * processes must agree bit for bit and the cache is off). The ranks of a
 * data-parallel job agree by themselves: mp_dist_init gives every rank
 * rank 0's choices. */
typedef enum {
    MP_DISPATCH_ONLY = 0,     /* one kernel can run the pair */
    MP_DISPATCH_FORCED = 1,   /* MP_ISA or mp_isa_set chose the path */
    MP_DISPATCH_MEASURED = 2, /* timed in this process */
    MP_DISPATCH_CACHED = 3,   /* timed earlier, read from the cache file */
    MP_DISPATCH_DEFAULT = 4,  /* timing ran out of memory: the most specialised kernel */
    MP_DISPATCH_AGREED = 5,   /* data parallel: rank 0's choice, taken by every rank */
} mp_dispatch_source;

#define MP_DISPATCH_MAX_KERNELS 4
typedef struct {
    int n_kernels;                               /* candidates (1 unless timed) */
    const char *kernel[MP_DISPATCH_MAX_KERNELS]; /* path names, as MP_ISA spells them */
    const char *method[MP_DISPATCH_MAX_KERNELS]; /* "vdpbf16ps", "widen to float32, FMA" */
    double gflops[MP_DISPATCH_MAX_KERNELS];      /* timed rate; 0 when not timed */
    int chosen;                                  /* the kernel mp_gemm uses */
    mp_dispatch_source source;
    int threads;          /* threads of the timing */
    char cache_file[512]; /* "" when the cache is off or not used */
    char cache_note[160]; /* what happened to it: "read", "none yet, written", ... */
} mp_gemm_dispatch_info;

/* The kernel mp_gemm uses for inputs of types a_type and b_type, timing the
 * candidates first if no GEMM has needed them yet. MP_ERR_INVALID on a NULL
 * info or an unknown dtype. */
mp_status mp_gemm_dispatch_query(mp_dtype a_type, mp_dtype b_type, mp_gemm_dispatch_info *info);
/* The choices as text, rates included (what `mixprec info` prints). */
mp_status mp_gemm_dispatch_report(FILE *out);
/* Conversions (float32 to and from bfloat16, float16, float8), MX blocks
 * (pack, unpack, quantize along rows or columns) and optimizer updates
 * have kernels on several paths that give the same bits: each is
 * timed once per process on first use (a few milliseconds in all), the
 * faster kept and cached as for GEMM (same directory, same
 * MP_DISPATCH_CACHE); a forced path times nothing. The rates and the
 * choices as text (mixprec info prints them). */
mp_status mp_kernel_dispatch_report(FILE *out);

/* Threads used by kernels: MP_NUM_THREADS, else OMP_NUM_THREADS, else all. */
int mp_num_threads(void);
void mp_set_num_threads(int n);

#ifdef __cplusplus
}
#endif

/* mx.h first: policies (nn.h) name MX element formats */
#include "mixprec/mx.h"
#include "mixprec/nn.h"
#include "mixprec/fp8.h"
#include "mixprec/optim.h"
/* dist.h before train.h: data-parallel steps name its reduction modes */
#include "mixprec/dist.h"
#include "mixprec/train.h"
#include "mixprec/data.h"
#include "mixprec/io.h"
#include "mixprec/tune.h"

#endif /* MIXPREC_H */
