/* bench_gpt.c - the GPT of examples/gpt_mini.json (4 layers, 4 heads, width
 * 256, context 128, bytes as tokens), in one run:
 *   1. the fused causal attention kernel (src/kernels/attention.h) against
 *      the plain three-matmul formula (S = QK^T/sqrt(d) materialized per
 *      head with mp_gemm, masked softmax, SV) at contexts 128, 512 and 2048,
 *      forward and forward+backward, float32, the kernel on its portable
 *      loops against the ISA path (time and bits), and the bytes each
 *      allocates at context 2048 (mixprec's memory accounting);
 *   2. training tokens per second at batch 32 x 128 (AdamW, a fixed random
 *      token batch) per policy, float32 and mixed_bfloat16, median step;
 *   3. generation tokens per second with the key/value cache against
 *      rerunning the whole window per token, prompts of 16 and 512 tokens,
 *      on the same model rebuilt for context 1024 (random weights, greedy),
 *      and the prompt's prefill against one position per step;
 *   4. Keras 3 on TensorFlow on the same model and batch (bench/gpt_keras.py,
 *      from the virtual environment `make bench-gpt` makes), with the ratio
 *      mixprec/Keras in tokens per second per policy. n/a where Keras is not
 *      there.
 *
 *   usage: bench_gpt [--keras-python PATH] [--warmup N] [--steps N]
 *                    [--gen-tokens N] [--reps N] [--only attention,train,generate,keras]
 * (--only: the sections to run; --reps: kernel repetitions) */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/times.h>
#include <unistd.h>

#include "kernels/attention.h"
#include "bench_util.h"

#define MODEL_FILE "examples/gpt_mini.json"
#define BATCH 32
#define CONTEXT 128
#define VOCAB 256
#define HEADS 4
#define HEAD_DIM 64
#define GEN_CONTEXT 1024
#define MAX_STEPS 64
#define MAX_REPS 64

static const char *const policies[2] = {"float32", "mixed_bfloat16"};
static const char *const tag[2] = {"f32", "bf16"};

static void die(const char *what)
{
    fprintf(stderr, "bench_gpt: %s: %s\n", what, mp_last_error());
    exit(1);
}

/* ------------------------------------------------------------------ setup */

/* The first processor's model name, family, model and stepping. */
/* n float32 values in [-1, 1), 64-byte aligned (untracked: the inputs and
 * outputs both attention versions share); free() it. */
static float *random_floats(size_t n, uint32_t seed)
{
    float *f = aligned_alloc(64, (n * sizeof *f + 63) / 64 * 64);
    if (!f) {
        fprintf(stderr, "bench_gpt: out of memory\n");
        exit(1);
    }
    uint32_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        f[i] = (float)(s >> 8) * (2.0f / 16777216.0f) - 1.0f;
    }
    return f;
}

static uint32_t lcg = 12345;
static int32_t random_token(void)
{
    lcg = lcg * 1664525u + 1013904223u;
    return (int32_t)(lcg >> 24);
}

/* ------------------------------------------------- 1. attention kernels */

typedef struct {
    float *q, *k, *v, *o, *dout, *dq, *dk, *dv, *lse; /* lse tracked (mp_alloc) */
    float *p, *dp; /* the plain formula's [heads, T, T] (mp_alloc), or NULL */
    int64_t t;
} attn_bufs;

static void bufs_init(attn_bufs *b, int64_t t)
{
    *b = (attn_bufs){.t = t};
    float **f[] = {&b->q, &b->k, &b->v, &b->o, &b->dout, &b->dq, &b->dk, &b->dv};
    for (uint32_t i = 0; i < 8; i++) *f[i] = random_floats((size_t)(t * HEADS * HEAD_DIM), i + 1);
}

static void bufs_free(attn_bufs *b)
{
    float *f[] = {b->q, b->k, b->v, b->o, b->dout, b->dq, b->dk, b->dv};
    for (int i = 0; i < 8; i++) free(f[i]);
    mp_free(b->lse);
    mp_free(b->p);
    mp_free(b->dp);
}

static void *tracked(size_t bytes)
{
    void *p = mp_alloc(bytes, MP_MEM_WORKSPACE);
    if (!p) die("mp_alloc");
    return p;
}

