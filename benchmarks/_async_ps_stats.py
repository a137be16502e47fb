"""The async-vs-sync benchmark's fixed job sizes and arms, and its arithmetic.

Pure functions over measured times (no TensorFlow): stamp files to batch
intervals, epoch ends to a steady epoch time, intervals to examples/s, the
straggler's sleep, medians over rounds. Kept apart so tests can check them fast.
"""

from __future__ import annotations

import statistics

from benchmarks import harness

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
    return harness.steady_interval(times, skip)


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
