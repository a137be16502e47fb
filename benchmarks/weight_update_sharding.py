"""Does weight-update sharding divide the optimizer's state and update by N? (issue 24)

Sharded (`kr.AllReduceOptions(shard_weight_update=True)`) against unsharded (the
same strategy with the default options), for

* the 6.3M-parameter MLP 784-2048-2048-256-10 of `step_overhead.py` with Adam,
* the same MLP with `kr.optimizers.LARS`,
* ResNet-20 (32x32x3, 0.27M parameters) with Adam,

on 2 worker processes on 127.0.0.1 (`kr.MultiWorkerReplicator`, one CPU replica
each, 1 thread each: the socket ring) and on 2 and 4 logical CPUs of one process
(`kr.MultiDeviceReplicator` after `kr.split_cpu(4)`, 2 threads), global batch
256. Each arm is a fresh process (or pair), arms interleaved round by round
(sharded first on odd rounds), medians over rounds; every ratio is sharded /
unsharded of the same run. Measured per arm (`_sharding_worker.py`):

* optimizer state per replica: the elements and bytes of `optimizer.variables`
  one replica holds (expected about 1/N of unsharded, plus padding);
* apply: median time of a replica step applying fixed precomputed gradients
  (`optimizer.apply` in `strategy.run`): the reduction plus the update, no
  forward or backward pass; the same with SGD (no slots) is the communication
  reference, and update = apply - SGD apply is the optimizer's compute (sharded
  and unsharded move the same bytes);
* `fit` examples/s in steady state.

    python -m benchmarks.weight_update_sharding [--rounds 2] [--quick]
        [--models mlp-adam mlp-lars resnet20-adam] [--topologies workers cpu2 cpu4]
        [--json benchmarks/weight_update_sharding.json]
        [--png benchmarks/weight_update_sharding.png]

A default run (2 rounds, 36 arms) takes about 19 minutes on 2 cores, most of it
process start-up and tracing; `--quick` (1 round, the MLP with Adam) about 2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from benchmarks import harness

GLOBAL_BATCH = 256
TIMEOUT = 600
TARGET_UPDATE = 0.6  # issue 24: sharded update <= 0.6x unsharded, Adam, 2 workers

MODELS = {  # key: (label, model, optimizer)
    "mlp-adam": ("MLP 6.3M, Adam", "mlp", "adam"),
    "mlp-lars": ("MLP 6.3M, LARS", "mlp", "lars"),
    "resnet20-adam": ("ResNet-20, Adam", "resnet20", "adam"),
}
TOPOLOGIES = {  # key: (label, processes, replicas)
    "workers": ("2 workers (ring)", 2, 2),
    "cpu2": ("2 logical CPUs", 1, 2),
    "cpu4": ("4 logical CPUs", 1, 4),
}
# Calls of the apply step timed, `fit` steps and the steps before steady state.
STEPS = {
    "mlp": {"apply_calls": 40, "fit_steps": 30, "steady_after": 8},
    "resnet20": {"apply_calls": 30, "fit_steps": 14, "steady_after": 4},
}
QUICK_STEPS = {"apply_calls": 10, "fit_steps": 10, "steady_after": 3}


def arm_config(model_key: str, topology: str, shard: bool, quick: bool) -> dict:
    """The JSON configuration `_sharding_worker.py` runs."""
    _, model, optimizer = MODELS[model_key]
    _, processes, replicas = TOPOLOGIES[topology]
    steps = QUICK_STEPS if quick else STEPS[model]
    return {
        "model": model,
        "optimizer": optimizer,
        "processes": processes,
        "replicas": replicas,
        "shard": shard,
        **steps,
    }


def measure(config: dict) -> dict:
    """Runs one arm in fresh process(es); returns worker 0's result."""
    command = harness.module_command("benchmarks._sharding_worker", json.dumps(config))
    processes, what = config["processes"], str(config)
    if processes > 1:
        return harness.fresh_workers(
            command, processes, what, timeout=TIMEOUT, reporting=[0]
        )[0]
    return harness.fresh_process(command, what, timeout=TIMEOUT)


def benchmark(models, topologies, rounds: int, quick: bool) -> dict:
    """`{(model, topology, shard): [result per round]}`, arms interleaved."""
    runs: dict = {}
    for round_index in range(rounds):
        order = (True, False) if round_index % 2 else (False, True)
        for model_key in models:
            for topology in topologies:
                for shard in order:
                    key = (model_key, topology, shard)
                    if any("skipped" in r for r in runs.get(key, [])):
                        continue  # refused once: refused every round
                    config = arm_config(model_key, topology, shard, quick)
                    start = time.perf_counter()
                    result = measure(config)
                    print(
                        f"{MODELS[model_key][0]}, {TOPOLOGIES[topology][0]}, "
                        f"sharded={shard}: {time.perf_counter() - start:.0f} s",
                        file=sys.stderr,
                        flush=True,
                    )
                    runs.setdefault(key, []).append(result)
                    if "skipped" in result:
                        print(
                            f"skipped {MODELS[model_key][0]}, "
                            f"{TOPOLOGIES[topology][0]}, sharded={shard}: "
                            f"{result['skipped']}",
                            file=sys.stderr,
                            flush=True,
                        )
        print(f"round {round_index + 1} of {rounds} done", file=sys.stderr, flush=True)
    return runs


