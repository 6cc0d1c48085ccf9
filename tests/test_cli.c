/* test_cli.c - the mixprec command line end to end on small generated CSV
 * data: train (with --save and --log), evaluate, predict, --init-from,
 * checkpoints with exact resume through the CLI, inspect, and
 * bad flags, values and files giving one clear line and a non-zero exit.
 * The CLI under test is $MP_CLI (set by tests/run.sh to the build's binary,
 * so the sanitizer run checks it too). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "train/train_internal.h"

static char dir[64];
static const char *cli;

static int setup(void **state)
{
    (void)state;
    cli = getenv("MP_CLI");
    if (!cli) cli = "build/mixprec";
    if (test_scratch_dir(dir, sizeof dir, "mp_cli")) return -1;
    /* One kernel choice for every process of these tests: runs compared bit
     * for bit across processes must not time the bf16 kernels apart (a
     * loaded machine could decide differently twice). */
    char cache[96];
    snprintf(cache, sizeof cache, "%s/dispatch", dir);
    setenv("MP_DISPATCH_CACHE", cache, 1);
    /* two separable classes in 4 features, train and test files */
    const char *names[2] = {"train.csv", "test.csv"};
    test_rng r = {1};
    for (int f = 0; f < 2; f++) {
        char p[128];
        snprintf(p, sizeof p, "%s/%s", dir, names[f]);
        FILE *fp = fopen(p, "w");
        fprintf(fp, "a,b,c,d,label\n");
        for (int i = 0; i < (f ? 60 : 200); i++) {
            int c = (int)(test_rng_u32(&r) % 2);
            for (int j = 0; j < 4; j++)
                fprintf(fp, "%.4f,", (c ? 1.0 : -1.0) + test_rng_uniform(&r, -0.5, 0.5));
            fprintf(fp, "%d\n", c);
        }
        fclose(fp);
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return test_remove_tree(dir);
}

/* Run the CLI with args (a format using %1$s for the directory); output to
 * dir/out.txt. Returns the exit status. */
