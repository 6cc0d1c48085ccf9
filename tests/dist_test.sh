#!/bin/sh
# dist_test.sh BUILD - data parallel through mpirun on 2 ranks of this
# machine: the library-level comparison with one process (dist_test.c, on 2
# and 4 ranks), then the CLI: a 2-rank run whose only writer is rank 0,
# --deterministic reproducible and resumable on another N, --allreduce
# bfloat16, a killed and a stopped rank, a rank with other data and a batch
# that does not divide refused. Leaves nothing behind.
set -u
build="$1"
export MP_DISPATCH_CACHE=0
# Open MPI as root on a machine with fewer cores than ranks, over loopback
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMP_NUM_THREADS=1
# Under SANITIZE=1: Open MPI keeps what MPI_Init allocates, much of it in
# components it has unloaded by exit (stacks LeakSanitizer cannot name, so no
# suppression file can match them): leak checks are off for these runs only
# (the rest of the suite checks the library's leaks; ASan and UBSan stay on).
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
mpirun="mpirun --oversubscribe --allow-run-as-root -x ASAN_OPTIONS -np 2"
dir=$(mktemp -d "${TMPDIR:-/tmp}/mp_dist.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
fail=0
t0=$(date +%s)
$mpirun "$build/tests/dist_test" "$dir" || fail=1
# 4 ranks: the same bits as one process with --deterministic (dist_test.c
# compares every rank count with its own single-process run)
${mpirun%-np 2} -np 4 "$build/tests/dist_test" "$dir" > "$dir/np4.txt" 2>&1 ||
    { cat "$dir/np4.txt"; fail=1; }
grep -E "same bits|shard-optimizer|passed on" "$dir/np4.txt"

# the CLI: three classes in six features
awk 'BEGIN { srand(7); print "a,b,c,d,e,f,label";
  for (i = 0; i < 256; i++) { c = int(rand() * 3); s = "";
    for (j = 0; j < 6; j++) s = s sprintf("%.4f,", (c - 1) * 0.8 + 2 * rand() - 1);
    print s c } }' > "$dir/train.csv"
common="train --data $dir/train.csv --hidden 16,16 --epochs 2 --batch-size 32 --quiet"
for run in 1 2; do
    $mpirun "$build/mixprec" $common --policy mixed_float16 --deterministic \
        --save "$dir/det$run.st" --log "$dir/h$run.csv" --checkpoint-dir "$dir/ck$run" \
        > "$dir/out$run.txt" 2>&1 || { cat "$dir/out$run.txt"; fail=1; }
done
$mpirun "$build/mixprec" $common --policy mixed_float16 --deterministic --shard-optimizer \
    --save "$dir/zero.st" > "$dir/zero.txt" 2>&1 || { cat "$dir/zero.txt"; fail=1; }
cmp -s "$dir/det1.st" "$dir/zero.st" ||
    { echo "dist_test.sh: --shard-optimizer saved other weights than without it"; fail=1; }
cmp -s "$dir/det1.st" "$dir/det2.st" ||
    { echo "dist_test.sh: mpirun --deterministic: two runs saved different weights"; fail=1; }
[ "$(grep -c '^[0-9]' "$dir/h1.csv" 2>/dev/null)" = 2 ] ||
    { echo "dist_test.sh: the history should have 2 epochs (written once, by rank 0)"; fail=1; }
[ "$(grep -c 'policy mixed_float16' "$dir/out1.txt")" = 1 ] ||
    { echo "dist_test.sh: the summary line should be printed once (rank 0)"; fail=1; }
ls "$dir/ck1"/ckpt-00000016.safetensors > /dev/null 2>&1 ||
    { echo "dist_test.sh: no final checkpoint from rank 0"; fail=1; }
# --allreduce bfloat16 and small buckets through the CLI: trains, rank 0 writes
$mpirun "$build/mixprec" $common --allreduce bfloat16 --bucket-mb 1 --save "$dir/bf16.st" \
    > "$dir/bf16.txt" 2>&1 || { cat "$dir/bf16.txt"; fail=1; }
