/* dist_test.c - data parallel against one process, run under mpirun by
 * tests/dist_test.sh (2 ranks). Every rank also trains the single-process
 * reference itself, so the comparison needs no files. Checked, in float32
 * and mixed_float16 (dynamic loss scaling):
 *   - after one SGD step the N-rank weights are within the bound the two
 *     float32 summation orders allow (derived below) of the one-process
 *     weights;
 *   - over several epochs with a sample that overflows float16 on one rank
 *     only, every rank skips the same steps as one process, ends with the
 *     same loss scale and the same bits as every other rank;
 *   - --deterministic (rank-order sums) gives the same bits run after run;
 *   - only rank 0 writes checkpoints, and resuming from one with the same
 *     number of ranks continues bit for bit;
 *   - float8 (mixed_float8, delayed scaling): ranks fed different rows, one
 *     sample on one rank 40 times the others, end with the same amax
 *     histories and scales, the large sample's amax in every rank's; and
 *     with the optimizer sharded (its kernels then quantized in the
 *     forward, not by the update) the same weights and moments as without.
 * Usage: dist_test SCRATCH_DIR (the same directory on every rank). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mixprec.h"

#define N_SAMPLES 192
#define DIM 6
#define CLASSES 3
#define BATCH 32
#define LR 0.05f

static int rank, nranks, failures;
static const char *scratch;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "dist_test rank %d: %s:%d: ", rank, __FILE__, __LINE__);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static void die(const char *what)
{
    fprintf(stderr, "dist_test rank %d: %s: %s\n", rank, what, mp_last_error());
    exit(1);
}

static uint64_t rng = 0x1234567;
static double uniform(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* Three classes in six features; outlier >= 0: that sample's features are
 * `value` (1e6: past float16's largest finite value). */
static mp_dataset *make_data_with(int outlier, float value)
{
    static float x[N_SAMPLES * DIM];
    static int32_t y[N_SAMPLES];
    rng = 0x1234567;
    for (int i = 0; i < N_SAMPLES; i++) {
        y[i] = (int32_t)(uniform() * CLASSES);
        for (int j = 0; j < DIM; j++)
            x[i * DIM + j] = (float)((y[i] - 1) * 0.8 + (j == y[i] ? 0.5 : 0) + 2 * uniform() - 1);
    }
    if (outlier >= 0)
        for (int j = 0; j < DIM; j++) x[outlier * DIM + j] = value;
    mp_dataset *ds;
    if (mp_dataset_from_arrays(x, y, N_SAMPLES, DIM, CLASSES, &ds)) die("data");
    return ds;
}

static mp_dataset *make_data(int outlier) { return make_data_with(outlier, 1e6f); }

/* dropout: a Dropout(0.25) after the first Dense, and loss scaling on
 * whatever the policy (float32 too) */
static mp_model *build_with(const char *policy, bool dropout)
{
    if (mp_set_global_policy(policy)) die("policy");
    mp_model *m = mp_model_new(11);
    mp_node x = mp_input(m, 1, (int64_t[]){DIM}, NULL);
    x = mp_dense(m, x, 16, MP_ACT_RELU, NULL);
    if (dropout) x = mp_dropout(m, x, 0.25f, NULL);
    x = mp_dense(m, x, 16, MP_ACT_RELU, NULL);
    x = mp_dense(m, x, CLASSES, MP_ACT_NONE, NULL);
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
    if (mp_model_build(m, x, BATCH)) die("build");
    mp_compile_options co = mp_compile_options_default();
    co.optimizer = mp_optimizer_config_default(MP_OPTIMIZER_SGD);
    co.optimizer.learning_rate = LR;
    if (dropout) co.loss_scaling = MP_LOSS_SCALING_DYNAMIC;
    if (mp_model_compile(m, &co)) die("compile");
    mp_set_global_policy("float32");
    return m;
}

static mp_model *build(const char *policy) { return build_with(policy, false); }

