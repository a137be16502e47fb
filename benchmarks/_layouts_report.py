"""The summary, table and plot of `layouts.py`, from its arms' results (no TF).

Every ratio is against the same run: step times against the data-parallel arm
(the baseline) and the one-device arm (the ceiling), bytes per replica against the
data-parallel arm, which holds every weight, slot and gradient whole.
"""

from __future__ import annotations

import statistics

from benchmarks import harness
from benchmarks._layouts_worker import (
    ARMS,
    DATA_PARALLEL,
    FULLY_SHARDED,
    GLOBAL_BATCH,
    LAYOUT_ARMS,
    ONE_DEVICE,
)

TARGET_MEMORY = 0.6  # issue 52: fully sharded bytes per replica <= 0.6x replicated
TARGET_STEP = 1.3  # issue 52: fully sharded step <= 1.3x our data-parallel step
PARTS = ("weights", "slots", "gradients")
MB = 1e6


def held_bytes(result: dict) -> dict:
    """Bytes one replica holds: the largest device's for a layout arm, else whole.

    Gradients of a layout arm are those the step hands to the optimizer.
    """
    if "per_device" not in result:
        held = dict(result["whole"])
    else:
        per_device = result["per_device"]
        held = {
            "weights": max(per_device["weights"]),
            "slots": max(per_device["slots"]),
            "gradients": max(per_device["to_optimizer"]),
        }
    held["total"] = sum(held[part] for part in PARTS)
    return held


def allocator(memory: dict) -> dict:
    """Per arm: what the allocator held after warm-up and at its peak, per device.

    Medians over the memory rounds of the process's bytes divided by its devices
    (all logical CPUs share one allocator), and each / the data-parallel arm's.
    """
    found = {}
    for arm, results in memory.items():
        found[arm] = {
            key: statistics.median(r[key] / r["devices"] for r in results)
            for key in ("held", "peak")
        }
    base = dict(found[DATA_PARALLEL])
    for values in found.values():
        for key in ("held", "peak"):
            values[key + "_vs_data_parallel"] = values[key] / base[key]
    return found


def summarize(runs: dict, memory: dict | None = None) -> dict:
    """Medians over rounds, ratios to the same run's arms, and the two targets."""
    steps = {arm: [r["step_s"] for r in results] for arm, results in runs.items()}
    medians = harness.medians(steps)
    vs_data_parallel = harness.ratios(medians, DATA_PARALLEL)
    vs_one_device = harness.ratios(medians, ONE_DEVICE)
    held = {arm: held_bytes(results[-1]) for arm, results in runs.items()}
    replicated = held[DATA_PARALLEL]
    arms = {}
    for arm in (a for a in ARMS if a in runs):
        last = runs[arm][-1]
        arms[arm] = {
            "step_ms": {
                k: 1e3 * v for k, v in harness.median_and_range(steps[arm]).items()
            },
            "step_ms_per_round": [1e3 * s for s in steps[arm]],
            "step_vs_data_parallel": vs_data_parallel[arm],
            "step_vs_data_parallel_per_round": [
                a / b for a, b in zip(steps[arm], steps[DATA_PARALLEL])
            ],
            "step_vs_one_device": vs_one_device[arm],
            "examples_per_s": GLOBAL_BATCH / medians[arm],
            "bytes_per_replica": held[arm],
            "bytes_vs_data_parallel": {
                part: held[arm][part] / replicated[part] for part in (*PARTS, "total")
            },
        }
        if "per_device" in last:
            arms[arm]["gradient_bytes_from_tape"] = max(last["per_device"]["from_tape"])
            arms[arm]["gradient_specs"] = {
                "from_tape": last["per_device"]["from_tape_specs"],
                "to_optimizer": last["per_device"]["to_optimizer_specs"],
            }
            arms[arm]["weight_specs"] = last["weight_specs"]
            arms[arm]["read_checks"] = {
                part: (last["per_device"][part], last["per_device"][part + "_traced"])
                for part in ("weights", "slots")
            }
    summary = {"arms": arms, "parameters": runs[DATA_PARALLEL][-1]["parameters"]}
    if memory:
        for arm, values in allocator(memory).items():
            arms[arm]["allocator_per_device"] = values
    if FULLY_SHARDED in arms:
        sharded = arms[FULLY_SHARDED]
        state = sharded["bytes_vs_data_parallel"]["total"]
        step = sharded["step_vs_data_parallel"]
        per_round = sharded["step_vs_data_parallel_per_round"]
        peak = sharded.get("allocator_per_device", {}).get("peak_vs_data_parallel")
        summary["targets"] = {
            "memory": {
                "value": state,
                "limit": TARGET_MEMORY,
                "met": state <= TARGET_MEMORY,
            },
            "allocator_peak": {
                "value": peak,
                "limit": TARGET_MEMORY,
                "met": None if peak is None else peak <= TARGET_MEMORY,
            },
            "step": {
                "value": step,
                "limit": TARGET_STEP,
                "met": step <= TARGET_STEP,
                "per_round_range": [min(per_round), max(per_round)],
            },
        }
    return summary