static void kernel_run(attn_bufs *b, bool backward)
{
    const mp_attn_geom g = {.batch = 1, .t = b->t, .heads = HEADS, .d = HEAD_DIM};
    if (!b->lse) b->lse = tracked((size_t)(HEADS * b->t) * sizeof(float));
    if (mp_attention_forward(&g, b->q, MP_F32, b->k, MP_F32, b->v, MP_F32, b->o, MP_F32, b->lse))
        die("attention forward");
    if (backward &&
        mp_attention_backward(&g, b->q, MP_F32, b->k, MP_F32, b->v, MP_F32, b->o, MP_F32, b->lse,
                              b->dout, MP_F32, b->dq, b->dk, b->dv, MP_F32))
        die("attention backward");
}

/* The plain formula, one head at a time through mp_gemm on the [T, heads, d]
 * rows (leading dimension heads * d), P = softmax(mask(QK^T / sqrt(d))) kept
 * for backward; backward: dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(P dP)),
 * dQ = dS K / sqrt(d), dK = dS^T Q / sqrt(d). Full [T, T] products: the
 * formula computes the masked half too. */
static void plain_run(attn_bufs *b, bool backward)
{
    const int64_t t = b->t, ld = HEADS * HEAD_DIM;
    const size_t tt = (size_t)(t * t);
    const float scale = 1.0f / sqrtf((float)HEAD_DIM);
    if (!b->p) b->p = tracked((size_t)HEADS * tt * sizeof(float));
    for (int h = 0; h < HEADS; h++)
        mp_gemm(false, true, t, t, HEAD_DIM, scale, b->q + h * HEAD_DIM, MP_F32, ld,
                b->k + h * HEAD_DIM, MP_F32, ld, 0.0f, b->p + h * tt, MP_F32, t);
#pragma omp parallel for schedule(static) num_threads(mp_num_threads())
    for (int64_t r = 0; r < HEADS * t; r++) {
        float *row = b->p + r * t, mx = -INFINITY, sum = 0.0f;
        const int64_t i = r % t;
        for (int64_t j = 0; j <= i; j++) mx = fmaxf(mx, row[j]);
        for (int64_t j = 0; j <= i; j++) sum += row[j] = expf(row[j] - mx);
        for (int64_t j = 0; j <= i; j++) row[j] /= sum;
        for (int64_t j = i + 1; j < t; j++) row[j] = 0.0f;
    }
    for (int h = 0; h < HEADS; h++)
        mp_gemm(false, false, t, HEAD_DIM, t, 1.0f, b->p + h * tt, MP_F32, t, b->v + h * HEAD_DIM,
                MP_F32, ld, 0.0f, b->o + h * HEAD_DIM, MP_F32, ld);
    if (!backward) return;
    if (!b->dp) b->dp = tracked((size_t)HEADS * tt * sizeof(float));
    for (int h = 0; h < HEADS; h++) {
        mp_gemm(true, false, t, HEAD_DIM, t, 1.0f, b->p + h * tt, MP_F32, t, b->dout + h * HEAD_DIM,
                MP_F32, ld, 0.0f, b->dv + h * HEAD_DIM, MP_F32, ld);
        mp_gemm(false, true, t, t, HEAD_DIM, 1.0f, b->dout + h * HEAD_DIM, MP_F32, ld,
                b->v + h * HEAD_DIM, MP_F32, ld, 0.0f, b->dp + h * tt, MP_F32, t);
    }
#pragma omp parallel for schedule(static) num_threads(mp_num_threads())
    for (int64_t r = 0; r < HEADS * t; r++) {
        const float *p = b->p + r * t;
        float *dp = b->dp + r * t, dot = 0.0f;
        for (int64_t j = 0; j < t; j++) dot += p[j] * dp[j];
        for (int64_t j = 0; j < t; j++) dp[j] = p[j] * (dp[j] - dot);
    }
    for (int h = 0; h < HEADS; h++) {
        mp_gemm(false, false, t, HEAD_DIM, t, scale, b->dp + h * tt, MP_F32, t, b->k + h * HEAD_DIM,
                MP_F32, ld, 0.0f, b->dq + h * HEAD_DIM, MP_F32, ld);
        mp_gemm(true, false, t, HEAD_DIM, t, scale, b->dp + h * tt, MP_F32, t, b->q + h * HEAD_DIM,
                MP_F32, ld, 0.0f, b->dk + h * HEAD_DIM, MP_F32, ld);
    }
}