/* The optimizer-state bytes this process holds at the end of an epoch
 * (inside fit: sharded when shard_optimizer is on). */
static size_t optimizer_bytes_in_fit;
static bool note_optimizer_bytes(const mp_epoch_log *log, void *user)
{
    (void)log;
    (void)user;
    mp_mem_stats st;
    mp_mem_get_stats(&st);
    optimizer_bytes_in_fit = st.current[MP_MEM_OPTIMIZER];
    return true;
}

typedef struct {
    bool dp, det, shuffle, bf16, zero;
    int epochs, slices;
    int64_t max_steps, checkpoint_every;
    const char *checkpoint_dir;
    const mp_fit_state *resume;
} run_opts;

static void fit(mp_model *m, const mp_dataset *ds, run_opts r)
{
    mp_fit_options o = mp_fit_options_default();
    o.batch_size = BATCH;
    o.epochs = r.epochs ? r.epochs : 1;
    o.shuffle = r.shuffle;
    o.seed = 5;
    o.verbose = 0;
    o.max_steps = r.max_steps;
    o.checkpoint_every = r.checkpoint_every;
    o.checkpoint_dir = r.checkpoint_dir;
    o.resume = r.resume;
    o.data_parallel = r.dp;
    o.deterministic = r.det;
    o.deterministic_slices = r.slices;
    o.shard_optimizer = r.zero;
    o.on_epoch_end = r.zero ? note_optimizer_bytes : NULL;
    o.reduce = r.bf16 ? MP_REDUCE_BFLOAT16 : MP_REDUCE_FLOAT32;
    /* small buckets: parameters packed several to a bucket, and the
     * 256-float kernel summed in place alone */
    o.bucket_bytes = 1024;
    if (mp_model_fit(m, ds, &o, NULL)) die("fit");
}

/* Largest |a - b| over the float32 masters, and whether every bit agrees. */
static bool same_bits(mp_model *a, mp_model *b)
{
    for (int i = 0; i < mp_model_num_params(a); i++) {
        const mp_model_param *p = mp_model_get_param(a, i), *q = mp_model_get_param(b, i);
        if (memcmp(p->master, q->master, (size_t)p->n * sizeof(float))) return false;
    }
    return true;
}

static uint64_t weights_hash(mp_model *m)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < mp_model_num_params(m); i++) {
        const mp_model_param *p = mp_model_get_param(m, i);
        const unsigned char *c = (const unsigned char *)p->master;
        for (size_t k = 0; k < (size_t)p->n * sizeof(float); k++) h = (h ^ c[k]) * 1099511628211ull;
    }
    return h;
}

static double max_rel_diff(mp_model *a, mp_model *b)
{
    double worst = 0;
    for (int i = 0; i < mp_model_num_params(a); i++) {
        const mp_model_param *p = mp_model_get_param(a, i), *q = mp_model_get_param(b, i);
        for (int64_t k = 0; k < p->n; k++) {
            double d =
                fabs((double)p->master[k] - q->master[k]) / fmax(1e-3, fabs((double)q->master[k]));
            if (!(d <= worst)) worst = d; /* NaN wins */
        }
    }
    return worst;
}

/* S[j] = sum over the batch of |input| x |output gradient| for every weight
 * (and |output gradient| for every bias) of the three Dense layers, in
 * double from the starting masters (m0, not yet trained) on rows 0..BATCH-1:
 * the magnitude each gradient element sums over. */
