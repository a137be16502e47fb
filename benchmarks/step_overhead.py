"""What does a distributed `fit` step cost over a plain Keras step? (issues 23, 36)

Each arm trains in fresh processes, arms interleaved round by round, so the
machine's drift hits all of them alike; each number is the median over rounds of
the median interval between batches after the first 10 (steady state). Time to
first step (from `fit` to the end of the first batch: tracing, iterator set-up,
the first all-reduce) is reported separately.

Every row is reported against its same-run ceiling, so the targets do not depend
on the machine's speed (issue 36):

* one-process arms (`plain`, `stock 1 device`, `ours 1 device`): `step / plain`,
  the step time over `plain`'s (lower is better; target: ours 1 device <= 1.05);
* two-process arms: `speed / 2 plain`, examples/s over `2 plain processes`'
  (higher is better; target: ours 2 workers >= 0.90 for the MLPs, >= 0.95 for
  ResNet-20);
* time to first step on 2 workers / ours 1 device's: target <= 1.2.

Arms, at each model's global batch:

* `plain`: Keras `fit` with no strategy, one process with 2 threads (the
  one-process ceiling);
* `stock 1 device` / `ours 1 device`: `tf.distribute.MirroredStrategy(["/cpu:0"])`
  / `kr.MultiDeviceReplicator(devices=["/cpu:0"])`, same process shape;
* `ours 2 workers`: `kr.MultiWorkerReplicator()` (socket ring, 16 MB buckets), 2
  processes with 1 thread each on 127.0.0.1, half the global batch each;
* `stock 2 workers`: TensorFlow's own collectives with stock packing (one pack),
  `kr.AllReduceOptions(transport="collective", bucket_mb=0)`, same processes.
  Stock Keras `fit` on `tf.distribute.MultiWorkerMirroredStrategy` itself does not
  run (keras-team/keras#20585: "Attempt to convert a value (PerReplica...)"), so
  stock's communication is measured under our Keras integration;
* `2 plain processes`: two plain `fit`s of half the global batch at the same
  time, no communication: the ceiling of any data-parallel transport on these
  cores;
* `ours 2 workers, no communication` (diagnostic, only with `--arms`): `ours 2
  workers` whose ring all-reduces return each worker's own values (wrong numbers):
  everything the step does but communicate, so the rest of the gap to the ceiling
  is the communication's (issue 36);
* `ours 2 workers, 16 MB buckets` (diagnostic, only with `--arms`): `ours 2
  workers` with `kr.AllReduceOptions(bucket_mb=16)`, the default before the
  default followed the executor (one buffer per dtype on a worker with one
  inter-op thread, as here; issue 36).
* `2 plain processes, in lockstep` (diagnostic, only with `--arms`): the two
  plain `fit`s of `2 plain processes`, made to start every batch together (one
  byte each way over 127.0.0.1 before each batch, nothing else shared): a
  synchronous step with no communication, the ceiling of any synchronous
  data-parallel trainer on these cores (issue 36).

    python -m benchmarks.step_overhead [--rounds 3]
        [--models mlp small_mlp resnet20] [--arms ARM ...] [--diagnose]
        [--json PATH] [--png benchmarks/step_overhead.png]

`--arms` runs a subset (`plain` and `2 plain processes` are always added: every
ratio needs them). `--diagnose` adds, per arm (worker 0's process on 2 workers),
the median `train_function` call per batch and the Keras loop between calls (from
`on_train_batch_begin/end` stamps), and the CPU time per steady step of each
thread group (`/proc/self/task/*/stat`, grouped by thread name), which shows
background threads' cost that op-time profiles miss. On the socket ring it
also times worker 0's ring calls: their seconds in the first step and per
steady step (a call counts in the step it ends in; waiting for the other worker
included). `--json` keeps every
round's raw numbers, every ratio, the medians and each target's met/missed.
One arm's process is `_step_overhead_arm.py`; the tables and the plot are
`_step_overhead_report.py`.

Models:

* `mlp`: the 6.3M-parameter MLP 784-2048-2048-256-10 of `allreduce.py --fit`,
  global batch 256 (25 MB of gradients a step, communication-bound on 2 workers);
* `small_mlp`: 784-2048-2048-1024-10, global batch 128 (~7.9M parameters, ~32 MB
  of gradients): a short step, where fixed per-step costs show;
* `resnet20`: ResNet-20 on 32x32x3, global batch 256 (compute-bound).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import harness
from benchmarks._step_overhead_arm import (
    BUCKETS_16MB,
    GLOBAL_BATCH,
    LOCKSTEP,
    NO_COMMUNICATION,
    STEADY_AFTER,
    STEPS,
    TWO_PROCESS_ARMS,
    run_arm,
)
from benchmarks._step_overhead_arm import build_model as build_model  # for callers
from benchmarks._step_overhead_report import plot, report, report_diagnose

MODELS = ("mlp", "small_mlp", "resnet20")
ARMS = (
    "plain",
    "stock 1 device",
    "ours 1 device",
    "ours 2 workers",
    "stock 2 workers",
    "2 plain processes",
)
# only when asked for with --arms
DIAGNOSTIC_ARMS = (NO_COMMUNICATION, BUCKETS_16MB, LOCKSTEP)
CEILINGS = ("plain", "2 plain processes")
# Issue 36's targets: ours 1 device's step / plain's; ours 2 workers' speed / 2
# plain processes'; ours 2 workers' first step / ours 1 device's.
ONE_DEVICE_TARGET = 1.05
TWO_WORKER_TARGET = {"mlp": 0.90, "small_mlp": 0.90, "resnet20": 0.95}
FIRST_STEP_TARGET = 1.2


def ceiling_of(arm: str) -> str:
    return "2 plain processes" if arm in TWO_PROCESS_ARMS else "plain"


def measure(arm: str, model_name: str, steps: int, diagnose: bool) -> dict:
    """Runs one arm in fresh processes; returns worker 0's result."""
    command = harness.module_command("benchmarks.step_overhead", "--arm", arm)
    command += ["--model", model_name, "--steps", str(steps)]
    command += ["--diagnose"] if diagnose else []
    what = f"{arm!r} on {model_name}"
    if arm in TWO_PROCESS_ARMS:
        return harness.fresh_workers(command, 2, what, reporting=[0])[0]
    return harness.fresh_process(command, what)


