/* bench_conv.c - the ResNet-20 of examples/resnet20.json at batch 128 on
 * 28x28x1 inputs: one training step (forward, loss, backward, Adam update)
 * per policy (float32, mixed_bfloat16, mixed_float16), median ms after
 * warm-up; each convolution shape of the model timed alone (forward, filter
 * gradient, data gradient; float32, bfloat16 and float16 inputs) in GFLOP/s
 * next to mp_gemm on the same GEMM dimensions and on a square GEMM of the
 * same work; and, in the same run, Keras 3 on TensorFlow on the same model
 * (bench/conv_keras.py, from the virtual environment `make bench-conv`
 * makes), with the speed-up per policy. n/a where Keras is not there.
 *
 *   usage: bench_conv [--keras-python PATH] [--warmup N] [--steps N] */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/times.h>
#include <unistd.h>

#include "kernels/conv.h"
#include "bench_util.h"

#define BATCH 128
#define KERNEL_REPS 5
#define MAX_STEPS 64

static const char *const policies[3] = {"float32", "mixed_bfloat16", "mixed_float16"};
static const mp_dtype policy_dtype[3] = {MP_F32, MP_BF16, MP_F16};

/* The convolutions of ResNet-20 for 28x28x1 (21 layers, 8 shapes). */
typedef struct {
    const char *name;
    int count;          /* layers of this shape in the model */
    int64_t h, w, c, k; /* input [h, w, c], kernel k x k */
    int64_t o, s;       /* filters, stride */
    bool first;         /* reads the image: no data gradient */
} conv_shape;

static const conv_shape shapes[] = {
    {"stem 28x28x1>16 3x3", 1, 28, 28, 1, 3, 16, 1, true},
    {"s1 28x28x16>16 3x3", 6, 28, 28, 16, 3, 16, 1, false},
    {"s2 28x28x16>32 3x3/2", 1, 28, 28, 16, 3, 32, 2, false},
    {"s2 proj 16>32 1x1/2", 1, 28, 28, 16, 1, 32, 2, false},
    {"s2 14x14x32>32 3x3", 5, 14, 14, 32, 3, 32, 1, false},
    {"s3 14x14x32>64 3x3/2", 1, 14, 14, 32, 3, 64, 2, false},
    {"s3 proj 32>64 1x1/2", 1, 14, 14, 32, 1, 64, 2, false},
    {"s3 7x7x64>64 3x3", 5, 7, 7, 64, 3, 64, 1, false},
};
#define NSHAPES ((int)(sizeof shapes / sizeof shapes[0]))

enum { OP_FWD, OP_FILTER, OP_DATA, NOPS };
static const char *const op_names[NOPS] = {"fwd", "dW", "dX"};

/* ------------------------------------------------------------------ setup */

/* n values in [-1, 1) in dtype t, 64-byte aligned; free() it. */
static void *random_buffer(size_t n, mp_dtype t, uint32_t seed)
{
    float *f = malloc(n * sizeof *f);
    size_t bytes = (n * mp_dtype_size(t) + 63) / 64 * 64;
    void *out = aligned_alloc(64, bytes ? bytes : 64);
    if (!f || !out) {
        fprintf(stderr, "bench_conv: out of memory\n");
        exit(1);
    }
    uint32_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        f[i] = (float)(s >> 8) * (2.0f / 16777216.0f) - 1.0f;
    }
    mp_convert(out, t, f, MP_F32, n);
    free(f);
    return out;
}

/* ------------------------------------------------------------ model steps */

typedef struct {
    double ms;
    int64_t skipped;
    float scale;
    int n;                   /* steps timed, in t */
    double t[2 * MAX_STEPS]; /* ms; a second run's appended after Keras */
} step_result;

