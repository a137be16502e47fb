"""What does a distributed `fit` step cost over a plain Keras step? (issue 23)

Each arm trains in fresh processes, arms interleaved round by round, so the
machine's drift hits all of them alike; each number is the median over rounds of
the median interval between batches after the first 10 (steady state). Time to
first step (from `fit` to the end of the first batch: tracing, iterator set-up,
the first all-reduce) is reported separately.

Arms, at global batch 256:

* `plain`: Keras `fit` with no strategy, one process with 2 threads (the
  baseline every ratio is against);
* `stock 1 device` / `ours 1 device`: `tf.distribute.MirroredStrategy(["/cpu:0"])`
  / `kr.MultiDeviceReplicator(devices=["/cpu:0"])`, same process shape;
* `ours 2 workers`: `kr.MultiWorkerReplicator()` (socket ring, 16 MB buckets), 2
  processes with 1 thread each on 127.0.0.1, 128 examples each;
* `stock 2 workers`: TensorFlow's own collectives with stock packing (one pack),
  `kr.AllReduceOptions(transport="collective", bucket_mb=0)`, same processes.
  Stock Keras `fit` on `tf.distribute.MultiWorkerMirroredStrategy` itself does not
  run (keras-team/keras#20585: "Attempt to convert a value (PerReplica...)"), so
  stock's communication is measured under our Keras integration;
* `2 plain processes`: two plain `fit`s of 128 examples at the same time, no
  communication: the ceiling of any data-parallel transport on these cores.

    python benchmarks/step_overhead.py [--rounds 3] [--models mlp resnet20]
        [--png benchmarks/step_overhead.png]

Models: the 6.3M-parameter MLP of `allreduce.py --fit` (25 MB of gradients a step,
communication-bound on 2 workers) and ResNet-20 on 32x32x3 (compute-bound).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

GLOBAL_BATCH = 256
STEADY_AFTER = 10
STEPS = {"mlp": 40, "resnet20": 24}
ARMS = (
    "plain",
    "stock 1 device",
    "ours 1 device",
    "ours 2 workers",
    "stock 2 workers",
    "2 plain processes",
)
TWO_PROCESS_ARMS = ("ours 2 workers", "stock 2 workers", "2 plain processes")


def build_model(keras, name: str):
    if name == "mlp":
        return keras.Sequential(
            [
                keras.Input((784,)),
                keras.layers.Dense(2048, activation="relu"),
                keras.layers.Dense(2048, activation="relu"),
                keras.layers.Dense(256, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _allreduce_fit import resnet20

    return resnet20(keras)


def run_arm(arm: str, model_name: str) -> None:
    """One process of one arm: trains and prints `RESULT {json}` (worker 0)."""
    import tensorflow as tf

    threads = 1 if arm in TWO_PROCESS_ARMS else 2
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    import keras
    import numpy as np

    import keras_replicator as kr

    strategy = {
        "plain": tf.distribute.get_strategy,
        "2 plain processes": tf.distribute.get_strategy,
        "stock 1 device": lambda: tf.distribute.MirroredStrategy(["/cpu:0"]),
        "ours 1 device": lambda: kr.MultiDeviceReplicator(devices=["/cpu:0"]),
        "ours 2 workers": kr.MultiWorkerReplicator,
        "stock 2 workers": lambda: kr.MultiWorkerReplicator(
            all_reduce=kr.AllReduceOptions(transport="collective", bucket_mb=0)
        ),
    }[arm]()
    # The dataset's batch is the global batch (tf.distribute splits it between
    # workers); two plain processes each train on half of it.
    batch = GLOBAL_BATCH // 2 if arm == "2 plain processes" else GLOBAL_BATCH
    shape = (784,) if model_name == "mlp" else (32, 32, 3)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * STEPS[model_name], *shape)).astype("float32")
    y = rng.integers(0, 10, len(x))
    with strategy.scope():
        model = build_model(keras, model_name)
        model.compile(
            keras.optimizers.SGD(0.01),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    stamps: list[float] = []

    class Stamp(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            stamps.append(time.perf_counter())

    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
    if arm in ("ours 2 workers", "stock 2 workers"):
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.DATA
        )
        data = data.with_options(options)
    start = time.perf_counter()
    model.fit(data, epochs=1, verbose=0, callbacks=[Stamp()])
    steady = [b - a for a, b in zip(stamps[STEADY_AFTER:], stamps[STEADY_AFTER + 1 :])]
    if int(os.environ.get("KERAS_REPLICATOR_WORKER_INDEX", "0")) == 0:
        result = {"first_step": stamps[0] - start, "step": statistics.median(steady)}
        print("RESULT " + json.dumps(result), flush=True)


def measure(arm: str, model_name: str) -> dict:
    """Runs one arm in fresh processes; returns worker 0's result."""
    from keras_replicator.launch import run_workers

    command = [sys.executable, os.path.abspath(__file__), "--arm", arm]
    command += ["--model", model_name]
    if arm in TWO_PROCESS_ARMS:
        output = run_workers(command, 2, timeout=900, echo=False).workers[0].output
    else:
        output = subprocess.run(
            command, capture_output=True, text=True, timeout=900
        ).stdout
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise SystemExit(f"{arm!r} on {model_name} failed:\n{output[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def benchmark(models, rounds: int) -> dict:
    samples = {(m, a): [] for m in models for a in ARMS}
    for round_index in range(rounds):
        for model_name in models:
            for arm in ARMS:
                samples[(model_name, arm)].append(measure(arm, model_name))
        print(f"round {round_index + 1} of {rounds} done", file=sys.stderr, flush=True)
    table = {}
    for (model_name, arm), results in samples.items():
        speeds = [GLOBAL_BATCH / r["step"] for r in results]
        table.setdefault(model_name, {})[arm] = {
            "examples_per_s": statistics.median(speeds),
            "first_step_s": statistics.median(r["first_step"] for r in results),
        }
    return table


def report(table: dict) -> None:
    for model_name, arms in table.items():
        base = arms["plain"]
        print(f"\n{model_name}, global batch {GLOBAL_BATCH}, steady state")
        print(
            f"{'arm':<18} {'examples/s':>11} {'step / plain':>13} "
            f"{'speed / plain':>14} {'1st step s':>11} {'1st / plain':>12}"
        )
        for arm, row in arms.items():
            speed = row["examples_per_s"]
            print(
                f"{arm:<18} {speed:>11,.0f} {base['examples_per_s'] / speed:>13.3f} "
                f"{speed / base['examples_per_s']:>14.3f} {row['first_step_s']:>11.2f} "
                f"{row['first_step_s'] / base['first_step_s']:>12.2f}"
            )
        speed = {arm: row["examples_per_s"] for arm, row in arms.items()}
        first = {arm: row["first_step_s"] for arm, row in arms.items()}
        print(
            f"{model_name}: ours 1 device step = "
            f"{speed['plain'] / speed['ours 1 device']:.3f}x plain (stock "
            f"{speed['plain'] / speed['stock 1 device']:.3f}x); ours 2 workers = "
            f"{speed['ours 2 workers'] / speed['plain']:.3f}x one process, "
            f"{speed['ours 2 workers'] / speed['stock 2 workers']:.2f}x stock; "
            "first step 2 workers / 1 device = "
            f"{first['ours 2 workers'] / first['ours 1 device']:.2f}"
        )


def plot(table: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(table), figsize=(6 * len(table), 4))
    axes = axes if len(table) > 1 else [axes]
    for axis, (model_name, arms) in zip(axes, table.items()):
        base = arms["plain"]["examples_per_s"]
        names = list(arms)
        axis.barh(names, [arms[n]["examples_per_s"] / base for n in names])
        axis.axvline(1.0, color="black", linewidth=0.8)
        axis.invert_yaxis()
        axis.set_xlabel("fit examples/s / plain Keras (one process, 2 threads)")
        axis.set_title(f"{model_name}, global batch {GLOBAL_BATCH}")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=["mlp", "resnet20"])
    parser.add_argument("--png", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        run_arm(args.arm, args.model)
        return
    table = benchmark(args.models, args.rounds)
    report(table)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(table, file, indent=1)
    if args.png:
        plot(table, args.png)


if __name__ == "__main__":
    main()
