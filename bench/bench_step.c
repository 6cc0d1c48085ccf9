/* bench_step.c - one training step (forward, loss, backward, Adam update) of
 * the seed MLP 784 -> 4096 -> 4096 -> 10 at batch 1024 per policy: median ms
 * after warm-up, peak memory per category at batch 1024 and 8192, and in the
 * same run PyTorch's step (bench/step_torch.py) when python3-torch is there.
 * mixed_float8 (its middle Dense in float8, the first and last in bfloat16)
 * also gets the float8 recipe's own work timed apart: the amax and scaled
 * casts (to fp8 and back to bfloat16) of one step: kernel, input twice,
 * output gradient. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mixprec.h"
#include "bench_util.h"

#define REPS 10
#define WARMUP 3

typedef struct {
    double ms;
    size_t peak[MP_MEM_CATEGORY_COUNT];
    size_t total;
} result;

/* Steps at `batch`; the per-category peaks cover build, compile and steps. */
static result run(const char *policy, int64_t batch, int reps, int warmup)
{
    result r;
    memset(&r, 0, sizeof r);
    mp_mem_reset_peaks();
    mp_mem_stats before;
    mp_mem_get_stats(&before);
    mp_model *m = seed_model(policy, batch);
    mp_tensor x;
    int32_t *y = seed_batch(batch, &x);
    double t[64];
    for (int i = 0; i < warmup + reps; i++) {
        double t0 = now();
        mp_step_result sr;
        if (mp_model_train_step(m, &x, y, NULL, &sr)) {
            fprintf(stderr, "bench_step: %s\n", mp_last_error());
            exit(1);
        }
        if (i >= warmup) t[i - warmup] = 1e3 * (now() - t0);
    }
    r.ms = median(t, (size_t)reps);
    mp_mem_stats st;
    mp_mem_get_stats(&st);
    for (int c = 0; c < MP_MEM_CATEGORY_COUNT; c++) {
        if (c == MP_MEM_OTHER) continue; /* the benchmark's own input batch */
        r.peak[c] = st.peak[c] - before.current[c];
        r.total += r.peak[c];
    }
    mp_tensor_release(&x);
    free(y);
    mp_model_free(m);
    return r;
}

static void print_memory(const char *policy, int64_t batch, const result *r)
{
    printf("  %-15s batch %5lld:", policy, (long long)batch);
    for (int c = 0; c < MP_MEM_CATEGORY_COUNT; c++)
        if (c != MP_MEM_OTHER)
            printf(" %s %.0f", mp_mem_category_name((mp_mem_category)c),
                   (double)r->peak[c] / (1 << 20));
    printf("  total %.0f MiB\n", (double)r->total / (1 << 20));
}

/* The float8 recipe's extra work in one mixed_float8 step of the seed MLP:
 * median ms of the casts its float8 Dense (4096 -> 4096) makes. */