static void gradient_magnitudes(mp_model *m0, const float *x, const int32_t *y, double **S)
{
    const int width[4] = {DIM, 16, 16, CLASSES};
    const float *W[3], *bias[3];
    for (int l = 0; l < 3; l++) {
        W[l] = mp_model_get_param(m0, 2 * l)->master;
        bias[l] = mp_model_get_param(m0, 2 * l + 1)->master;
        memset(S[2 * l], 0, sizeof(double) * (size_t)(width[l] * width[l + 1]));
        memset(S[2 * l + 1], 0, sizeof(double) * (size_t)width[l + 1]);
    }
    for (int i = 0; i < BATCH; i++) {
        double a[4][16], z[4][16], d[4][16];
        for (int j = 0; j < DIM; j++) a[0][j] = x[i * DIM + j];
        for (int l = 0; l < 3; l++)
            for (int o = 0; o < width[l + 1]; o++) {
                double s = bias[l][o];
                for (int j = 0; j < width[l]; j++) s += a[l][j] * W[l][j * width[l + 1] + o];
                z[l + 1][o] = s;
                a[l + 1][o] = l < 2 ? fmax(s, 0) : s;
            }
        double mx = -INFINITY, se = 0;
        for (int c = 0; c < CLASSES; c++) mx = fmax(mx, z[3][c]);
        for (int c = 0; c < CLASSES; c++) se += exp(z[3][c] - mx);
        for (int c = 0; c < CLASSES; c++) d[3][c] = (exp(z[3][c] - mx) / se - (c == y[i])) / BATCH;
        for (int l = 2; l >= 1; l--)
            for (int j = 0; j < width[l]; j++) {
                double s = 0;
                for (int o = 0; o < width[l + 1]; o++)
                    s += d[l + 1][o] * W[l][j * width[l + 1] + o];
                d[l][j] = z[l][j] > 0 ? s : 0;
            }
        for (int l = 0; l < 3; l++)
            for (int o = 0; o < width[l + 1]; o++) {
                for (int j = 0; j < width[l]; j++)
                    S[2 * l][j * width[l + 1] + o] += fabs(a[l][j] * d[l + 1][o]);
                S[2 * l + 1][o] += fabs(d[l + 1][o]);
            }
    }
}

static double gamma_n(int n)
{
    return n * (double)FLT_EPSILON / 2 / (1 - n * (double)FLT_EPSILON / 2);
}

/* One SGD step on batch 0 by one process and by N ranks (reduce: bf16
 * sums or not); every weight of the two within 2 lr g S + one rounding of
 * the weight, S the summed magnitudes (gradient_magnitudes) and g the
 * relative bound of the two sums' difference. Returns how many weights
 * differ. */
static int64_t one_step_within(const char *what, const char *policy, bool bf16, double g)
{
    mp_dataset *ds = make_data(-1);
    mp_model *m0 = build(policy), *ref = build(policy), *dp = build(policy);
    fit(ref, ds, (run_opts){.max_steps = 1});
    fit(dp, ds, (run_opts){.dp = true, .bf16 = bf16, .max_steps = 1});
    CHECK(mp_model_steps_applied(ref) == 1 && mp_model_steps_applied(dp) == 1,
          "%s: first step not applied", what);
    double *S[6], worst = 0;
    for (int i = 0; i < 6; i++)
        S[i] = malloc(sizeof(double) * (size_t)mp_model_get_param(m0, i)->n);
    gradient_magnitudes(m0, mp_dataset_features(ds), mp_dataset_labels(ds), S);
    int64_t differ = 0, total = 0;
    for (int i = 0; i < 6; i++) {
        const mp_model_param *p = mp_model_get_param(ref, i), *q = mp_model_get_param(dp, i);
        for (int64_t k = 0; k < p->n; k++) {
            double diff = fabs((double)p->master[k] - q->master[k]);
            double bound = 2 * LR * g * S[i][k] + nextafterf(fabsf(p->master[k]), INFINITY) -
                           fabsf(p->master[k]);
            differ += diff != 0;
            total++;
            if (diff / bound > worst) worst = diff / bound;
            CHECK(diff <= bound, "%s: %s[%lld]: |%.9g - %.9g| = %.3g above the bound %.3g", what,
                  p->name, (long long)k, (double)p->master[k], (double)q->master[k], diff, bound);
        }
    }
    CHECK(mp_dist_check_same(weights_hash(dp), "the weights after one step") == MP_OK, "%s: %s",
          what, mp_last_error());
    if (rank == 0)
        printf("dist_test: %s, one step: %lld of %lld weights differ from one float32 process, "
               "at most %.2f of the derived bound\n",
               what, (long long)differ, (long long)total, worst);
    for (int i = 0; i < 6; i++) free(S[i]);
    mp_model_free(m0);
    mp_model_free(ref);
    mp_model_free(dp);
    mp_dataset_free(ds);
    return differ;
}

