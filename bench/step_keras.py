"""step_keras.py - the Keras peer for `bench_step --peers`: one training step
(forward, loss, backward, Adam update) of the seed MLP 784 -> 4096 -> 4096 ->
10 (relu, a float32 softmax, sparse categorical cross-entropy, Adam 1e-3) at
batch 1024 in Keras 3 on TensorFlow, per policy (float32, mixed_bfloat16, set
with keras.mixed_precision.set_global_policy), with the thread count given
(TensorFlow's intra- and inter-op pools; bench_step passes its own).

Each policy runs with XLA off (what Keras picks on a CPU) and on
(model.compile(jit_compile=True)), --jit both (the default), so that the
caller can keep the faster: on a 2-core Xeon XLA was about twice as fast in
mixed_bfloat16 and slower in float32, in some runs.

Prints one JSON line per policy and XLA setting as it is measured:
{"policy", "jit_compile", "median_ms", "cpu_ms", "steps", "warmup",
"threads", ...}; cpu_ms is the median of the process's CPU time per step
(all its threads), which other processes' load moves less than wall time.
A policy whose steps are slow gets fewer timed steps, at least one, so that
a policy takes about --budget-s seconds; the line says how many ran.

usage: step_keras.py [--threads N] [--warmup N] [--steps N] [--batch N]
                     [--budget-s S] [--policies float32,mixed_bfloat16]
                     [--jit off|on|both]"""
import argparse
import os
import statistics
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--batch", type=int, default=1024)
ap.add_argument("--budget-s", type=float, default=60.0)
ap.add_argument("--policies", default="float32,mixed_bfloat16")
ap.add_argument("--jit", choices=["off", "on", "both"], default="both")
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
from keras import layers  # noqa: E402
from keras_report import report  # noqa: E402


def seed_mlp():
    inp = keras.Input((784,))
    x = layers.Dense(4096, activation="relu")(inp)
    x = layers.Dense(4096, activation="relu")(x)
    x = layers.Dense(10)(x)
    out = layers.Activation("softmax", dtype="float32")(x)
    return keras.Model(inp, out)


rng = np.random.default_rng(3)
x = tf.constant(rng.random((args.batch, 784), dtype=np.float32))
y = tf.constant(rng.integers(0, 10, args.batch, dtype=np.int32))

jits = {"off": [False], "on": [True], "both": [False, True]}[args.jit]
for policy, jit in [(p, j) for p in args.policies.split(",") for j in jits]:
    keras.utils.clear_session()
    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(0)
    model = seed_mlp()
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy",
                  jit_compile=jit)

    def step():
        t0, c0 = time.perf_counter(), time.process_time()
        loss = model.train_on_batch(x, y)  # returns a Python float: the step has finished
        return time.perf_counter() - t0, loss, time.process_time() - c0

    start = time.perf_counter()
    warmup = 0
    while warmup < max(1, args.warmup):  # the first step also traces the graph
        last, loss, _ = step()
        warmup += 1
        if time.perf_counter() - start + last > args.budget_s:
            break
    left = args.budget_s - (time.perf_counter() - start)
    steps = max(1, min(args.steps, int(left / last)))
    times, cpu = [], []
    for i in range(steps):
        t, loss, c = step()
        times.append(t * 1e3)
        cpu.append(c * 1e3)
    report(policy, times, steps, warmup, args.threads, model, loss,
           cpu_ms=statistics.median(cpu))
keras.mixed_precision.set_global_policy("float32")
sys.exit(0)