typedef void (*attn_fn)(attn_bufs *, bool);

static double median_ms(attn_fn f, attn_bufs *b, bool backward, int reps)
{
    double ts[MAX_REPS];
    for (int r = -1; r < reps; r++) {
        double ta = now();
        f(b, backward);
        if (r >= 0) ts[r] = 1e3 * (now() - ta);
    }
    return median(ts, (size_t)reps);
}

/* Bytes the accounting saw allocated during one forward+backward above
 * what was there before (the first call of its kind in this process, so
 * per-thread scratch that the call grows counts). */
static size_t peak_bytes(attn_fn f, attn_bufs *b)
{
    mp_mem_stats s;
    mp_mem_get_stats(&s);
    size_t before = s.total_current;
    mp_mem_reset_peaks();
    f(b, true);
    mp_mem_get_stats(&s);
    return s.total_peak - before;
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - (double)b[i]));
    return m;
}

typedef struct {
    double fwd, fwd_plain, both, both_plain, both_portable;
    bool same_bits; /* the portable loops gave the ISA path's o, dq, dk, dv */
} attn_times;

/* The kernel's forward+backward on the portable loops (mp_isa_set
 * MP_ISA_SCALAR), timed in turn with the ISA path above, and whether its
 * outputs are the ISA path's bits (kb holds those). */
static double portable_ms(attn_bufs *kb, int reps, bool *same)
{
    const size_t n = (size_t)(kb->t * HEADS * HEAD_DIM) * sizeof(float);
    float *keep[4], *out[4] = {kb->o, kb->dq, kb->dk, kb->dv};
    for (int i = 0; i < 4; i++) {
        if (!(keep[i] = malloc(n))) die("malloc");
        memcpy(keep[i], out[i], n);
    }
    if (mp_isa_set(MP_ISA_SCALAR)) die("mp_isa_set");
    const double ms = median_ms(kernel_run, kb, true, reps);
    mp_isa_reset();
    *same = true;
    for (int i = 0; i < 4; i++) {
        *same = *same && !memcmp(keep[i], out[i], n);
        free(keep[i]);
    }
    return ms;
}

static const int64_t contexts[3] = {128, 512, 2048};

static void bench_attention(int reps, attn_times at[3], size_t mem[2])
{
    printf("\nfused causal attention vs the plain formula (batch 1, %d heads, d %d, float32; "
           "median ms of %d):\n",
           HEADS, HEAD_DIM, reps);
    /* memory first, before anything has grown the per-thread scratch */
    attn_bufs kb, pb;
    bufs_init(&kb, 2048);
    bufs_init(&pb, 2048);
    mem[0] = peak_bytes(kernel_run, &kb);
    mem[1] = peak_bytes(plain_run, &pb);
    bufs_free(&kb);
    bufs_free(&pb);
    printf("  %7s %9s %9s %7s %11s %11s %7s %9s %9s %7s %5s\n", "context", "fwd", "plain", "x",
           "fwd+bwd", "plain", "x", "max|diff|", "portable", "x", "bits");
    for (int c = 0; c < 3; c++) {
        bufs_init(&kb, contexts[c]);
        bufs_init(&pb, contexts[c]);
        attn_times *a = &at[c];
        a->fwd = median_ms(kernel_run, &kb, false, reps);
        a->fwd_plain = median_ms(plain_run, &pb, false, reps);
        a->both = median_ms(kernel_run, &kb, true, reps);
        a->both_plain = median_ms(plain_run, &pb, true, reps);
        size_t n = (size_t)(contexts[c] * HEADS * HEAD_DIM);
        double d = fmax(fmax(max_diff(kb.o, pb.o, n), max_diff(kb.dq, pb.dq, n)),
                        fmax(max_diff(kb.dk, pb.dk, n), max_diff(kb.dv, pb.dv, n)));
        a->both_portable = portable_ms(&kb, reps, &a->same_bits);
        printf("  %7lld %9.3f %9.3f %6.2fx %11.3f %11.3f %6.2fx %9.1e %9.3f %6.2fx %5s\n",
               (long long)contexts[c], a->fwd, a->fwd_plain, a->fwd_plain / a->fwd, a->both,
               a->both_plain, a->both_plain / a->both, d, a->both_portable,
               a->both_portable / a->both, a->same_bits ? "same" : "DIFF");
        fflush(stdout);
        bufs_free(&kb);
        bufs_free(&pb);
    }
    const size_t scratch = (mp_attention_scratch_bytes(HEAD_DIM) + 4095) / 4096 * 4096;
    printf("  (x = plain ms / kernel ms; max|diff| over o, dq, dk, dv of the two; portable: "
           "the kernel's fwd+bwd on its portable loops (MP_ISA_SCALAR), x = portable ms / %s "
           "ms, bits: its outputs against the %s path's)\n"
           "  memory at context 2048, forward+backward, bytes allocated beyond the shared "
           "q, k, v, o and gradients:\n"
           "    kernel %10zu B = %.2f MiB (measured; expected %d threads x %zu B scratch + "
           "lse %d x 2048 x 4 B)\n"
           "    plain  %10zu B = %.2f MiB (measured; expected P and dP, 2 x %d x 2048 x 2048 x "
           "4 B = %d MiB, + GEMM packing)\n",
           mp_isa_name(mp_isa_active()), mp_isa_name(mp_isa_active()), mem[0],
           (double)mem[0] / 1048576.0, mp_num_threads(), scratch, HEADS, mem[1],
           (double)mem[1] / 1048576.0, HEADS, 2 * HEADS * 2048 * 2048 * 4 / 1048576);
}

