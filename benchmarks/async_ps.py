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

    python -m benchmarks.async_ps [--rounds 2] [--epochs 20] [--slowdown 3]

Prints the table and async / sync (target >= 1.5x examples/s with the straggler);
saves benchmarks/async_ps.png and benchmarks/async_ps.json.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import harness

# F401: names tests/benchmarks/test_async_ps.py reads from this script.
from benchmarks._async_ps_job import _sleep_each, job, pipeline, task_of  # noqa: F401
from benchmarks._async_ps_report import plot, progress, table
from benchmarks._async_ps_stats import (
    ARMS,
    RESULT,
    STRAGGLER,
    SYNC_STEPS,
    WORKERS,
    interval_rate,
    median_interval,
    parse_stamps,
    sleep_for,
    steady_epoch_seconds,  # noqa: F401
    summarize,
)

HERE = pathlib.Path(__file__).parent


def run_arm(arm: str, args, sleep_s: float, workdir: str) -> dict:
    """Starts one arm in fresh processes; returns its numbers and stamp intervals."""
    from keras_replicator.launch import launch, run_workers

    mode, level = ARMS[arm]
    sleep_us = int(1e6 * sleep_s) if level else 0
    stamp_file = os.path.join(workdir, f"stamps-{time.monotonic_ns()}.txt")
    command = harness.module_command(
        "benchmarks.async_ps", "--job", mode, "--epochs", args.epochs,
        "--sleep-us", sleep_us, "--stamp-file", stamp_file, "--lr", args.lr,
    )  # fmt: skip
    env = harness.module_environment({"TF_CPP_MIN_LOG_LEVEL": "2"})
    if mode == "one":
        numbers = harness.fresh_process(
            command, f"arm {arm!r}", env=env, timeout=args.timeout, tag=RESULT,
            cwd=workdir,
        )  # fmt: skip
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
        chief = result.workers[result.job_index or 0]
        output = chief.output if result.ok else result.describe_failure()
        numbers = harness.read_result(output, f"arm {arm!r}", RESULT)
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
            progress(arm, 0, runs[arm][-1], args.slowdown)
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
            for arm in harness.rotate(names, number * 3):
                if number == 0 and arm in ("sync", "async"):
                    continue  # the calibration runs are round 0 of these arms
                level = ARMS[arm][1]
                runs[arm].append(run_arm(arm, args, sleeps.get(level, 0.0), workdir))
                progress(arm, number, runs[arm][-1], args.slowdown)
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
    harness.write_json(out.with_suffix(".json"), record)
    plot(summary, out.with_suffix(".png"), args.slowdown)
    print(f"saved {out.with_suffix('.png')} and {out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
