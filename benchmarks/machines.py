"""The socket ring across machines: flat, by listing, in rows and columns (issue 37).

Four worker processes on 2 simulated machines (network namespaces joined by a
bridge whose links `tc` shapes to `--rates`; `simulated_cluster`, needs root), 2
workers each. Per link speed, arms interleaved round by round, each a fresh
process group; worker 0 times `all_reduce` of `--sizes-mb` float32 buffers
(median of 5 calls after one warm-up) straight on the strategy's ring:

* `flat, listed h1 h1 h2 h2`: the flat ring (`KERAS_REPLICATOR_RING_HIERARCHY=0`),
  the workers listed machine by machine: the flat ring at its best, the baseline
  of every ratio;
* `flat, listed h1 h2 h1 h2`: the same, interleaved as schedulers may list them
  (the ring orders itself by machine: should match the baseline);
* `grid, listed h1 h2 h1 h2`: the default on a grid of machines: rows (shared
  memory in each machine) and columns (sockets between machines).

`--fit` adds the 6.3M-parameter MLP of `step_overhead.py` (global batch 256, 1
thread per worker): the median steady step of `fit`, flat vs grid.

    sudo python -m benchmarks.machines [--rates 1gbit] [--rounds 3]
        [--sizes-mb 25 100] [--fit] [--json PATH] [--png PATH]

Reports each arm's time and its speed-up over the baseline (higher is better;
issue 37's targets at 1 Gbit/s: grid >= 1.3x for the all-reduce, >= 1.2x for
`fit`; the interleaved listing ~1.0x).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import harness

ARMS = {  # name: (machine of each worker, environment)
    "flat, listed h1 h1 h2 h2": (
        [0, 0, 1, 1],
        {"KERAS_REPLICATOR_RING_HIERARCHY": "0"},
    ),
    "flat, listed h1 h2 h1 h2": (
        [0, 1, 0, 1],
        {"KERAS_REPLICATOR_RING_HIERARCHY": "0"},
    ),
    "grid, listed h1 h2 h1 h2": (
        [0, 1, 0, 1],
        {"KERAS_REPLICATOR_RING_HIERARCHY": "1"},
    ),
}
BASELINE = "flat, listed h1 h1 h2 h2"
FIT_ARMS = ("flat, listed h1 h1 h2 h2", "grid, listed h1 h2 h1 h2")
CALLS = 5


def worker(sizes_mb, fit: bool) -> None:
    """One worker: opens the strategy's ring, times it, prints `RESULT` (worker 0)."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import time

    import numpy as np

    import keras_replicator as kr
    from keras_replicator._replicator_state import replicator_state

    strategy = kr.MultiWorkerReplicator()
    ring = replicator_state(strategy).transport.ring
    result = {"ring": type(ring).__name__, "all_reduce_s": {}}
    for size in sizes_mb:
        values = np.ones(int(size * 1e6) // 4, np.float32)
        times = []
        for _ in range(CALLS + 1):
            start = time.perf_counter()
            ring.all_reduce(values)
            times.append(time.perf_counter() - start)
        result["all_reduce_s"][str(size)] = statistics.median(times[1:])
    if fit:
        result["fit_step_s"] = _fit_step(strategy)
    if os.environ.get("KERAS_REPLICATOR_WORKER_INDEX") == "0":
        harness.emit_result(result)


def _fit_step(strategy) -> float:
    import keras
    import numpy as np

    from benchmarks._models import build_model, compiled

    batch, steps, steady = 256, 30, 10
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * steps, 784)).astype("float32")
    y = rng.integers(0, 10, len(x))
    model = compiled(
        keras,
        strategy,
        lambda k: build_model(k, "mlp"),
        lambda: keras.optimizers.SGD(0.01),
    )
    stamp, ends = harness.batch_end_stamps(keras)
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0, callbacks=[stamp])
    return harness.steady_interval(ends, steady)


