/* bench_mpi.c - data parallel on this machine, run by `make bench-mpi`
 * under mpirun -np 2: the seed MLP (784 -> 4096 -> 4096 -> 10, Adam) at a
 * global batch of 1024, one training step timed (median after warm-up) as
 *   - 1 rank x 2 threads: rank 0 alone, a plain step (rank 1 waits);
 *   - 2 ranks x 1 thread: the data-parallel step, gradients summed in
 *     buckets while backward runs (float32, ordered, bfloat16 sums, ZeRO-1);
 *   - the same with the gradients handed over only after backward
 *     (no_overlap), and each rank's step with no exchange at all (its
 *     shard alone: what the step costs without communication).
 * The overlap's share of the communication hidden behind backward is
 * (no overlap - overlap) / (no overlap - no exchange). Bytes sent per step
 * are set against the all-reduce's lower bound 2 (N - 1) / N x the
 * gradient bytes (ZeRO-1 adds the all-gather of the updated masters,
 * (N - 1) / N x their bytes: it still sums whole gradients, which the
 * finite check and clip_norm read). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

#define GLOBAL 1024
#define REPS 8
#define WARMUP 2

static int rank, nranks;

static void die(const char *what)
{
    fprintf(stderr, "bench_mpi rank %d: %s: %s\n", rank, what, mp_last_error());
    exit(1);
}

typedef struct {
    const char *name;
    bool plain; /* rank 0 alone, a whole batch, 2 threads */
    bool local; /* each rank its shard, no exchange */
    mp_reduce_mode reduce;
    bool no_overlap, zero;
} config;

typedef struct {
    double ms, bytes, wait_ms, work_ms;
    bool exact;
} result;

static result run(const char *policy, const config *c)
{
    result r = {0, 0, 0, 0, false};
    int64_t lo, hi;
    mp_dist_shard(GLOBAL, rank, nranks, &lo, &hi);
    if (c->plain) {
        lo = 0;
        hi = GLOBAL;
    }
    double t[REPS];
    if (c->plain && rank != 0) { /* waits, near idle (the barrier polls with sleeps) */
        if (mp_dist_barrier()) die("barrier");
        goto slowest;
    }
    mp_set_num_threads(c->plain ? 2 : 1);
    mp_model *m = seed_model(policy, hi - lo);
    mp_tensor x;
    int32_t *y = seed_batch(hi - lo, &x);
    for (int i = 0; i < WARMUP + REPS; i++) {
        double t0 = now();
        mp_step_result sr;
        mp_status s;
        if (c->plain) {
            s = mp_model_train_step(m, &x, y, NULL, &sr);
        } else {
            mp_shard_options o = mp_shard_options_default(GLOBAL, lo);
            o.reduce = c->reduce;
            o.local = c->local;
            o.no_overlap = c->no_overlap;
            o.shard_optimizer = c->zero;
            if (c->local) { /* this rank's rows as a whole batch of its own */
                o.global_batch = hi - lo;
                o.first_row = 0;
            }
            s = mp_model_train_step_shard(m, &x, y, NULL, &o, &sr);
        }
        if (s) die(c->name);
        if (i >= WARMUP) {
            t[i - WARMUP] = 1e3 * (now() - t0);
            mp_dist_reducer_stats st;
            mp_model_last_reduction(m, &st);
            r.bytes += st.bytes_sent / REPS;
            r.wait_ms += 1e3 * st.wait_seconds / REPS;
            r.work_ms += 1e3 * st.work_seconds / REPS;
            r.exact = st.bytes_exact;
        }
    }
    r.ms = median(t, REPS);
    if (c->zero) { /* and the all-gather of the updated float32 masters */
        double n = 0;
        for (int i = 0; i < mp_model_num_params(m); i++) n += (double)mp_model_get_param(m, i)->n;
        r.bytes += (nranks - 1.0) / nranks * 4.0 * n;
    }
    mp_tensor_release(&x);
    free(y);
    mp_model_free(m);
    if (c->plain && mp_dist_barrier()) die("barrier");
slowest:; /* every rank reports the slowest rank's time: the step is as slow as it */
    double all[64] = {0};
    all[rank] = r.ms;
    if (mp_dist_allreduce_f64(all, (size_t)nranks)) die("allreduce");
    for (int i = 0; i < nranks; i++)
        if (all[i] > r.ms) r.ms = all[i];
    return r;
}