static double fp8_extra_ms(int64_t batch)
{
    size_t nw = 4096 * 4096, nx = (size_t)batch * 4096;
    float *w = malloc(nw * sizeof *w);
    uint16_t *x = malloc(nx * sizeof *x);
    uint16_t *ops = malloc(nw * sizeof *ops);
    srand(5);
    for (size_t i = 0; i < nw; i++) w[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (size_t i = 0; i < nx; i++) x[i] = mp_f32_to_bf16((float)rand() / (float)RAND_MAX);
    double t[REPS];
    for (int i = 0; i < REPS + 1; i++) {
        double t0 = now();
        /* kernel, input (forward and again in backward), dL/dy */
        mp_float8_quantize_bf16(NULL, ops, MP_F8E4M3, w, MP_F32, nw, 3.0f);
        mp_float8_quantize_bf16(NULL, ops, MP_F8E4M3, x, MP_BF16, nx, 5.0f);
        mp_float8_quantize_bf16(NULL, ops, MP_F8E4M3, x, MP_BF16, nx, 5.0f);
        mp_float8_quantize_bf16(NULL, ops, MP_F8E5M2, x, MP_BF16, nx, 7.0f);
        if (i) t[i - 1] = 1e3 * (now() - t0);
    }
    free(w);
    free(x);
    free(ops);
    return median(t, REPS);
}

int main(void)
{
    enum { NP = 4 };
    const char *policies[NP] = {"float32", "mixed_bfloat16", "mixed_float16", "mixed_float8"};
    result r1[NP], r8[NP];
    printf("training step of the seed MLP 784-4096-4096-10 (Adam), %d threads, path %s\n",
           mp_num_threads(), mp_isa_name(mp_isa_active()));
    mp_gemm_dispatch_report(stdout);
    printf("median of %d steps after %d warm-up steps at batch 1024\n\n", REPS, WARMUP);
    for (int p = 0; p < NP; p++) {
        r1[p] = run(policies[p], 1024, REPS, WARMUP);
        printf("  %-15s %8.1f ms/step  (%.2fx float32)\n", policies[p], r1[p].ms,
               r1[0].ms / r1[p].ms);
    }
    double extra = fp8_extra_ms(1024);
    printf("  mixed_float8's recipe work (amax and scaled casts): %.1f ms/step = %.1f%% of a "
           "mixed_bfloat16 step; the whole step %.2fx mixed_bfloat16's\n",
           extra, 100 * extra / r1[1].ms, r1[3].ms / r1[1].ms);
    for (int p = 0; p < NP; p++) r8[p] = run(policies[p], 8192, 1, 0);
    printf("\npeak memory per category (MiB), library allocations only:\n");
    for (int p = 0; p < NP; p++) print_memory(policies[p], 1024, &r1[p]);
    for (int p = 0; p < NP; p++) print_memory(policies[p], 8192, &r8[p]);
    double act_ws[NP];
    for (int p = 0; p < NP; p++)
        act_ws[p] = (double)(r8[p].peak[MP_MEM_ACTIVATIONS] + r8[p].peak[MP_MEM_WORKSPACE]);
    printf("  mixed_bfloat16 / float32 at batch 8192: total %.2f, activations + workspace %.2f\n",
           (double)r8[1].total / (double)r8[0].total, act_ws[1] / act_ws[0]);

    /* the peer, in the same run */
    double tf32 = 0, tbf16 = 0;
    /* with as many threads as ours */
    char cmd[256];
    snprintf(cmd, sizeof cmd,
             "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE GLIBC_TUNABLES=glibc.malloc.hugetlb=1 "
             "/usr/bin/python3 bench/step_torch.py %d 2>/dev/null",
             mp_num_threads());
    FILE *py = popen(cmd, "r");
    if (py) {
        char line[256] = "";
        if (fgets(line, sizeof line, py) &&
            sscanf(line, "torch_f32_ms=%lf torch_bf16_ms=%lf", &tf32, &tbf16) == 2)
            printf("\nPyTorch (python3-torch, %d threads): float32 %.1f ms/step, bf16 autocast "
                   "%.1f ms/step\n",
                   mp_num_threads(), tf32, tbf16);
        else
            printf("\nPyTorch: not available (apt-get install python3-torch to compare)\n");
        pclose(py);
    }
    printf("\nsummary: bf16_step_ms=%.1f f32_step_ms=%.1f bf16_speedup_vs_f32=%.2f ", r1[1].ms,
           r1[0].ms, r1[0].ms / r1[1].ms);
    if (tbf16 > 0)
        printf("bf16_vs_torch_bf16=%.2f f32_vs_torch_f32=%.2f ", tbf16 / r1[1].ms, tf32 / r1[0].ms);
    else
        printf("bf16_vs_torch_bf16=n/a f32_vs_torch_f32=n/a ");
    printf("mem_bf16_vs_f32_b8192=%.2f fp8_step_ms=%.1f fp8_extra_vs_bf16_step=%.3f\n",
           (double)r8[1].total / (double)r8[0].total, r1[3].ms, extra / r1[1].ms);
    return 0;
}
