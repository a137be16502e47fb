"""Keras `fit` on 2 worker processes per all-reduce option, against one process.

`--fit` / `--fit-only`: the MLP (25 MB of gradients a step) or ResNet-20
(compute-bound), each configuration a fresh process group (`--fit-worker`),
against one process with 2 threads and against 2 processes that train at the same
time with no communication at all (the ceiling of any transport on these cores).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

from _allreduce_common import SCRIPT
from _allreduce_timeline import TIMELINE_CONFIGS, trace_ring_calls

FIT_CONFIGS = {
    "one process, 2 threads": None,
    "2 processes, no communication": "independent",
    "2 one-worker strategies, no communication": "solo",
    "2 stock one-device MirroredStrategies, no communication": "mirrored",
    "ours default (socket ring)": {},
    "ours socket ring, 16 MB": {"bucket_mb": 16},
    "collective 1 pack (stock packing)": {"transport": "collective", "bucket_mb": 0},
    "collective 16MB": {"transport": "collective"},
    "collective bf16": {"transport": "collective", "compression": "bf16"},
    "socket 1MB": {"transport": "socket", "bucket_mb": 1},
    "socket bf16": {"transport": "socket", "compression": "bf16"},
}


RESNET20_CONFIGS = (
    "one process, 2 threads",
    "2 processes, no communication",
    "2 one-worker strategies, no communication",
    "ours default (socket ring)",
    "collective 1 pack (stock packing)",
    "collective 16MB",
)


def resnet20(keras):
    """He et al.'s CIFAR ResNet-20: 3 stages of 3 basic blocks, 16/32/64 filters."""
    inputs = keras.Input((32, 32, 3))

    def conv_bn(x, filters, strides=1, relu=True):
        x = keras.layers.Conv2D(filters, 3, strides, padding="same", use_bias=False)(x)
        x = keras.layers.BatchNormalization()(x)
        return keras.layers.ReLU()(x) if relu else x

    x = conv_bn(inputs, 16)
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(3):
            strides = 2 if stage and not block else 1
            shortcut = x
            y = conv_bn(x, filters, strides)
            y = conv_bn(y, filters, relu=False)
            if strides != 1:
                shortcut = keras.layers.Conv2D(filters, 1, strides, use_bias=False)(x)
            x = keras.layers.ReLU()(keras.layers.Add()([shortcut, y]))
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(10)(x))


def fit_worker(
    config: str,
    trace: bool = False,
    inter_op: int | None = None,
    model_name: str = "mlp",
) -> None:
    calls = trace_ring_calls() if trace else None
    setting = {**FIT_CONFIGS, **TIMELINE_CONFIGS}[config]
    independent = setting in ("independent", "solo", "mirrored")
    if setting == "solo":  # this worker alone: a cluster of one, no peers
        task = json.loads(os.environ["TF_CONFIG"])
        address = task["cluster"]["worker"][task["task"]["index"]]
        os.environ["TF_CONFIG"] = json.dumps(
            {"cluster": {"worker": [address]}, "task": {"type": "worker", "index": 0}}
        )
    import tensorflow as tf

    threads = 2 if setting is None else 1
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(inter_op or threads)
    import keras
    import numpy as np

    import keras_replicator as kr

    if setting is None or setting == "independent":
        strategy = tf.distribute.get_strategy()
    elif setting == "solo":
        strategy = kr.MultiWorkerReplicator()
    elif setting == "mirrored":
        strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    else:
        strategy = kr.MultiWorkerReplicator(all_reduce=kr.AllReduceOptions(**setting))
    # The dataset's batch is the global batch (tf.distribute splits it). Two
    # independent processes each train on half of it, with no communication: the
    # ceiling of any data-parallel transport on these cores; as one-worker
    # strategies, the ceiling of any transport under tf.distribute.
    steps = 40 if model_name == "mlp" else 22
    global_batch = 128 if independent else 256
    shape = (784,) if model_name == "mlp" else (32, 32, 3)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(global_batch * steps, *shape)).astype("float32")
    y = rng.integers(0, 10, len(x))
    with strategy.scope():
        if model_name == "mlp":
            model = keras.Sequential(
                [
                    keras.Input((784,)),
                    keras.layers.Dense(2048, activation="relu"),
                    keras.layers.Dense(2048, activation="relu"),
                    keras.layers.Dense(256, activation="relu"),
                    keras.layers.Dense(10),
                ]
            )
        else:
            model = resnet20(keras)
        model.compile(
            keras.optimizers.SGD(0.01),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    stamps = []

    class Stamp(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            stamps.append(time.perf_counter())

    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    if isinstance(setting, dict):
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.OFF
        )
        data = data.with_options(options)
    start = time.perf_counter()
    model.fit(data, epochs=1, verbose=0, callbacks=[Stamp()])
    steady = [b - a for a, b in zip(stamps[10:], stamps[11:])]
    if int(os.environ.get("KERAS_REPLICATOR_WORKER_INDEX", "0")) == 0:
        result = {
            "first_step": stamps[0] - start,
            "step": statistics.median(steady),
            "params": model.count_params(),
        }
        if calls is not None:
            result["stamps"], result["calls"] = stamps, calls
        print("RESULT " + json.dumps(result), flush=True)


def fit_benchmark(rounds: int, model_name: str = "mlp") -> None:
    import subprocess

    from keras_replicator.launch import run_workers

    names = list(FIT_CONFIGS) if model_name == "mlp" else list(RESNET20_CONFIGS)
    samples = {name: [] for name in names}
    first = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            setting = FIT_CONFIGS[name]
            command = [sys.executable, SCRIPT, "--fit-worker", name]
            command += ["--fit-model", model_name]
            if setting is None:  # "independent" runs 2 processes, as the workers
                done = subprocess.run(
                    command, capture_output=True, text=True, timeout=600
                )
                output = done.stdout
            else:
                output = (
                    run_workers(command, 2, timeout=600, echo=False).workers[0].output
                )
            lines = [ln for ln in output.splitlines() if ln.startswith("RESULT ")]
            if not lines:
                raise SystemExit(f"fit run {name!r} failed:\n{output[-3000:]}")
            result = json.loads(lines[-1][len("RESULT ") :])
            samples[name].append(256 / result["step"])
            first[name].append(result["first_step"])
    base = statistics.median(samples["one process, 2 threads"])
    title = {
        "mlp": "MLP 6.3M parameters (25 MB gradients)",
        "resnet20": "ResNet-20 on 32x32x3, 0.27M parameters (1.1 MB gradients)",
    }[model_name]
    print(f"\nfit, {title}, global batch 256, steady state")
    print(
        f"{'configuration':<24} {'examples/s':>11} {'/ 1 process':>12} "
        f"{'1st step s':>11}"
    )
    for name in names:
        speed = statistics.median(samples[name])
        print(
            f"{name:<24} {speed:>11,.0f} {speed / base:>12.2f} "
            f"{statistics.median(first[name]):>11.1f}"
        )