[ -s "$dir/bf16.st" ] || { echo "dist_test.sh: --allreduce bfloat16 saved nothing"; fail=1; }
out=$($mpirun "$build/mixprec" $common --allreduce float64 2>&1)
case "$out" in
*"--allreduce"*"float64"*) ;;
*) echo "dist_test.sh: --allreduce float64 should be refused, got: $out"; fail=1 ;;
esac
# resume on another number of ranks: --deterministic weights do not depend
# on N, so 2 ranks to step 10 then 4 ranks from its checkpoint end on the
# bits of one process straight through
det="$common --deterministic"
"$build/mixprec" $det --save "$dir/one.st" > "$dir/one.txt" 2>&1 || { cat "$dir/one.txt"; fail=1; }
$mpirun "$build/mixprec" $det --max-steps 10 --checkpoint-dir "$dir/ckn" > "$dir/n2.txt" 2>&1 ||
    { cat "$dir/n2.txt"; fail=1; }
${mpirun%-np 2} -np 4 "$build/mixprec" train --data "$dir/train.csv" --epochs 2 --quiet \
    --deterministic --resume "$dir/ckn" --save "$dir/n4.st" \
    > "$dir/n4.txt" 2>&1 || { cat "$dir/n4.txt"; fail=1; }
cmp -s "$dir/one.st" "$dir/n4.st" ||
    { echo "dist_test.sh: 2 ranks resumed on 4 (--deterministic) differ from one process"; fail=1; }

# a small GPT with its output tied to the token embedding (whose gradient is
# final only after the embedding's own backward), attention, Dropout and
# LayerNorm: --deterministic gives one process's bits on 2 and 4 ranks
cat > "$dir/tied.json" <<'JSON'
{"format": "mixprec.model", "version": 2, "policy": "mixed_bfloat16", "layers": [
 {"class_name": "InputLayer", "name": "tokens", "inputs": [], "shape": [16], "dtype": "int32"},
 {"class_name": "Embedding", "name": "emb", "inputs": ["tokens"], "input_dim": 256, "output_dim": 32},
 {"class_name": "PositionEmbedding", "name": "pos", "inputs": ["emb"], "sequence_length": 16},
 {"class_name": "LayerNormalization", "name": "ln1", "inputs": ["pos"], "epsilon": 1e-05},
 {"class_name": "MultiHeadAttention", "name": "att", "inputs": ["ln1"], "num_heads": 2, "key_dim": 16,
  "use_causal_mask": true},
 {"class_name": "Dropout", "name": "drop", "inputs": ["att"], "rate": 0.1},
 {"class_name": "Add", "name": "add", "inputs": ["pos", "drop"]},
 {"class_name": "LayerNormalization", "name": "ln2", "inputs": ["add"], "epsilon": 1e-05},
 {"class_name": "ReversibleEmbedding", "name": "logits", "inputs": ["ln2"], "embedding": "emb",
  "reverse": true},
 {"class_name": "Activation", "name": "softmax", "inputs": ["logits"], "activation": "softmax",
  "policy": "float32"}]}
JSON
awk 'BEGIN { srand(11); for (i = 0; i < 400; i++) { s = "";
  for (j = 0; j < 12; j++) s = s sprintf("%c", 97 + int(rand() * 26)); print s " the end." } }' \
    > "$dir/text.txt"
lm="train --model $dir/tied.json --data text:$dir/text.txt --batch-size 8 --max-steps 6 --deterministic --quiet"
"$build/mixprec" $lm --save "$dir/lm1.st" > "$dir/lm1.txt" 2>&1 || { cat "$dir/lm1.txt"; fail=1; }
for n in 2 4; do
    ${mpirun%-np 2} -np $n "$build/mixprec" $lm --save "$dir/lm$n.st" > "$dir/lm$n.txt" 2>&1 ||
        { cat "$dir/lm$n.txt"; fail=1; }
    cmp -s "$dir/lm1.st" "$dir/lm$n.st" ||
        { echo "dist_test.sh: tied GPT on $n ranks (--deterministic) differs from one process"; fail=1; }
done

# examples/data_parallel.c, a loop of one's own: runs, rank 0 alone prints
if [ -x "$build/examples/data_parallel" ]; then
    out=$($mpirun "$build/examples/data_parallel" 20 2>&1) || { echo "$out"; fail=1; }
    [ "$(echo "$out" | grep -c '(2 ranks)')" = 3 ] ||
        { echo "dist_test.sh: examples/data_parallel should print 3 lines from rank 0: $out"; fail=1; }
fi

