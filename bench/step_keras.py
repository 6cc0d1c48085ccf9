"""step_keras.py - the Keras peer for `bench_step --peers`: one training step
(forward, loss, backward, Adam update) of the seed MLP 784 -> 4096 -> 4096 ->
10 (relu, a float32 softmax, sparse categorical cross-entropy, Adam 1e-3) at
batch 1024 in Keras 3 on TensorFlow, per policy (float32, mixed_bfloat16, set
with keras.mixed_precision.set_global_policy), with the thread count given
(TensorFlow's intra- and inter-op pools; bench_step passes its own).

Prints one JSON line per policy as it is measured: {"policy", "median_ms",
"steps", "warmup", "threads", ...}. A policy whose steps are slow gets fewer
timed steps, at least one, so that a policy takes about --budget-s seconds;
the line says how many ran.

usage: step_keras.py [--threads N] [--warmup N] [--steps N] [--batch N]
                     [--budget-s S] [--policies float32,mixed_bfloat16]"""
import argparse
import json
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

for policy in args.policies.split(","):
    keras.utils.clear_session()
    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(0)
    model = seed_mlp()
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")

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
    print(json.dumps({
        "policy": policy,
        "median_ms": round(statistics.median(times), 2),
        "steps": steps,
        "warmup": warmup,
        "threads": args.threads,
        "params": model.count_params(),
        "optimizer": type(model.optimizer).__name__,
        "jit_compile": bool(model.jit_compile),
        "loss": float(np.asarray(loss).ravel()[0]) if np.ndim(loss) else float(loss),
        "keras": keras.__version__,
        "tensorflow": tf.__version__,
    }), flush=True)
keras.mixed_precision.set_global_policy("float32")
sys.exit(0)