/* ------------------------------------------------------------ 2. training */

typedef struct {
    double ms, tokens_s;
    float loss;
    int n;                   /* steps timed, in t */
    double t[2 * MAX_STEPS]; /* ms; a second run's appended after Keras */
} train_result;

static train_result bench_train(const char *policy, int warmup, int steps)
{
    mp_model *m = NULL;
    mp_compile_options o = mp_compile_options_default();
    o.optimizer = mp_optimizer_config_default(MP_OPTIMIZER_ADAMW);
    if (mp_model_from_config_file(MODEL_FILE, policy, 1, BATCH, &m) || mp_model_compile(m, &o))
        die(MODEL_FILE);
    mp_tensor x;
    if (mp_tensor_init(&x, MP_I32, 2, (int64_t[]){BATCH, CONTEXT}, MP_MEM_OTHER)) die("tensor");
    static int32_t y[BATCH * CONTEXT];
    int32_t *ids = x.data;
    lcg = 7; /* the same batch for every policy: windows of random bytes */
    for (int b = 0; b < BATCH; b++) {
        int32_t next = random_token();
        for (int t = 0; t < CONTEXT; t++) {
            ids[b * CONTEXT + t] = next;
            y[b * CONTEXT + t] = next = random_token();
        }
    }
    train_result r = {.n = steps};
    mp_step_result sr = {0};
    for (int i = 0; i < warmup + steps; i++) {
        double ta = now();
        if (mp_model_train_step(m, &x, y, NULL, &sr)) die("train step");
        if (i >= warmup) r.t[i - warmup] = 1e3 * (now() - ta);
    }
    r.ms = median_copy(r.t, steps);
    r.loss = sr.loss;
    r.tokens_s = BATCH * CONTEXT / (r.ms * 1e-3);
    mp_tensor_release(&x);
    mp_model_free(m);
    return r;
}

/* ---------------------------------------------------------- 3. generation */

/* gpt_mini at context GEN_CONTEXT (its input shape and PositionEmbedding's
 * sequence_length changed), random weights, saved as a checkpoint in
 * path (a temporary file the caller removes). */