def run_arm(cluster, arm: str, sizes_mb, fit: bool) -> dict:
    machines, environment = ARMS[arm]
    workers = [f"{cluster.address(m)}:{24100 + i}" for i, m in enumerate(machines)]
    command = harness.module_command("benchmarks.machines", "--worker")
    command += ["--sizes-mb", *map(str, sizes_mb)] + (["--fit"] if fit else [])
    processes = []
    for index, machine in enumerate(machines):
        env = dict(os.environ, **harness.module_environment(environment))
        env["KERAS_REPLICATOR_WORKER_INDEX"] = str(index)
        env["TF_CONFIG"] = json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        )
        processes.append(
            cluster.popen(
                machine,
                command,
                env=env,
                cwd=harness.ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [p.communicate(timeout=900)[0] for p in processes]
    failed = [i for i, p in enumerate(processes) if p.returncode]
    if failed:
        raise RuntimeError(f"{arm!r}: workers {failed} failed:\n{outputs[0][-3000:]}")
    return harness.read_result(outputs[0], repr(arm))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", nargs="+", default=["1gbit"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes-mb", nargs="+", type=float, default=[25.0, 100.0])
    parser.add_argument("--fit", action="store_true")
    parser.add_argument("--json", default=None)
    parser.add_argument("--png", default=None)
    parser.add_argument("--replot", default=None, help="a --json file to plot again")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.sizes_mb, args.fit)
        return
    if args.replot:
        with open(args.replot) as file:
            plot(json.load(file)["rates"], args.png or "machines.png")
        return
    import simulated_cluster as simulated

    reason = simulated.unavailable_reason()
    if reason is not None:
        raise SystemExit(f"No simulated machines here: {reason}")
    summary = {}
    for rate in args.rates:
        with simulated.SimulatedCluster(hosts=2, rate=rate) as cluster:

            def measure(arm, cluster=cluster):
                fit = args.fit and arm in FIT_ARMS
                return run_arm(cluster, arm, args.sizes_mb, fit)

            samples = harness.interleave(list(ARMS), args.rounds, measure)
        summary[rate] = summarize(samples, args.sizes_mb)
        report(rate, summary[rate])
    if args.json:
        harness.write_json(args.json, {"settings": vars(args), "rates": summary})
    if args.png:
        plot(summary, args.png)


def summarize(samples: dict, sizes_mb) -> dict:
    out = {}
    for arm, results in samples.items():
        row = {"ring": results[0]["ring"], "all_reduce_s": {}, "speedup": {}}
        for size in map(str, sizes_mb):
            row["all_reduce_s"][size] = statistics.median(
                r["all_reduce_s"][size] for r in results
            )
        if "fit_step_s" in results[0]:
            row["fit_step_s"] = statistics.median(r["fit_step_s"] for r in results)
        row["per_round"] = results
        out[arm] = row
    base = out[BASELINE]
    for row in out.values():
        for size, seconds in row["all_reduce_s"].items():
            row["speedup"][size] = base["all_reduce_s"][size] / seconds
        if "fit_step_s" in row and "fit_step_s" in base:
            row["speedup"]["fit"] = base["fit_step_s"] / row["fit_step_s"]
    return out


def report(rate: str, rows: dict) -> None:
    sizes = list(next(iter(rows.values()))["all_reduce_s"])
    head = " ".join(f"{s + ' MB':>16}" for s in sizes)
    print(f"\n{rate}, 2 machines x 2 workers: all-reduce s (speed-up vs {BASELINE})")
    print(f"{'arm':<26} {'ring':<17} {head} {'fit step s':>16}")
    for arm, row in rows.items():
        cells = " ".join(
            f"{row['all_reduce_s'][s]:>8.3f} ({row['speedup'][s]:.2f}x)" for s in sizes
        )
        fit = ""
        if "fit_step_s" in row:
            fit = f"{row['fit_step_s']:>8.3f} ({row['speedup'].get('fit', 1):.2f}x)"
        print(f"{arm:<26} {row['ring']:<17} {cells} {fit:>16}")


def plot(summary: dict, path: str) -> None:
    harness.plot_panels(path, summary, _plot_rate, panel_size=(7, 4.5))


def _plot_rate(axis, rate: str, rows: dict) -> None:
    keys = list(dict.fromkeys(k for row in rows.values() for k in row["speedup"]))
    for row in rows.values():
        row["speedup"] = {key: row["speedup"].get(key) for key in keys}
    width = 0.8 / len(rows)
    for k, (arm, row) in enumerate(rows.items()):
        shown = [(i, row["speedup"][key]) for i, key in enumerate(keys)]
        shown = [(i, v) for i, v in shown if v is not None]
        positions = [i + k * width for i, _ in shown]
        values = [v for _, v in shown]  # an arm not run for `fit` has no bar
        axis.bar(positions, values, width, label=arm)
        for x, v in zip(positions, values):
            axis.text(x, v, f"{v:.2f}", ha="center", va="bottom", fontsize=7)
    axis.set_xticks([i + width for i in range(len(keys))])
    axis.set_xticklabels([f"{k} MB" if k != "fit" else "MLP fit" for k in keys])
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.set_ylabel(f"speed-up over {BASELINE} (same run)")
    axis.set_title(f"2 machines x 2 workers, links shaped to {rate}")
    axis.legend(fontsize=7)


if __name__ == "__main__":
    main()