/* One SGD step on batch 0. Each gradient element is a float32 sum of the
 * same BATCH per-sample terms (each rank's rows go through the same
 * arithmetic as in one process, and the loss gradient is divided by the
 * global batch on every rank): one process sums them in some order of depth
 * <= BATCH, N ranks in one of depth <= BATCH/N + N (the per-rank sums, then
 * the sum over ranks). Each differs from the exact sum by at most
 * gamma(depth) * S, so they differ from each other by at most
 * (gamma(BATCH) + gamma(BATCH/N + N)) * S; the update w - lr*g adds
 * lr times that and one rounding of w (a factor 2 covers S computed in
 * double and float16 terms under mixed_float16). */
static void test_one_step_bound(const char *policy)
{
    one_step_within(policy, policy, false, gamma_n(BATCH) + gamma_n(BATCH / nranks + nranks));
}

/* Several epochs, shuffled; under mixed_float16 one sample overflows
 * float16: the steps whose batch holds it are skipped by one process and by
 * every rank. */
static void test_epochs(const char *policy)
{
    /* an overflowing sample that falls in rank 0's shard in some epochs and
     * in another rank's in others: its non-finite gradients reach every
     * rank through the sum either way (the order depends on n and the seed
     * only) */
    mp_dataset *ds = make_data(-1);
    int64_t order[3][N_SAMPLES], outlier = -1;
    for (int e = 0; e < 3; e++)
        if (mp_dataset_order(ds, (uint64_t)e, 5, true, order[e])) die("order");
    for (int64_t s = 0; s < N_SAMPLES && outlier < 0 && nranks > 1; s++) {
        bool on_rank0 = false, elsewhere = false;
        for (int e = 0; e < 3; e++)
            for (int64_t i = 0; i < N_SAMPLES; i++)
                if (order[e][i] == s) {
                    on_rank0 |= (i % BATCH) < BATCH / nranks;
                    elsewhere |= (i % BATCH) >= BATCH / nranks;
                }
        if (on_rank0 && elsewhere) outlier = s;
    }
    CHECK(nranks == 1 || outlier >= 0, "no sample visits two ranks' shards");
    mp_dataset_free(ds);
    bool f16 = !strcmp(policy, "mixed_float16"); /* in float32 1e6 is only a large input */
    ds = make_data(f16 ? (int)(outlier >= 0 ? outlier : 50) : -1);
    mp_model *ref = build(policy), *dp = build(policy), *det1 = build(policy),
             *det2 = build(policy);
    run_opts r = {.shuffle = true, .epochs = 3};
    fit(ref, ds, r);
    r.dp = true;
    fit(dp, ds, r);
    r.det = true;
    fit(det1, ds, r);
    fit(det2, ds, r);
    int64_t skipped = mp_model_steps_skipped(ref);
    CHECK(mp_model_steps_skipped(dp) == skipped && mp_model_steps_skipped(det1) == skipped,
          "%s: skipped %lld / %lld (dp) / %lld (deterministic), one process %lld", policy,
          (long long)mp_model_steps_skipped(dp), (long long)mp_model_steps_skipped(det1),
          (long long)mp_model_steps_skipped(det1), (long long)skipped);
    if (f16)
        CHECK(skipped >= 3, "%s: the float16 overflow skipped only %lld steps", policy,
              (long long)skipped);
    mp_loss_scaler *a = mp_model_loss_scaler(ref), *b = mp_model_loss_scaler(dp);
    CHECK(!a == !b && (!a || mp_loss_scaler_scale(a) == mp_loss_scaler_scale(b)),
          "%s: the loss scales differ", policy);
    double rel = max_rel_diff(dp, ref);
    CHECK(rel < 1e-3, "%s: after 3 epochs the weights differ by %.3g (relative)", policy, rel);
    CHECK(same_bits(det1, det2), "%s: --deterministic differs between two runs", policy);
    if (mp_dist_check_same(weights_hash(dp), "the weights (default reduction)") ||
        mp_dist_check_same(weights_hash(det1), "the weights (deterministic)")) {
        fprintf(stderr, "dist_test rank %d: %s: %s\n", rank, policy, mp_last_error());
        failures++;
    }
    if (rank == 0)
        printf("dist_test: %s, 3 epochs: %lld skipped steps on every rank as in one process, "
               "weights within %.2g (relative) of one process, deterministic runs identical, %s\n",
               policy, (long long)skipped, rel,
               same_bits(det1, dp) ? "equal to the default here" : "not equal to the default");
    mp_model_free(ref);
    mp_model_free(dp);
    mp_model_free(det1);
    mp_model_free(det2);
    mp_dataset_free(ds);
}