static void make_long_checkpoint(char *path, size_t len)
{
    json_error_t err;
    json_t *cfg = json_load_file(MODEL_FILE, 0, &err);
    if (!cfg) {
        fprintf(stderr, "bench_gpt: %s: %s\n", MODEL_FILE, err.text);
        exit(1);
    }
    size_t i;
    json_t *layer;
    json_array_foreach(json_object_get(cfg, "layers"), i, layer)
    {
        const char *cls = json_string_value(json_object_get(layer, "class_name"));
        if (cls && !strcmp(cls, "InputLayer"))
            json_object_set_new(layer, "shape", json_pack("[I]", (json_int_t)GEN_CONTEXT));
        if (cls && !strcmp(cls, "PositionEmbedding"))
            json_object_set_new(layer, "sequence_length", json_integer(GEN_CONTEXT));
    }
    char cfg_path[] = "/tmp/bench_gpt_XXXXXX";
    int fd = mkstemp(cfg_path);
    if (fd < 0 || json_dump_file(cfg, cfg_path, 0)) {
        fprintf(stderr, "bench_gpt: cannot write %s\n", cfg_path);
        exit(1);
    }
    close(fd);
    json_decref(cfg);
    mp_model *m = NULL;
    mp_status s = mp_model_from_config_file(cfg_path, NULL, 1, 1, &m);
    unlink(cfg_path);
    if (s) die("the context-1024 model");
    snprintf(path, len, "/tmp/bench_gpt_%ld.safetensors", (long)getpid());
    if (mp_model_save_checkpoint(m, path, NULL)) die(path);
    mp_model_free(m);
}

static int argmax(const mp_tensor *y, int64_t row)
{
    float p[VOCAB];
    mp_convert(p, MP_F32, (const char *)y->data + (size_t)(row * VOCAB) * mp_dtype_size(y->dtype),
               y->dtype, VOCAB);
    int best = 0;
    for (int i = 1; i < VOCAB; i++)
        if (p[i] > p[best]) best = i;
    return best;
}

typedef struct {
    double prefill_s, stepwise_s, cached_tok_s, plain_tok_s;
    int agree; /* generated tokens equal in both ways before the first difference */
} gen_result;

/* prompt tokens, then n greedy tokens each way: the cache (one position per
 * step) and a forward of the whole [1, GEN_CONTEXT] window per token,
 * reading the last position's row. The prompt's positions but the last are
 * timed apart, twice: one position per step, then as prefills of up to
 * max_batch positions (the way generation continues from; both leave the
 * same cache, bit for bit). */
static gen_result bench_generate(mp_model *dec, mp_model *full, int64_t prompt, int n)
{
    gen_result r = {0};
    int32_t *seq = calloc(GEN_CONTEXT, sizeof *seq), *seq2 = calloc(GEN_CONTEXT, sizeof *seq2);
    if (!seq || !seq2) exit(1);
    lcg = 99;
    for (int64_t i = 0; i < prompt; i++) seq[i] = seq2[i] = random_token();
    mp_tensor x;
    const mp_tensor *y = NULL;
    if (mp_model_decode_reset(dec, GEN_CONTEXT)) die("decode reset");
    double ta = now();
    for (int64_t i = 0; i < prompt - 1; i++) {
        mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){1, 1}, &seq[i]);
        if (mp_model_decode_step(dec, &x, &y)) die("decode step");
    }
    r.stepwise_s = now() - ta;
    if (mp_model_decode_reset(dec, GEN_CONTEXT)) die("decode reset");
    const int64_t chunk = mp_model_max_batch(dec);
    ta = now();
    for (int64_t i = 0; i < prompt - 1; i += chunk) {
        const int64_t rows = prompt - 1 - i < chunk ? prompt - 1 - i : chunk;
        mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){rows, 1}, &seq[i]);
        if (mp_model_decode_prefill(dec, &x, &y)) die("decode prefill");
    }
    r.prefill_s = now() - ta;
    ta = now();
    for (int64_t i = prompt - 1; i < prompt - 1 + n; i++) {
        mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){1, 1}, &seq[i]);
        if (mp_model_decode_step(dec, &x, &y)) die("decode step");
        seq[i + 1] = argmax(y, 0);
    }
    r.cached_tok_s = n / (now() - ta);
    ta = now();
    for (int64_t i = prompt - 1; i < prompt - 1 + n; i++) {
        mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){1, GEN_CONTEXT}, seq2);
        if (mp_model_forward(full, &x, false, &y)) die("forward");
        seq2[i + 1] = argmax(y, i);
    }
    r.plain_tok_s = n / (now() - ta);
    while (r.agree < n && seq[prompt + r.agree] == seq2[prompt + r.agree]) r.agree++;
    free(seq);
    free(seq2);
    return r;
}

