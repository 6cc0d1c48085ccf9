"""conv_keras.py - the peer for bench_conv: one training step (forward, loss,
backward, Adam update) of the CIFAR-style ResNet-20 of examples/resnet20.json
on random 28x28x1 images at batch 128, in Keras 3 on TensorFlow, per policy
(float32, mixed_bfloat16, mixed_float16, set with
keras.mixed_precision.set_global_policy; mixed_float16 with Keras's loss
scaling), with the thread count given (TensorFlow's intra- and inter-op
pools; bench_conv passes its own). Prints one JSON line per policy as it is
measured: {"policy", "median_ms", "steps", "warmup", "threads", ...}.
A policy whose steps are slow (TensorFlow's float16 convolutions on CPU take
about a minute a step) gets fewer warm-up and timed steps, at least one each,
so that a policy takes about --budget-s seconds; the line says how many ran.

usage: conv_keras.py [--threads N] [--warmup N] [--steps N] [--batch N]
                     [--budget-s S] [--policies float32,mixed_bfloat16,mixed_float16]"""
import argparse
import os
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--steps", type=int, default=7)
ap.add_argument("--batch", type=int, default=128)
ap.add_argument("--budget-s", type=float, default=60.0)
ap.add_argument("--policies", default="float32,mixed_bfloat16,mixed_float16")
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


def conv_bn(x, filters, k, stride):
    x = layers.Conv2D(filters, k, strides=stride, padding="same", use_bias=False)(x)
    return layers.BatchNormalization(momentum=0.9, epsilon=1e-5)(x)


def block(x, filters, stride):
    y = layers.Activation("relu")(conv_bn(x, filters, 3, stride))
    y = conv_bn(y, filters, 3, 1)
    shortcut = x if stride == 1 else conv_bn(x, filters, 1, stride)
    return layers.Activation("relu")(layers.Add()([shortcut, y]))


def resnet20():
    inp = keras.Input((28, 28, 1))
    x = layers.Activation("relu")(conv_bn(inp, 16, 3, 1))
    for stage in range(3):
        for b in range(3):
            x = block(x, 16 << stage, 2 if stage > 0 and b == 0 else 1)
    x = layers.Dense(10)(layers.GlobalAveragePooling2D()(x))
    out = layers.Activation("softmax", dtype="float32")(x)
    return keras.Model(inp, out)


rng = np.random.default_rng(3)
x = tf.constant(rng.random((args.batch, 28, 28, 1), dtype=np.float32))
y = tf.constant(rng.integers(0, 10, args.batch, dtype=np.int32))

for policy in args.policies.split(","):
    keras.utils.clear_session()
    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(0)
    model = resnet20()
    # Keras wraps the optimizer in a LossScaleOptimizer under mixed_float16.
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
    report(policy, times, steps, warmup, args.threads, model, loss)
keras.mixed_precision.set_global_policy("float32")
sys.exit(0)