static step_result time_steps(const char *model_file, const char *policy, int warmup, int steps)
{
    mp_model *m = NULL;
    if (mp_model_from_config_file(model_file, policy, 1, BATCH, &m) || mp_model_compile(m, NULL)) {
        fprintf(stderr, "bench_conv: %s\n", mp_last_error());
        exit(1);
    }
    mp_tensor x;
    if (mp_tensor_init(&x, MP_F32, 4, (int64_t[]){BATCH, 28, 28, 1}, MP_MEM_OTHER)) {
        fprintf(stderr, "bench_conv: %s\n", mp_last_error());
        exit(1);
    }
    int32_t y[BATCH];
    srand(3);
    for (int64_t i = 0; i < BATCH * 28 * 28; i++)
        ((float *)x.data)[i] = (float)rand() / (float)RAND_MAX;
    for (int i = 0; i < BATCH; i++) y[i] = rand() % 10;
    step_result r = {.n = steps};
    mp_step_result sr = {0};
    for (int i = 0; i < warmup + steps; i++) {
        double t0 = now();
        if (mp_model_train_step(m, &x, y, NULL, &sr)) {
            fprintf(stderr, "bench_conv: %s\n", mp_last_error());
            exit(1);
        }
        if (i >= warmup) r.t[i - warmup] = 1e3 * (now() - t0);
    }
    r.ms = median_copy(r.t, steps);
    r.skipped = mp_model_steps_skipped(m);
    r.scale = sr.loss_scale;
    mp_tensor_release(&x);
    mp_model_free(m);
    return r;
}

/* --------------------------------------------------------- kernels alone */

typedef struct {
    double ms;      /* median */
    double gflops;  /* useful work (the forward's 2*M*N*K) per second */
    double gemm_ms; /* mp_gemm on the same GEMM dimensions */
    double gemm_gflops;
} op_result;

static double median_ms_conv(int op, const mp_conv_geom *g, mp_dtype t, const void *x,
                             const void *w, void *y, const void *dy, float *dw, void *dx)
{
    double ts[KERNEL_REPS];
    for (int r = -1; r < KERNEL_REPS; r++) {
        double t0 = now();
        mp_status s = op == OP_FWD      ? mp_conv2d_forward(g, x, t, w, t, NULL, MP_ACT_NONE, y, t)
                      : op == OP_FILTER ? mp_conv2d_backward_filter(g, x, t, dy, t, dw, false)
                                        : mp_conv2d_backward_data(g, dy, t, w, t, dx, t);
        if (s) {
            fprintf(stderr, "bench_conv: %s\n", mp_last_error());
            exit(1);
        }
        if (r >= 0) ts[r] = 1e3 * (now() - t0);
    }
    return median(ts, KERNEL_REPS);
}

static double median_ms_gemm(bool ta, int64_t m, int64_t n, int64_t k, const void *a, const void *b,
                             mp_dtype t, void *c, mp_dtype ct)
{
    double ts[KERNEL_REPS];
    for (int r = -1; r < KERNEL_REPS; r++) {
        double t0 = now();
        mp_gemm(ta, false, m, n, k, 1.0f, a, t, ta ? m : k, b, t, n, 0.0f, c, ct, n);
        if (r >= 0) ts[r] = 1e3 * (now() - t0);
    }
    return median(ts, KERNEL_REPS);
}

/* The three kernels of one shape in dtype t (outputs in t, the filter
 * gradient in float32, as the layer runs them), and the plain GEMMs of the
 * same dimensions: forward M=N*OH*OW, N=O, K=KH*KW*C; filter M=KH*KW*C,
 * N=O, K=N*OH*OW (A transposed); data M=N*H*W, N=C, K=KH*KW*O. */