/* ------------------------------------------------------------------ Keras */

/* Runs bench/gpt_keras.py under `python` with `threads` threads, printing
 * each policy it reports and its step time into ms[p] (0 for a policy it
 * did not report; the last line it printed says why). */
static void run_keras(const char *python, int threads, int warmup, int steps, double ms[2])
{
    char why[256], line[4096], versions[200] = "";
    snprintf(why, sizeof why, "%s not found (make bench-gpt installs tensorflow-cpu and keras)",
             python);
    FILE *py = NULL;
    if (!access(python, X_OK)) {
        snprintf(line, sizeof line,
                 "env OMP_NUM_THREADS=%d TF_CPP_MIN_LOG_LEVEL=2 KERAS_BACKEND=tensorflow '%s' "
                 "bench/gpt_keras.py --threads %d --warmup %d --steps %d --batch %d --context %d "
                 "2>&1",
                 threads, python, threads, warmup, steps, BATCH, CONTEXT);
        py = popen(line, "r");
        snprintf(why, sizeof why, "gpt_keras.py printed nothing");
    }
    int got = 0;
    while (py && fgets(line, sizeof line, py)) {
        json_t *j = line[0] == '{' ? json_loads(line, 0, NULL) : NULL;
        const char *pol = json_string_value(json_object_get(j, "policy"));
        int p = !pol ? -1 : !strcmp(pol, policies[0]) ? 0 : !strcmp(pol, policies[1]) ? 1 : -1;
        if (p < 0 && !got && line[0] != '\n') {
            line[strcspn(line, "\n")] = 0;
            snprintf(why, sizeof why, "%.200s", line);
        }
        if (p >= 0) {
            ms[p] = json_number_value(json_object_get(j, "median_ms"));
            printf("  Keras %-15s %8.1f ms/step %8.0f tokens/s  (median of %lld after %lld "
                   "warm-up, loss %.3f)\n",
                   policies[p], ms[p], BATCH * CONTEXT / (ms[p] * 1e-3),
                   (long long)json_integer_value(json_object_get(j, "steps")),
                   (long long)json_integer_value(json_object_get(j, "warmup")),
                   json_number_value(json_object_get(j, "loss")));
            fflush(stdout);
            const char *kv = json_string_value(json_object_get(j, "keras"));
            const char *tv = json_string_value(json_object_get(j, "tensorflow"));
            snprintf(versions, sizeof versions,
                     "Keras %s, TensorFlow %s (tensorflow-cpu), jit_compile %s, %lld parameters",
                     kv ? kv : "?", tv ? tv : "?",
                     json_is_true(json_object_get(j, "jit_compile")) ? "on" : "off",
                     (long long)json_integer_value(json_object_get(j, "params")));
            got++;
        }
        json_decref(j);
    }
    if (py) pclose(py);
    if (got)
        printf("  (%s)\n", versions);
    else
        printf("  Keras: n/a (%s)\n", why);
}

/* ------------------------------------------------------------------- main */

/* The generation table (section 3) for prompts of 16 and 512 tokens. */
static const int64_t prompts[2] = {16, 512};
static void section_generate(int gen_tokens, gen_result gr[2])
{
    char ckpt[128];
    make_long_checkpoint(ckpt, sizeof ckpt);
    mp_model *dec = NULL, *full = NULL;
    int64_t ctx = 0;
    if (mp_model_decoder_from_checkpoint(ckpt, &dec, &ctx)) die("decoder");
    if (mp_model_from_checkpoint(ckpt, 1, &full, NULL)) die("model");
    unlink(ckpt);
    printf("\ngeneration, gpt_mini at context %lld (%s, random weights, greedy), "
           "%d tokens after the prompt:\n  %6s %10s %10s %7s %14s %14s %7s %7s\n",
           (long long)ctx, mp_model_policy(dec).name, gen_tokens, "prompt", "prefill s",
           "stepwise s", "x", "cache tok/s", "no-cache tok/s", "x", "agree");
    for (int i = 0; i < 2; i++) {
        gr[i] = bench_generate(dec, full, prompts[i], gen_tokens);
        printf("  %6lld %10.4f %10.4f %6.1fx %14.1f %14.2f %6.1fx %3d/%-3d\n",
               (long long)prompts[i], gr[i].prefill_s, gr[i].stepwise_s,
               gr[i].stepwise_s / gr[i].prefill_s, gr[i].cached_tok_s, gr[i].plain_tok_s,
               gr[i].cached_tok_s / gr[i].plain_tok_s, gr[i].agree, gen_tokens);
        fflush(stdout);
    }
    printf("  (prefill: the prompt's positions through the cache as prefills of up to %lld "
           "positions, against one position per step (stepwise); no-cache forwards the whole "
           "[1, %lld] window per token; agree: tokens equal both ways before the first "
           "difference)\n",
           (long long)mp_model_max_batch(dec), (long long)ctx);
    mp_model_free(dec);
    mp_model_free(full);
}

