/* bench_step.c - one training step (forward, loss, backward, Adam update) of
 * the seed MLP 784 -> 4096 -> 4096 -> 10 at batch 1024 per policy: median ms
 * after warm-up (the policies stepping in turns), peak memory per category
 * at batch 1024 and 8192, and in the same run PyTorch's step
 * (bench/step_torch.py) when python3-torch is there.
 * mixed_float8 (its middle Dense in float8, the first and last in bfloat16)
 * also gets the float8 recipe's own work timed apart: the amax and scaled
 * casts (to fp8 and back to bfloat16) of one step: kernel, input twice,
 * output gradient.
 *
 * `bench_step --peers [--keras-python PATH]` (make bench-peers) measures
 * instead float32 and mixed_bfloat16 side by side with Keras 3 on TensorFlow
 * (bench/step_keras.py from the virtual environment under build/, XLA off
 * and on) and PyTorch (bench/step_torch.py under Debian's /usr/bin/python3),
 * all with our thread count (bench/step_peers.h), and prints the ratios of
 * that one run, of wall time and of CPU time per step; a peer that is not
 * installed is reported as missing, with how to install it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mixprec.h"
#include "core/profile.h"
#include "bench_util.h"
#include "openblas_core.h"
#include "step_peers.h"

#define REPS 10
#define WARMUP 3

typedef struct {
    double ms;
    double t[64], cpu[64]; /* each timed step's wall and process CPU ms, in order */
    size_t peak[MP_MEM_CATEGORY_COUNT];
    size_t total;
} result;

/* CPU seconds of this process, all threads. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One training step; a failure ends the benchmark. */
static void step(mp_model *m, const mp_tensor *x, const int32_t *y)
{
    if (mp_model_train_step(m, x, y, NULL, NULL)) {
        fprintf(stderr, "bench_step: %s\n", mp_last_error());
        exit(1);
    }
}

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
    for (int i = 0; i < warmup + reps && i < 64 + warmup; i++) {
        double t0 = now(), c0 = cpu_now();
        step(m, &x, y);
        if (i >= warmup) {
            t[i - warmup] = 1e3 * (now() - t0);
            r.cpu[i - warmup] = 1e3 * (cpu_now() - c0);
        }
    }
    memcpy(r.t, t, (size_t)reps * sizeof *t);
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

/* Median ms per step of each policy at `batch`, the policies' steps taken
 * in turns (one of each per round, after `warmup` rounds), so that load from
 * elsewhere on a shared machine hits them alike and their ratios stay fair. */
