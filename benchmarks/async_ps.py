"""Async parameter servers vs synchronous all-reduce, with one worker slowed 3x.

The same digits job (scikit-learn's 8x8 digits, MLP 64-64-10, Adam, 32 examples per
worker step, 2 workers on 127.0.0.1) runs as:

* `sync`: `kr.MultiWorkerReplicator` on the 2 workers (global batch 64, every step
  waits for both workers' gradients);
* `async`: `kr.ParameterServerReplicator`, a chief + the same 2 workers + 1 ps
  (each worker applies its own batch's gradient when it is done);
* `one device`: plain Keras `fit` at batch 32 in one process (accuracy reference).

The straggler: worker 1's input pipeline sleeps before every batch, so that its
batches arrive `--slowdown` (3) times as far apart as a normal step's (one batch is
prefetched, so the sleep overlaps the step and sets the interval on its own).
Under PS training the dataset function is traced once, on the chief, and the same
graph runs on every worker, so which worker straggles is decided at run time on the
worker: the graph reads its own process's `TF_CONFIG` from `/proc/self/environ`
(Linux). The sleep is TensorFlow's `SleepDataset` op (`tf.raw_ops`; tf.data has no
public sleep transformation), and each pipeline appends `task, time` per batch to a
stamp file, from which the straggler's real slowdown is measured in every run.

Calibration (same run, first): round 0 of the no-straggler `sync` and `async` arms
measures each mode's normal step (median batch interval). The straggler then sleeps
`slowdown` x the normal sync step ("straggler 3x sync step": sync runs 3x slower) or
`slowdown` x the normal async step ("3x async step"); both levels run in both modes.
The table's measured slowdown is the straggler's batch interval over the normal step
of the same mode. On a 2-core machine the fast async worker also speeds up while
the straggler sleeps (fewer processes want the cores); the table shows its step.

Timing is steady state: the median epoch time over epochs 2..N (epoch 1 holds
tracing and start-up); an epoch is the same 1,344 examples in every arm (21 sync
steps of 64, 42 async steps of 32). Arms are fresh process groups, interleaved
round by round in rotating order; medians over rounds. Final accuracy is
`evaluate` on the 397 held-out digits after the last epoch.

    python benchmarks/async_ps.py [--rounds 2] [--epochs 20] [--slowdown 3]

Prints the table and async / sync (target >= 1.5x examples/s with the straggler);
saves benchmarks/async_ps.png and benchmarks/async_ps.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HERE = pathlib.Path(__file__).parent
BATCH = 32  # examples per worker step, in every arm
WORKERS = 2
STRAGGLER = "worker 1"
TRAIN = 1400  # digits 0..1399 (fixed permutation) train, the other 397 test
SYNC_STEPS = TRAIN // (BATCH * WORKERS)  # 21 steps of 64 = 1,344 examples
EPOCH_EXAMPLES = SYNC_STEPS * BATCH * WORKERS
# Arms: (mode, straggler level). The straggler's per-batch delay is `slowdown` x the
# normal step of sync (level "sync": sync then runs `slowdown` x slower) or of async
# (level "async": the straggler is `slowdown` x slower than async's fast worker).
ARMS = {
    "one device": ("one", None),
    "sync": ("sync", None),
    "async": ("async", None),
    "sync, straggler S": ("sync", "sync"),
    "async, straggler S": ("async", "sync"),
    "sync, straggler A": ("sync", "async"),
    "async, straggler A": ("async", "async"),
}
RESULT = "RESULT "
# The task of this process as TF_CONFIG names it ("worker 1"), read at run time.
_TASK_PATTERN = r'(?s).*"type": "(\w+)", "index": (\d+).*'


# --------------------------------------------------------------------- pure helpers
def parse_stamps(text: str) -> dict[str, list[float]]:
    """`task microseconds` lines -> {task: sorted seconds}."""
    stamps: dict[str, list[float]] = {}
    for line in text.splitlines():
        parts = line.rsplit(" ", 1)
        if len(parts) == 2 and parts[1].isdigit():
            stamps.setdefault(parts[0].strip('"'), []).append(int(parts[1]) / 1e6)
    return {task: sorted(times) for task, times in stamps.items()}


def median_interval(times: list[float], skip: int) -> float:
    """Median gap between consecutive stamps after the first `skip` (warm-up)."""
    steady = times[skip:]
    if len(steady) < 3:
        raise ValueError(
            f"`times` must hold at least {skip + 3} stamps to measure a steady "
            f"interval. Received: {len(times)} stamps. Train more epochs."
        )
    return statistics.median(b - a for a, b in zip(steady, steady[1:]))


def steady_epoch_seconds(epoch_ends: list[float]) -> float:
    """Median epoch time, epochs 2..N (`epoch_ends[0]` is the start of training)."""
    durations = [b - a for a, b in zip(epoch_ends, epoch_ends[1:])]
    if len(durations) < 2:
        raise ValueError(
            "`epoch_ends` must hold the start and at least 2 epoch ends. "
            f"Received: {len(epoch_ends)} times. Use `--epochs 3` or more."
        )
    return statistics.median(durations[1:])


def interval_rate(mode: str, intervals: dict[str, float]) -> float:
    """Examples/s from median batch intervals (no epoch ends, no slow outliers).

    Sync steps take every worker's batch at once; async workers add up.
    """
    if mode == "async":
        return BATCH * sum(1 / seconds for seconds in intervals.values())
    return BATCH * len(intervals) / statistics.median(intervals.values())


def sleep_for(normal_step_seconds: float, slowdown: float) -> float:
    """The straggler's per-batch sleep: `slowdown` x a normal step (seconds)."""
    if slowdown < 1:
        raise ValueError(
            f"`slowdown` must be at least 1. Received: slowdown={slowdown}. "
            "Use 3 for the issue's 3x straggler."
        )
    return slowdown * normal_step_seconds