static int run(const char *args)
{
    char a[1024], cmd[1400];
    snprintf(a, sizeof a, args, dir, dir, dir, dir, dir);
    snprintf(cmd, sizeof cmd, "%s %s > %s/out.txt 2>&1", cli, a, dir);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *output(void)
{
    static char buf[16384];
    char p[128];
    snprintf(p, sizeof p, "%s/out.txt", dir);
    FILE *f = fopen(p, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    buf[n] = 0;
    if (f) fclose(f);
    return buf;
}

static void test_train_save_evaluate_predict(void **state)
{
    (void)state;
    assert_int_equal(
        run("train --data %s/train.csv --test-data %s/test.csv --hidden 16 --epochs 5 --batch-size "
            "32 "
            "--policy mixed_bfloat16 --lr 0.01 --save %s/m.safetensors --log %s/h.csv --quiet"),
        0);
    const char *o = output();
    assert_non_null(strstr(o, "test: loss"));
    assert_non_null(strstr(o, "policy mixed_bfloat16"));
    assert_int_equal(run("evaluate %s/m.safetensors --data %s/test.csv"), 0);
    o = output();
    assert_non_null(strstr(o, "60 samples: loss"));
    double acc = atof(strstr(o, "accuracy ") + 9);
    assert_true(acc >= 0.95); /* the classes are 2 apart with noise of half-width 0.5 */
    assert_int_equal(run("predict %s/m.safetensors --data %s/test.csv --output %s/p.csv"), 0);
    char p[128];
    snprintf(p, sizeof p, "%s/p.csv", dir);
    FILE *f = fopen(p, "r");
    char line[256];
    int lines = 0;
    while (fgets(line, sizeof line, f)) lines++;
    fclose(f);
    assert_int_equal(lines, 61);
    snprintf(p, sizeof p, "%s/h.csv", dir);
    f = fopen(p, "r");
    lines = 0;
    while (fgets(line, sizeof line, f)) lines++;
    fclose(f);
    assert_int_equal(lines, 6); /* header + 5 epochs */
    /* continue from the saved weights, in another policy */
    assert_int_equal(run("train --data %s/train.csv --hidden 16 --epochs 1 --init-from "
                         "%s/m.safetensors --policy float32 --quiet"),
                     0);
    /* a file from another architecture: refused with the reason */
    assert_int_equal(
        run("train --data %s/train.csv --hidden 8 --epochs 1 --init-from %s/m.safetensors --quiet"),
        1);
    assert_non_null(strstr(output(), "dense.kernel"));
}

/* The tensors of two safetensors files are identical, byte for byte, and so
 * is their training state (the fit state differs only in timings). */
static void assert_same_tensors(const char *a, const char *b)
{
    char pa[160], pb[160];
    snprintf(pa, sizeof pa, "%s/%s", dir, a);
    snprintf(pb, sizeof pb, "%s/%s", dir, b);
    mp_safetensors *fa, *fb;
    assert_int_equal(mp_safetensors_read(pa, &fa), MP_OK);
    assert_int_equal(mp_safetensors_read(pb, &fb), MP_OK);
    assert_int_equal(mp_safetensors_count(fa), mp_safetensors_count(fb));
    for (int i = 0; i < mp_safetensors_count(fa); i++) {
        const mp_named_tensor *x = mp_safetensors_tensor(fa, i);
        const mp_named_tensor *y = mp_safetensors_find(fb, x->name);
        assert_non_null(y);
        size_t bytes = mp_dtype_size(x->dtype);
        for (int d = 0; d < x->ndim; d++) bytes *= (size_t)x->shape[d];
        assert_int_equal(x->dtype, y->dtype);
        if (memcmp(x->data, y->data, bytes))
            fail_msg("%s differs between %s and %s", x->name, a, b);
    }
    assert_string_equal(mp_safetensors_metadata(fa, "mixprec.training"),
                        mp_safetensors_metadata(fb, "mixprec.training"));
    mp_safetensors_free(fa);
    mp_safetensors_free(fb);
}

static int count_checkpoints(const char *sub)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ls %s/%s | grep -c '^ckpt-.*\\.safetensors$' > %s/n.txt", dir, sub,
             dir);
    if (system(cmd) < 0) return -1;
    char p[160];
    snprintf(p, sizeof p, "%s/n.txt", dir);
    FILE *f = fopen(p, "r");
    int n = -1;
    if (f && fscanf(f, "%d", &n) != 1) n = -1;
    if (f) fclose(f);
    return n;
}

/* 180 training samples (200, 10% held out), batch 16: 12 batches an
 * epoch; 3 epochs = 36 steps. An
 * interrupted run (--max-steps 20, inside epoch 2) resumed from its
 * checkpoint directory ends bit-identical to a straight run, in a policy
 * with dynamic loss scaling. */
/* The demo takes every train flag after its defaults (`make resnet` passes
 * --lr-decay cosine, which it once dropped), and refuses the two that make
 * no sense for its three fresh runs. */
static void test_demo_flags(void **state)
{
    (void)state;
    assert_int_equal(run("demo --data %1$s/train.csv --test-data %1$s/test.csv --hidden 4 "
                         "--epochs 1 --batch-size 20 --lr-decay cosine --run-dir %1$s/demo"),
                     0);
    const char *o = output();
    assert_non_null(strstr(o, "adam lr 0.001 with cosine decay, batch 20, 1 epoch on "));
    assert_non_null(strstr(o, "mixed_float16"));
    /* make resnet's recipe: the banner names what trained */
    assert_int_equal(run("demo --data %1$s/train.csv --test-data %1$s/test.csv --hidden 4 "
                         "--epochs 1 --batch-size 20 --optimizer adamw --lr 2e-3 --weight-decay "
                         "0.05 --warmup-steps 3 --lr-decay cosine --run-dir %1$s/demo"),
                     0);
    assert_non_null(strstr(output(), "adamw lr 0.002 weight decay 0.05, 3 warm-up steps with "
                                     "cosine decay, batch 20"));
    assert_int_equal(run("demo --policy float32"), 2);
    assert_non_null(strstr(output(), "--policy"));
}

