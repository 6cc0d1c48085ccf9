"""keras_report.py - the one JSON line each Keras peer benchmark
(conv_keras.py, gpt_keras.py, step_keras.py) prints per policy: the median
step in ms and what was measured, read by the C benchmark that ran it."""
import json
import statistics

import keras
import numpy as np
import tensorflow as tf


def report(policy, times_ms, steps, warmup, threads, model, loss, **extra):
    out = {
        "policy": policy,
        "median_ms": round(statistics.median(times_ms), 2),
    }
    out.update({k: round(v, 2) if isinstance(v, float) else v for k, v in extra.items()})
    out.update({
        "steps": steps,
        "warmup": warmup,
        "threads": threads,
        "params": model.count_params(),
        "optimizer": type(model.optimizer).__name__,
        "jit_compile": bool(model.jit_compile),
        "loss": float(np.asarray(loss).ravel()[0]) if np.ndim(loss) else float(loss),
        "keras": keras.__version__,
        "tensorflow": tf.__version__,
    })
    print(json.dumps(out), flush=True)
