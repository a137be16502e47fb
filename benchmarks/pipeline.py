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

    python -m benchmarks.pipeline            # table + benchmarks/pipeline.png/.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess

from benchmarks import harness
from benchmarks._pipeline_configs import (
    BFC,
    CAP_DEPTHS,
    CAP_MB,
    memory_configs,
    throughput_configs,
)
from benchmarks._pipeline_report import plot
from benchmarks._pipeline_report import tables as _tables  # the name the tests read
from benchmarks._pipeline_worker import worker

HERE = pathlib.Path(__file__).parent


def start(config: dict, env: dict | None = None) -> subprocess.Popen:
    """Starts one measurement in a fresh process (several may run at once)."""
    extra = {"MALLOC_MMAP_THRESHOLD_": "65536", "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.Popen(
        harness.module_command("benchmarks.pipeline", "--worker", json.dumps(config)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=harness.ROOT,
        env={**os.environ, **harness.module_environment({**extra, **(env or {})})},
    )


def result(process: subprocess.Popen, config: dict) -> dict:
    stdout, stderr = process.communicate(timeout=900)
    return harness.read_result(stdout + stderr, f"worker for {config}")


def run(config: dict, env: dict | None = None) -> dict:
    return result(start(config, env), config)


def run_together(config: dict, copies: int = 2) -> float:
    """Samples/s of `copies` independent processes training at the same time."""
    processes = [start(config) for _ in range(copies)]
    return sum(result(p, config)["samples_per_second"] for p in processes)


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
        for name in harness.rotate(names, r):
            config, copies = configs[name]
            speed = run_together(config, copies)
            speeds[name].append(speed)
            print(f"round {r} {name}: {speed:.0f} samples/s", flush=True)
    median = harness.medians(speeds)
    memory = {name: run(c, BFC) for name, c in memory_configs().items()}
    cap = {mode: deepest_trainable(mode) for mode in ("never", "always")}
    table = _tables(names, median, memory, cap)
    print(table)
    record = {
        "speeds": speeds,
        "median": median,
        "memory": memory,
        "cap_mb": CAP_MB,
        "deepest": cap,
    }
    harness.write_json(HERE / "pipeline.json", record)
    plot(names, median, memory, cap, HERE / "pipeline.png")


def replot() -> None:
    """Prints the tables and redraws the PNG from `pipeline.json` (no measuring)."""
    saved = json.loads((HERE / "pipeline.json").read_text())
    names, median = list(saved["median"]), saved["median"]
    cap = {mode: tuple(value) for mode, value in saved["deepest"].items()}
    print(_tables(names, median, saved["memory"], cap))
    plot(names, median, saved["memory"], cap, HERE / "pipeline.png")


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
        harness.emit_result(worker(json.loads(args.worker)))
    else:
        main(args.rounds, args.steps)
