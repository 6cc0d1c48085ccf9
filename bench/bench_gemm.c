/* bench_gemm.c - GEMM throughput of mixprec (f32, bf16, f16, fp8 inputs)
 * against the machine's own measured FMA / vdpbf16ps peak and, when
 * installed, OpenBLAS sgemm and oneDNN matmul (f32, bf16), all loaded with
 * dlopen so neither is needed to build. Shapes: the training step of the MLP
 * 784 -> 4096 -> 4096 -> 10 at batch 1024 and 2048^3. Times are medians. */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/internal.h"
#include "bench_util.h"
#include "openblas_core.h"

#if __has_include(<dnnl.h>)
#include <dnnl.h> /* types only: the functions come from dlsym */
#define HAVE_DNNL_H 1
#else
#define HAVE_DNNL_H 0
#endif

/* ------------------------------------------------------------------ peaks */

static volatile float peak_sink;

#if MP_X86
#include <immintrin.h>
/* 24 independent chains per thread, register-only: the FMA ports' limit. */
MP_TARGET_AVX512 static double peak_fma_thread(long iters)
{
    __m512 acc[24];
    __m512 x = _mm512_set1_ps(1.0000001f), y = _mm512_set1_ps(0.9999999f);
    for (int i = 0; i < 24; i++) acc[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < iters; it++) {
#pragma GCC unroll 24
        for (int i = 0; i < 24; i++) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
        __asm__ volatile("" : "+v"(x));
    }
    __m512 s = acc[0];
    for (int i = 1; i < 24; i++) s = _mm512_add_ps(s, acc[i]);
    peak_sink = _mm512_reduce_add_ps(s);
    return (double)iters * 24 * 32;
}

/* The same on 256-bit vectors (AVX2 path): 12 chains fill the two FMA
 * pipes of a 4-cycle latency with room to spare. */
MP_TARGET_AVX2 static double peak_fma256_thread(long iters)
{
    __m256 acc[12];
    __m256 x = _mm256_set1_ps(1.0000001f), y = _mm256_set1_ps(0.9999999f);
    for (int i = 0; i < 12; i++) acc[i] = _mm256_set1_ps((float)i);
    for (long it = 0; it < iters; it++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) acc[i] = _mm256_fmadd_ps(acc[i], x, y);
        __asm__ volatile("" : "+x"(x));
    }
    __m256 s = acc[0];
    for (int i = 1; i < 12; i++) s = _mm256_add_ps(s, acc[i]);
    float lane[8];
    _mm256_storeu_ps(lane, s);
    peak_sink = lane[0] + lane[7];
    return (double)iters * 12 * 16;
}

MP_TARGET_AVX512BF16 static double peak_bf16_thread(long iters)
{
    __m512 acc[24];
    __m512bh x = (__m512bh)_mm512_set1_epi32(0x3F803F80),
             y = (__m512bh)_mm512_set1_epi32(0x3F80BF80);
    for (int i = 0; i < 24; i++) acc[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < iters; it++) {
#pragma GCC unroll 24
        for (int i = 0; i < 24; i++) acc[i] = _mm512_dpbf16_ps(acc[i], x, y);
        __asm__ volatile("" : "+v"(x));
    }
    __m512 s = acc[0];
    for (int i = 1; i < 24; i++) s = _mm512_add_ps(s, acc[i]);
    peak_sink = _mm512_reduce_add_ps(s);
    return (double)iters * 24 * 64;
}

/* AMX: four chains of tdpbf16ps on tiles held in registers (a 32x32 C,
 * A and B loaded once), as the GEMM's kernel holds its C tile; iters / 16
 * rounds (a round is 16 times the FMA loop's work). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

__attribute__((target("amx-tile,amx-bf16"))) static double peak_amx_thread(long iters)
{
    static const tile_config cfg = {.palette = 1,
                                    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
                                    .rows = {16, 16, 16, 16, 16, 16, 16, 16}};
    _Alignas(64) static const uint16_t ab[16 * 32] = {0x3F80};
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, ab, 64);
    _tile_loadd(5, ab, 64);
    _tile_loadd(6, ab, 64);
    _tile_loadd(7, ab, 64);
    const long rounds = iters / 16;
    for (long it = 0; it < rounds; it++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _Alignas(64) float c[16 * 16];
    _tile_stored(0, c, 64);
    peak_sink = c[0];
    return (double)rounds * 4 * 16 * 16 * 32 * 2;
}
#endif

/* The peak loops: the FMA loop of the path the GEMM runs on, vdpbf16ps's,
 * AMX's. */