/* --deterministic: one process (sliced alone) and N ranks end on the same
 * bits, 3 shuffled epochs with Dropout (masks drawn per global row) and
 * dynamic loss scaling, the batch in 4 slices (and 8, which also covers a
 * last batch of 0 rows in some slices: 192 = 6 x 32). */
static void test_same_bits_as_one_process(const char *policy)
{
    mp_dataset *ds = make_data(-1);
    int slices[2] = {4, 8};
    for (int k = 0; k < 2; k++) {
        if (slices[k] % nranks) continue;
        mp_model *one = build_with(policy, true), *dp = build_with(policy, true);
        run_opts r = {.shuffle = true, .epochs = 3, .det = true, .slices = slices[k]};
        fit(one, ds, r);
        r.dp = true;
        fit(dp, ds, r);
        CHECK(same_bits(one, dp), "%s, %d slices: %d ranks end on other weights than one process",
              policy, slices[k], nranks);
        CHECK(mp_model_steps_skipped(one) == mp_model_steps_skipped(dp) &&
                  mp_model_forward_count(one) == mp_model_forward_count(dp),
              "%s: step or forward counts differ", policy);
        if (rank == 0 && k == 0)
            printf("dist_test: %s --deterministic (%d slices, Dropout, loss scaling): %d ranks "
                   "and one process end on the same bits\n",
                   policy, slices[k], nranks);
        mp_model_free(one);
        mp_model_free(dp);
    }
    mp_dataset_free(ds);
}

/* --allreduce bfloat16, one SGD step against one process in float32. Rank
 * r's part g_r of a gradient element is rounded to bfloat16 (relative error
 * <= u = 2^-8), the N parts summed in float32 (gamma(N)), the sum rounded to
 * bfloat16 once (u): within (2u + gamma(N)) (1 + u) sum_r |g_r| <= that
 * times S of the float32 sum, on top of the float32 bound of
 * test_one_step_bound. Without the reduction (a rank's own part) or with
 * bfloat16 sums of bfloat16 partials the error would be ~S/N or larger. */
static void test_bfloat16_sum(void)
{
    double u = 0x1p-8;
    double g =
        gamma_n(BATCH) + gamma_n(BATCH / nranks + nranks) + (2 * u + gamma_n(nranks)) * (1 + u);
    int64_t differ = one_step_within("--allreduce bfloat16", "float32", true, g);
    CHECK(nranks == 1 || differ > 0, "bfloat16 sum: no weight differs from float32 sums");
}

/* The GEMM kernel for every pair of bf16-like input types is rank 0's on
 * every rank (mp_dist_init shares it; each rank timing its own, with the
 * cache off as here, could differ), so the ranks' products agree bit for
 * bit. */
