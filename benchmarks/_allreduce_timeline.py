"""When do the gradient buckets travel, relative to the training step?

`--timeline PNG`: the MLP's `fit` on 2 workers with the socket ring, 1 MB buckets
against one pack, with 1 and 2 inter-op threads; every ring call of worker 0 is
timestamped (`trace_ring_calls` wraps `SocketRing.all_reduce` in the worker
process) and placed inside the steady steps.
"""

from __future__ import annotations

import statistics
import time

from benchmarks import harness
from benchmarks._allreduce_common import MB, MODULE

TIMELINE_CONFIGS = {
    "socket 1MB": {"transport": "socket", "bucket_mb": 1},
    "socket 1 pack": {"transport": "socket", "bucket_mb": 0},
}


def trace_ring_calls() -> list:
    """Records (start, end, bytes) of every socket-ring call in this process."""
    from keras_replicator.communication.ring import _socket_ring

    calls = []
    original = _socket_ring.SocketRing.all_reduce

    def traced(self, *arrays):
        start = time.perf_counter()
        out = original(self, *arrays)
        calls.append((start, time.perf_counter(), sum(a.nbytes for a in arrays)))
        return out

    _socket_ring.SocketRing.all_reduce = traced
    return calls


def timeline(png: str) -> None:
    """When do the gradient buckets travel, relative to the training step?

    Runs the MLP's `fit` on 2 workers with the socket ring twice: 1 MB buckets
    (each layer's gradients travel on their own) and one pack (one call, which can
    only start once the whole backward pass is done). Ring calls are chained in
    program order and otherwise wait only for their bucket's gradients, so a call
    that starts before the one-pack call's start travelled while the backward pass
    was still computing earlier layers' gradients: that is the overlap.
    """
    steps = {}
    runs = [(name, inter) for inter in (1, 2) for name in TIMELINE_CONFIGS]
    for name, inter in runs:
        command = harness.module_command(MODULE, "--fit-worker", name, "--trace")
        command += ["--inter-op", str(inter)]
        name = f"{name}, {inter} inter-op thread{'s' if inter > 1 else ''}"
        (result,) = harness.fresh_workers(
            command, 2, f"timeline run {name!r}", timeout=600, reporting=[0]
        )
        stamps, calls = result["stamps"], result["calls"]
        rows = []
        for step in range(10, len(stamps) - 1):  # steady steps: (start, end]
            begin, end = stamps[step], stamps[step + 1]
            inside = [(a - begin, b - begin, n) for a, b, n in calls if begin < a < end]
            rows.append({"step": end - begin, "calls": inside})
        steps[name] = rows
    print("\nfit timeline, socket ring, 2 workers (ms from the previous batch end;")
    print("median over steady steps; a call is one bucket)")
    summary = {}
    for name, rows in steps.items():
        count = statistics.mode(len(r["calls"]) for r in rows)
        rows = [r for r in rows if len(r["calls"]) == count]
        starts = [
            statistics.median(r["calls"][k][0] for r in rows) for k in range(count)
        ]
        ends = [statistics.median(r["calls"][k][1] for r in rows) for k in range(count)]
        sizes = [rows[0]["calls"][k][2] / MB for k in range(count)]
        step = statistics.median(r["step"] for r in rows)
        summary[name] = (step, starts, ends, sizes)
        print(f"{name}: step {step * 1e3:.0f} ms, {count} ring calls")
        for k in range(count):
            print(
                f"  call {k + 1}: {sizes[k]:6.2f} MB  {starts[k] * 1e3:6.1f} -> "
                f"{ends[k] * 1e3:6.1f} ms"
            )
    for inter in ("1 inter-op thread", "2 inter-op threads"):
        starts, ends = summary[f"socket 1MB, {inter}"][1:3]
        gaps = [s - e for s, e in zip(starts[1:], ends)]
        # A call that starts well after the previous one ended was waiting for its
        # gradients: every call before the last such wait travelled while the
        # backward pass was still computing.
        waits = [k for k, g in enumerate(gaps) if g > 0.002]
        overlapped = (
            sum(ends[k] - starts[k] for k in range(waits[-1] + 1)) if waits else 0.0
        )
        print(
            f"{inter}, 1 MB buckets: gaps between calls "
            f"{', '.join(f'{g * 1e3:.1f}' for g in gaps)} ms; "
            f"{overlapped * 1e3:.1f} ms of ring time before the last wait for "
            "gradients (travelled during the backward pass)"
        )
    _plot_timeline(summary, png)


def _plot_timeline(summary, png):
    drawing = harness.figure(png, size=(11, 3.6), layout="constrained")
    with drawing as (_, (ax,)):
        for y, (step, starts, ends, _) in enumerate(summary.values()):
            ax.broken_barh(
                [(s * 1e3, (e - s) * 1e3) for s, e in zip(starts, ends)],
                (y - 0.3, 0.6),
                facecolors=["C0", "C1"] * len(starts),
            )
            ax.plot([step * 1e3] * 2, [y - 0.4, y + 0.4], "k--")
        ax.set_yticks(range(len(summary)), list(summary))
        ax.set_xlabel("ms from the previous batch end (dashed: the step's end)")
        ax.set_title("socket-ring calls inside a steady fit step, MLP, 2 workers")
