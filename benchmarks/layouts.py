"""Fully sharded data parallelism at N = 2: memory and step time (issue 52).

Question: does `kr.ModelParallelReplicator(LayoutMap(mesh), fully_shard=True)` on a
one-axis mesh of 2 devices (ZeRO-3 / FSDP: each device keeps half of every weight
and Adam slot, DTensor gathers a weight where the step uses it) cut the memory a
replica holds, and at what cost in step time?

Baseline: our data-parallel step, `kr.MultiDeviceReplicator(num_replicas=2)`, same
model, optimizer, global batch and machine, same run. Ceiling: plain Keras `fit` on
one device. Extra row: tensor parallelism (Megatron's MLP split, first Dense by
columns, second by rows, on a (1, 2) ["batch", "model"] mesh).

Target (issue 52): fully sharded at N = 2 holds weights + gradients + slots per
replica <= 0.6x the replicated model's (data-parallel), and its step takes <= 1.3x
our data-parallel step.

Model: the MLP 784-2048-2048-10 (5.8M float32 parameters), Adam, global batch
256, 2 logical CPUs (2 intra- and inter-op threads in every arm). Every arm is a
fresh process (`_layouts_worker.py`; DTensor and tf.distribute's collectives
must never share one), arms interleaved round by round in a rotating order; the
step is the median batch interval after the warm-up, then the median (and range)
over rounds. Bytes per replica (`_layouts_report.py`) are read from the shards
for the layout arms (weights, slots, and the gradients one traced step hands to
Adam); the data-parallel and one-device replicas hold everything whole. Then,
one more process per arm, what TF's CPU allocator holds after warm-up and at its
peak during steps, per device: what the shards do not count (activations,
weights gathered whole, what the traced step keeps).

    python -m benchmarks.layouts [--rounds 5] [--steps 40] [--steady-after 10]
        [--memory-rounds 1] [--quick]
        [--json benchmarks/layouts.json] [--png benchmarks/layouts.png]

A default run (5 rounds, 24 processes) takes about 3-4 minutes on 2 cores, most of
it start-up and tracing; `--quick` (1 round, 12 steps) about 1.
"""

from __future__ import annotations

import argparse
import subprocess
import time

from benchmarks import harness
from benchmarks._layouts_report import plot, report, summarize
from benchmarks._layouts_worker import ARMS, GLOBAL_BATCH, THREADS, WIDTHS

TIMEOUT = 600
STEPS = {"steps": 40, "steady_after": 10}
QUICK_STEPS = {"steps": 12, "steady_after": 4}
MEMORY_STEPS = 8


def measure(arm: str, steps: int, steady_after: int) -> dict:
    """Runs `arm` once in a fresh process; its result, with the process's wall time."""
    command = harness.module_command(
        "benchmarks._layouts_worker", arm, steps, steady_after
    )
    start = time.perf_counter()
    result = harness.fresh_process(command, arm, timeout=TIMEOUT)
    return {**result, "process_s": time.perf_counter() - start}


def measure_memory(arm: str, steps: int) -> dict:
    """`arm`'s allocator statistics, from a fresh process with TF's BFC allocator."""
    command = harness.module_command("benchmarks._layouts_worker", arm, steps, "memory")
    env = {"TF_CPU_ALLOCATOR_USE_BFC": "true"}
    return harness.fresh_process(command, f"{arm} (memory)", env=env, timeout=TIMEOUT)


def source_state() -> dict:
    """The commit measured, and the library files changed since (a dirty tree)."""

    def git(*args):
        done = subprocess.run(
            ["git", *args], cwd=harness.ROOT, capture_output=True, text=True
        )
        return done.stdout.rstrip("\n")

    changed = git("status", "--porcelain", "--", "keras_replicator").splitlines()
    return {"commit": git("rev-parse", "HEAD"), "library_changes": changed}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=STEPS["steps"])
    parser.add_argument("--steady-after", type=int, default=STEPS["steady_after"])
    parser.add_argument(
        "--memory-rounds",
        type=int,
        default=1,
        help="rounds of the allocator measurement (a process per arm each)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 1 round, 12 steps"
    )
    parser.add_argument("--json", default="benchmarks/layouts.json")
    parser.add_argument("--png", default="benchmarks/layouts.png")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds = 1
        args.steps, args.steady_after = (
            QUICK_STEPS["steps"],
            QUICK_STEPS["steady_after"],
        )
    if args.steps < args.steady_after + 3:
        parser.error("--steps must exceed --steady-after by at least 3")
    start = time.perf_counter()
    runs = harness.interleave(
        ARMS,
        args.rounds,
        lambda arm: measure(arm, args.steps, args.steady_after),
        rotating=True,
        label=lambda arm, r: (
            f"{arm}: step {1e3 * r['step_s']:.1f} ms ({r['process_s']:.0f} s process)"
        ),
    )
    memory = harness.interleave(
        ARMS,
        args.memory_rounds,
        lambda arm: measure_memory(arm, MEMORY_STEPS),
        label=lambda arm, r: f"{arm}: allocator peak {r['peak'] / 1e6:.0f} MB",
    )
    summary = summarize(runs, memory)
    report(summary)
    wall = time.perf_counter() - start
    print(f"\nwall time {wall / 60:.1f} min")
    settings = {
        "rounds": args.rounds,
        "steps": args.steps,
        "steady_after": args.steady_after,
        "global_batch": GLOBAL_BATCH,
        "widths": WIDTHS,
        "threads": THREADS,
        "optimizer": "Adam(1e-4)",
        "arm_order": "rotating",
        "memory_rounds": args.memory_rounds,
        "memory_steps": MEMORY_STEPS,
        "wall_s": wall,
        **source_state(),
    }
    record = {"settings": settings, "summary": summary, "runs": runs, "memory": memory}
    harness.write_json(args.json, record)
    print(f"wrote {args.json}")
    plot(summary, args.png)


if __name__ == "__main__":
    main()
