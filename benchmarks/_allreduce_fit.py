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
import time

from benchmarks import harness
from benchmarks._allreduce_common import MODULE
from benchmarks._allreduce_timeline import TIMELINE_CONFIGS, trace_ring_calls
from benchmarks._models import build_model, compiled

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
    model = compiled(
        keras,
        strategy,
        lambda k: build_model(k, model_name),
        lambda: keras.optimizers.SGD(0.01),
    )
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    if isinstance(setting, dict):
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.OFF
        )
        data = data.with_options(options)
    start = time.perf_counter()
    stamp, stamps = harness.batch_end_stamps(keras)
    model.fit(data, epochs=1, verbose=0, callbacks=[stamp])
    if int(os.environ.get("KERAS_REPLICATOR_WORKER_INDEX", "0")) == 0:
        result = {
            "first_step": stamps[0] - start,
            "step": harness.steady_interval(stamps, 10),
            "params": model.count_params(),
        }
        if calls is not None:
            result["stamps"], result["calls"] = stamps, calls
        harness.emit_result(result)


def fit_benchmark(rounds: int, model_name: str = "mlp") -> None:
    names = list(FIT_CONFIGS) if model_name == "mlp" else list(RESNET20_CONFIGS)
    samples = {name: [] for name in names}
    first = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            setting = FIT_CONFIGS[name]
            command = harness.module_command(MODULE, "--fit-worker", name)
            command += ["--fit-model", model_name]
            what = f"fit run {name!r}"
            if setting is None:  # "independent" runs 2 processes, as the workers
                result = harness.fresh_process(command, what, timeout=600)
            else:
                (result,) = harness.fresh_workers(
                    command, 2, what, timeout=600, reporting=[0]
                )
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