static void test_checkpoint_resume(void **state)
{
    (void)state;
    const char *common = "--data %1$s/train.csv --hidden 12 --epochs 3 --batch-size 16 "
                         "--validation-split 0.1 --policy mixed_float16 --quiet";
    char args[512];
    snprintf(args, sizeof args, "train %s --save %%1$s/straight.st --save-state", common);
    if (run(args)) fail_msg("%s", output());
    snprintf(args, sizeof args,
             "train %s --max-steps 20 --checkpoint-dir %%1$s/ck --checkpoint-every 6 --keep-last 2",
             common);
    assert_int_equal(run(args), 0);
    assert_int_equal(count_checkpoints("ck"), 2); /* steps 18 and 20 */
    assert_int_equal(run("train --data %1$s/train.csv --resume %1$s/ck --quiet --save "
                         "%1$s/resumed.st --save-state"),
                     0);
    assert_same_tensors("straight.st", "resumed.st");
    /* the resumed run kept the cadence (every 6, keep 2): steps 30, 36 */
    assert_int_equal(count_checkpoints("ck"), 2);
    char p0[160];
    snprintf(p0, sizeof p0, "%s/ck/ckpt-00000030.safetensors", dir);
    assert_int_equal(access(p0, F_OK), 0);
    /* the newest checkpoint is the final one, at step 36 */
    assert_int_equal(run("inspect %1$s/ck/ckpt-00000036.safetensors"), 0);
    const char *o = output();
    assert_non_null(strstr(o, "optimizer/dense.kernel/exp_avg_sq"));
    assert_non_null(strstr(o, "loss scaling   dynamic"));
    assert_non_null(strstr(o, "36 steps in all"));
    assert_non_null(strstr(o, "epoch 3 of 3"));
    assert_non_null(strstr(o, "Total params"));

    /* a torn newest file (as if the disk lost it) is passed over for the
     * previous valid one */
    char p[160];
    snprintf(p, sizeof p, "%s/ck/ckpt-00000099.safetensors", dir);
    FILE *f = fopen(p, "w");
    fprintf(f, "garbage");
    fclose(f);
    assert_int_equal(run("train --data %1$s/train.csv --resume %1$s/ck --max-steps 36 --quiet"), 0);
    /* resuming on other data or changing the model is refused */
    assert_int_equal(run("train --data %1$s/test.csv --resume %1$s/ck --quiet"), 1);
    assert_non_null(strstr(output(), "other training data"));
    assert_int_equal(run("train --resume %1$s/ck --batch-size 8"), 2);
    assert_non_null(strstr(output(), "batch-size"));
    assert_int_equal(run("train --resume %1$s/nothing-here --quiet"), 1);
    assert_non_null(strstr(output(), "nothing-here"));
    /* a weights-only file has no state to resume */
    assert_int_equal(run("train --data %1$s/train.csv --hidden 4 --epochs 1 --save %1$s/w.st "
                         "--quiet"),
                     0);
    assert_int_equal(run("train --data %1$s/train.csv --resume %1$s/w.st --quiet"), 1);
    assert_non_null(strstr(output(), "no fit state"));
    assert_int_equal(run("inspect %1$s/w.st"), 0);
    assert_non_null(strstr(output(), "training state: none"));
    /* --weight-decay reaches the optimizer and its checkpoint */
    assert_int_equal(run("train --data %1$s/train.csv --hidden 4 --epochs 1 --optimizer adamw "
                         "--weight-decay 0.25 --save %1$s/wd.st --save-state --quiet"),
                     0);
    assert_int_equal(run("inspect %1$s/wd.st"), 0);
    assert_non_null(strstr(output(), "weight decay 0.25"));
    assert_int_equal(run("train --checkpoint-every 5"), 2);
    assert_non_null(strstr(output(), "--checkpoint-dir"));
    assert_int_equal(run("inspect %1$s/ck/ckpt-00000099.safetensors"), 1);
    assert_non_null(strstr(output(), "ckpt-00000099"));
    assert_int_equal(run("inspect"), 2);
}

/* SIGINT in the middle of training: the step in progress finishes, a
 * checkpoint is written, the exit status is 130; resuming from it and
 * running to step K gives the bits of a straight run to step K. */
