#!/bin/sh
# lm_demo.sh BUILD - the language-model job (make lm): gpt_mini
# (examples/gpt_mini.json) trained on Debian's fortunes under float32 and
# mixed_bfloat16 from the same seed, the validation loss in nats per byte of
# both at every evaluation point side by side, and a sample of generated text.
# The last 5% of the text validates. LM_STEPS (default 600) training steps,
# LM_EVERY (default 100) steps between
# evaluations, LM_BATCH (default 32) windows of 128 bytes per step.
set -eu
build=${1:-build}
steps=${LM_STEPS:-600}
every=${LM_EVERY:-100}
batch=${LM_BATCH:-32}
out=$build/lm
mkdir -p "$out"
epochs=$(( (steps + every - 1) / every ))
for policy in float32 mixed_bfloat16; do
    echo "== gpt_mini, $policy: $steps steps of $batch x 128 bytes, validation every $every"
    "$build/mixprec" train --model examples/gpt_mini.json --data text:fortunes \
        --policy "$policy" --optimizer adamw --lr 1e-3 --batch-size "$batch" \
        --steps-per-epoch "$every" --epochs "$epochs" --max-steps "$steps" --seed 1 \
        --validation-split 0.05 \
        --log "$out/$policy.csv" --save "$out/$policy.safetensors" \
        | grep -v '^[a-z_0-9]* (' | grep -v '^-----\|^Layer\|^  [a-z_]* *[0-9]'
done
echo
echo "validation loss (nats per byte) at each evaluation point"
echo "step     float32  mixed_bfloat16  difference"
paste -d, "$out/float32.csv" "$out/mixed_bfloat16.csv" | awk -F, -v every="$every" '
    NR > 1 { printf "%-8d %7.4f  %14.4f  %+10.4f\n", $1 * every, $4, $13, $13 - $4 }'
echo
echo "== a sample from the mixed_bfloat16 model (temperature 0.8, top-k 40):"
"$build/mixprec" generate "$out/mixed_bfloat16.safetensors" --prompt "The " --tokens 120 --seed 1
