"""GPipe on 2 logical CPUs: throughput vs micro-batches, memory vs re-materialization.

Every measurement runs in its own process (peak memory is per process; thread
settings are fixed at start-up). Throughput: K = 2 stages, one intra-op thread per op
and two inter-op threads, so each stage's ops run on their own core and only the
pipeline (stage k on micro-batch i while stage k + 1 is on i - 1) makes both cores
work; the configurations are measured in rotating order over several rounds and the
median taken, with the plain model (one device, same threads; and one device with 2
intra-op threads, which is what a user would run on 2 cores) as baselines.
Memory: peak RSS during training steps minus the RSS before them (after the first,
compiling step), with `MALLOC_MMAP_THRESHOLD_` fixed so freed tensors return to the OS.

    python benchmarks/pipeline.py            # table + benchmarks/pipeline.png/.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).parent


def build(kind: str):
    import keras

    keras.utils.set_random_seed(0)
    if kind == "mlp":
        layers = [keras.Input((512,))]
        layers += [keras.layers.Dense(512, activation="relu") for _ in range(16)]
        layers += [keras.layers.Dense(10)]
        return keras.Sequential(layers), (512,), 10
    if kind == "deep_mlp":
        layers = [keras.Input((512,))]
        layers += [keras.layers.Dense(512, activation="relu") for _ in range(24)]
        layers += [keras.layers.Dense(10)]
        return keras.Sequential(layers), (512,), 10
    if kind == "resnet":
        layers = [keras.Input((32, 32, 3)), keras.layers.Conv2D(32, 3, padding="same")]
        layers += [ResidualBlock(32) for _ in range(8)]
        layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)]
        return keras.Sequential(layers), (32, 32, 3), 10
    raise ValueError(kind)


def _residual_block_class():
    import keras

    class ResidualBlock(keras.layers.Layer):
        def __init__(self, filters, **kwargs):
            super().__init__(**kwargs)
            self.conv1 = keras.layers.Conv2D(filters, 3, padding="same")
            self.bn1 = keras.layers.BatchNormalization()
            self.conv2 = keras.layers.Conv2D(filters, 3, padding="same")
            self.bn2 = keras.layers.BatchNormalization()

        def call(self, x, training=None):
            h = keras.activations.relu(self.bn1(self.conv1(x), training=training))
            h = self.bn2(self.conv2(h), training=training)
            return keras.activations.relu(x + h)

    return ResidualBlock


def worker(config: dict) -> dict:
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(config["intra"])
    tf.config.threading.set_inter_op_parallelism_threads(2)
    import keras_replicator as kr

    kr.split_cpu(2)
    import keras
    import numpy as np

    global ResidualBlock
    ResidualBlock = _residual_block_class()
    model, shape, classes = build(config["model"])
    if config["pipeline"]:
        n = len(model.layers)
        model = kr.pipeline.GPipe(
            model,
            balance=[n // 2, n - n // 2],
            num_microbatches=config["M"],
            checkpoint=config["checkpoint"],
        )
    model.compile(
        optimizer=keras.optimizers.SGD(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    batch = config["batch"]
    rng = np.random.default_rng(0)
    x = tf.constant(rng.random((batch, *shape)).astype("float32"))
    y = tf.constant(rng.integers(0, classes, batch))
    for _ in range(2):
        model.train_on_batch(x, y)
    pathlib.Path("/proc/self/clear_refs").write_text("5")  # resets the peak RSS
    before = _status("VmRSS")
    start = time.perf_counter()
    for _ in range(config["steps"]):
        model.train_on_batch(x, y)
    seconds = time.perf_counter() - start
    return {
        **config,
        "samples_per_second": batch * config["steps"] / seconds,
        "activation_mb": (_status("VmHWM") - before) / 1024,
    }


def _status(field: str) -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def run(config: dict) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"worker failed for {config}:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def throughput_configs(steps: int) -> dict:
    base = {"model": "mlp", "batch": 512, "steps": steps, "checkpoint": "never"}
    configs = {
        "plain, 1 thread/op": {**base, "pipeline": False, "M": 1, "intra": 1},
        "plain, 2 threads/op": {**base, "pipeline": False, "M": 1, "intra": 2},
    }
    for m in (1, 2, 4, 8):
        configs[f"GPipe K=2 M={m}"] = {**base, "pipeline": True, "M": m, "intra": 1}
    return configs


def memory_configs() -> dict:
    configs = {}
    for model, batch in (("deep_mlp", 2048), ("resnet", 64)):
        for checkpoint in ("never", "always"):
            configs[f"{model} M=4 checkpoint={checkpoint}"] = {
                "model": model,
                "batch": batch,
                "steps": 2,
                "pipeline": True,
                "M": 4,
                "checkpoint": checkpoint,
                "intra": 1,
            }
    return configs


def main(rounds: int, steps: int) -> None:
    configs = throughput_configs(steps)
    names = list(configs)
    speeds = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            speeds[name].append(run(configs[name])["samples_per_second"])
            print(f"round {r} {name}: {speeds[name][-1]:.0f} samples/s", flush=True)
    median = {name: statistics.median(v) for name, v in speeds.items()}
    memory = {name: run(c)["activation_mb"] for name, c in memory_configs().items()}
    lines = ["| configuration | samples/s | vs GPipe M=1 | vs plain (2 threads) |"]
    lines.append("|---|---|---|---|")
    for name in names:
        lines.append(
            f"| {name} | {median[name]:.0f} | "
            f"{median[name] / median['GPipe K=2 M=1']:.2f}x | "
            f"{median[name] / median['plain, 2 threads/op']:.2f}x |"
        )
    lines += [
        "",
        "| memory run | peak activation memory (MB) | vs no re-materialization |",
    ]
    lines.append("|---|---|---|")
    for name, mb in memory.items():
        ref = memory[name.replace("always", "never")]
        lines.append(f"| {name} | {mb:.0f} | {mb / ref:.2f}x |")
    table = "\n".join(lines)
    print(table)
    (HERE / "pipeline.json").write_text(
        json.dumps({"speeds": speeds, "median": median, "memory": memory}, indent=1)
    )
    _plot(names, median, memory)


def _plot(names, median, memory) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4))
    a.barh(names, [median[n] for n in names])
    a.set_xlabel("samples/s (median)")
    a.set_title("K=2 stages on 2 logical CPUs, 16x512 MLP, batch 512")
    b.barh(list(memory), list(memory.values()))
    b.set_xlabel("peak activation memory (MB, RSS)")
    b.set_title("re-materialization")
    fig.tight_layout()
    fig.savefig(HERE / "pipeline.png", dpi=100)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(json.loads(args.worker))), flush=True)
    else:
        main(args.rounds, args.steps)