static void time_shape(const conv_shape *cs, mp_dtype t, op_result r[NOPS])
{
    mp_conv_geom g = {.n = BATCH,
                      .h = cs->h,
                      .w = cs->w,
                      .c = cs->c,
                      .kh = cs->k,
                      .kw = cs->k,
                      .o = cs->o,
                      .sh = cs->s,
                      .sw = cs->s,
                      .dh = 1,
                      .dw = 1};
    if (mp_conv_geom_init(&g, true)) {
        fprintf(stderr, "bench_conv: %s\n", mp_last_error());
        exit(1);
    }
    const int64_t pix_in = g.n * g.h * g.w, pix_out = g.n * g.oh * g.ow;
    const int64_t kin = g.kh * g.kw * g.c, kout = g.kh * g.kw * g.o;
    const double useful = 2.0 * (double)pix_out * (double)g.o * (double)kin;
    void *x = random_buffer((size_t)(pix_in * g.c), t, 1);
    void *w = random_buffer((size_t)(kin * g.o), t, 2);
    void *dy = random_buffer((size_t)(pix_out * g.o), t, 3);
    void *y = random_buffer((size_t)(pix_out * g.o), t, 4);
    void *dx = random_buffer((size_t)(pix_in * g.c), t, 5);
    float *dw = random_buffer((size_t)(kin * g.o), MP_F32, 6);
    memset(r, 0, NOPS * sizeof *r);
    for (int op = 0; op < NOPS; op++) {
        if (op == OP_DATA && cs->first) continue;
        r[op].ms = median_ms_conv(op, &g, t, x, w, y, dy, dw, dx);
        r[op].gflops = useful / r[op].ms * 1e-6;
        int64_t m = op == OP_FWD ? pix_out : op == OP_FILTER ? kin : pix_in;
        int64_t n = op == OP_DATA ? g.c : g.o;
        int64_t k = op == OP_FWD ? kin : op == OP_FILTER ? pix_out : kout;
        void *a = random_buffer((size_t)(m * k), t, 7), *b = random_buffer((size_t)(k * n), t, 8);
        mp_dtype ct = op == OP_FILTER ? MP_F32 : t;
        void *c = random_buffer((size_t)(m * n), ct, 9);
        r[op].gemm_ms = median_ms_gemm(op == OP_FILTER, m, n, k, a, b, t, c, ct);
        r[op].gemm_gflops = 2.0 * (double)m * (double)n * (double)k / r[op].gemm_ms * 1e-6;
        free(a);
        free(b);
        free(c);
    }
    free(x);
    free(w);
    free(dy);
    free(y);
    free(dx);
    free(dw);
}

/* ------------------------------------------------------------------ Keras */

typedef struct {
    double ms;
    int steps, warmup;
    char optimizer[64];
} keras_result;

/* Runs bench/conv_keras.py under `python` with our thread count; fills
 * kr[p] for each policy it reports (ms 0 otherwise). Returns the number of
 * policies measured, and in why the last line it printed otherwise. */
static int run_keras(const char *python, int warmup, int steps, keras_result kr[3], char *why,
                     size_t why_len, char *versions, size_t ver_len)
{
    memset(kr, 0, 3 * sizeof *kr);
    snprintf(why, why_len, "%s not found (make bench-conv installs tensorflow-cpu and keras)",
             python);
    if (access(python, X_OK)) return 0;
    char cmd[1024];
    int threads = mp_num_threads();
    snprintf(cmd, sizeof cmd,
             "env OMP_NUM_THREADS=%d TF_CPP_MIN_LOG_LEVEL=2 KERAS_BACKEND=tensorflow '%s' "
             "bench/conv_keras.py --threads %d --warmup %d --steps %d 2>&1",
             threads, python, threads, warmup, steps);
    FILE *py = popen(cmd, "r");
    if (!py) return 0;
    int got = 0;
    char line[4096];
    snprintf(why, why_len, "conv_keras.py printed nothing");
    while (fgets(line, sizeof line, py)) {
        if (line[0] != '{') {
            if (line[0] != '\n' && !got) {
                line[strcspn(line, "\n")] = 0;
                snprintf(why, why_len, "%.200s", line);
            }
            continue;
        }
        json_t *j = json_loads(line, 0, NULL);
        const char *pol = j ? json_string_value(json_object_get(j, "policy")) : NULL;
        for (int p = 0; pol && p < 3; p++) {
            if (strcmp(pol, policies[p])) continue;
            kr[p].ms = json_number_value(json_object_get(j, "median_ms"));
            kr[p].steps = (int)json_integer_value(json_object_get(j, "steps"));
            kr[p].warmup = (int)json_integer_value(json_object_get(j, "warmup"));
            const char *o = json_string_value(json_object_get(j, "optimizer"));
            snprintf(kr[p].optimizer, sizeof kr[p].optimizer, "%s", o ? o : "?");
            const char *kv = json_string_value(json_object_get(j, "keras"));
            const char *tv = json_string_value(json_object_get(j, "tensorflow"));
            snprintf(versions, ver_len, "Keras %s, TensorFlow %s (tensorflow-cpu), jit_compile %s",
                     kv ? kv : "?", tv ? tv : "?",
                     json_is_true(json_object_get(j, "jit_compile")) ? "on" : "off");
            printf("  Keras %-15s %8.1f ms/step  (median of %d after %d warm-up, %s)\n",
                   policies[p], kr[p].ms, kr[p].steps, kr[p].warmup, kr[p].optimizer);
            fflush(stdout);
            got++;
        }
        json_decref(j);
    }
    pclose(py);
    return got;
}