typedef enum { PEAK_FMA = 0, PEAK_VDP = 1, PEAK_AMX = 2 } peak_kind;
static const char *const peak_names[3] = {"f32 FMA", "vdpbf16ps", "AMX tdpbf16ps"};

/* Floating-point operations of one run of peak loop `kind` on `threads`
 * threads (its time is the caller's); 0 where the CPU cannot run it. */
static double peak_run(peak_kind kind, int threads, long iters)
{
#if MP_X86
    const mp_isa needs = kind == PEAK_AMX   ? MP_ISA_AMX
                         : kind == PEAK_VDP ? MP_ISA_AVX512BF16
                                            : MP_ISA_AVX2;
    if (!mp_isa_supported(needs)) return 0;
    const bool wide = mp_isa_active() >= MP_ISA_AVX512;
    double flops = 0;
#pragma omp parallel num_threads(threads) reduction(+ : flops)
    flops += kind == PEAK_AMX   ? peak_amx_thread(iters)
             : kind == PEAK_VDP ? peak_bf16_thread(iters)
             : wide             ? peak_fma_thread(iters)
                                : peak_fma256_thread(2 * iters);
    return flops;
#else
    (void)kind;
    (void)threads;
    (void)iters;
    return 0;
#endif
}

/* GFLOP/s of all threads together, best of a few tries. */
static double measure_peak(peak_kind kind, int threads)
{
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now(), flops = peak_run(kind, threads, 4000000);
        double g = flops / (now() - t0) * 1e-9;
        if (g > best) best = g;
    }
    return best;
}

/* ------------------------------------------------------------------ peers */

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *,
                         int, float, float *, int);
static sgemm_fn p_sgemm;

static void load_openblas(int threads)
{
    void *h = dlopen_openblas();
    if (!h) return;
    *(void **)&p_sgemm = dlsym(h, "cblas_sgemm");
    void (*set_threads)(int);
    *(void **)&set_threads = dlsym(h, "openblas_set_num_threads");
    if (set_threads) set_threads(threads);
}

