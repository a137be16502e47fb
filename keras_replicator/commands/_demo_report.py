"""The demo's report: the printed summary, `summary.json` and `demo.png`.

The JSON holds numbers only (the runs' weights stay in memory), so a user or a test
can read what the demo printed. matplotlib is imported only when the PNG is drawn,
with its non-interactive backend: the demo runs on machines without a display.
"""

from __future__ import annotations

import json
import os

from keras_replicator.commands._demo_transparency import (
    print_transparency,
    transparency,
)


def summarize(results, setup, data, float64_gaps=None, steps_per_epoch=None):
    """Prints the runs' numbers; returns them, with the transparency check, as JSON."""
    summary = {
        "data": data.description,
        "setup": setup,
        "runs": {
            label: {
                k: v
                for k, v in run.items()
                if k not in ("history", "weights", "epoch_weights")
            }
            for label, run in results.items()
        },
    }
    print("\n== summary ==")
    for label, run in summary["runs"].items():
        print(
            f"{label:>12}: test accuracy {run['test_accuracy']:.4f}  "
            f"{run['examples_per_second']:>8,.0f} examples/s  {run['seconds']:6.1f} s"
        )
    if len(results) == 2:
        (_, ours), (_, single) = results.items()
        check = transparency(ours, single, float64_gaps, steps_per_epoch)
        summary["transparency"] = check
        summary["max_weight_difference"] = check["float32"][
            "max_weight_difference_per_epoch"
        ][-1]
        speedup = ours["examples_per_second"] / single["examples_per_second"]
        summary["speed_ratio_replicas_vs_one_device"] = speedup
        print_transparency(check)
        print(f"examples/s, replicas / one device: {speedup:.2f}x")
        if ours["replicas"] > 1 and not _has_accelerators():
            print(
                "(the replicas are logical devices sharing this machine's CPU cores, "
                "so they cannot be faster than one device using all cores)"
            )
    return summary


def _has_accelerators():
    import tensorflow as tf

    return bool(
        tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU")
    )


def write(summary, results, output_dir):
    """Writes `demo.png` (curves, weight gaps, throughput) and `summary.json`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(output_dir, exist_ok=True)
    figure, (loss_axes, accuracy_axes, gap_axes, speed_axes) = plt.subplots(
        1, 4, figsize=(19, 4), constrained_layout=True
    )
    for label, run in results.items():
        history = run["history"]
        epochs = range(1, len(history["loss"]) + 1)
        loss_axes.plot(epochs, history["loss"], label=f"{label} train")
        loss_axes.plot(epochs, history["val_loss"], "--", label=f"{label} test")
        accuracy_axes.plot(epochs, history["accuracy"], label=f"{label} train")
        accuracy_axes.plot(epochs, history["val_accuracy"], "--", label=f"{label} test")
        if "examples_per_second" in history:
            speed_axes.plot(epochs, history["examples_per_second"], "o-", label=label)
    _plot_transparency(gap_axes, summary.get("transparency"))
    loss_axes.set(title="loss", xlabel="epoch", yscale="log")
    accuracy_axes.set(title="accuracy", xlabel="epoch", ylim=(0, 1.01))
    speed_axes.set(title="throughput (epoch 1 includes tracing)", xlabel="epoch")
    speed_axes.set_ylabel("examples/s")
    for axes in (loss_axes, accuracy_axes, gap_axes, speed_axes):
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
    figure.suptitle(f"keras-replicator demo: {summary['data']}")
    png = os.path.join(output_dir, "demo.png")
    figure.savefig(png, dpi=100)
    plt.close(figure)
    path = os.path.join(output_dir, "summary.json")
    with open(path, "w") as file:
        json.dump(summary, file, indent=2)
    print(f"wrote {png} and {path}")


def _plot_transparency(axes, transparency):
    """Largest weight difference, replicas vs one device, per epoch: float32 and 64."""
    axes.set(
        title="weights, replicas vs one device",
        xlabel="epoch",
        ylabel="largest difference",
        yscale="log",
    )
    if not transparency:
        return
    float32 = transparency["float32"]["max_weight_difference_per_epoch"]
    axes.plot(range(1, len(float32) + 1), float32, "o-", label="float32")
    if "float64" in transparency:
        check = transparency["float64"]
        per_step = check["max_weight_difference_per_step"]
        steps_per_epoch = check["steps"] // max(1, check["epochs"])
        # Steps as fractions of an epoch; exactly 0 cannot be drawn on a log scale.
        axes.plot(
            [(i + 1) / steps_per_epoch for i in range(len(per_step))],
            [max(value, 1e-17) for value in per_step],
            "s-",
            label="float64 rerun (each step)",
        )
