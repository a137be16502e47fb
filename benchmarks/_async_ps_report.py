"""The async-vs-sync benchmark's output: arm names, progress lines, table, plot."""

from __future__ import annotations

from benchmarks import harness
from benchmarks._async_ps_stats import ARMS


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


def progress(arm, number, result, slowdown):
    print(
        f"round {number} {label(arm, slowdown):<32} "
        f"{result['examples_per_s']:7,.0f} examples/s  "
        f"accuracy {100 * result['accuracy']:.2f} %  batch intervals "
        + ", ".join(f"{t} {1e3 * s:.1f} ms" for t, s in result["intervals"].items()),
        flush=True,
    )


def plot(summary, path, slowdown) -> None:
    arms = [arm for arm in ARMS if "examples_per_s" in summary.get(arm, {})]
    names = [label(arm, slowdown) for arm in arms]
    colors = [
        {"one": "grey", "sync": "C0", "async": "C1"}[ARMS[arm][0]] for arm in arms
    ]
    with harness.figure(path, size=(13, 4), panels=2) as (_, (speed, accuracy)):
        examples = [summary[a]["examples_per_s"] for a in arms]
        bars = speed.barh(names, examples, color=colors)
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