int main(int argc, char **argv)
{
    if (mp_dist_init(&argc, &argv)) die("init (run under mpirun -np 2: make bench-mpi)");
    rank = mp_dist_rank();
    nranks = mp_dist_size();
    if (nranks < 2 || nranks > 64) {
        if (rank == 0) fprintf(stderr, "bench_mpi: run it on 2..64 ranks (make bench-mpi)\n");
        mp_dist_finalize();
        return 2;
    }
    char cpu[512];
    bench_cpu_model(cpu, sizeof cpu);
    const char *policies[2] = {"float32", "mixed_bfloat16"};
    const config cfgs[] = {
        {"1 rank x 2 threads", true, false, MP_REDUCE_FLOAT32, false, false},
        {"no exchange (each rank's shard alone)", false, true, MP_REDUCE_FLOAT32, false, false},
        {"float32 sums, after backward", false, false, MP_REDUCE_FLOAT32, true, false},
        {"float32 sums, overlapped", false, false, MP_REDUCE_FLOAT32, false, false},
        {"ordered (--deterministic)", false, false, MP_REDUCE_ORDERED, false, false},
        {"bfloat16 sums (--allreduce)", false, false, MP_REDUCE_BFLOAT16, false, false},
        {"float32, ZeRO-1 (--shard-optimizer)", false, false, MP_REDUCE_FLOAT32, false, true},
    };
    enum { NC = sizeof cfgs / sizeof *cfgs };
    double grad_bytes = 4.0 * (784.0 * 4096 + 4096 + 4096.0 * 4096 + 4096 + 4096.0 * 10 + 10);
    double bound = 2.0 * (nranks - 1) / nranks * grad_bytes;
    if (rank == 0) {
        printf("bench_mpi: seed MLP step, global batch %d, %d ranks, on %s\n", GLOBAL, nranks, cpu);
        printf("  gradients %.1f MiB a step; all-reduce lower bound 2(N-1)/N x that = %.1f MiB "
               "sent per rank\n",
               grad_bytes / (1 << 20), bound / (1 << 20));
    }
    for (int p = 0; p < 2; p++) {
        result res[NC];
        bench_watch w = bench_watch_start();
        for (int i = 0; i < NC; i++) res[i] = run(policies[p], &cfgs[i]);
        if (rank != 0) continue;
        printf("\n%s (median of %d steps, ms; the slowest rank's)\n", policies[p], REPS);
        printf("  %-40s %9s %8s %11s %9s %9s\n", "", "ms/step", "vs 1x2", "MiB sent", "vs bound",
               "wait ms");
        for (int i = 0; i < NC; i++) {
            printf("  %-40s %9.1f %7.2fx", cfgs[i].name, res[i].ms, res[0].ms / res[i].ms);
            if (i >= 2)
                printf(" %10.1f%s %8.2fx %9.1f", res[i].bytes / (1 << 20), res[i].exact ? " " : "*",
                       res[i].bytes / bound, res[i].wait_ms);
            printf("\n");
        }
        double exposed = res[2].ms - res[1].ms, saved = res[2].ms - res[3].ms;
        printf("  communication after backward costs %.1f ms a step; overlapped, %.1f ms of it "
               "(%.0f%%) is hidden behind backward\n",
               exposed, saved, exposed > 0 ? 100.0 * saved / exposed : 0.0);
        printf("  * MPI_Iallreduce picks its algorithm: bytes are its lower bound; the other "
               "rows count what this rank sent\n");
        printf("  note: on one machine the ranks move the bytes themselves (shared memory), "
               "taking CPU time from backward\n");
        bench_watch_report(w, policies[p]);
        printf("  (the other rank counts among the other processes: ~%d%% of a core is ours)\n",
               100 * (nranks - 1));
    }
    mp_dist_finalize();
    return 0;
}