static void run_in_turns(const char *const *policies, int np, int64_t batch, int reps, int warmup,
                         double *ms)
{
    enum { MAXP = 8, MAXR = 64 };
    mp_model *m[MAXP];
    mp_tensor x;
    int32_t *y = seed_batch(batch, &x);
    double t[MAXP][MAXR];
    for (int p = 0; p < np; p++) m[p] = seed_model(policies[p], batch);
    for (int i = 0; i < warmup + reps && i < warmup + MAXR; i++) {
        for (int p = 0; p < np; p++) {
            double t0 = now();
            step(m[p], &x, y);
            if (i >= warmup) t[p][i - warmup] = 1e3 * (now() - t0);
        }
    }
    for (int p = 0; p < np; p++) {
        ms[p] = median(t[p], (size_t)(reps < MAXR ? reps : MAXR));
        mp_model_free(m[p]);
    }
    mp_tensor_release(&x);
    free(y);
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

/* ---------------------------------------------------------- where it goes */

enum { PH_FWD_GEMM, PH_BWD_GEMM, PH_ACT_LOSS, PH_CASTS, PH_OPTIM, PH_CHECKS, PH_OTHER, NPH };
static const char *phase_names[NPH] = {"forward GEMMs",
                                       "backward GEMMs",
                                       "activations/loss",
                                       "casts (convert)",
                                       "optimizer update",
                                       "loss-scale checks",
                                       "other"};

/* Mean ms per step of each phase over `reps` steps after `warmup`, with the
 * library's per-phase clock (core/profile.h) on; ph[NPH] is the whole step. */
static void phases(const char *policy, int reps, int warmup, double ph[NPH + 1])
{
    mp_model *m = seed_model(policy, 1024);
    mp_tensor x;
    int32_t *y = seed_batch(1024, &x);
    double total = 0;
    for (int i = 0; i < warmup + reps; i++) {
        if (i == warmup) mp_prof_enable(true);
        double t0 = now();
        step(m, &x, y);
        if (i >= warmup) total += now() - t0;
    }
    mp_prof_times pt;
    mp_prof_get(&pt);
    mp_prof_enable(false);
    const double *lf = pt.leaf[MP_PROF_FORWARD], *lb = pt.leaf[MP_PROF_BACKWARD];
    double casts = 0, leaves_in[MP_PROF_REGIONS] = {0};
    for (int r = 0; r < MP_PROF_REGIONS; r++)
        for (int l = 0; l < MP_PROF_LEAVES; l++) leaves_in[r] += pt.leaf[r][l];
    for (int r = 0; r < MP_PROF_REGIONS; r++) casts += pt.leaf[r][MP_PROF_CONVERT];
    ph[PH_FWD_GEMM] = lf[MP_PROF_GEMM];
    ph[PH_BWD_GEMM] = lb[MP_PROF_GEMM];
    ph[PH_ACT_LOSS] = pt.region[MP_PROF_FORWARD] - leaves_in[MP_PROF_FORWARD] +
                      pt.region[MP_PROF_BACKWARD] - leaves_in[MP_PROF_BACKWARD];
    ph[PH_CASTS] = casts;
    ph[PH_OPTIM] = pt.region[MP_PROF_OPTIMIZER] - leaves_in[MP_PROF_OPTIMIZER];
    ph[PH_CHECKS] = pt.region[MP_PROF_GRAD_CHECK] - leaves_in[MP_PROF_GRAD_CHECK];
    double known = 0;
    for (int p = 0; p < PH_OTHER; p++) known += ph[p];
    ph[PH_OTHER] = total - known;
    ph[NPH] = total;
    for (int p = 0; p <= NPH; p++) ph[p] *= 1e3 / reps;
    mp_tensor_release(&x);
    free(y);
    mp_model_free(m);
}

static void print_phases(const char *const *policies, int np)
{
    enum { PREPS = 5, PWARM = 2 };
    double ph[8][NPH + 1];
    printf("\nwhere the step goes (mean ms per step of %d steps after %d warm-up, the library's "
           "per-phase clock on; %% of the step):\n",
           PREPS, PWARM);
    bench_watch w = bench_watch_start();
    for (int p = 0; p < np; p++) phases(policies[p], PREPS, PWARM, ph[p]);
    printf("  %-18s", "phase");
    for (int p = 0; p < np; p++) printf(" %20s", policies[p]);
    printf("\n");
    for (int i = 0; i <= NPH; i++) {
        printf("  %-18s", i < NPH ? phase_names[i] : "whole step");
        for (int p = 0; p < np; p++)
            printf(" %10.1f (%5.1f%%)", ph[p][i], 100 * ph[p][i] / ph[p][NPH]);
        printf("\n");
    }
    printf("  %-18s", "not GEMM");
    for (int p = 0; p < np; p++) {
        double g = ph[p][NPH] - ph[p][PH_FWD_GEMM] - ph[p][PH_BWD_GEMM];
        printf(" %10.1f (%5.1f%%)", g, 100 * g / ph[p][NPH]);
    }
    printf("   (issue 17's target: at most 10%%)\n");
    printf("  (GEMM time includes the fused bias and activation epilogues; casts are the "
           "mp_convert calls\n   made outside parallel regions: the optimizer's fused weight "
           "casts count as its own time)\n");
    bench_watch_report(w, "the per-phase steps");
    printf("summary-phases:");
    for (int p = 0; p < np; p++)
        printf(" %s_not_gemm_pct=%.1f", policies[p],
               100 * (ph[p][NPH] - ph[p][PH_FWD_GEMM] - ph[p][PH_BWD_GEMM]) / ph[p][NPH]);
    printf("\n");
}

static int peers_main(const char *keras_python, const coretype_try *tries, int ntries,
                      int best_core)
{
    const char *policies[2] = {"float32", "mixed_bfloat16"};
    const int threads = mp_num_threads();
    char cpu[384];
    bench_cpu_model(cpu, sizeof cpu);
    double load[3] = {0};
    if (getloadavg(load, 3) < 0) load[0] = -1;
    printf("seed MLP 784-4096-4096-10 training step (relu, float32 softmax, sparse categorical "
           "cross-entropy, Adam 1e-3), batch 1024, %d threads each\n",
           threads);
    printf("cpu: %s\nmixprec path %s; load average before: %.2f\n", cpu,
           mp_isa_name(mp_isa_active()), load[0]);
    mp_gemm_dispatch_report(stdout);
    print_openblas_coretypes(tries, ntries, best_core);
    printf("median ms/step after warm-up (mixprec: %d steps after %d warm-up before the peers "
           "and as many after them, the median of all %d; peers: 10 after 3)\n\n",
           REPS, WARMUP, 2 * REPS);
    double mp[2], all[2][2 * REPS], mp_cpu[2], all_cpu[2][2 * REPS];
    bench_watch w = bench_watch_start();
    for (int p = 0; p < 2; p++) {
        result r = run(policies[p], 1024, REPS, WARMUP);
        memcpy(all[p], r.t, REPS * sizeof r.t[0]);
        memcpy(all_cpu[p], r.cpu, REPS * sizeof r.cpu[0]);
        printf("  mixprec %-15s %8.1f ms/step (before the peers)\n", policies[p], r.ms);
        fflush(stdout);
    }
    bench_watch_report(w, "mixprec");
    w = bench_watch_start();
    peer_result pr[2] = {run_keras(keras_python, threads), run_torch(threads)};
    if (pr[0].ms[0] > 0 || pr[0].ms[1] > 0 || pr[1].ms[0] > 0 || pr[1].ms[1] > 0)
        bench_watch_report(w, "the peers");
    w = bench_watch_start();
    for (int p = 0; p < 2; p++) {
        result r = run(policies[p], 1024, REPS, WARMUP);
        memcpy(all[p] + REPS, r.t, REPS * sizeof r.t[0]);
        memcpy(all_cpu[p] + REPS, r.cpu, REPS * sizeof r.cpu[0]);
        mp[p] = median(all[p], 2 * REPS);
        mp_cpu[p] = median(all_cpu[p], 2 * REPS);
        printf("  mixprec %-15s %8.1f ms/step (after the peers); all %d: %.1f\n", policies[p], r.ms,
               2 * REPS, mp[p]);
        fflush(stdout);
    }
    bench_watch_report(w, "mixprec again");
    const char *names[2] = {"Keras/TF", "PyTorch"};
    for (int i = 0; i < 2; i++) {
        printf("  %-8s %s\n", names[i],
               pr[i].ms[0] > 0 || pr[i].ms[1] > 0 ? pr[i].version : pr[i].why);
        for (int p = 0; p < 2; p++)
            if (pr[i].note[p][0]) printf("           %s: %s\n", policies[p], pr[i].note[p]);
    }
    char summary[512];
    snprintf(summary, sizeof summary, "summary: mp_f32_ms=%.1f mp_bf16_ms=%.1f", mp[0], mp[1]);
    const double wall[2][2] = {{pr[0].ms[0], pr[0].ms[1]}, {pr[1].ms[0], pr[1].ms[1]}};
    const double cpu_ms[2][2] = {{pr[0].cpu[0], pr[0].cpu[1]}, {pr[1].cpu[0], pr[1].cpu[1]}};
    print_peer_table("median wall ms per step", "wall", mp, wall, summary, sizeof summary);
    print_peer_table("median CPU ms per step (the process's, all threads: less moved by other "
                     "processes' load, though a thread that spins while it waits counts too)",
                     "cpu", mp_cpu, cpu_ms, summary, sizeof summary);
    if (getloadavg(load, 3) < 0) load[0] = -1;
    printf("(load average after: %.2f)\n%s\n", load[0], summary);
    return 0;
}

int main(int argc, char **argv)
{
    const char *keras_python = "build/venv-keras/bin/python";
    bool peers = false;
    if (argc == 2 && !strcmp(argv[1], "--openblas-probe")) return openblas_probe(mp_num_threads());
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--peers"))
            peers = true;
        else if (!strcmp(argv[i], "--keras-python") && i + 1 < argc)
            keras_python = argv[++i];
        else {
            fprintf(stderr, "usage: bench_step [--peers [--keras-python PATH]]\n");
            return 2;
        }
    }
    /* PyTorch runs its float32 products on OpenBLAS: at its best core type */
    coretype_try tries[4];
    int best_core = -1, ntries = choose_openblas_coretype(tries, 4, &best_core);
    if (peers) return peers_main(keras_python, tries, ntries, best_core);

    enum { NP = 4 };
    const char *policies[NP] = {"float32", "mixed_bfloat16", "mixed_float16", "mixed_float8"};
    result r1[NP], r8[NP];
    printf("training step of the seed MLP 784-4096-4096-10 (Adam), %d threads, path %s\n",
           mp_num_threads(), mp_isa_name(mp_isa_active()));
    mp_gemm_dispatch_report(stdout);
    print_openblas_coretypes(tries, ntries, best_core);
    printf("median of %d steps after %d warm-up steps at batch 1024, the policies' steps in "
           "turns\n\n",
           REPS, WARMUP);
    /* memory first, in this order from a fresh process as always (the
     * packing buffers a thread keeps count where they first grow) */
    for (int p = 0; p < NP; p++) r1[p] = run(policies[p], 1024, 1, 0);
    double ms[NP];
    run_in_turns(policies, NP, 1024, REPS, WARMUP, ms);
    for (int p = 0; p < NP; p++) {
        r1[p].ms = ms[p];
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

    /* the peer, in the same run, with as many threads as ours */
    peer_result torch = run_torch(mp_num_threads());
    const double tf32 = torch.ms[0], tbf16 = torch.ms[1];
    if (tf32 > 0 && tbf16 > 0)
        printf("\n%s, %d threads: float32 %.1f ms/step, bf16 autocast %.1f ms/step\n",
               torch.version, mp_num_threads(), tf32, tbf16);
    else
        printf("\nPyTorch: %s\n", torch.why);
    print_phases(policies, NP);
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
