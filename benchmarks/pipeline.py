"""GPipe on 2 logical CPUs: throughput vs micro-batches, memory vs re-materialization.

Every measurement runs in its own process (peak memory is per process; thread
settings are fixed at start-up), in rotating order over several rounds; medians.

Throughput: K = 2 stages, one intra-op thread per op and two inter-op threads, so a
single chain of ops keeps one core busy and only independent work (stage k on micro-
batch i while stage k + 1 is on i - 1) fills the second. Baselines in the same run:
the plain model on one device (1 intra-op thread, and 2, which is what a user would
run on 2 cores). Two limit rows say what the pipeline can reach here: the *parallel
ceiling*, two independent 1-thread processes training at once (their summed
samples/s over one alone: what 2 cores give to two fully independent chains), and
the *micro-batch efficiency*, the plain model's samples/s at batch B/8 over batch B
(smaller matmuls, and per-step work that does not shrink with the batch). Their
product estimates GPipe M=8 (pessimistic at small batches: a plain step at B/8 pays
the optimizer update and the per-step overhead 8 times, GPipe once per mini-batch).
Shown at batch 4096 (512-row micro-batches) and 512 (64-row micro-batches).

Memory: TF's CPU allocator switched to its BFC allocator
(`TF_CPU_ALLOCATOR_USE_BFC=true`), whose statistics give the peak bytes in use
during training steps above the bytes held before them (weights, optimizer state).
The cap row sets `TF_CPU_BFC_MEM_LIMIT_IN_MB` and deepens a model until a training
step runs out of memory, with and without re-materialization.

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


def build(kind: str, depth: int | None = None, width: int = 512):
    import keras

    keras.utils.set_random_seed(0)
    if kind in ("mlp", "deep_mlp"):
        depth = depth or (16 if kind == "mlp" else 24)
        layers = [keras.Input((width,))]
        layers += [keras.layers.Dense(width, activation="relu") for _ in range(depth)]
        layers += [keras.layers.Dense(10)]
        return keras.Sequential(layers), (width,), 10
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
    model, shape, classes = build(
        config["model"], config.get("depth"), config.get("width", 512)
    )
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
    try:
        for _ in range(2):
            model.train_on_batch(x, y)
    except tf.errors.ResourceExhaustedError:
        return {**config, "trains": False}
    pathlib.Path("/proc/self/clear_refs").write_text("5")  # resets the peak RSS
    before = _status("VmRSS")
    allocator = _allocator_tracks_memory(tf)
    if allocator:
        tf.config.experimental.reset_memory_stats("CPU:0")
        held = tf.config.experimental.get_memory_info("CPU:0")["current"]
    start = time.perf_counter()
    for _ in range(config["steps"]):
        model.train_on_batch(x, y)
    seconds = time.perf_counter() - start
    result = {
        **config,
        "trains": True,
        "samples_per_second": batch * config["steps"] / seconds,
        "rss_mb": (_status("VmHWM") - before) / 1024,
    }
    if allocator:
        peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
        result["allocator_mb"] = (peak - held) / 2**20
    return result


def _allocator_tracks_memory(tf) -> bool:
    """True when TF's CPU allocator is the BFC allocator, which keeps statistics.

    Both logical CPU devices allocate from the one process-wide CPU allocator, so
    `CPU:0`'s statistics cover both stages; checked here by allocating on `/cpu:1`.
    """
    if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC") != "true":
        return False
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    with tf.device("/cpu:1"):
        probe = tf.zeros((1024, 256))
    after = tf.config.experimental.get_memory_info("CPU:0")["current"]
    if after - before < probe.shape[0] * probe.shape[1] * 4:
        raise RuntimeError("CPU:0's allocator statistics do not cover /cpu:1")
    return True


def _status(field: str) -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def start(config: dict, env: dict | None = None) -> subprocess.Popen:
    env = dict(
        os.environ,
        MALLOC_MMAP_THRESHOLD_="65536",
        TF_CPP_MIN_LOG_LEVEL="3",
        **(env or {}),
    )
    return subprocess.Popen(
        [sys.executable, __file__, "--worker", json.dumps(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def result(process: subprocess.Popen, config: dict) -> dict:
    stdout, stderr = process.communicate(timeout=900)
    lines = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"worker failed for {config}:\n{stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def run(config: dict, env: dict | None = None) -> dict:
    return result(start(config, env), config)


def run_together(config: dict, copies: int = 2) -> float:
    """Samples/s of `copies` independent processes training at the same time."""
    processes = [start(config) for _ in range(copies)]
    return sum(result(p, config)["samples_per_second"] for p in processes)


BATCH = 4096  # 512-row micro-batches at M = 8
SMALL_BATCH = 512  # 64-row micro-batches at M = 8


def plain(batch: int, steps: int, intra: int = 1) -> dict:
    return {
        "model": "mlp",
        "batch": batch,
        "steps": steps,
        "checkpoint": "never",
        "pipeline": False,
        "M": 1,
        "intra": intra,
    }


def gpipe(batch: int, steps: int, m: int) -> dict:
    return {**plain(batch, steps), "pipeline": True, "M": m}


def throughput_configs(steps: int) -> dict:
    """name -> (config, copies run at once). `steps` is for the large batch."""
    small_steps = steps * BATCH // SMALL_BATCH
    configs = {
        "plain, 1 thread/op": (plain(BATCH, steps), 1),
        "plain, 2 threads/op": (plain(BATCH, steps, intra=2), 1),
    }
    for m in (1, 2, 4, 8):
        configs[f"GPipe K=2 M={m}"] = (gpipe(BATCH, steps, m), 1)
    configs["2 plain processes at once, 1 thread/op"] = (plain(BATCH, steps), 2)
    configs["small batch: plain, 1 thread/op"] = (plain(SMALL_BATCH, small_steps), 1)
    configs["small batch: plain, 1 thread/op, batch 64"] = (
        plain(SMALL_BATCH // 8, small_steps * 8),
        1,
    )
    configs["small batch: 2 plain processes at once"] = (
        plain(SMALL_BATCH, small_steps),
        2,
    )
    for m in (1, 8):
        configs[f"small batch: GPipe K=2 M={m}"] = (
            gpipe(SMALL_BATCH, small_steps, m),
            1,
        )
    return configs


BFC = {"TF_CPU_ALLOCATOR_USE_BFC": "true"}


MEMORY_MODELS = {
    # name: (model, width, batch). Activations dominate the first two, as in
    # GPipe's setting; in the third, weight gradients weigh as much as activations
    # (each micro-batch's weight gradient is held until the tape sums all M).
    "deep_mlp 24x256, batch 4096": ("deep_mlp", 256, 4096),
    "resnet 8 blocks, batch 64": ("resnet", None, 64),
    "deep_mlp 24x512, batch 2048": ("deep_mlp", 512, 2048),
}


def memory_configs() -> dict:
    configs = {}
    for label, (model, width, batch) in MEMORY_MODELS.items():
        for checkpoint in ("never", "except_last", "always"):
            configs[f"{label}, M=4, checkpoint={checkpoint}"] = {
                "model": model,
                "width": width or 512,
                "batch": batch,
                "steps": 2,
                "pipeline": True,
                "M": 4,
                "checkpoint": checkpoint,
                "intra": 1,
            }
    return configs


CAP_MB = 256
CAP_DEPTHS = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def deepest_trainable(checkpoint: str) -> tuple[int, list]:
    """The deepest 256-wide MLP (batch 4096, K=2, M=4) that trains under CAP_MB."""
    deepest, tried = 0, []
    for depth in CAP_DEPTHS:
        config = {
            "model": "mlp",
            "depth": depth,
            "width": 256,
            "batch": 4096,
            "steps": 1,
            "pipeline": True,
            "M": 4,
            "checkpoint": checkpoint,
            "intra": 1,
        }
        env = {**BFC, "TF_CPU_BFC_MEM_LIMIT_IN_MB": str(CAP_MB)}
        trains = run(config, env)["trains"]
        tried.append((depth, trains))
        if not trains:
            break
        deepest = depth
    return deepest, tried


def main(rounds: int, steps: int) -> None:
    configs = throughput_configs(steps)
    names = list(configs)
    speeds = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            config, copies = configs[name]
            speed = run_together(config, copies)
            speeds[name].append(speed)
            print(f"round {r} {name}: {speed:.0f} samples/s", flush=True)
    median = {name: statistics.median(v) for name, v in speeds.items()}
    memory = {name: run(c, BFC) for name, c in memory_configs().items()}
    cap = {mode: deepest_trainable(mode) for mode in ("never", "always")}
    table = _tables(names, median, memory, cap)
    print(table)
    (HERE / "pipeline.json").write_text(
        json.dumps(
            {
                "speeds": speeds,
                "median": median,
                "memory": memory,
                "cap_mb": CAP_MB,
                "deepest": cap,
            },
            indent=1,
        )
    )
    _plot(names, median, memory, cap)


def replot() -> None:
    """Prints the tables and redraws the PNG from `pipeline.json` (no measuring)."""
    saved = json.loads((HERE / "pipeline.json").read_text())
    names, median = list(saved["median"]), saved["median"]
    cap = {mode: tuple(value) for mode, value in saved["deepest"].items()}
    print(_tables(names, median, saved["memory"], cap))
    _plot(names, median, saved["memory"], cap)


def _tables(names, median, memory, cap) -> str:
    def ratio(name, ref):
        return f"{median[name] / median[ref]:.2f}x"

    lines = [
        f"| configuration (batch {BATCH} unless named) | samples/s | vs GPipe M=1 "
        "| vs plain, 1 thread/op |",
        "|---|---|---|---|",
    ]
    for name in names:
        small = name.startswith("small batch")
        m1 = "small batch: GPipe K=2 M=1" if small else "GPipe K=2 M=1"
        one = "small batch: plain, 1 thread/op" if small else "plain, 1 thread/op"
        lines.append(
            f"| {name} | {median[name]:.0f} | {ratio(name, m1)} | {ratio(name, one)} |"
        )
    lines += ["", "| limit | batch 4096 | batch 512 |", "|---|---|---|"]
    for label, big, small in (
        (
            "2 cores, two independent processes (parallel ceiling)",
            ("2 plain processes at once, 1 thread/op", "plain, 1 thread/op"),
            (
                "small batch: 2 plain processes at once",
                "small batch: plain, 1 thread/op",
            ),
        ),
        (
            "micro-batch efficiency at M=8 (plain at B/8 vs B, per sample)",
            ("small batch: plain, 1 thread/op", "plain, 1 thread/op"),
            (
                "small batch: plain, 1 thread/op, batch 64",
                "small batch: plain, 1 thread/op",
            ),
        ),
    ):
        lines.append(f"| {label} | {ratio(*big)} | {ratio(*small)} |")
    bound = {}
    for key, (together, one, micro, m1) in {
        "big": (
            "2 plain processes at once, 1 thread/op",
            "plain, 1 thread/op",
            "small batch: plain, 1 thread/op",
            "GPipe K=2 M=1",
        ),
        "small": (
            "small batch: 2 plain processes at once",
            "small batch: plain, 1 thread/op",
            "small batch: plain, 1 thread/op, batch 64",
            "small batch: GPipe K=2 M=1",
        ),
    }.items():
        bound[key] = median[together] * median[micro] / median[one] / median[m1]
    lines.append(
        "| M=8 estimate: ceiling x efficiency, vs GPipe M=1 "
        f"| {bound['big']:.2f}x | {bound['small']:.2f}x |"
    )
    lines.append(
        "| M=8 measured, vs GPipe M=1 "
        f"| {ratio('GPipe K=2 M=8', 'GPipe K=2 M=1')} "
        f"| {ratio('small batch: GPipe K=2 M=8', 'small batch: GPipe K=2 M=1')} |"
    )
    lines += [
        "",
        "| memory run (K=2) | peak allocator MB above the weights | vs never |",
        "|---|---|---|",
    ]
    for name, r in memory.items():
        ref = memory[name.split("checkpoint=")[0] + "checkpoint=never"]
        lines.append(
            f"| {name} | {r['allocator_mb']:.0f} "
            f"| {r['allocator_mb'] / ref['allocator_mb']:.2f}x |"
        )
    lines += [
        "",
        f"| under a {CAP_MB} MB allocator cap (256-wide MLP, batch 4096, K=2, M=4) "
        "| deepest that trains | tried (depth: trains) |",
        "|---|---|---|",
    ]
    for mode, (deepest, tried) in cap.items():
        tried_text = ", ".join(f"{d}: {'yes' if ok else 'no'}" for d, ok in tried)
        lines.append(f"| checkpoint={mode} | {deepest} layers | {tried_text} |")
    return "\n".join(lines)


def _plot(names, median, memory, cap) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(
        1,
        3,
        figsize=(20, 6),
        layout="constrained",
        gridspec_kw={"width_ratios": [4, 4, 1.5]},
    )
    a.barh(names, [median[n] for n in names])
    a.set_xlabel("samples/s (median; 'at once' rows: both processes summed)")
    a.set_title(f"K=2 stages on 2 logical CPUs, 16x512 MLP, batch {BATCH}")
    b.barh(list(memory), [r["allocator_mb"] for r in memory.values()])
    b.set_xlabel("peak allocator MB in a step, above the weights")
    b.set_title("re-materialization (K=2, M=4)")
    modes = list(cap)
    c.bar(modes, [cap[m][0] for m in modes])
    c.set_xlabel("checkpoint")
    c.set_ylabel("layers")
    c.set_title(f"{CAP_MB} MB allocator cap:\ndeepest 256-wide MLP\nthat trains")
    fig.savefig(HERE / "pipeline.png", dpi=100)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--replot", action="store_true", help="redraw from pipeline.json, no runs"
    )
    args = parser.parse_args()
    if args.replot:
        replot()
    elif args.worker:
        print("RESULT " + json.dumps(worker(json.loads(args.worker))), flush=True)
    else:
        main(args.rounds, args.steps)