static void openblas_run(bool ta, bool tb, int m, int n, int k, const float *a, int lda,
                         const float *b, int ldb, float *c, int ldc)
{
    /* CblasRowMajor = 101, CblasNoTrans = 111, CblasTrans = 112 */
    p_sgemm(101, ta ? 112 : 111, tb ? 112 : 111, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
}

#if HAVE_DNNL_H
static struct {
    bool ok;
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    dnnl_status_t (*engine_create)(dnnl_engine_t *, dnnl_engine_kind_t, size_t);
    dnnl_status_t (*stream_create)(dnnl_stream_t *, dnnl_engine_t, unsigned);
    dnnl_status_t (*md_init)(dnnl_memory_desc_t *, int, const dnnl_dims_t, dnnl_data_type_t,
                             const dnnl_dims_t);
    dnnl_status_t (*matmul_init)(dnnl_matmul_desc_t *, const dnnl_memory_desc_t *,
                                 const dnnl_memory_desc_t *, const dnnl_memory_desc_t *,
                                 const dnnl_memory_desc_t *);
    dnnl_status_t (*pd_create)(dnnl_primitive_desc_t *, const_dnnl_op_desc_t,
                               const_dnnl_primitive_attr_t, dnnl_engine_t,
                               const_dnnl_primitive_desc_t);
    dnnl_status_t (*pd_destroy)(dnnl_primitive_desc_t);
    dnnl_status_t (*prim_create)(dnnl_primitive_t *, const_dnnl_primitive_desc_t);
    dnnl_status_t (*prim_destroy)(dnnl_primitive_t);
    dnnl_status_t (*mem_create)(dnnl_memory_t *, const dnnl_memory_desc_t *, dnnl_engine_t, void *);
    dnnl_status_t (*mem_destroy)(dnnl_memory_t);
    dnnl_status_t (*execute)(const_dnnl_primitive_t, dnnl_stream_t, int, const dnnl_exec_arg_t *);
    dnnl_status_t (*wait)(dnnl_stream_t);
} dn;

static void load_dnnl(void)
{
    void *h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libdnnl.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    struct {
        void **slot;
        const char *name;
    } syms[] = {
        {(void **)&dn.engine_create, "dnnl_engine_create"},
        {(void **)&dn.stream_create, "dnnl_stream_create"},
        {(void **)&dn.md_init, "dnnl_memory_desc_init_by_strides"},
        {(void **)&dn.matmul_init, "dnnl_matmul_desc_init"},
        {(void **)&dn.pd_create, "dnnl_primitive_desc_create"},
        {(void **)&dn.pd_destroy, "dnnl_primitive_desc_destroy"},
        {(void **)&dn.prim_create, "dnnl_primitive_create"},
        {(void **)&dn.prim_destroy, "dnnl_primitive_destroy"},
        {(void **)&dn.mem_create, "dnnl_memory_create"},
        {(void **)&dn.mem_destroy, "dnnl_memory_destroy"},
        {(void **)&dn.execute, "dnnl_primitive_execute"},
        {(void **)&dn.wait, "dnnl_stream_wait"},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++)
        if (!(*syms[i].slot = dlsym(h, syms[i].name))) return;
    if (dn.engine_create(&dn.eng, dnnl_cpu, 0) != dnnl_success) return;
    if (dn.stream_create(&dn.stream, dn.eng, dnnl_stream_default_flags) != dnnl_success) return;
    dn.ok = true;
}

typedef struct {
    dnnl_primitive_t prim;
    dnnl_memory_t ma, mb, mc;
} dnnl_mm;

/* A matmul primitive for C(f32) = op(A) op(B), inputs f32 or bf16; the
 * transposes are expressed as strides, as oneDNN wants them. */
static bool dnnl_mm_create(dnnl_mm *x, bool bf16, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                           void *a, void *b, float *c)
{
    dnnl_memory_desc_t da, db, dc;
    dnnl_data_type_t it = bf16 ? dnnl_bf16 : dnnl_f32;
    dnnl_dims_t sa = {m, k}, ta_s = {ta ? 1 : k, ta ? m : 1};
    dnnl_dims_t sb = {k, n}, tb_s = {tb ? 1 : n, tb ? k : 1};
    dnnl_dims_t sc = {m, n}, tc_s = {n, 1};
    if (dn.md_init(&da, 2, sa, it, ta_s) || dn.md_init(&db, 2, sb, it, tb_s) ||
        dn.md_init(&dc, 2, sc, dnnl_f32, tc_s))
        return false;
    dnnl_matmul_desc_t md;
    if (dn.matmul_init(&md, &da, &db, NULL, &dc)) return false;
    dnnl_primitive_desc_t pd;
    if (dn.pd_create(&pd, &md, NULL, dn.eng, NULL)) return false;
    dnnl_status_t s = dn.prim_create(&x->prim, pd);
    dn.pd_destroy(pd);
    if (s) return false;
    return !dn.mem_create(&x->ma, &da, dn.eng, a) && !dn.mem_create(&x->mb, &db, dn.eng, b) &&
           !dn.mem_create(&x->mc, &dc, dn.eng, c);
}

static void dnnl_mm_run(const dnnl_mm *x)
{
    dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_SRC, x->ma}, {DNNL_ARG_WEIGHTS, x->mb}, {DNNL_ARG_DST, x->mc}};
    dn.execute(x->prim, dn.stream, 3, args);
    dn.wait(dn.stream);
}

static void dnnl_mm_destroy(dnnl_mm *x)
{
    dn.mem_destroy(x->ma);
    dn.mem_destroy(x->mb);
    dn.mem_destroy(x->mc);
    dn.prim_destroy(x->prim);
}
#endif

/* n bytes (rounded up to whole lines) on a 64-byte boundary; exits when
 * memory runs out. */
static void *aligned(size_t n)
{
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "bench_gemm: out of memory\n");
        exit(1);
    }
    return p;
}

/* ----------------------------------------------------------------- timing */

typedef struct {
    const char *name;
    bool ta, tb;
    int64_t m, n, k;
    bool big;
    int calls; /* per timed run (0: one): a product of microseconds runs many */
} shape;