def summarize(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Median over rounds of every arm's numbers."""
    keys = ("examples_per_s", "updates_per_s", "accuracy", "straggler_factor")
    keys += ("sleep_s", "step_s", "fast_step_s", "straggler_step_s")
    keys += ("interval_examples_per_s",)
    summary = {}
    for arm, results in runs.items():
        summary[arm] = {
            key: statistics.median(r[key] for r in results)
            for key in keys
            if results and all(r.get(key) is not None for r in results)
        }
        summary[arm]["rounds"] = len(results)
    return summary


def label(arm: str, slowdown: float) -> str:
    """The printed name of an arm ("async, straggler 3x sync step")."""
    mode, level = ARMS[arm]
    if level is None:
        return arm
    return f"{mode}, straggler {slowdown:g}x {level} step"


def table(summary: dict[str, dict], slowdown: float) -> str:
    """A Markdown table: one row per arm; async against sync with the same straggler."""
    lines = [
        "| arm | straggler sleep | step ms, worker 0 / 1 | straggler / normal step "
        "| examples/s | async / sync | examples/s from batch intervals | async / sync "
        "| updates/s | test accuracy |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, (mode, level) in ARMS.items():
        row = summary.get(arm)
        if not row or "examples_per_s" not in row:
            continue
        base = summary.get(arm.replace("async", "sync"), {})
        ratios = [
            f"{row[key] / base[key]:.2f}x" if mode == "async" and key in base else ""
            for key in ("examples_per_s", "interval_examples_per_s")
        ]
        steps = (
            f"{1e3 * row['fast_step_s']:.1f} / {1e3 * row['straggler_step_s']:.1f}"
            if "fast_step_s" in row
            else f"{1e3 * row['step_s']:.1f}"
        )
        factor = f"{row['straggler_factor']:.2f}x" if level else ""
        sleep = f"{1e3 * row['sleep_s']:.1f} ms" if level else ""
        lines.append(
            f"| {label(arm, slowdown)} | {sleep} | {steps} | {factor} | "
            f"{row['examples_per_s']:,.0f} | {ratios[0]} | "
            f"{row['interval_examples_per_s']:,.0f} | {ratios[1]} | "
            f"{row['updates_per_s']:,.1f} | {100 * row['accuracy']:.2f} % |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------- the job
def digits():
    import numpy as np
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16).astype("float32")
    y = data.target.astype("int32")
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    return x[:TRAIN], y[:TRAIN], x[TRAIN:], y[TRAIN:]


def task_of(environ):
    """The task TF_CONFIG names in a process environment ("worker 1"), else "local".

    `environ` is a string tensor such as the contents of `/proc/self/environ`:
    read at run time, so the one traced graph tells the workers apart.
    """
    import tensorflow as tf

    found = tf.strings.regex_full_match(environ, _TASK_PATTERN)
    task = tf.strings.regex_replace(environ, _TASK_PATTERN, r"\1 \2")
    return tf.where(found, task, "local")


def _sleep_each(dataset, microseconds):
    import tensorflow as tf

    specs = tf.nest.flatten(dataset.element_spec)
    variant = tf.raw_ops.SleepDataset(
        input_dataset=tf.data.experimental.to_variant(dataset),
        sleep_microseconds=tf.cast(microseconds, tf.int64),
        output_types=[s.dtype for s in specs],
        output_shapes=[s.shape for s in specs],
    )
    return tf.data.experimental.from_variant(variant, dataset.element_spec)


def pipeline(x, y, *, sleep_us: int, stamp_file: str, shard=None):
    """Shuffled, repeated batches of 32; the straggler sleeps before each batch."""
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    if shard is not None:
        dataset = dataset.shard(*shard)
    dataset = dataset.shuffle(len(x)).repeat().batch(BATCH, drop_remainder=True)
    task = task_of(tf.io.read_file("/proc/self/environ"))
    if sleep_us:
        dataset = _sleep_each(dataset, tf.where(task == STRAGGLER, sleep_us, 0))
    if stamp_file:

        def stamp(features, labels):
            now = tf.cast(tf.timestamp() * 1e6, tf.int64)
            printed = tf.print(task, now, output_stream=f"file://{stamp_file}")
            with tf.control_dependencies([printed]):
                return tf.identity(features), tf.identity(labels)

        dataset = dataset.map(stamp)
    # One batch in flight: a worker's pipeline runs beside its step, so the
    # straggler's batch interval is its sleep, the same in both arms.
    return dataset.prefetch(1)


def build(learning_rate: float):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def job(mode: str, epochs: int, sleep_us: int, stamp_file: str, lr: float) -> None:
    """One arm, in the process(es) the parent started; prints one RESULT line."""
    import keras
    import tensorflow as tf

    import keras_replicator as kr

    if mode == "async":
        strategy = kr.ParameterServerReplicator()  # worker / ps tasks block here
    elif mode == "sync":
        strategy = kr.MultiWorkerReplicator(collective_timeout=120)
    else:
        strategy = tf.distribute.get_strategy()
    x, y, x_test, y_test = digits()
    ends: list[float] = []

    class EpochEnds(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            ends.append(time.perf_counter())

        def on_epoch_end(self, epoch, logs=None):
            ends.append(time.perf_counter())

    options = dict(sleep_us=sleep_us, stamp_file=stamp_file)
    if mode == "sync":
        # Learning rates: docs/async.md. Sync averages 2 batches of 32 (global 64):
        # the linear scaling rule doubles the one-device rate.
        with strategy.scope():
            model = build(kr.scaled_learning_rate(lr, BATCH * WORKERS, BATCH))

        def input_fn(context):
            shard = (context.num_input_pipelines, context.input_pipeline_id)
            return pipeline(x, y, shard=shard, **options)

        data = strategy.distribute_datasets_from_function(input_fn)
        steps = SYNC_STEPS
    elif mode == "async":
        # Each update is one worker's batch, about W - 1 updates stale: lr / W.
        with strategy.scope():
            model = build(lr / strategy.num_workers)
        data = lambda: pipeline(x, y, **options)  # noqa: E731 (a dataset function)
        steps = SYNC_STEPS * WORKERS
    else:
        model = build(lr)
        data = pipeline(x, y, **options)
        steps = SYNC_STEPS * WORKERS
    model.fit(
        data, epochs=epochs, steps_per_epoch=steps, verbose=0, callbacks=[EpochEnds()]
    )
    _, accuracy = model.evaluate(x_test, y_test, batch_size=128, verbose=0)
    epoch = steady_epoch_seconds(ends)
    result = {
        "mode": mode,
        "epoch_seconds": epoch,
        "examples_per_s": EPOCH_EXAMPLES / epoch,
        "updates_per_s": steps / epoch,
        "first_epoch_seconds": ends[1] - ends[0],
        "accuracy": float(accuracy),
    }
    if mode != "sync" or os.environ.get("KERAS_REPLICATOR_WORKER_INDEX") == "0":
        print(RESULT + json.dumps(result), flush=True)


# --------------------------------------------------------------------- the parent
def run_arm(arm: str, args, sleep_s: float, workdir: str) -> dict:
    """Starts one arm in fresh processes; returns its numbers and stamp intervals."""
    from keras_replicator.launch import launch, run_workers

    mode, level = ARMS[arm]
    sleep_us = int(1e6 * sleep_s) if level else 0
    stamp_file = os.path.join(workdir, f"stamps-{time.monotonic_ns()}.txt")
    command = [
        sys.executable, __file__, "--job", mode, "--epochs", str(args.epochs),
        "--sleep-us", str(sleep_us), "--stamp-file", stamp_file, "--lr", str(args.lr),
    ]  # fmt: skip
    env = {"TF_CPP_MIN_LOG_LEVEL": "2"}
    if mode == "one":
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=args.timeout,
            env={**os.environ, **env}, cwd=workdir,
        )  # fmt: skip
        output, failed = done.stdout + done.stderr, done.returncode != 0
    else:
        if mode == "sync":
            result = run_workers(
                command, WORKERS, timeout=args.timeout, env=env, cwd=workdir,
                echo=False,
            )  # fmt: skip
        else:
            result = launch(
                command, WORKERS, num_ps=1, timeout=args.timeout, env=env,
                cwd=workdir, echo=False, grace_seconds=3.0,
            )  # fmt: skip
        failed = not result.ok
        chief = result.workers[result.job_index or 0]
        output = result.describe_failure() if failed else chief.output
    lines = [ln for ln in output.splitlines() if ln.startswith(RESULT)]
    if failed or not lines:
        raise SystemExit(f"arm {arm!r} failed:\n{output[-4000:]}")
    numbers = json.loads(lines[-1][len(RESULT) :])
    stamps = parse_stamps(pathlib.Path(stamp_file).read_text())
    # Skip each worker's first epoch of batches (tracing, start-up).
    skip = SYNC_STEPS * (WORKERS if mode == "one" else 1)
    numbers["intervals"] = {
        task: median_interval(times, skip)
        for task, times in stamps.items()
        if task.startswith("worker") or task == "local"
    }
    numbers["sleep_s"] = sleep_us / 1e6
    numbers["step_s"] = statistics.median(numbers["intervals"].values())
    numbers["interval_examples_per_s"] = interval_rate(mode, numbers["intervals"])
    return numbers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--slowdown", type=float, default=3.0)
    parser.add_argument("--lr", type=float, default=3e-3, help="one-device Adam lr")
    parser.add_argument("--timeout", type=float, default=300, help="per arm, s")
    parser.add_argument("--out", default=str(HERE / "async_ps"))
    parser.add_argument("--job", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--sleep-us", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--stamp-file", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        job(args.job, args.epochs, args.sleep_us, args.stamp_file, args.lr)
        return
    sleep_for(1.0, args.slowdown)  # validates --slowdown before any run
    runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    names = list(ARMS)
    with tempfile.TemporaryDirectory(prefix="kr-async-bench-") as workdir:
        # Calibration = round 0 of the no-straggler arms: each mode's normal step.
        for arm in ("sync", "async"):
            runs[arm].append(run_arm(arm, args, 0.0, workdir))
            _progress(arm, 0, runs[arm][-1], args.slowdown)
        sleeps = {
            level: sleep_for(runs[level][0]["step_s"], args.slowdown)
            for level in ("sync", "async")
        }
        print(
            "straggler sleeps per batch: "
            + ", ".join(f"{1e3 * v:.1f} ms ({k} level)" for k, v in sleeps.items()),
            flush=True,
        )
        for number in range(args.rounds):
            shift = number * 3 % len(names)
            for arm in names[shift:] + names[:shift]:
                if number == 0 and arm in ("sync", "async"):
                    continue  # the calibration runs are round 0 of these arms
                level = ARMS[arm][1]
                runs[arm].append(run_arm(arm, args, sleeps.get(level, 0.0), workdir))
                _progress(arm, number, runs[arm][-1], args.slowdown)
    # The straggler's measured slowdown: its batch interval / the normal step of
    # the same mode (the no-straggler runs), and the fast worker's step.
    normal = {
        mode: statistics.median(r["step_s"] for r in runs[mode])
        for mode in ("sync", "async")
    }
    for arm, (mode, level) in ARMS.items():
        for r in runs[arm]:
            if mode in normal:
                r["fast_step_s"] = r["intervals"]["worker 0"]
                r["straggler_step_s"] = r["intervals"][STRAGGLER]
            if level:
                r["straggler_factor"] = r["straggler_step_s"] / normal[mode]
    summary = summarize(runs)
    text = table(summary, args.slowdown)
    ratios = {
        level: summary[f"async, straggler {level}"]["examples_per_s"]
        / summary[f"sync, straggler {level}"]["examples_per_s"]
        for level in ("S", "A")
    }
    plain = summary["async"]["examples_per_s"] / summary["sync"]["examples_per_s"]
    print()
    print(text)
    print(
        f"\nasync / sync, examples/s: {ratios['S']:.2f}x with the straggler at "
        f"{args.slowdown:g}x the sync step (target >= 1.5x), {ratios['A']:.2f}x at "
        f"{args.slowdown:g}x the async step, {plain:.2f}x without a straggler"
    )
    out = pathlib.Path(args.out)
    record = {
        "args": vars(args),
        "sleeps_s": sleeps,
        "summary": summary,
        "ratios": {**ratios, "none": plain},
        "runs": runs,
    }
    out.with_suffix(".json").write_text(json.dumps(record, indent=1))
    _plot(summary, out.with_suffix(".png"), args.slowdown)
    print(f"saved {out.with_suffix('.png')} and {out.with_suffix('.json')}")


def _progress(arm, number, result, slowdown):
    print(
        f"round {number} {label(arm, slowdown):<32} "
        f"{result['examples_per_s']:7,.0f} examples/s  "
        f"accuracy {100 * result['accuracy']:.2f} %  batch intervals "
        + ", ".join(f"{t} {1e3 * s:.1f} ms" for t, s in result["intervals"].items()),
        flush=True,
    )


def _plot(summary, path, slowdown) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [arm for arm in ARMS if "examples_per_s" in summary.get(arm, {})]
    names = [label(arm, slowdown) for arm in arms]
    colors = [
        {"one": "grey", "sync": "C0", "async": "C1"}[ARMS[arm][0]] for arm in arms
    ]
    fig, (speed, accuracy) = plt.subplots(1, 2, figsize=(13, 4))
    bars = speed.barh(names, [summary[a]["examples_per_s"] for a in arms], color=colors)
    speed.bar_label(bars, fmt="{:,.0f}", padding=2)
    speed.margins(x=0.12)
    speed.set_xlabel("examples/s (steady state, median over rounds)")
    speed.set_title("digits MLP, 2 workers on 127.0.0.1 (worker 1 = straggler)")
    speed.invert_yaxis()
    bars = accuracy.barh(
        names, [100 * summary[a]["accuracy"] for a in arms], color=colors
    )
    accuracy.bar_label(bars, fmt="{:.2f} %", padding=2)
    accuracy.set_xlim(85, 100)
    accuracy.set_xlabel("digits test accuracy after training (%)")
    accuracy.set_yticklabels([])
    accuracy.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