def with_ceilings(arms) -> list[str]:
    """`arms` plus the ceilings every ratio needs, in `ARMS` order."""
    missing = [arm for arm in CEILINGS if arm not in arms]
    if missing:
        print(
            f"--arms: adding the ceilings {missing} (every ratio is against them)",
            file=sys.stderr,
        )
    return [arm for arm in ARMS + DIAGNOSTIC_ARMS if arm in arms or arm in missing]


def benchmark(models, rounds: int, arms=ARMS, steps=None, diagnose=False) -> dict:
    """Per (model, arm), the list of per-round results, interleaved round by round."""

    def run(pair):
        model_name, arm = pair
        return measure(arm, model_name, steps or STEPS[model_name], diagnose)

    pairs = [(model_name, arm) for model_name in models for arm in arms]
    results = harness.interleave(pairs, rounds, run)
    samples = {model: {} for model in models}
    for (model_name, arm), per_round in results.items():
        samples[model_name][arm] = per_round
    return samples


def ratio_to_ceiling(arm: str, step: float, ceiling_step: float) -> float:
    """`step / plain` for one-process arms, `speed / 2 plain` for two-process ones.

    Both compare step times (the global batch is the same), one way round or the
    other, so that each reads the way its target is stated.
    """
    if ceiling_of(arm) == "plain":
        return step / ceiling_step
    return ceiling_step / step


def _median_of(results: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in results)