static const shape shapes[] = {
    {"fc1 fwd    1024x4096x784 ", false, false, 1024, 4096, 784, true, 0},
    {"fc1 dW     784x4096x1024 ", true, false, 784, 4096, 1024, true, 0},
    {"fc1 dX     1024x784x4096 ", false, true, 1024, 784, 4096, true, 0},
    {"fc2 fwd    1024x4096x4096", false, false, 1024, 4096, 4096, true, 0},
    {"fc2 dW     4096x4096x1024", true, false, 4096, 4096, 1024, true, 0},
    {"fc2 dX     1024x4096x4096", false, true, 1024, 4096, 4096, true, 0},
    {"fc3 fwd    1024x10x4096  ", false, false, 1024, 10, 4096, false, 0},
    {"fc3 dW     4096x10x1024  ", true, false, 4096, 10, 1024, false, 0},
    {"fc3 dX     1024x4096x10  ", false, true, 1024, 4096, 10, false, 0},
    {"square     2048x2048x2048", false, false, 2048, 2048, 2048, true, 0},
    /* gpt_mini's MLP weight gradient (x^T dz over a batch of 32 x 128 tokens) */
    {"gpt dW     1024x256x4096 ", true, false, 1024, 256, 4096, false, 0},
    /* a decoder's step: one position through gpt_mini's MLP (W read as it lies) */
    {"dec up     1x1024x256    ", false, false, 1, 1024, 256, false, 400},
    {"dec down   1x256x1024    ", false, false, 1, 256, 1024, false, 400},
};
#define NSHAPES ((int)(sizeof shapes / sizeof shapes[0]))

/* shape si's name without its dimensions ("fc3 fwd": up to the first two
 * spaces), as printf's "%.*s" arguments */
#define short_name(si) (int)(strstr(shapes[si].name, "  ") - shapes[si].name), shapes[si].name

typedef struct {
    int kind; /* 0 mixprec, 1 openblas, 2 dnnl, 3 the peak loop (t: MP_F32 FMA, MP_BF16) */
    const shape *s;
    mp_dtype t;
    void *a, *b;
    float *c;
#if HAVE_DNNL_H
    dnnl_mm *dm;
#endif
} job;

/* The peak loop's length as a job: about 15 ms on a core of a few GHz, long
 * enough that waking the threads is lost in it (at 3 ms the medians were 1-5%
 * below the best of 5 long runs), short against the shapes it takes turns
 * with. */
#define PEAK_JOB_ITERS 2500000

/* The peak loop of the kernel mixprec's bf16 GEMM runs on (main sets it). */
static peak_kind bf16_peak = PEAK_VDP;

/* One call of job j's product (not the peak loop). */
static void run_call(const job *j)
{
    const shape *s = j->s;
    int64_t lda = s->ta ? s->m : s->k, ldb = s->tb ? s->k : s->n;
    if (j->kind == 0)
        mp_gemm(s->ta, s->tb, s->m, s->n, s->k, 1.0f, j->a, j->t, lda, j->b, j->t, ldb, 0.0f, j->c,
                MP_F32, s->n);
    else if (j->kind == 1)
        openblas_run(s->ta, s->tb, (int)s->m, (int)s->n, (int)s->k, j->a, (int)lda, j->b, (int)ldb,
                     j->c, (int)s->n);
#if HAVE_DNNL_H
    else
        dnnl_mm_run(j->dm);
#endif
}

/* Floating-point operations of one run of job j. */
static double run_job(const job *j)
{
    const shape *s = j->s;
    if (j->kind == 3)
        return peak_run(j->t == MP_BF16 ? bf16_peak : PEAK_FMA, mp_num_threads(), PEAK_JOB_ITERS);
    const int calls = s->calls > 0 ? s->calls : 1;
    for (int r = 0; r < calls; r++) run_call(j);
    return 2.0 * (double)s->m * (double)s->n * (double)s->k * calls;
}