# faults. A rank killed mid-run: mpirun stops the others within seconds and
# the last checkpoint (written atomically) loads. A rank that stops
# answering (SIGSTOP): the others give up after --dist-timeout, saying so.
awk 'BEGIN { srand(3); print "a,b,c,d,e,f,label";
  for (i = 0; i < 4096; i++) { c = int(rand() * 3); s = "";
    for (j = 0; j < 6; j++) s = s sprintf("%.4f,", (c - 1) * 0.8 + 2 * rand() - 1);
    print s c } }' > "$dir/big.csv"
long="train --data $dir/big.csv --hidden 512,512 --epochs 1000 --batch-size 32 --quiet"
fault() { # $1: signal, $2: what to find in the output, $3: extra flags
    $mpirun "$build/mixprec" $long --checkpoint-dir "$dir/f$1" --checkpoint-every 20 ${3:-} \
        > "$dir/f$1.txt" 2>&1 &
    job=$!
    i=0
    while [ $i -lt 300 ] && ! ls "$dir/f$1"/ckpt-*.safetensors > /dev/null 2>&1; do
        sleep 0.1; i=$((i + 1))
    done
    victim=$(pgrep -P $job | tail -1)
    t1=$(date +%s)
    kill -"$1" "$victim"
    wait $job
    rc=$?
    took=$(( $(date +%s) - t1 ))
    last=$(ls "$dir/f$1"/ckpt-*.safetensors 2>/dev/null | tail -1)
    if [ $rc = 0 ] || [ $took -gt 20 ] || ! grep -q "$2" "$dir/f$1.txt"; then
        echo "dist_test.sh: SIG$1 on a rank: exit $rc after $took s, output:"; cat "$dir/f$1.txt"; fail=1
    elif ! "$build/mixprec" inspect "$last" > /dev/null 2>&1; then
        echo "dist_test.sh: after SIG$1 the last checkpoint $last does not load"; fail=1
    else
        echo "dist_test.sh: SIG$1 on rank 1: the job stopped in $took s, \"$(grep -m1 "$2" "$dir/f$1.txt" | cut -c1-90)...\", $(basename "$last") loads"
    fi
}
fault KILL "exited on signal 9"
fault STOP "no answer from the other ranks" "--dist-timeout 3"

# a rank given other data (MPMD: one command line per rank) is refused at start
head -200 "$dir/train.csv" > "$dir/other.csv"
out=$(${mpirun%-np 2} -np 1 "$build/mixprec" $common : -np 1 "$build/mixprec" \
    train ${common#train --data $dir/train.csv} --data "$dir/other.csv" 2>&1)
case "$out" in
*"ranks disagree on"*) ;;
*) echo "dist_test.sh: ranks with different data should be refused, got: $out"; fail=1 ;;
esac
# a rank that fails alone (its data file is missing) stops the job at once
# instead of leaving the others in a collective until the timeout
t1=$(date +%s)
out=$(${mpirun%-np 2} -np 1 "$build/mixprec" $common : -np 1 "$build/mixprec" \
    train ${common#train --data $dir/train.csv} --data "$dir/missing.csv" 2>&1)
took=$(( $(date +%s) - t1 ))
case "$out" in
*"missing.csv"*"rank 1 failed while other ranks still run"*) [ $took -le 20 ] ||
    { echo "dist_test.sh: a rank failing alone stopped the job only after $took s"; fail=1; } ;;
*) echo "dist_test.sh: a rank failing alone should stop the job, got: $out"; fail=1 ;;
esac
out=$($mpirun "$build/mixprec" $common --batch-size 33 2>&1)
case "$out" in
*"does not divide by 2 ranks"*) ;;
*) echo "dist_test.sh: batch 33 on 2 ranks should be refused, got: $out"; fail=1 ;;
esac
if [ $fail = 0 ]; then
    echo "dist_test.sh: mpirun -np 2 mixprec train: rank 0 alone prints and writes, --deterministic reproducible and resumed from 2 ranks on 4 as one process, --shard-optimizer the same, a tied-embedding GPT on 1, 2 and 4 ranks the same, --allreduce bfloat16 trains, other data on a rank and batch 33 refused, a rank failing alone stops the job ($(( $(date +%s) - t0 )) s in all)"
else
    echo "dist_test.sh: FAILED"
fi
exit $fail