static void test_kernels_agree(void)
{
    const mp_dtype like[3] = {MP_BF16, MP_F8E4M3, MP_F8E5M2};
    uint64_t h = 1469598103934665603ull;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            mp_gemm_dispatch_info in;
            if (mp_gemm_dispatch_query(like[a], like[b], &in)) die("dispatch query");
            for (const char *p = in.kernel[in.chosen]; *p; p++)
                h = (h ^ (uint8_t)*p) * 1099511628211ull;
            CHECK(rank == 0 || nranks == 1 || in.n_kernels < 2 || in.source == MP_DISPATCH_AGREED,
                  "%s x %s: kernel %s not rank 0's (source %d)", mp_dtype_name(like[a]),
                  mp_dtype_name(like[b]), in.kernel[in.chosen], (int)in.source);
        }
    CHECK(mp_dist_check_same(h, "the GEMM kernels") == MP_OK, "%s", mp_last_error());
}

/* ZeRO stage 1, Adam: the same weights and the same (whole, gathered at the
 * end) optimizer state as without sharding, bit for bit, over 3 shuffled
 * epochs with checkpoints in between (which gather the state to write it);
 * inside the fit each rank held about 1/N of the state's bytes. */
static void test_sharded_optimizer(const char *policy)
{
    mp_dataset *ds = make_data(-1);
    mp_model *plain = build_with(policy, true), *zero = build_with(policy, true);
    mp_compile_options co = mp_compile_options_default(); /* Adam: two slots a weight */
    co.loss_scaling = MP_LOSS_SCALING_DYNAMIC;
    if (mp_model_compile(plain, &co) || mp_model_compile(zero, &co)) die("compile");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s-zero-rank%d", scratch, policy, rank);
    mp_mem_stats st;
    mp_mem_get_stats(&st);
    size_t whole = st.current[MP_MEM_OPTIMIZER] / 2; /* one model's, both compiled */
    run_opts r = {.dp = true, .shuffle = true, .epochs = 3};
    fit(plain, ds, r);
    r.zero = true;
    r.checkpoint_every = 7;
    r.checkpoint_dir = dir;
    fit(zero, ds, r);
    size_t held = optimizer_bytes_in_fit;
    mp_mem_get_stats(&st);
    size_t two = st.current[MP_MEM_OPTIMIZER]; /* both optimizers whole again */
    CHECK(same_bits(plain, zero), "%s: sharded optimizer: other weights", policy);
    mp_optimizer *a = mp_model_optimizer(plain), *b = mp_model_optimizer(zero);
    CHECK(mp_optimizer_shards(b) == 1, "%s: the optimizer is still sharded after fit", policy);
    bool state_same = true;
    for (int i = 0; i < mp_optimizer_num_params(a); i++)
        for (int k = 0; k < mp_optimizer_num_slots(a); k++) {
            int64_t n1, n2;
            const float *s1 = mp_optimizer_slot(a, i, k, &n1),
                        *s2 = mp_optimizer_slot(b, i, k, &n2);
            state_same &= n1 == n2 && !memcmp(s1, s2, (size_t)n1 * sizeof(float));
        }
    CHECK(state_same, "%s: sharded optimizer: other moments", policy);
    /* held = plain's whole state + zero's part */
    double part = ((double)held - (double)whole) / (double)whole;
    CHECK(nranks == 1 || (part < 1.0 / nranks + 0.1 && two == 2 * whole),
          "%s: sharded, a rank held %.2f of the optimizer state (%zu of %zu bytes)", policy, part,
          held - whole, whole);
    if (rank == 0)
        printf("dist_test: %s --shard-optimizer: the same weights and moments as unsharded, "
               "%.2f of the state on each rank during fit\n",
               policy, part);
    mp_model_free(plain);
    mp_model_free(zero);
    mp_dataset_free(ds);
}

/* BatchNormalization on 2+ ranks: each rank normalizes by its shard's
 * statistics, and the moving statistics are averaged over the ranks after
 * every step, so every rank ends with the same bits of them (each alone
 * would follow its own shards') and the same evaluation. */