/* Median GFLOP/s of each job, and for a job paired with a peak loop
 * (peak_of[i] >= 0) the median over the rounds of its rate over the peak
 * loop's in the same round. The jobs of one shape run in turns (one of
 * each per round) so that load from elsewhere on this shared machine hits
 * mixprec, its peers and the peak loop alike and the ratios stay fair. A
 * small product (fc3's: 0.3-1 ms) runs at the state its neighbour leaves
 * (its 16 MiB operand in or out of the caches, the cores after the peak
 * loops' 15 ms of every FMA unit busy), and in a fixed or rotated cycle
 * every job keeps its neighbour: mixprec float32 always followed the bf16
 * peak loop, oneDNN float32 followed OpenBLAS on the same operands. So
 * each round runs the jobs in a shuffled order, and with `warm` each timed
 * run follows an untimed run of the same job, so every job finds its own
 * operands where its last run left them. (fc3's forward, float32, Zen 5:
 * mixprec 112 against oneDNN 147 GFLOP/s in the rotated cycle, 120 against
 * 144 shuffled; 166-200 against 191-200 with the peak loops and the other
 * input types left out.) At
 * least 3 rounds, then more while under `budget` seconds (at most 15). */
#define MAX_ROUNDS 15
#define MAX_JOBS 10

/* One step of a 64-bit LCG (Knuth's MMIX constants): the operands' values
 * and the rounds' job orders, the same on every run. */
static uint64_t lcg(uint64_t *z)
{
    *z = *z * 6364136223846793005ull + 1442695040888963407ull;
    return *z;
}
static void time_jobs(const job *jobs, int nj, double budget, bool warm, const int *peak_of,
                      double *gflops, double *frac)
{
    double ts[MAX_JOBS][MAX_ROUNDS], flops[MAX_JOBS];
    int n = 0;
    for (int i = 0; i < nj; i++) flops[i] = run_job(&jobs[i]);
    double start = now();
    while (n < MAX_ROUNDS && (n < 3 || now() - start < budget)) {
        /* this round's order: a shuffle (Fisher-Yates, a fixed LCG seeded
         * by the round), so each job follows different neighbours */
        int order[MAX_JOBS];
        uint64_t z = 0x9E3779B97F4A7C15ull * (uint64_t)(n + 1);
        for (int q = 0; q < nj; q++) order[q] = q;
        for (int q = nj - 1; q > 0; q--) {
            const int r = (int)((lcg(&z) >> 33) % (uint64_t)(q + 1)), t = order[q];
            order[q] = order[r];
            order[r] = t;
        }
        for (int q = 0; q < nj; q++) {
            const int i = order[q];
            if (warm) run_job(&jobs[i]);
            double t0 = now();
            run_job(&jobs[i]);
            ts[i][n] = now() - t0;
        }
        n++;
    }
    for (int i = 0; i < nj; i++) {
        gflops[i] = flops[i] / median(ts[i], (size_t)n) * 1e-9;
        const int p = peak_of[i];
        if (p < 0) continue;
        double r[MAX_ROUNDS];
        for (int q = 0; q < n; q++) r[q] = (flops[i] / ts[i][q]) / (flops[p] / ts[p][q]);
        frac[i] = median(r, (size_t)n);
    }
}