static int int_arg(const char *s, int lo, int hi)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < lo || v > hi) {
        fprintf(stderr, "bench_gpt: '%s' is not a number in [%d, %d]\n", s, lo, hi);
        exit(2);
    }
    return (int)v;
}

static int usage(void)
{
    fprintf(stderr, "usage: bench_gpt [--keras-python PATH] [--warmup N] [--steps N] "
                    "[--gen-tokens N] [--reps N] [--only attention,train,generate,keras]\n");
    return 2;
}

enum { S_ATTENTION, S_TRAIN, S_GENERATE, S_KERAS, NSECTIONS };
static const char *const section_names[NSECTIONS] = {"attention", "train", "generate", "keras"};

int main(int argc, char **argv)
{
    const char *python = "build/venv-keras/bin/python";
    int warmup = 2, steps = 10, gen_tokens = 32, reps = 5;
    bool on[NSECTIONS] = {true, true, true, true};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--keras-python") && i + 1 < argc)
            python = argv[++i];
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc)
            warmup = int_arg(argv[++i], 0, 100);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = int_arg(argv[++i], 1, MAX_STEPS);
        else if (!strcmp(argv[i], "--gen-tokens") && i + 1 < argc)
            gen_tokens = int_arg(argv[++i], 1, GEN_CONTEXT - 512);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = int_arg(argv[++i], 1, MAX_REPS);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
            int n = 0;
            for (int k = 0; k < NSECTIONS; k++)
                n += on[k] = strstr(argv[i + 1], section_names[k]) != NULL;
            if (!n) return usage();
            i++;
        } else
            return usage();
    }
    char cpu[512], lbuf[128] = "?\n";
    bench_cpu_model(cpu, sizeof cpu);
    const int threads = mp_num_threads();
    printf("GPT (%s): 4 layers, %d heads of %d, width 256, context %d, vocabulary %d\n", MODEL_FILE,
           HEADS, HEAD_DIM, CONTEXT, VOCAB);
    printf("CPU: %s\n%d threads, path %s\n", cpu, threads, mp_isa_name(mp_isa_active()));
    mp_gemm_dispatch_report(stdout);
    FILE *la = fopen("/proc/loadavg", "r");
    if (la && !fgets(lbuf, sizeof lbuf, la)) snprintf(lbuf, sizeof lbuf, "?\n");
    if (la) fclose(la);
    printf("load average at start: %s", lbuf);

    bench_watch w;
    attn_times at[3] = {{0}};
    size_t mem[2] = {0};
    if (on[S_ATTENTION]) {
        w = bench_watch_start();
        bench_attention(reps, at, mem);
        bench_watch_report(w, "the attention kernels");
    }
    train_result tr[2] = {{0}};
    if (on[S_TRAIN]) {
        printf("\ntraining step, batch %d x %d tokens, AdamW, median of %d after %d warm-up:\n",
               BATCH, CONTEXT, steps, warmup);
        w = bench_watch_start();
        for (int p = 0; p < 2; p++) {
            tr[p] = bench_train(policies[p], warmup, steps);
            printf("  mixprec %-15s %8.1f ms/step %8.0f tokens/s  (%.2fx float32, loss %.3f)\n",
                   policies[p], tr[p].ms, tr[p].tokens_s, tr[0].ms / tr[p].ms, (double)tr[p].loss);
            fflush(stdout);
        }
        bench_watch_report(w, "the steps");
    }
    gen_result gr[2] = {{0}};
    if (on[S_GENERATE]) {
        w = bench_watch_start();
        section_generate(gen_tokens, gr);
        bench_watch_report(w, "generation");
    }
    double kms[2] = {0};
    if (on[S_KERAS]) {
        printf("\nKeras 3 on TensorFlow, same model, intra-op and inter-op %d threads "
               "(bench/gpt_keras.py, %s):\n",
               threads, python);
        fflush(stdout);
        w = bench_watch_start();
        run_keras(python, threads, warmup, steps, kms);
        bench_watch_report(w, "Keras");
    }
    /* The host's speed drifts over a run (a gpt_mini step 185 ms at the
     * start of a process, 210 after a minute of load, Zen 5): mixprec's
     * steps are timed again after Keras's, and its figure is the median of
     * both runs' steps. */
    if (on[S_TRAIN] && kms[0] > 0) {
        for (int p = 0; p < 2; p++) {
            train_result again = bench_train(policies[p], warmup, steps);
            tr[p].ms = append_median(tr[p].t, &tr[p].n, again.t, again.n);
            tr[p].tokens_s = BATCH * CONTEXT / (tr[p].ms * 1e-3);
            printf("  mixprec %-15s %8.1f ms/step after Keras; all %d steps: %.1f ms/step\n",
                   policies[p], again.ms, tr[p].n, tr[p].ms);
        }
    }

    if (on[S_TRAIN])
        printf("\ngpt_mini training, batch %d x %d (tokens/s; ratio = mixprec tokens/s / Keras "
               "tokens/s; targets: >= 1.2x float32, >= 1.5x mixed_bfloat16):\n  %-15s %10s %10s "
               "%8s\n",
               BATCH, CONTEXT, "policy", "mixprec", "Keras", "ratio");
    for (int p = 0; p < 2 && on[S_TRAIN]; p++) {
        double ktok = kms[p] > 0 ? BATCH * CONTEXT / (kms[p] * 1e-3) : 0;
        if (ktok > 0)
            printf("  %-15s %10.0f %10.0f %7.2fx\n", policies[p], tr[p].tokens_s, ktok,
                   kms[p] / tr[p].ms);
        else
            printf("  %-15s %10.0f %10s %8s\n", policies[p], tr[p].tokens_s, "n/a", "n/a");
    }
    printf("\nsummary:");
    for (int p = 0; p < 2; p++) {
        if (on[S_TRAIN]) printf(" %s_tokens_s=%.0f", tag[p], tr[p].tokens_s);
        if (kms[p] > 0)
            printf(" keras_%s_tokens_s=%.0f", tag[p], BATCH * CONTEXT / (kms[p] * 1e-3));
        if (kms[p] > 0 && on[S_TRAIN])
            printf(" %s_vs_keras=%.2f", tag[p], kms[p] / tr[p].ms);
        else if (on[S_TRAIN])
            printf(" %s_vs_keras=n/a", tag[p]);
    }
    for (int c = 0; c < 3 && on[S_ATTENTION]; c++)
        printf(" attn_fwd_%lld_x=%.2f attn_fwdbwd_%lld_x=%.2f attn_portable_%lld_x=%.2f",
               (long long)contexts[c], at[c].fwd_plain / at[c].fwd, (long long)contexts[c],
               at[c].both_plain / at[c].both, (long long)contexts[c],
               at[c].both_portable / at[c].both);
    if (on[S_ATTENTION])
        printf(" attn_2048_kernel_bytes=%zu attn_2048_plain_bytes=%zu", mem[0], mem[1]);
    for (int i = 0; i < 2 && on[S_GENERATE]; i++)
        printf(" gen_%lld_cache_tok_s=%.1f gen_%lld_nocache_tok_s=%.2f gen_%lld_prefill_x=%.1f",
               (long long)prompts[i], gr[i].cached_tok_s, (long long)prompts[i], gr[i].plain_tok_s,
               (long long)prompts[i], gr[i].stepwise_s / gr[i].prefill_s);
    printf("\n");
    return 0;
}