static void test_interrupt_and_resume(void **state)
{
    (void)state;
    const char *common = "--data %1$s/train.csv --hidden 12 --epochs 2000 --batch-size 16 "
                         "--policy mixed_bfloat16 --quiet";
    char args[512], script[2048];
    snprintf(args, sizeof args, "train %s --checkpoint-dir %%1$s/ick --checkpoint-every 200",
             common);
    char a2[600];
    snprintf(a2, sizeof a2, args, dir);
    /* interrupt a little after the first checkpoint shows training is under
     * way (not at its very step, which would leave one checkpoint) */
    snprintf(
        script, sizeof script,
        "%s %s > %s/int.txt 2>&1 & pid=$!; n=0; while [ ! -e %s/ick/ckpt-00000200.safetensors ] "
        "&& [ $n -lt 1200 ]; do sleep 0.05; n=$((n+1)); done; sleep 0.3; kill -INT $pid; wait "
        "$pid; echo $? > %s/rc.txt",
        cli, a2, dir, dir, dir);
    assert_int_equal(system(script), 0);
    char p[160];
    snprintf(p, sizeof p, "%s/rc.txt", dir);
    FILE *f = fopen(p, "r");
    int rc = -1;
    assert_int_equal(fscanf(f, "%d", &rc), 1);
    fclose(f);
    assert_int_equal(rc, 130);
    snprintf(p, sizeof p, "%s/ick", dir);
    mp_checkpoint_entry *list;
    int n = mp_checkpoint_list(p, &list);
    assert_true(n >= 2);
    int64_t stopped = list[n - 1].steps;
    free(list);
    assert_true(stopped > 200 && stopped < 24000);
    int64_t target = stopped + 30;
    snprintf(args, sizeof args,
             "train --data %%1$s/train.csv --resume %%1$s/ick --max-steps %lld --save %%1$s/ir.st "
             "--save-state --quiet",
             (long long)target);
    assert_int_equal(run(args), 0);
    snprintf(args, sizeof args, "train %s --max-steps %lld --save %%1$s/is.st --save-state", common,
             (long long)target);
    assert_int_equal(run(args), 0);
    assert_same_tensors("ir.st", "is.st");
}

/* The loss evaluate prints. */
static double printed_loss(void)
{
    const char *o = strstr(output(), "samples: loss ");
    assert_non_null(o);
    return atof(o + 14);
}

/* A model saved under mixed_bfloat16 keeps its policy and its explicit
 * float32 softmax: evaluate --policy X changes the other layers (a
 * different loss wherever X computes differently) and keeps the softmax.
 * Before config version 2 the file said "float32" (the global policy at save
 * time) and every --policy gave the same loss. */
static void test_evaluate_under_another_policy(void **state)
{
    (void)state;
    assert_int_equal(run("train --data %1$s/train.csv --hidden 16 --epochs 3 --batch-size 32 "
                         "--policy mixed_bfloat16 --lr 0.01 --save %1$s/bf.st --quiet"),
                     0);
    assert_int_equal(run("evaluate %1$s/bf.st --data %1$s/test.csv"), 0);
    assert_non_null(strstr(output(), "(policy mixed_bfloat16)"));
    double stored = printed_loss();
    assert_int_equal(run("evaluate %1$s/bf.st --data %1$s/test.csv --policy mixed_bfloat16"), 0);
    assert_true(printed_loss() == stored);
    const char *others[] = {"float32", "mixed_float16", "bfloat16"};
    for (int i = 0; i < 3; i++) {
        char args[256];
        snprintf(args, sizeof args, "evaluate %%1$s/bf.st --data %%1$s/test.csv --policy %s",
                 others[i]);
        assert_int_equal(run(args), 0);
        assert_non_null(strstr(output(), others[i]));
        assert_true(printed_loss() != stored);
    }
    /* the explicit softmax stays float32 under every --policy */
    assert_int_equal(run("inspect %1$s/bf.st"), 0);
    const char *line = strstr(output(), "activation (Activation)");
    assert_non_null(line);
    const char *f32 = strstr(line, "float32"), *nl = strchr(line, '\n');
    assert_true(f32 && nl && f32 < nl);
}

/* --model FILE trains the model a JSON file describes; a broken file gets
 * one line naming the file, the layer and the field, and exit status 2. */