/* ------------------------------------------------------------------- main */

static int int_arg(const char *s, int lo, int hi)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < lo || v > hi) {
        fprintf(stderr, "bench_conv: '%s' is not a number in [%d, %d]\n", s, lo, hi);
        exit(2);
    }
    return (int)v;
}

int main(int argc, char **argv)
{
    const char *python = "build/venv-keras/bin/python";
    const char *model_file = "examples/resnet20.json";
    int warmup = 3, steps = 7;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--keras-python") && i + 1 < argc)
            python = argv[++i];
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc)
            warmup = int_arg(argv[++i], 0, 100);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = int_arg(argv[++i], 1, MAX_STEPS);
        else {
            fprintf(stderr, "usage: bench_conv [--keras-python PATH] [--warmup N] [--steps N]\n");
            return 2;
        }
    }
    char cpu[400];
    bench_cpu_model(cpu, sizeof cpu);
    printf("ResNet-20 (%s), batch %d, 28x28x1 inputs, 10 classes, Adam\n", model_file, BATCH);
    printf("CPU: %s\n%d threads, path %s\n", cpu, mp_num_threads(), mp_isa_name(mp_isa_active()));
    mp_gemm_dispatch_report(stdout);

    printf("load average at start: ");
    FILE *la = fopen("/proc/loadavg", "r");
    char lbuf[128] = "?\n";
    if (la && fgets(lbuf, sizeof lbuf, la))
        printf("%s", lbuf);
    else
        printf("?\n");
    if (la) fclose(la);

    /* 1. mixprec's training step per policy */
    printf("\ntraining step, median of %d after %d warm-up:\n", steps, warmup);
    bench_watch w = bench_watch_start();
    step_result sr[3];
    for (int p = 0; p < 3; p++) {
        sr[p] = time_steps(model_file, policies[p], warmup, steps);
        printf("  mixprec %-15s %8.1f ms/step  (%.2fx float32", policies[p], sr[p].ms,
               sr[0].ms / sr[p].ms);
        if (sr[p].scale != 1.0f)
            printf("; loss scale %g, %lld of %d steps skipped", (double)sr[p].scale,
                   (long long)sr[p].skipped, warmup + steps);
        printf(")\n");
        fflush(stdout);
    }
    bench_watch_report(w, "the steps");

    /* 2. the convolutions alone */
    printf("\nconvolution kernels alone (median of %d): ms, GFLOP/s of the convolution's "
           "work\n(2*N*OH*OW*O*KH*KW*C for each of fwd, dW, dX) and GFLOP/s of mp_gemm on the "
           "same GEMM dimensions\n",
           KERNEL_REPS);
    printf("%-22s %-3s %2s", "shape", "op", "n");
    for (int d = 0; d < 3; d++)
        printf(" | %-8s %6s %6s %6s", mp_dtype_name(policy_dtype[d]), "ms", "conv", "gemm");
    printf("\n");
    op_result res[NSHAPES][3][NOPS];
    w = bench_watch_start();
    for (int s = 0; s < NSHAPES; s++)
        for (int d = 0; d < 3; d++) time_shape(&shapes[s], policy_dtype[d], res[s][d]);
    double step_ms[3] = {0}, step_flops = 0, op_ms[3][NOPS] = {{0}}, op_flops[NOPS] = {0};
    for (int s = 0; s < NSHAPES; s++) {
        const conv_shape *cs = &shapes[s];
        int64_t oh = (cs->h + cs->s - 1) / cs->s, ow = (cs->w + cs->s - 1) / cs->s;
        double useful = 2.0 * BATCH * (double)(oh * ow * cs->o * cs->k * cs->k * cs->c);
        for (int op = 0; op < NOPS; op++) {
            if (op == OP_DATA && cs->first) continue;
            printf("%-22s %-3s %2d", cs->name, op_names[op], cs->count);
            for (int d = 0; d < 3; d++) {
                const op_result *r = &res[s][d][op];
                printf(" | %-8s %6.2f %6.1f %6.1f", "", r->ms, r->gflops, r->gemm_gflops);
                step_ms[d] += cs->count * r->ms;
                op_ms[d][op] += cs->count * r->ms;
            }
            step_flops += cs->count * useful;
            op_flops[op] += cs->count * useful;
            printf("\n");
        }
    }
    /* a square GEMM with the work of one 3x3 convolution of the body */
    const int64_t sq = (int64_t)lround(cbrt((double)BATCH * 28 * 28 * 16 * 9 * 16));
    printf("\nper training step, all 21 convolutions (%.2f GFLOP), against a square GEMM "
           "%lld^3\n(the work of one 3x3 convolution of the body):\n",
           step_flops * 1e-9, (long long)sq);
    for (int d = 0; d < 3; d++) {
        mp_dtype t = policy_dtype[d];
        void *a = random_buffer((size_t)(sq * sq), t, 10),
             *b = random_buffer((size_t)(sq * sq), t, 11);
        void *c = random_buffer((size_t)(sq * sq), t, 12);
        double gms = median_ms_gemm(false, sq, sq, sq, a, b, t, c, t);
        free(a);
        free(b);
        free(c);
        printf("  %-8s conv %6.1f ms = %5.1f GFLOP/s (fwd %5.1f, dW %5.1f, dX %5.1f); "
               "square GEMM %5.1f GFLOP/s; conv = %2.0f%% of the %s step\n",
               mp_dtype_name(t), step_ms[d], step_flops / step_ms[d] * 1e-6,
               op_flops[OP_FWD] / op_ms[d][OP_FWD] * 1e-6,
               op_flops[OP_FILTER] / op_ms[d][OP_FILTER] * 1e-6,
               op_flops[OP_DATA] / op_ms[d][OP_DATA] * 1e-6,
               2.0 * (double)sq * (double)sq * (double)sq / gms * 1e-6,
               100.0 * step_ms[d] / sr[d].ms, policies[d]);
    }
    bench_watch_report(w, "the kernels");
    fflush(stdout);

    /* 3. Keras on the same model, in the same run */
    printf("\nKeras 3 on TensorFlow, same model, %d threads (bench/conv_keras.py, %s):\n",
           mp_num_threads(), python);
    fflush(stdout);
    keras_result kr[3];
    char why[256], versions[160] = "";
    w = bench_watch_start();
    int got = run_keras(python, warmup, steps, kr, why, sizeof why, versions, sizeof versions);
    if (!got) {
        printf("  Keras: n/a (%s)\n", why);
    } else {
        printf("  (%s)\n", versions);
        bench_watch_report(w, "Keras");
        /* The host's speed drifts over a run: mixprec's steps are timed
         * again after Keras's, its figure the median of both runs' steps
         * (as bench-peers and bench-gpt do). */
        for (int p = 0; p < 3; p++) {
            step_result again = time_steps(model_file, policies[p], warmup, steps);
            sr[p].ms = append_median(sr[p].t, &sr[p].n, again.t, again.n);
            printf("  mixprec %-15s %8.1f ms/step after Keras; all %d steps: %.1f ms/step\n",
                   policies[p], again.ms, sr[p].n, sr[p].ms);
        }
    }

    printf("\nResNet-20 training step, batch %d (median ms; speed-up = Keras ms / mixprec ms):\n",
           BATCH);
    printf("  %-15s %10s %10s %9s\n", "policy", "mixprec", "Keras", "speed-up");
    for (int p = 0; p < 3; p++) {
        if (kr[p].ms > 0)
            printf("  %-15s %10.1f %10.1f %8.2fx\n", policies[p], sr[p].ms, kr[p].ms,
                   kr[p].ms / sr[p].ms);
        else
            printf("  %-15s %10.1f %10s %9s\n", policies[p], sr[p].ms, "n/a", "n/a");
    }
    printf("\nsummary:");
    const char *tag[3] = {"f32", "bf16", "f16"};
    for (int p = 0; p < 3; p++) {
        printf(" %s_step_ms=%.1f", tag[p], sr[p].ms);
        if (kr[p].ms > 0)
            printf(" keras_%s_ms=%.1f %s_vs_keras=%.2f", tag[p], kr[p].ms, tag[p],
                   kr[p].ms / sr[p].ms);
        else
            printf(" keras_%s_ms=n/a %s_vs_keras=n/a", tag[p], tag[p]);
    }
    for (int d = 0; d < 3; d++)
        printf(" conv_%s_gflops=%.1f", tag[d], step_flops / step_ms[d] * 1e-6);
    printf("\n");
    return 0;
}