def summarize(samples: dict) -> dict:
    """Medians, ratios to the ceilings and the targets, from `benchmark`'s samples.

    Ratios are of the medians over rounds (the per-round ratios, each against the
    same round's ceiling, are kept too). Speeds are global examples per second:
    two processes that each take `step` seconds for half the global batch.
    """
    summary = {}
    for model_name, arms in samples.items():
        batch = GLOBAL_BATCH[model_name]
        step = {arm: _median_of(results, "step") for arm, results in arms.items()}
        first = {
            arm: _median_of(results, "first_step") for arm, results in arms.items()
        }
        rows = {}
        for arm, results in arms.items():
            ceiling = ceiling_of(arm)
            row = {
                "ceiling": ceiling,
                "ratio_kind": (
                    "step / plain (lower is better)"
                    if ceiling == "plain"
                    else "speed / 2 plain processes (higher is better)"
                ),
                "step_s": step[arm],
                "examples_per_s": batch / step[arm],
                "first_step_s": first[arm],
                "ratio_to_ceiling": ratio_to_ceiling(arm, step[arm], step[ceiling]),
                "ratio_to_ceiling_per_round": [
                    ratio_to_ceiling(arm, r["step"], c["step"])
                    for r, c in zip(results, arms[ceiling])
                ],
                "speed_vs_plain": step["plain"] / step[arm],
                "first_step_vs_ours_1_device": (
                    first[arm] / first["ours 1 device"]
                    if "ours 1 device" in first
                    else None
                ),
                "per_round": {
                    "step_s": [r["step"] for r in results],
                    "first_step_s": [r["first_step"] for r in results],
                },
            }
            if "call" in results[0]:
                row["diagnose"] = _diagnose_medians(results)
            rows[arm] = row
        summary[model_name] = {
            "global_batch": batch,
            "arms": rows,
            "targets": targets(model_name, rows),
        }
    return summary


DIAGNOSE_KEYS = (
    "call",
    "loop",
    "cpu_per_step",
    "cpu_per_step_by_name",
    "ring_first_step",
    "ring_per_step",
)


def _diagnose_medians(results: list[dict]) -> dict:
    groups = sorted({g for r in results for g in r["cpu_per_step"]})
    ring = {}
    if all("ring_first_step" in r for r in results):
        ring = {
            "ring_first_step_s": _median_of(results, "ring_first_step"),
            "ring_per_step_s": _median_of(results, "ring_per_step"),
        }
    return {
        **ring,
        "call_s": _median_of(results, "call"),
        "loop_s": _median_of(results, "loop"),
        "cpu_s_per_step": {
            g: statistics.median(r["cpu_per_step"].get(g, 0.0) for r in results)
            for g in groups
        },
        "per_round": [
            {key: r[key] for key in DIAGNOSE_KEYS if key in r} for r in results
        ],
    }


def targets(model_name: str, rows: dict) -> dict:
    """Issue 36's targets on one model's rows; `None` where an arm was not run."""

    def target(value, op, limit):
        if value is None:
            return {"value": None, "op": op, "limit": limit, "met": None}
        met = value <= limit if op == "<=" else value >= limit
        return {"value": value, "op": op, "limit": limit, "met": met}

    def get(arm, key):
        return rows[arm][key] if arm in rows else None

    return {
        "ours_1_device_step_vs_plain": target(
            get("ours 1 device", "ratio_to_ceiling"), "<=", ONE_DEVICE_TARGET
        ),
        "ours_2_workers_speed_vs_2_plain_processes": target(
            get("ours 2 workers", "ratio_to_ceiling"),
            ">=",
            TWO_WORKER_TARGET[model_name],
        ),
        "first_step_2_workers_vs_ours_1_device": target(
            get("ours 2 workers", "first_step_vs_ours_1_device"),
            "<=",
            FIRST_STEP_TARGET,
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument(
        "--arms", nargs="+", default=list(ARMS), choices=ARMS + DIAGNOSTIC_ARMS
    )
    parser.add_argument("--diagnose", action="store_true")
    parser.add_argument("--png", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--steps", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps is not None and args.steps < STEADY_AFTER + 3:
        parser.error(
            f"`--steps` must be at least {STEADY_AFTER + 3} (steady state starts "
            f"after batch {STEADY_AFTER}). Received: --steps={args.steps}."
        )
    if args.arm:
        run_arm(args.arm, args.model, args.steps or STEPS[args.model], args.diagnose)
        return
    arms = with_ceilings(args.arms)
    samples = benchmark(args.models, args.rounds, arms, args.steps, args.diagnose)
    summary = summarize(samples)
    report(summary)
    if args.diagnose:
        report_diagnose(summary)
    if args.json:
        settings = {
            "rounds": args.rounds,
            "arms": arms,
            "steps": {m: args.steps or STEPS[m] for m in args.models},
            "steady_after": STEADY_AFTER,
            "diagnose": args.diagnose,
        }
        harness.write_json(args.json, {"settings": settings, "models": summary})
    if args.png:
        plot(summary, args.png)


if __name__ == "__main__":
    main()