static void test_model_file(void **state)
{
    (void)state;
    char p[128];
    snprintf(p, sizeof p, "%s/model.json", dir);
    FILE *f = fopen(p, "w");
    fprintf(
        f,
        "{\"format\": \"mixprec.model\", \"version\": 2, \"policy\": \"mixed_float16\",\n"
        " \"layers\": [\n"
        "  {\"class_name\": \"InputLayer\", \"name\": \"x\", \"inputs\": [], \"shape\": [4]},\n"
        "  {\"class_name\": \"Dense\", \"name\": \"h\", \"inputs\": [\"x\"], \"units\": 8,\n"
        "   \"activation\": \"tanh\", \"kernel_initializer\": \"he_uniform\"},\n"
        "  {\"class_name\": \"Dense\", \"name\": \"logits\", \"inputs\": [\"h\"], \"units\": 2},\n"
        "  {\"class_name\": \"Activation\", \"name\": \"p\", \"inputs\": [\"logits\"],\n"
        "   \"activation\": \"softmax\", \"policy\": \"float32\"}]}\n");
    fclose(f);
    assert_int_equal(run("train --data %1$s/train.csv --test-data %1$s/test.csv --model "
                         "%1$s/model.json --epochs 5 --batch-size 32 --lr 0.01 --save "
                         "%1$s/mf.st --quiet"),
                     0);
    const char *o = output();
    assert_non_null(strstr(o, "policy mixed_float16"));
    assert_true(atof(strstr(o, "accuracy ") + 9) >= 0.95);
    assert_int_equal(run("evaluate %1$s/mf.st --data %1$s/test.csv"), 0);
    assert_non_null(strstr(output(), "(policy mixed_float16)"));
    /* --policy replaces the file's */
    assert_int_equal(run("train --data %1$s/train.csv --model %1$s/model.json --epochs 1 "
                         "--policy float32"),
                     0);
    assert_non_null(strstr(output(), "policy float32:"));
    /* broken files */
    const char *bad[][2] = {
        {"{\"format\": \"mixprec.model\", \"version\": 2, \"layers\": [", "not valid JSON"},
        {"{\"format\": \"mixprec.model\", \"version\": 2, \"layers\": [{\"class_name\": "
         "\"InputLayer\", \"name\": \"x\", \"inputs\": [], \"shape\": [4]}, {\"class_name\": "
         "\"Dense\", \"name\": \"h\", \"inputs\": [\"x\"], \"units\": 0}]}",
         "layer 'h' (Dense): 'units'"},
        {"{\"format\": \"mixprec.model\", \"version\": 2, \"layers\": [{\"class_name\": "
         "\"InputLayer\", \"name\": \"x\", \"inputs\": [], \"shape\": [4]}, {\"class_name\": "
         "\"Dense\", \"name\": \"h\", \"inputs\": [\"x\"], \"units\": 3, \"activaton\": "
         "\"relu\"}]}",
         "unknown field 'activaton'"},
        {"{\"format\": \"mixprec.model\", \"version\": 2, \"layers\": [{\"class_name\": "
         "\"InputLayer\", \"name\": \"x\", \"inputs\": [], \"shape\": [4]}, {\"class_name\": "
         "\"Dense\", \"name\": \"h\", \"inputs\": [\"y\"], \"units\": 3}]}",
         "input 'y'"},
        {"{\"format\": \"mixprec.model\", \"version\": 9, \"layers\": []}", "'version'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        f = fopen(p, "w");
        fprintf(f, "%s", bad[i][0]);
        fclose(f);
        assert_int_equal(run("train --data %1$s/train.csv --model %1$s/model.json --quiet"), 2);
        o = output();
        assert_non_null(strstr(o, "model.json"));
        assert_non_null(strstr(o, bad[i][1]));
        assert_null(strchr(o, '\n') == NULL ? NULL : strchr(strchr(o, '\n') + 1, '\n'));
    }
    assert_int_equal(run("train --data %1$s/train.csv --model %1$s/nothing.json"), 2);
    assert_non_null(strstr(output(), "nothing.json"));
    assert_int_equal(run("train --data %1$s/train.csv --model %1$s/model.json --hidden 3"), 2);
}

/* --batch-size auto takes the largest batch whose planned memory fits
 * --memory-limit; a fixed batch over the limit, or a limit below a batch of
 * one, is refused with the figures. */
static void test_memory_limit(void **state)
{
    (void)state;
    assert_int_equal(run("train --data %1$s/train.csv --hidden 16 --batch-size auto --epochs 1"),
                     2);
    assert_non_null(strstr(output(), "--memory-limit"));
    assert_int_equal(run("train --data %1$s/train.csv --hidden 16 --memory-limit 12x"), 2);
    assert_int_equal(run("train --data %1$s/train.csv --hidden 16 --batch-size auto "
                         "--memory-limit 1K --epochs 1"),
                     1);
    assert_non_null(strstr(output(), "a batch of 1 plans"));
    assert_int_equal(run("train --data %1$s/train.csv --hidden 16 --batch-size auto "
                         "--memory-limit 64K --epochs 1"),
                     0);
    const char *o = strstr(output(), "batch size ");
    assert_non_null(o);
    long b = atol(o + 11);
    assert_true(b > 1);
    char args[256];
    snprintf(args, sizeof args,
             "train --data %%1$s/train.csv --hidden 16 --batch-size %ld --memory-limit 64K "
             "--epochs 1 --quiet",
             b + 1);
    assert_int_equal(run(args), 1);
    assert_non_null(strstr(output(), "the largest that fits is"));
}

static void test_bad_input(void **state)
{
    (void)state;
    assert_int_equal(run("train --bogus"), 2);
    assert_non_null(strstr(output(), "unknown option '--bogus'"));
    assert_int_equal(run("train --policy mixed_float4"), 2);
    assert_non_null(strstr(output(), "mixed_float4"));
    assert_int_equal(run("train --policy mixed_float8 --fp8-format e5m3"), 2);
    assert_non_null(strstr(output(), "--fp8-format e5m3: float8: unknown format 'e5m3'"));
    assert_int_equal(run("train --fp8-history 0"), 2);
    assert_non_null(strstr(output(), "amax_history_len '0'"));
    assert_int_equal(run("train --fp8-algorithm mean"), 2);
    assert_non_null(strstr(output(), "'mean'"));
    assert_int_equal(run("train --fp8-margin -1"), 2);
    assert_non_null(strstr(output(), "margin '-1'"));
    assert_int_equal(run("train --resume ck --fp8-margin 1"), 2);
    assert_non_null(strstr(output(), "fp8-margin"));
    assert_int_equal(run("train --weight-decay -0.1"), 2);
    assert_non_null(strstr(output(), "--weight-decay -0.1: expected a number >= 0"));
    assert_int_equal(run("train --resume ck --weight-decay 0.1"), 2);
    assert_non_null(strstr(output(), "weight-decay"));
    assert_int_equal(run("train --batch-size 0"), 2);
    assert_int_equal(run("train --validation-split 1.5"), 2);
    assert_int_equal(run("train --loss-scale sometimes"), 2);
    assert_int_equal(run("train --epochs"), 2);
    assert_non_null(strstr(output(), "needs a value"));
    assert_int_equal(run("train --data %s/missing.csv --quiet"), 1);
    assert_non_null(strstr(output(), "missing.csv"));
    char p[128];
    snprintf(p, sizeof p, "%s/nan.csv", dir);
    FILE *f = fopen(p, "w");
    fprintf(f, "1,2,0\n3,nan,1\n");
    fclose(f);
    assert_int_equal(run("train --data %s/nan.csv --quiet"), 1);
    assert_non_null(strstr(output(), "line 2"));
    assert_int_equal(run("evaluate %s/missing.safetensors --data %s/test.csv"), 1);
    assert_non_null(strstr(output(), "missing.safetensors"));
    /* a failed predict leaves an existing output file as it was */
    snprintf(p, sizeof p, "%s/keep.csv", dir);
    f = fopen(p, "w");
    fprintf(f, "precious\n");
    fclose(f);
    assert_int_equal(run("predict %1$s/missing.safetensors --data %1$s/test.csv --output "
                         "%1$s/keep.csv"),
                     1);
    char line[64] = "";
    f = fopen(p, "r");
    assert_non_null(fgets(line, sizeof line, f));
    fclose(f);
    assert_string_equal(line, "precious\n");
    assert_int_equal(run("evaluate"), 2);
    assert_int_equal(run("frobnicate"), 2);
    assert_non_null(strstr(output(), "unknown command"));
    assert_int_equal(run("--help"), 0);
    assert_non_null(strstr(output(), "train"));
    assert_int_equal(run("train --help"), 0);
    assert_non_null(strstr(output(), "--loss-scale"));
}

/* A small language model on a text file: train with validation in nats
 * per byte, resume from a checkpoint on the same text, generate greedily
 * with and without the key/value cache (the same text: the two paths
 * differ by float32 reordering only), and the refusals. */
static void test_language_model(void **state)
{
    (void)state;
    char p[160];
    snprintf(p, sizeof p, "%s/lm.json", dir);
    FILE *f = fopen(p, "w");
    fprintf(
        f,
        "{\"format\": \"mixprec.model\", \"version\": 2, \"policy\": \"float32\", \"layers\": [\n"
        " {\"class_name\": \"InputLayer\", \"name\": \"ids\", \"inputs\": [], \"shape\": [16], "
        "\"dtype\": \"int32\"},\n"
        " {\"class_name\": \"Embedding\", \"name\": \"emb\", \"inputs\": [\"ids\"], "
        "\"input_dim\": 256, \"output_dim\": 16},\n"
        " {\"class_name\": \"PositionEmbedding\", \"name\": \"pos\", \"inputs\": [\"emb\"], "
        "\"sequence_length\": 16},\n"
        " {\"class_name\": \"MultiHeadAttention\", \"name\": \"att\", \"inputs\": [\"pos\"], "
        "\"num_heads\": 2, \"key_dim\": 8},\n"
        " {\"class_name\": \"Add\", \"name\": \"res\", \"inputs\": [\"pos\", \"att\"]},\n"
        " {\"class_name\": \"Dense\", \"name\": \"out\", \"inputs\": [\"res\"], \"units\": 256},\n"
        " {\"class_name\": \"Activation\", \"name\": \"p\", \"inputs\": [\"out\"], "
        "\"activation\": \"softmax\"}]}\n");
    fclose(f);
    snprintf(p, sizeof p, "%s/text.txt", dir);
    f = fopen(p, "w");
    for (int i = 0; i < 200; i++) fprintf(f, "the cat sat on the mat %d times. ", i);
    fclose(f);
    assert_int_equal(run("train --model %1$s/lm.json --data text:%1$s/text.txt --optimizer adamw "
                         "--batch-size 8 --steps-per-epoch 3 --epochs 2 --checkpoint-dir %1$s/lmck "
                         "--save %1$s/lm.safetensors"),
                     0);
    assert_non_null(strstr(output(), "windows of 16 tokens"));
    assert_non_null(strstr(output(), "nats per byte"));
    assert_non_null(strstr(output(), "perplexity"));
    assert_int_equal(run("train --resume %1$s/lmck --data text:%1$s/text.txt --epochs 3 --quiet"),
                     0);
    assert_int_equal(run("generate %1$s/lm.safetensors --prompt 'the cat' --tokens 9 "
                         "--temperature 0 --quiet"),
                     0);
    char cached[256];
    snprintf(cached, sizeof cached, "%s", output());
    assert_int_equal(strlen(cached), strlen("the cat") + 9 + 1);
    assert_int_equal(run("generate %1$s/lm.safetensors --prompt 'the cat' --tokens 9 "
                         "--temperature 0 --quiet --no-cache"),
                     0);
    assert_string_equal(output(), cached);
    /* refusals: one line naming the value and the limit */
    assert_int_equal(run("generate %1$s/lm.safetensors --prompt 'the cat sat' --tokens 6"), 2);
    assert_non_null(strstr(output(), "17 positions"));
    assert_non_null(strstr(output(), "context is 16"));
    assert_int_equal(run("generate %1$s/lm.safetensors --prompt ''"), 2);
    assert_int_equal(run("generate %1$s/missing.safetensors"), 1);
    assert_non_null(strstr(output(), "missing.safetensors"));
    assert_int_equal(run("train --data text:%1$s/text.txt"), 2);
    assert_non_null(strstr(output(), "needs --model"));
    snprintf(p, sizeof p, "%s/empty.txt", dir);
    fclose(fopen(p, "w"));
    assert_int_equal(run("train --model %1$s/lm.json --data text:%1$s/empty.txt --quiet"), 1);
    assert_non_null(strstr(output(), "is empty"));
    assert_int_equal(run("train --data text:%1$s/text.txt --model resnet20 --quiet"), 2);
    assert_non_null(strstr(output(), "no sequence model"));
}

/* tune-precision: the table, a tuned file that trains, one-line errors. */
static void test_tune_precision(void **state)
{
    (void)state;
    char p[128];
    snprintf(p, sizeof p, "%s/tune.json", dir);
    FILE *f = fopen(p, "w");
    fprintf(
        f,
        "{\"format\": \"mixprec.model\", \"version\": 2, \"layers\": [\n"
        " {\"class_name\": \"InputLayer\", \"name\": \"x\", \"inputs\": [], \"shape\": [4]},\n"
        " {\"class_name\": \"Dense\", \"name\": \"h\", \"inputs\": [\"x\"], \"units\": 16,"
        " \"activation\": \"relu\"},\n"
        " {\"class_name\": \"Dense\", \"name\": \"h2\", \"inputs\": [\"h\"], \"units\": 16,"
        " \"activation\": \"relu\"},\n"
        " {\"class_name\": \"Dense\", \"name\": \"logits\", \"inputs\": [\"h2\"], \"units\": 2},\n"
        " {\"class_name\": \"Activation\", \"name\": \"p\", \"inputs\": [\"logits\"],"
        " \"activation\": \"softmax\", \"policy\": \"float32\"}]}\n");
    fclose(f);
    assert_int_equal(run("tune-precision --model %1$s/tune.json --data %1$s/train.csv --budget 0.1 "
                         "--batch-size 16"),
                     0);
    const char *o = output();
    assert_non_null(strstr(o, "budget 0.1"));
    assert_non_null(strstr(o, "chosen"));
    assert_non_null(strstr(o, "tune-tuned.json"));
    assert_int_equal(run("train --data %1$s/train.csv --model %1$s/tune-tuned.json --epochs 1 "
                         "--batch-size 16 --quiet"),
                     0);
    const char *bad[][2] = {
        {"--budget 0", "--budget 0:"},
        {"--budget nan", "--budget nan:"},
        {"--candidates bfloat16,bf16", "'bf16'"},
        {"--probe-batches 0", "--probe-batches 0:"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char args[256];
        snprintf(args, sizeof args,
                 "tune-precision --model %%1$s/tune.json --data %%1$s/train.csv %s", bad[i][0]);
        assert_int_equal(run(args), 2);
        o = output();
        if (!strstr(o, bad[i][1])) fail_msg("'%s' lacks '%s'", o, bad[i][1]);
        assert_int_equal(strchr(o, '\n') - o + 1, (long)strlen(o)); /* one line */
    }
    f = fopen(p, "w");
    fprintf(f, "{\"format\": \"mixprec.model\", \"version\": 2, \"layers\": ["
               "{\"class_name\": \"InputLayer\", \"name\": \"x\", \"inputs\": [], \"shape\": [4]},"
               "{\"class_name\": \"Activation\", \"name\": \"p\", \"inputs\": [\"x\"],"
               " \"activation\": \"softmax\"}]}\n");
    fclose(f);
    assert_int_equal(run("tune-precision --model %1$s/tune.json --data %1$s/train.csv"), 2);
    assert_non_null(strstr(output(), "no layer with a kernel"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_train_save_evaluate_predict),
        cmocka_unit_test(test_demo_flags),
        cmocka_unit_test(test_checkpoint_resume),
        cmocka_unit_test(test_interrupt_and_resume),
        cmocka_unit_test(test_evaluate_under_another_policy),
        cmocka_unit_test(test_model_file),
        cmocka_unit_test(test_memory_limit),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_language_model),
        cmocka_unit_test(test_tune_precision),
    };
    return cmocka_run_group_tests_name("cli", tests, setup, teardown);
}