def table(summary: dict) -> str:
    """The Markdown table: step time and bytes per replica, each with its ratios."""
    rows = []
    for arm, a in summary["arms"].items():
        step, held = a["step_ms"], a["bytes_per_replica"]
        rows.append(
            [
                arm,
                f"{step['median']:.1f} ({step['min']:.1f}-{step['max']:.1f})",
                f"{a['step_vs_data_parallel']:.2f}x",
                f"{a['step_vs_one_device']:.2f}x",
                *(f"{held[part] / MB:.1f}" for part in PARTS),
                f"{held['total'] / MB:.1f}",
                f"{a['bytes_vs_data_parallel']['total']:.2f}x",
            ]
        )
    header = [
        "arm",
        "step ms (range)",
        "step / data-parallel",
        "step / one device",
        "weights MB",
        "Adam slots MB",
        "gradients MB",
        "total MB / replica",
        "total / data-parallel",
    ]
    return harness.markdown_table(header, rows)


def allocator_table(summary: dict) -> str:
    """The Markdown table of the allocator's statistics, per device."""
    rows = []
    for arm, values in summary["arms"].items():
        a = values.get("allocator_per_device")
        if a is not None:
            held, peak = a["held"] / MB, a["peak"] / MB
            rows.append([arm, f"{held:.1f}", f"{a['held_vs_data_parallel']:.2f}x"])
            rows[-1] += [f"{peak:.1f}", f"{a['peak_vs_data_parallel']:.2f}x"]
    header = [
        "arm",
        "held after warm-up, MB / device",
        "/ data-parallel",
        "peak during steps, MB / device",
        "/ data-parallel",
    ]
    return harness.markdown_table(header, rows)