int main(int argc, char **argv)
{
    const int threads = mp_num_threads();
    if (argc == 2 && !strcmp(argv[1], "--openblas-probe")) return openblas_probe(threads);
    if (argc > 1) {
        fprintf(stderr, "usage: bench_gemm\n");
        return 2;
    }
#ifdef _OPENMP
    omp_set_num_threads(threads);
#endif
    coretype_try tries[4];
    int best_core = -1, ntries = choose_openblas_coretype(tries, 4, &best_core);
    /* The bf16 column is measured against the peak of the kernel that ran it. */
    mp_gemm_dispatch_info di;
    const bool have_di = mp_gemm_dispatch_query(MP_BF16, MP_BF16, &di) == MP_OK;
    const char *bf16_kernel = have_di ? di.kernel[di.chosen] : "avx512";
    bf16_peak = !strcmp(bf16_kernel, "amx")          ? PEAK_AMX
                : !strcmp(bf16_kernel, "avx512bf16") ? PEAK_VDP
                                                     : PEAK_FMA;
    const bool bf16_on_fma = bf16_peak == PEAK_FMA;
    double pk_f32 = measure_peak(PEAK_FMA, threads), pk_bf16 = measure_peak(PEAK_VDP, threads);
    load_openblas(threads);
#if HAVE_DNNL_H
    load_dnnl();
    const bool have_dnnl = dn.ok;
#else
    const bool have_dnnl = false;
#endif
    double pk_amx = bf16_peak == PEAK_AMX ? measure_peak(PEAK_AMX, threads) : 0;
    /* 7, 8: mp f32's and mp bf16's fractions of their peak loops, round by
     * round; 9, 10: those peak loops' GFLOP/s */
    double res[NSHAPES][11];
    /* sums of logs: ratios to the peers, fractions of the peak loops in
     * turns and of the best peak (the b_ ones) */
    double sum_lr_bf = 0, sum_lr_f32 = 0, sum_lr_df = 0, sum_lpf_bf = 0, sum_lpf_f32 = 0;
    double sum_b_bf = 0, sum_b_f32 = 0;
    int n_bf = 0, n_f32 = 0, n_df = 0, n_pf = 0, n_pb = 0, n_big = 0;
    for (int si = 0; si < NSHAPES; si++) {
        const shape *s = &shapes[si];
        const size_t na = (size_t)(s->m * s->k), nb = (size_t)(s->k * s->n);
        /* 64-byte aligned, as mixprec's tensors are (and as oneDNN asks):
         * from malloc, 16 bytes past a line, every 64-byte row load of a
         * float32 A read in place spans two lines (fc3's forward on the
         * column kernel 0.48 -> 0.55 ms) */
        float *af = aligned(na * 4), *bf = aligned(nb * 4), *c = aligned((size_t)(s->m * s->n) * 4);
        void *ah = aligned(na * 2), *bh = aligned(nb * 2), *a8 = aligned(na), *b8 = aligned(nb);
        uint64_t z = 12345 + (uint64_t)si;
        for (size_t i = 0; i < na + nb; i++) {
            float v = (float)((double)(lcg(&z) >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
            if (i < na)
                af[i] = v;
            else
                bf[i - na] = v;
        }
        /* Every input format gets its own buffers so all jobs can take turns. */
        void *ah16 = aligned(na * 2), *bh16 = aligned(nb * 2);
        mp_convert(ah, MP_BF16, af, MP_F32, na);
        mp_convert(bh, MP_BF16, bf, MP_F32, nb);
        mp_convert(ah16, MP_F16, af, MP_F32, na);
        mp_convert(bh16, MP_F16, bf, MP_F32, nb);
        mp_convert(a8, MP_F8E4M3, af, MP_F32, na);
        mp_convert(b8, MP_F8E4M3, bf, MP_F32, nb);
        job jobs[MAX_JOBS];
        int nj = 0, i_ob = -1, i_df = -1, i_db = -1;
        jobs[nj++] = (job){.kind = 0, .s = s, .t = MP_F32, .a = af, .b = bf, .c = c};
        jobs[nj++] = (job){.kind = 0, .s = s, .t = MP_BF16, .a = ah, .b = bh, .c = c};
        jobs[nj++] = (job){.kind = 0, .s = s, .t = MP_F16, .a = ah16, .b = bh16, .c = c};
        jobs[nj++] = (job){.kind = 0, .s = s, .t = MP_F8E4M3, .a = a8, .b = b8, .c = c};
        if (p_sgemm) {
            i_ob = nj;
            jobs[nj++] = (job){.kind = 1, .s = s, .a = af, .b = bf, .c = c};
        }
#if HAVE_DNNL_H
        dnnl_mm dm_f32, dm_bf16;
        bool have_df = false, have_db = false;
        if (have_dnnl) {
            have_db = dnnl_mm_create(&dm_bf16, true, s->ta, s->tb, s->m, s->n, s->k, ah, bh, c);
            have_df = dnnl_mm_create(&dm_f32, false, s->ta, s->tb, s->m, s->n, s->k, af, bf, c);
            if (have_df) {
                i_df = nj;
                jobs[nj++] = (job){.kind = 2, .s = s, .dm = &dm_f32};
            }
            if (have_db) {
                i_db = nj;
                jobs[nj++] = (job){.kind = 2, .s = s, .dm = &dm_bf16};
            }
        }
#endif
        int i_pf = -1, i_pb = -1;
        if (pk_f32 > 0) {
            i_pf = nj;
            jobs[nj++] = (job){.kind = 3, .s = s, .t = MP_F32};
        }
        if (pk_bf16 > 0) {
            i_pb = nj;
            jobs[nj++] = (job){.kind = 3, .s = s, .t = MP_BF16};
        }
        const int i_pk_bf16 = bf16_on_fma ? i_pf : i_pb;
        int peak_of[MAX_JOBS];
        for (int i = 0; i < nj; i++) peak_of[i] = -1;
        peak_of[0] = i_pf;
        peak_of[1] = i_pk_bf16;
        double gf[MAX_JOBS] = {0}, frac[MAX_JOBS] = {0};
        time_jobs(jobs, nj, s->big ? 4.0 : 1.0, !s->big, peak_of, gf, frac);
#if HAVE_DNNL_H
        if (have_df) dnnl_mm_destroy(&dm_f32);
        if (have_db) dnnl_mm_destroy(&dm_bf16);
#endif
        free(ah16);
        free(bh16);
        const double g_f32 = gf[0], g_bf16 = gf[1], g_f16 = gf[2], g_fp8 = gf[3];
        const double g_ob = i_ob >= 0 ? gf[i_ob] : 0, g_dnnl_f32 = i_df >= 0 ? gf[i_df] : 0;
        const double g_dnnl_bf16 = i_db >= 0 ? gf[i_db] : 0;
        const double g_pf = i_pf >= 0 ? gf[i_pf] : 0;
        const double g_pb = i_pk_bf16 >= 0 ? gf[i_pk_bf16] : 0;
        const double row[11] = {g_f32,       g_bf16,  g_f16,   g_fp8, g_ob, g_dnnl_f32,
                                g_dnnl_bf16, frac[0], frac[1], g_pf,  g_pb};
        memcpy(res[si], row, sizeof row);
        if (s->big) {
            if (g_ob > 0) sum_lr_f32 += log(g_f32 / g_ob), n_f32++;
            if (g_dnnl_bf16 > 0) sum_lr_bf += log(g_bf16 / g_dnnl_bf16), n_bf++;
            if (g_dnnl_f32 > 0) sum_lr_df += log(g_f32 / g_dnnl_f32), n_df++;
        }
        free(af);
        free(bf);
        free(c);
        free(ah);
        free(bh);
        free(a8);
        free(b8);
    }
    /* The peak is measured again at the end and the better figure kept:
     * other load on the machine during one measurement would understate it.
     * The fractions below are against the peak loop timed in the same
     * rounds as each shape: the host's speed drifts by 10-15% over a run. */
    double p2 = measure_peak(PEAK_FMA, threads), p3 = measure_peak(PEAK_VDP, threads);
    double p4 = bf16_peak == PEAK_AMX ? measure_peak(PEAK_AMX, threads) : 0;
    if (p2 > pk_f32) pk_f32 = p2;
    if (p3 > pk_bf16) pk_bf16 = p3;
    if (p4 > pk_amx) pk_amx = p4;
    printf("mixprec gemm benchmark: %d threads, isa %s\n", threads, mp_isa_name(mp_isa_active()));
    mp_gemm_dispatch_report(stdout);
    printf("measured peak: f32 FMA %.0f GFLOP/s, bf16 vdpbf16ps %.0f GFLOP/s", pk_f32, pk_bf16);
    if (pk_amx > 0) printf(", bf16 AMX tdpbf16ps %.0f GFLOP/s (tiles in registers)", pk_amx);
    printf(" (best of 5 runs before and after the shapes)\n");
    const double pk_bf16_kernel = bf16_peak == PEAK_AMX ? pk_amx : bf16_on_fma ? pk_f32 : pk_bf16;
    if (bf16_peak != PEAK_VDP)
        printf("(mp bf16 runs on %s: its fraction is of the %s peak)\n", bf16_kernel,
               peak_names[bf16_peak]);
    printf("peers: openblas %s, onednn %s\n",
           p_sgemm ? "yes" : "not found (apt-get install -y libopenblas0-pthread)",
           have_dnnl     ? "yes"
           : HAVE_DNNL_H ? "not found (apt-get install -y libdnnl-dev)"
                         : "left out: bench_gemm was built without <dnnl.h> "
                           "(apt-get install -y libdnnl-dev, then make bench-gemm rebuilds it)");
    print_openblas_coretypes(tries, ntries, best_core);
    printf("GFLOP/s (fraction of the matching peak loop: the median over rounds of the rate over "
           "the loop's in the same round; pk: the loops' GFLOP/s); ratios are mixprec / peer\n");
    printf("%-26s %13s %13s %7s %7s %9s %9s %9s %9s %9s %9s %7s %7s\n", "shape", "mp f32",
           "mp bf16", "mp f16", "mp fp8", "openblas", "dnnl f32", "dnnl bf16", "f32/oblas",
           "f32/dnnl", "bf16/dnnl", "pk f32", "pk bf16");

    /* the lowest ratio to oneDNN over every shape, small ones included */
    double min_df = 0, min_db = 0;
    int at_df = -1, at_db = -1;
    for (int si = 0; si < NSHAPES; si++) {
        const double *g = res[si];
        char r1[16] = "-", r2[16] = "-", r3[16] = "-", f1[32], f2[32];
        if (g[4] > 0) snprintf(r1, sizeof r1, "%.2f", g[0] / g[4]);
        if (g[5] > 0) snprintf(r3, sizeof r3, "%.2f", g[0] / g[5]);
        if (g[6] > 0) snprintf(r2, sizeof r2, "%.2f", g[1] / g[6]);
        if (g[5] > 0 && (at_df < 0 || g[0] / g[5] < min_df)) min_df = g[0] / g[5], at_df = si;
        if (g[6] > 0 && (at_db < 0 || g[1] / g[6] < min_db)) min_db = g[1] / g[6], at_db = si;
        snprintf(f1, sizeof f1, "%.0f (%.2f)", g[0], g[7]);
        snprintf(f2, sizeof f2, "%.0f (%.2f)", g[1], g[8]);
        printf("%-26s %13s %13s %7.0f %7.0f %9.0f %9.0f %9.0f %9s %9s %9s %7.0f %7.0f\n",
               shapes[si].name, f1, f2, g[2], g[3], g[4], g[5], g[6], r1, r3, r2, g[9], g[10]);
        if (shapes[si].big) {
            if (g[7] > 0) sum_lpf_f32 += log(g[7]), n_pf++;
            if (g[8] > 0) sum_lpf_bf += log(g[8]), n_pb++;
            if (pk_f32 > 0) sum_b_f32 += log(g[0] / pk_f32);
            if (pk_bf16_kernel > 0) sum_b_bf += log(g[1] / pk_bf16_kernel);
            n_big++;
        }
    }
    printf("(summary: geometric means over the big shapes, the fc1/fc2 products and 2048^3)\n");
    /* a ratio without its peer in this run is n/a, never a number */
    char rb[16] = "n/a", rf[16] = "n/a", rd[16] = "n/a";
    if (n_bf) snprintf(rb, sizeof rb, "%.2f", exp(sum_lr_bf / n_bf));
    if (n_f32) snprintf(rf, sizeof rf, "%.2f", exp(sum_lr_f32 / n_f32));
    if (n_df) snprintf(rd, sizeof rd, "%.2f", exp(sum_lr_df / n_df));
    /* the fractions of the best peak understate where the host was slower
     * during the shapes than during the best peak run, and overstate where
     * it was slower during every peak run: both are printed */
    printf("summary: bf16_vs_onednn_bf16=%s f32_vs_onednn_f32=%s f32_vs_openblas=%s "
           "bf16_peak_fraction=%.2f f32_peak_fraction=%.2f bf16_best_peak_fraction=%.2f "
           "f32_best_peak_fraction=%.2f\n",
           rb, rd, rf, n_pb ? exp(sum_lpf_bf / n_pb) : 0.0, n_pf ? exp(sum_lpf_f32 / n_pf) : 0.0,
           n_big && pk_bf16_kernel > 0 ? exp(sum_b_bf / n_big) : 0.0,
           n_big && pk_f32 > 0 ? exp(sum_b_f32 / n_big) : 0.0);
    /* issue 17 asks for at least 1.0x oneDNN on every shape: the lowest */
    if (at_df >= 0 || at_db >= 0) {
        printf("summary-min: ");
        if (at_df >= 0) printf("f32_vs_onednn_f32_min=%.2f (%.*s) ", min_df, short_name(at_df));
        if (at_db >= 0) printf("bf16_vs_onednn_bf16_min=%.2f (%.*s)", min_db, short_name(at_db));
        printf("\n");
    }
    return 0;
}