static void test_batch_norm_state(const char *policy)
{
    mp_dataset *ds = make_data(-1);
    if (mp_set_global_policy(policy)) die("policy");
    mp_model *m = mp_model_new(13);
    mp_node x = mp_input(m, 1, (int64_t[]){DIM}, NULL);
    x = mp_dense(m, x, 16, MP_ACT_NONE, NULL);
    mp_batch_norm_options bo = mp_batch_norm_options_default();
    bo.momentum = 0.5f; /* the batches' statistics show within 3 epochs */
    x = mp_batch_norm(m, x, &bo, NULL);
    x = mp_activation_layer(m, x, MP_ACT_RELU, NULL);
    x = mp_dense(m, x, CLASSES, MP_ACT_NONE, NULL);
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
    if (mp_model_build(m, x, BATCH) || mp_model_compile(m, NULL)) die("build");
    mp_set_global_policy("float32");
    fit(m, ds, (run_opts){.dp = true, .shuffle = true, .epochs = 3});
    uint64_t h = 1469598103934665603ull;
    int state = 0;
    for (int i = 0; i < mp_model_num_params(m); i++) {
        const mp_model_param *p = mp_model_get_param(m, i);
        if (p->trainable) continue;
        state++;
        const unsigned char *c = (const unsigned char *)p->master;
        for (size_t k = 0; k < (size_t)p->n * sizeof(float); k++) h = (h ^ c[k]) * 1099511628211ull;
    }
    double loss, acc;
    if (mp_model_evaluate(m, ds, BATCH, &loss, &acc)) die("evaluate");
    uint64_t lb;
    memcpy(&lb, &loss, sizeof lb);
    CHECK(state == 2, "%s: %d state tensors, expected the moving mean and variance", policy, state);
    CHECK(mp_dist_check_same(h, "the moving statistics") == MP_OK, "%s: %s", policy,
          mp_last_error());
    CHECK(mp_dist_check_same(lb, "the evaluation loss") == MP_OK, "%s: %s", policy,
          mp_last_error());
    if (rank == 0)
        printf("dist_test: %s BatchNormalization: moving statistics averaged over %d ranks, the "
               "same bits and evaluation on every rank\n",
               policy, nranks);
    mp_model_free(m);
    mp_dataset_free(ds);
}

/* Rank 0 alone writes (each rank is given its own directory); a resume from
 * step 6 with the same number of ranks ends on the same bits as the run
 * straight to step 12. */