def summarize(runs: dict) -> list[dict]:
    """One row per (model, topology): medians per arm and sharded / unsharded."""
    rows = []
    pairs = sorted({(m, t) for m, t, _ in runs}, key=_order)
    for model_key, topology in pairs:
        row = {
            "model": model_key,
            "topology": topology,
            "label": f"{MODELS[model_key][0]}, {TOPOLOGIES[topology][0]}",
        }
        arms = {}
        for shard in (False, True):
            results = runs.get((model_key, topology, shard), [])
            skipped = [r["skipped"] for r in results if "skipped" in r]
            if skipped or not results:
                row["skipped"] = skipped[0] if skipped else "not run"
                break
            arms[shard] = _medians(results)
        if "skipped" not in row:
            row["unsharded"], row["sharded"] = arms[False], arms[True]
            row["ratios"] = {
                name: arms[True][name] / arms[False][name]
                for name in ("state_bytes", "apply_ms", "update_ms", "examples_per_s")
                if arms[False][name] > 0
            }
        rows.append(row)
    return rows


def _order(pair):
    return list(MODELS).index(pair[0]), list(TOPOLOGIES).index(pair[1])


def _medians(results: list[dict]) -> dict:
    def median(values):
        return statistics.median(values)

    return {
        "state_elements": median(r["state_elements"] for r in results),
        "state_bytes": median(r["state_bytes"] for r in results),
        "weight_elements": results[0]["weight_elements"],
        "apply_ms": median(1e3 * r["apply_s"] for r in results),
        "sgd_apply_ms": median(1e3 * r["sgd_apply_s"] for r in results),
        # Per run, then the median: both applies share the run's machine state.
        "update_ms": median(1e3 * (r["apply_s"] - r["sgd_apply_s"]) for r in results),
        "examples_per_s": median(GLOBAL_BATCH / r["fit_step_s"] for r in results),
        "rounds": len(results),
    }


def report(rows: list[dict]) -> None:
    print(
        f"\nglobal batch {GLOBAL_BATCH}; medians over rounds; "
        "ratio = sharded / unsharded"
    )
    print(
        f"{'configuration':<38} {'arm':<9} {'state MB/replica':>16} "
        f"{'apply ms':>9} {'SGD apply':>10} {'update ms':>10} {'fit ex/s':>9}"
    )
    for row in rows:
        if "skipped" in row:
            print(f"{row['label']:<38} skipped: {row['skipped']}")
            continue
        for arm in ("unsharded", "sharded"):
            a = row[arm]
            print(
                f"{row['label'] if arm == 'unsharded' else '':<38} {arm:<9} "
                f"{a['state_bytes'] / 1e6:>16.2f} {a['apply_ms']:>9.1f} "
                f"{a['sgd_apply_ms']:>10.1f} {a['update_ms']:>10.1f} "
                f"{a['examples_per_s']:>9,.0f}"
            )
        r = row["ratios"]
        print(
            f"{'':<38} {'ratio':<9} {r['state_bytes']:>16.3f} "
            f"{r['apply_ms']:>9.3f} {'':>10} {r.get('update_ms', float('nan')):>10.3f} "
            f"{r['examples_per_s']:>9.3f}"
        )
    for row in rows:
        target = row["model"] == "mlp-adam" and row["topology"] == "workers"
        if target and "ratios" in row:
            update = row["ratios"].get("update_ms", float("nan"))
            verdict = "met" if update <= TARGET_UPDATE else "not met"
            fit = row["ratios"]["examples_per_s"]
            print(
                f"\ntarget: sharded update <= {TARGET_UPDATE}x unsharded (Adam, MLP, "
                f"2 workers): {update:.3f}x, {verdict}; sharded fit "
                f"{fit:.3f}x unsharded examples/s "
                f"({'at least as fast' if fit >= 1.0 else 'slower'})"
            )


def plot(rows: list[dict], path: str) -> None:
    shown = [r for r in rows if "ratios" in r]
    metrics = (
        ("state_bytes", "optimizer state / replica"),
        ("update_ms", "update time (apply - SGD apply)"),
        ("apply_ms", "apply time (reduction + update)"),
        ("examples_per_s", "fit examples/s"),
    )
    size = (10, 1.8 + 0.8 * max(len(shown), 1))
    with harness.figure(path, size=size) as (_, (axis,)):
        _plot_ratios(axis, shown, metrics)
    print(f"wrote {path}")


def _plot_ratios(axis, shown: list[dict], metrics) -> None:
    height = 0.8 / len(metrics)
    for k, (name, label) in enumerate(metrics):
        positions = [i + (k - 1.5) * height for i in range(len(shown))]
        values = [r["ratios"].get(name, 0.0) for r in shown]
        axis.barh(positions, values, height, label=label)
    axis.set_yticks(range(len(shown)), [r["label"] for r in shown])
    axis.axvline(1.0, color="black", linewidth=0.8)
    axis.axvline(TARGET_UPDATE, color="grey", linestyle="--", linewidth=0.8)
    axis.invert_yaxis()
    axis.set_xlabel("sharded / unsharded (same run; dashed: 0.6x update target)")
    axis.set_title(f"Weight-update sharding, global batch {GLOBAL_BATCH}, 2 CPU cores")
    axis.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument(
        "--topologies", nargs="+", default=list(TOPOLOGIES), choices=TOPOLOGIES
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 1 round, the MLP with Adam, fewer steps (about 2 minutes)",
    )
    parser.add_argument("--json", default=None)
    parser.add_argument("--png", default=None)
    args = parser.parse_args()
    models = args.models
    if args.quick:
        args.rounds = 1
        if models == list(MODELS):
            models = ["mlp-adam"]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    runs = benchmark(models, args.topologies, args.rounds, args.quick)
    rows = summarize(runs)
    report(rows)
    if args.json:
        settings = {
            "rounds": args.rounds,
            "quick": args.quick,
            "global_batch": GLOBAL_BATCH,
            "steps": QUICK_STEPS if args.quick else STEPS,
        }
        harness.write_json(args.json, {"settings": settings, "rows": rows})
        print(f"wrote {args.json}")
    if args.png:
        plot(rows, args.png)


if __name__ == "__main__":
    main()
