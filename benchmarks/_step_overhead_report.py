"""The tables, target lines and plot of `step_overhead.py`, from its summary.

Every row reads against its same-run ceiling: `step / plain` for one-process arms
(lower is better), `speed / 2 plain` for two-process arms (higher is better).
The table's last column is the range of that ratio over the rounds, each round
against its own ceiling: on a machine whose speed drifts, a target missed by
less than that range is missed within the noise (issue 36).
"""

from __future__ import annotations

from benchmarks import harness


def _cell(value, spec: str, width: int) -> str:
    return f"{value:>{width}{spec}}" if value is not None else " " * width


def round_range(arm: str, row: dict) -> str:
    """`min-max` of `arm`'s per-round ratios to its ceiling; blank for a ceiling."""
    ratios = row.get("ratio_to_ceiling_per_round") or []
    if not ratios or row["ceiling"] == arm:
        return ""
    spread = harness.median_and_range(ratios)
    return f"{spread['min']:.3f}-{spread['max']:.3f}"


def target_line(model_name: str, summary: dict) -> str:
    found = summary["targets"]
    parts = []
    for key, text, unit in (
        ("ours_1_device_step_vs_plain", "ours 1 device = {}x plain step", ".3f"),
        (
            "ours_2_workers_speed_vs_2_plain_processes",
            "ours 2 workers = {}x of 2 plain processes",
            ".3f",
        ),
        (
            "first_step_2_workers_vs_ours_1_device",
            "first step 2 workers / ours 1 device = {}",
            ".2f",
        ),
    ):
        t = found[key]
        if t["value"] is None:
            parts.append(text.format("n/a") + " (arm not run)")
            continue
        verdict = "met" if t["met"] else "MISSED"
        value = format(t["value"], unit)
        parts.append(f"{text.format(value)} ({t['op']} {t['limit']:g}: {verdict})")
    return f"{model_name} targets: " + "; ".join(parts)


def continuity_line(model_name: str, summary: dict) -> str:
    """Issue 23's figures: ratios to one process and to stock."""
    rows = summary["arms"]
    parts = []
    for arm in ("ours 1 device", "stock 1 device"):
        if arm in rows:
            parts.append(f"{arm} step = {rows[arm]['ratio_to_ceiling']:.3f}x plain")
    if "ours 2 workers" in rows:
        ours = rows["ours 2 workers"]
        text = f"ours 2 workers = {ours['speed_vs_plain']:.3f}x one process"
        if "stock 2 workers" in rows:
            stock = rows["stock 2 workers"]["examples_per_s"]
            text += f", {ours['examples_per_s'] / stock:.2f}x stock 2 workers"
        parts.append(text)
    return f"{model_name} (issue 23's figures): " + "; ".join(parts)


def report(summary: dict) -> None:
    for model_name, model in summary.items():
        print(
            f"\n{model_name}, global batch {model['global_batch']}, steady state. "
            "step / plain: 1-process arms, lower is better; speed / 2 plain: "
            "2-process arms, higher is better"
        )
        print(
            f"{'arm':<33} {'examples/s':>10} {'step ms':>8} {'step / plain':>12} "
            f"{'speed / 2 plain':>15} {'1st step s':>10} {'1st / ours 1 device':>19} "
            f"{'ratio over rounds':>17}"
        )
        for arm, row in model["arms"].items():
            one_process = row["ceiling"] == "plain"
            ratio = row["ratio_to_ceiling"]
            print(
                f"{arm:<33} {row['examples_per_s']:>10,.0f} "
                f"{1000 * row['step_s']:>8.1f} "
                f"{_cell(ratio if one_process else None, '.3f', 12)} "
                f"{_cell(None if one_process else ratio, '.3f', 15)} "
                f"{row['first_step_s']:>10.2f} "
                f"{_cell(row['first_step_vs_ours_1_device'], '.2f', 19)} "
                f"{round_range(arm, row):>17}"
            )
        print(target_line(model_name, model))
        print(continuity_line(model_name, model))


def report_diagnose(summary: dict) -> None:
    for model_name, model in summary.items():
        rows = {a: r["diagnose"] for a, r in model["arms"].items() if "diagnose" in r}
        if not rows:
            continue
        groups = sorted({g for d in rows.values() for g in d["cpu_s_per_step"]})
        groups = [g for g in groups if g != "total"] + ["total"]
        print(
            f"\n{model_name} diagnose (worker 0's process on 2 workers): ms per "
            "steady step; call = train_function, loop = Keras loop + callbacks "
            "between calls; CPU ms per step by thread group"
        )
        print(
            f"{'arm':<33} {'call':>6} {'loop':>6} "
            + " ".join(f"{g:>{max(len(g), 6)}}" for g in groups)
        )
        for arm, d in rows.items():
            cpu = d["cpu_s_per_step"]
            print(
                f"{arm:<33} {1000 * d['call_s']:>6.1f} {1000 * d['loop_s']:>6.2f} "
                + " ".join(
                    f"{1000 * cpu.get(g, 0.0):>{max(len(g), 6)}.1f}" for g in groups
                )
            )
        for arm, d in rows.items():
            if "ring_first_step_s" in d:
                print(
                    f"{arm}: ring calls {1000 * d['ring_first_step_s']:.1f} ms in "
                    f"the first step, {1000 * d['ring_per_step_s']:.1f} ms per "
                    "steady step (worker 0, waits included)"
                )


def plot(summary: dict, path: str) -> None:
    """One panel per model: each arm's ratio to its ceiling, with the targets."""
    harness.plot_panels(path, summary, _plot_model, panel_size=(6, 5.5))


def _plot_model(axis, model_name: str, model: dict) -> None:
    names = list(model["arms"])
    values = [model["arms"][n]["ratio_to_ceiling"] for n in names]
    one_process = [model["arms"][n]["ceiling"] == "plain" for n in names]
    colors = ["tab:blue" if one else "tab:orange" for one in one_process]
    axis.barh(names, values, color=colors)
    for y, value in enumerate(values):
        axis.text(
            value,
            y,
            f" {value:.3f}",
            va="center",
            fontsize=8,
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5},
        )
    axis.axvline(1.0, color="black", linewidth=0.8)
    one_device = model["targets"]["ours_1_device_step_vs_plain"]["limit"]
    two_workers = model["targets"]["ours_2_workers_speed_vs_2_plain_processes"]
    axis.axvline(
        one_device,
        color="tab:blue",
        linestyle="--",
        label=f"1 process: step / plain, target <= {one_device:g}",
    )
    axis.axvline(
        two_workers["limit"],
        color="tab:orange",
        linestyle="--",
        label=f"2 processes: speed / 2 plain, target >= {two_workers['limit']:g}",
    )
    axis.invert_yaxis()
    axis.set_xlim(0, max(values + [1.2]) * 1.2)
    axis.set_xlabel(
        "ratio to the arm's same-run ceiling\nblue: step / plain (lower is "
        "better)\norange: speed / 2 plain processes (higher is better)"
    )
    axis.set_title(f"{model_name}, global batch {model['global_batch']}")
    axis.legend(loc="upper center", bbox_to_anchor=(0.5, -0.32), fontsize=7)
