"""gpt_keras.py - the peer for bench_gpt: one training step (forward, loss,
backward, AdamW update) of the GPT of examples/gpt_mini.json in Keras 3 on
TensorFlow, on a fixed batch of random byte windows (batch 32 x 128 tokens),
per policy (float32, mixed_bfloat16, set with
keras.mixed_precision.set_global_policy), with the thread count given
(TensorFlow's intra- and inter-op pools; bench_gpt passes its own).

The model, layer for layer as mixprec builds it: Embedding(256, 256), a
learned position table [context, 256] added to it, 4 pre-LN blocks of
LayerNormalization(epsilon=1e-5) -> MultiHeadAttention(num_heads=4,
key_dim=64) called with use_causal_mask=True -> Add -> LayerNormalization ->
Dense(1024, GELU tanh form) -> Dense(256) -> Add, a final
LayerNormalization, Dense(256) and a float32 softmax; sparse categorical
cross-entropy over every position; AdamW (lr 1e-3, weight decay 0.01,
biases, norms and embeddings exempt from the decay as in mixprec).

Prints one JSON line per policy as it is measured: {"policy", "median_ms",
"steps", "warmup", "threads", ...}. A policy whose steps are slow gets fewer
timed steps, at least one, so that a policy takes about --budget-s seconds;
the line says how many ran.

usage: gpt_keras.py [--threads N] [--warmup N] [--steps N] [--batch N]
                    [--context N] [--budget-s S] [--policies float32,mixed_bfloat16]"""
import argparse
import os
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--warmup", type=int, default=2)
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--context", type=int, default=128)
ap.add_argument("--budget-s", type=float, default=120.0)
ap.add_argument("--policies", default="float32,mixed_bfloat16")
args = ap.parse_args()

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["OMP_NUM_THREADS"] = str(args.threads)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

# Before TensorFlow runs anything: both pools get the thread count.
tf.config.threading.set_intra_op_parallelism_threads(args.threads)
tf.config.threading.set_inter_op_parallelism_threads(args.threads)

import keras  # noqa: E402
from keras import layers, ops  # noqa: E402
from keras_report import report  # noqa: E402

VOCAB, WIDTH, HEADS, KEY_DIM, MLP, LAYERS = 256, 256, 4, 64, 1024, 4


class PositionEmbedding(layers.Layer):
    """A learned [length, width] table added to the input (mixprec's
    PositionEmbedding)."""

    def __init__(self, length, **kw):
        super().__init__(**kw)
        self.length = length

    def build(self, shape):
        self.embeddings = self.add_weight(shape=(self.length, shape[-1]), name="embeddings",
                                          initializer=keras.initializers.RandomUniform(-0.05, 0.05))

    def call(self, x):
        return x + ops.cast(self.embeddings, x.dtype)[None, :, :]


def gelu_tanh(x):
    return keras.activations.gelu(x, approximate=True)


def gpt(context):
    tokens = keras.Input((context,), dtype="int32")
    x = layers.Embedding(VOCAB, WIDTH)(tokens)
    x = PositionEmbedding(context)(x)
    for _ in range(LAYERS):
        h = layers.LayerNormalization(epsilon=1e-5)(x)
        h = layers.MultiHeadAttention(num_heads=HEADS, key_dim=KEY_DIM)(h, h, use_causal_mask=True)
        x = layers.Add()([x, h])
        h = layers.LayerNormalization(epsilon=1e-5)(x)
        h = layers.Dense(MLP, activation=gelu_tanh)(h)
        h = layers.Dense(WIDTH)(h)
        x = layers.Add()([x, h])
    x = layers.LayerNormalization(epsilon=1e-5)(x)
    x = layers.Dense(VOCAB)(x)
    out = layers.Activation("softmax", dtype="float32")(x)
    return keras.Model(tokens, out)


# The same kind of batch as bench_gpt: windows of random bytes, each label
# the next byte.
rng = np.random.default_rng(7)
seq = rng.integers(0, VOCAB, (args.batch, args.context + 1), dtype=np.int32)
x = tf.constant(seq[:, :-1])
y = tf.constant(seq[:, 1:])

for policy in args.policies.split(","):
    keras.utils.clear_session()
    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(0)
    model = gpt(args.context)
    opt = keras.optimizers.AdamW(learning_rate=1e-3, weight_decay=0.01)
    opt.exclude_from_weight_decay(var_names=["bias", "gamma", "beta", "embeddings"])
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")

    def step():
        t0 = time.perf_counter()
        loss = model.train_on_batch(x, y)  # returns a Python float: the step has finished
        return time.perf_counter() - t0, loss

    start = time.perf_counter()
    warmup = 0
    while warmup < max(1, args.warmup):  # the first step also traces the graph
        last, loss = step()
        warmup += 1
        if time.perf_counter() - start + last > args.budget_s:
            break
    left = args.budget_s - (time.perf_counter() - start)
    steps = max(1, min(args.steps, int(left / last)))
    times = []
    for i in range(steps):
        t, loss = step()
        times.append(t * 1e3)
    report(policy, times, steps, warmup, args.threads, model, loss)
keras.mixed_precision.set_global_policy("float32")
sys.exit(0)
