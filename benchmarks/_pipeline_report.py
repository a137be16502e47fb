"""The GPipe benchmark's tables (Markdown) and plot, from measured or saved numbers.

The limit rows are ratios of measured rows (parallel ceiling, micro-batch
efficiency and their product as an estimate of M=8), so `--replot` rebuilds them
from `pipeline.json` without measuring.
"""

from __future__ import annotations

from benchmarks import harness
from benchmarks._pipeline_configs import BATCH, CAP_MB


def tables(names, median, memory, cap) -> str:
    def ratio(name, ref):
        return f"{median[name] / median[ref]:.2f}x"

    lines = [
        f"| configuration (batch {BATCH} unless named) | samples/s | vs GPipe M=1 "
        "| vs plain, 1 thread/op |",
        "|---|---|---|---|",
    ]
    for name in names:
        small = name.startswith("small batch")
        m1 = "small batch: GPipe K=2 M=1" if small else "GPipe K=2 M=1"
        one = "small batch: plain, 1 thread/op" if small else "plain, 1 thread/op"
        lines.append(
            f"| {name} | {median[name]:.0f} | {ratio(name, m1)} | {ratio(name, one)} |"
        )
    lines += ["", "| limit | batch 4096 | batch 512 |", "|---|---|---|"]
    for label, big, small in (
        (
            "2 cores, two independent processes (parallel ceiling)",
            ("2 plain processes at once, 1 thread/op", "plain, 1 thread/op"),
            (
                "small batch: 2 plain processes at once",
                "small batch: plain, 1 thread/op",
            ),
        ),
        (
            "micro-batch efficiency at M=8 (plain at B/8 vs B, per sample)",
            ("small batch: plain, 1 thread/op", "plain, 1 thread/op"),
            (
                "small batch: plain, 1 thread/op, batch 64",
                "small batch: plain, 1 thread/op",
            ),
        ),
    ):
        lines.append(f"| {label} | {ratio(*big)} | {ratio(*small)} |")
    bound = {}
    for key, (together, one, micro, m1) in {
        "big": (
            "2 plain processes at once, 1 thread/op",
            "plain, 1 thread/op",
            "small batch: plain, 1 thread/op",
            "GPipe K=2 M=1",
        ),
        "small": (
            "small batch: 2 plain processes at once",
            "small batch: plain, 1 thread/op",
            "small batch: plain, 1 thread/op, batch 64",
            "small batch: GPipe K=2 M=1",
        ),
    }.items():
        bound[key] = median[together] * median[micro] / median[one] / median[m1]
    lines.append(
        "| M=8 estimate: ceiling x efficiency, vs GPipe M=1 "
        f"| {bound['big']:.2f}x | {bound['small']:.2f}x |"
    )
    lines.append(
        "| M=8 measured, vs GPipe M=1 "
        f"| {ratio('GPipe K=2 M=8', 'GPipe K=2 M=1')} "
        f"| {ratio('small batch: GPipe K=2 M=8', 'small batch: GPipe K=2 M=1')} |"
    )
    lines += [
        "",
        "| memory run (K=2) | peak allocator MB above the weights | vs never |",
        "|---|---|---|",
    ]
    for name, r in memory.items():
        ref = memory[name.split("checkpoint=")[0] + "checkpoint=never"]
        lines.append(
            f"| {name} | {r['allocator_mb']:.0f} "
            f"| {r['allocator_mb'] / ref['allocator_mb']:.2f}x |"
        )
    lines += [
        "",
        f"| under a {CAP_MB} MB allocator cap (256-wide MLP, batch 4096, K=2, M=4) "
        "| deepest that trains | tried (depth: trains) |",
        "|---|---|---|",
    ]
    for mode, (deepest, tried) in cap.items():
        tried_text = ", ".join(f"{d}: {'yes' if ok else 'no'}" for d, ok in tried)
        lines.append(f"| checkpoint={mode} | {deepest} layers | {tried_text} |")
    return "\n".join(lines)


def plot(names, median, memory, cap, path) -> None:
    """Draws throughput, peak memory and the deepest model under the cap to `path`."""
    layout = {"layout": "constrained", "gridspec_kw": {"width_ratios": [4, 4, 1.5]}}
    with harness.figure(path, size=(20, 6), panels=3, **layout) as (_, (a, b, c)):
        _draw(names, median, memory, cap, a, b, c)


def _draw(names, median, memory, cap, a, b, c) -> None:
    a.barh(names, [median[n] for n in names])
    a.set_xlabel("samples/s (median; 'at once' rows: both processes summed)")
    a.set_title(f"K=2 stages on 2 logical CPUs, 16x512 MLP, batch {BATCH}")
    b.barh(list(memory), [r["allocator_mb"] for r in memory.values()])
    b.set_xlabel("peak allocator MB in a step, above the weights")
    b.set_title("re-materialization (K=2, M=4)")
    modes = list(cap)
    c.bar(modes, [cap[m][0] for m in modes])
    c.set_xlabel("checkpoint")
    c.set_ylabel("layers")
    c.set_title(f"{CAP_MB} MB allocator cap:\ndeepest 256-wide MLP\nthat trains")