def report(summary: dict) -> None:
    print(
        f"\nMLP {summary['parameters']:,} float32 parameters, Adam, global batch 256; "
        "step: median over rounds of each process's median batch interval; "
        "MB = 1e6 bytes held by one replica (device)\n"
    )
    print(table(summary))
    print(
        "\nBytes: read from the shards for the layout arms (weights and slots from "
        "`bytes_per_device`, gradients from one traced step's gradients as handed to "
        "Adam, `dtensor.unpack`); whole for one device and data-parallel. Not "
        "counted: activations, and what a step holds only while it runs (a weight "
        "gathered whole for its layer, a gradient before its reduction)."
    )
    for arm in LAYOUT_ARMS:
        a = summary["arms"].get(arm)
        if a is None:
            continue
        for part, (library, traced) in a["read_checks"].items():
            if library != traced:
                print(
                    f"WARNING {arm}: `bytes_per_device` gives {library} bytes of "
                    f"{part} per device, a traced read of the shards {traced}"
                )
        specs = a["gradient_specs"]
        moved = [
            p
            for p in specs["to_optimizer"]
            if specs["from_tape"][p] != specs["to_optimizer"][p]
        ]
        from_tape = a["gradient_bytes_from_tape"] / MB
        print(
            f"{arm}: gradients as the tape returned them {from_tape:.1f} MB per "
            f"device; relaid out before Adam: {', '.join(moved) or 'none'}"
        )
    if any("allocator_per_device" in a for a in summary["arms"].values()):
        print(
            "\nTF's CPU allocator (BFC), a process of its own per arm: bytes in use "
            "from just before the model is built, after 2 warm-up steps and at the "
            "peak of the next steps, divided by the process's devices (they share "
            "one allocator). Counts what the shards do not: activations, weights "
            "gathered whole, gradients before their reduction, and whatever the "
            "traced step keeps between calls.\n"
        )
        print(allocator_table(summary))
    targets = summary.get("targets")
    if targets:
        memory, step = targets["memory"], targets["step"]
        low, high = step["per_round_range"]
        print(
            f"\ntarget: fully sharded weights + gradients + slots per replica <= "
            f"{memory['limit']}x data-parallel: {memory['value']:.2f}x, "
            f"{'met' if memory['met'] else 'NOT met'}"
        )
        peak = targets["allocator_peak"]
        if peak["value"] is not None:
            print(
                f"  (allocator peak per device: {peak['value']:.2f}x data-parallel, "
                f"{'within' if peak['met'] else 'ABOVE'} {peak['limit']}x)"
            )
        print(
            f"target: fully sharded step <= {step['limit']}x data-parallel step: "
            f"{step['value']:.2f}x (rounds {low:.2f}-{high:.2f}), "
            f"{'met' if step['met'] else 'NOT met'}"
        )


def plot(summary: dict, path: str) -> None:
    """Two panels: step time and bytes per replica, each / data-parallel."""
    harness.plot_panels(
        path, {"step": summary, "memory": summary}, _draw, panel_size=(5.5, 3.6)
    )


def _draw(axis, key: str, summary: dict) -> None:
    arms = list(summary["arms"])
    positions = range(len(arms))
    if key == "step":
        values = [summary["arms"][a]["step_vs_data_parallel"] for a in arms]
        ranges = [summary["arms"][a]["step_vs_data_parallel_per_round"] for a in arms]
        errors = [
            [v - min(r) for v, r in zip(values, ranges)],
            [max(r) - v for v, r in zip(values, ranges)],
        ]
        axis.barh(positions, values, xerr=errors, color="tab:blue", capsize=3)
        axis.axvline(TARGET_STEP, color="grey", linestyle="--", linewidth=0.8)
        axis.set_xlabel(f"step time / data-parallel (dashed: {TARGET_STEP}x target)")
        axis.set_title("Step time (median, range over rounds)")
    else:
        left = [0.0] * len(arms)
        for part in PARTS:
            full = summary["arms"][DATA_PARALLEL]["bytes_per_replica"]["total"]
            values = [
                summary["arms"][a]["bytes_per_replica"][part] / full for a in arms
            ]
            axis.barh(positions, values, left=left, label=part)
            left = [x + v for x, v in zip(left, values)]
        peaks = [
            (i, summary["arms"][a]["allocator_per_device"]["peak_vs_data_parallel"])
            for i, a in enumerate(arms)
            if "allocator_per_device" in summary["arms"][a]
        ]
        if peaks:
            axis.plot(
                [p for _, p in peaks],
                [i for i, _ in peaks],
                "kD",
                label="allocator peak / device",
            )
        axis.axvline(TARGET_MEMORY, color="grey", linestyle="--", linewidth=0.8)
        axis.set_xlabel(f"bytes per replica / data-parallel (dashed: {TARGET_MEMORY}x)")
        axis.set_title("Weights + Adam slots + gradients")
        axis.legend(fontsize=8)
    axis.axvline(1.0, color="black", linewidth=0.8)
    axis.set_yticks(list(positions), arms)
    axis.invert_yaxis()