static void test_checkpoint_resume(const char *policy)
{
    mp_dataset *ds = make_data(50);
    char dir[4096], mine[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/%s-ck-rank0", scratch, policy);
    snprintf(mine, sizeof mine, "%s/%s-ck-rank%d", scratch, policy, rank);
    mp_model *straight = build(policy);
    fit(straight, ds,
        (run_opts){.dp = true,
                   .shuffle = true,
                   .epochs = 3,
                   .max_steps = 12,
                   .checkpoint_every = 6,
                   .checkpoint_dir = mine});
    if (mp_dist_barrier()) die("barrier");
    struct stat st;
    if (rank != 0) CHECK(stat(mine, &st) != 0, "rank %d wrote checkpoints to %s", rank, mine);
    snprintf(path, sizeof path, "%s/ckpt-00000006.safetensors", dir);
    mp_model *resumed;
    mp_fit_state fs;
    if (mp_model_from_checkpoint(path, BATCH, &resumed, &fs)) die("from_checkpoint");
    fit(resumed, ds,
        (run_opts){.dp = true, .shuffle = true, .epochs = 3, .max_steps = 12, .resume = &fs});
    CHECK(same_bits(resumed, straight), "%s: resumed at step 6 != straight to 12", policy);
    CHECK(mp_model_steps_skipped(resumed) == mp_model_steps_skipped(straight) &&
              mp_model_steps_applied(resumed) == mp_model_steps_applied(straight),
          "%s: step counts differ after resume", policy);
    if (rank == 0)
        printf("dist_test: %s, checkpoints from rank 0 only; resume at step 6 of 12 on %d ranks is "
               "bit-exact (%lld skipped)\n",
               policy, nranks, (long long)mp_model_steps_skipped(resumed));
    mp_fit_state_free(&fs);
    mp_model_free(resumed);
    mp_model_free(straight);
    mp_dataset_free(ds);
}

/* Every Dense in float8 with 16-step histories; 4 steps without
 * shuffling: sample 50 (features 40, the rest within 3) is in the second
 * batch's rows 48..63, rank 1's shard on 2 ranks. */
static void test_float8_amax(void)
{
    mp_dataset *ds = make_data_with(50, 40.0f);
    mp_float8_params p = mp_float8_params_default();
    p.keep_first_last = false;
    p.amax_history_len = 16;
    if (mp_set_global_float8_params(&p)) die("float8 params");
    mp_model *m = build("mixed_float8");
    p = mp_float8_params_default();
    mp_set_global_float8_params(&p);
    fit(m, ds, (run_opts){.dp = true, .max_steps = 4});
    int n = mp_model_float8_num_tensors(m);
    CHECK(n == 9, "float8: %d quantized tensors, expected 9 (3 Dense)", n);
    uint64_t h = 1469598103934665603ull;
    float input_amax = 0;
    for (int i = 0; i < n; i++) {
        mp_float8_tensor_info t;
        if (mp_model_float8_tensor(m, i, &t)) die("float8 tensor");
        const unsigned char *c = (const unsigned char *)t.history;
        for (size_t k = 0; k < 16 * sizeof(float); k++) h = (h ^ c[k]) * 1099511628211ull;
        c = (const unsigned char *)&t.scale;
        for (size_t k = 0; k < sizeof(float); k++) h = (h ^ c[k]) * 1099511628211ull;
        if (!strcmp(t.name, "dense/input"))
            for (int k = 0; k < 16; k++) input_amax = fmaxf(input_amax, t.history[k]);
    }
    CHECK(mp_dist_check_same(h, "the float8 histories and scales") == MP_OK, "%s", mp_last_error());
    CHECK(input_amax == 40.0f,
          "float8: dense/input's history peaks at %g, not 40 (the sample "
          "on rank 1)",
          (double)input_amax);
    if (rank == 0)
        printf("dist_test: float8 amaxes maxed over %d ranks: the same histories and scales on "
               "every rank\n",
               nranks);
    mp_model_free(m);
    mp_dataset_free(ds);
}

int main(int argc, char **argv)
{
    if (mp_dist_init(&argc, &argv)) die("init");
    rank = mp_dist_rank();
    nranks = mp_dist_size();
    if (argc < 2) {
        fprintf(stderr, "usage: dist_test SCRATCH_DIR (under mpirun)\n");
        mp_dist_finalize();
        return 2;
    }
    scratch = argv[1];
    mp_set_num_threads(1);
    test_kernels_agree();
    const char *policies[3] = {"float32", "mixed_bfloat16", "mixed_float16"};
    for (int i = 0; i < 3; i++) {
        test_one_step_bound(policies[i]);
        test_epochs(policies[i]);
        test_same_bits_as_one_process(policies[i]);
        test_sharded_optimizer(policies[i]);
        test_batch_norm_state(policies[i]);
        test_checkpoint_resume(policies[i]);
    }
    test_bfloat16_sum();
    test_float8_amax();
    /* float8 kernels: quantized by the update unsharded, by the forward
     * after a sharded update (nn/quant.h): the same bits */
    test_sharded_optimizer("mixed_float8");
    int64_t bad = failures;
    mp_dist_allreduce_i64(&bad, 1);
    if (rank == 0) printf("dist_test: %s on %d ranks\n", bad ? "FAILED" : "passed", nranks);
    mp_dist_finalize();
    return bad ? 1 : 0;
}
