"""The demo's evidence that N replicas compute what one device computes.

In float32 the two runs drift apart (a split batch sums in another order, and batch
norm and LARS' trust ratios amplify those rounding differences step after step), so
one final weight difference would prove nothing. This module reruns the first
epoch(s) in float64 on both sides, where the weights agree to ~1e-14 after each full
batch, and compares that gap with the float32 one after each epoch and with the
distance between the two runs' curves.
"""

from __future__ import annotations

import contextlib
import time

from keras_replicator.commands._demo_training import epoch_weights_callback


def transparency(ours, single, float64_gaps, steps_per_epoch):
    """Replicas vs one device: weight gaps (float64 and float32) and the curves."""
    pairs = list(zip(ours["epoch_weights"], single["epoch_weights"]))
    curves = {}
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        if key in ours["history"] and key in single["history"]:
            curves[key] = max(
                abs(a - b) for a, b in zip(ours["history"][key], single["history"][key])
            )
    result = {
        "float32": {
            "max_weight_difference_per_epoch": [max_difference(a, b) for a, b in pairs],
            "relative_weight_difference_per_epoch": [
                relative_difference(a, b) for a, b in pairs
            ],
        },
        "largest_curve_difference": curves,
        "test_accuracy_difference": ours["test_accuracy"] - single["test_accuracy"],
    }
    if float64_gaps is not None:
        result["float64"] = {
            "epochs": len(float64_gaps) // steps_per_epoch,
            "steps": len(float64_gaps),
            "max_weight_difference_per_step": float64_gaps,
            "max_weight_difference_per_epoch": float64_gaps[
                steps_per_epoch - 1 :: steps_per_epoch
            ],
        }
    return result


def print_transparency(transparency):
    """Prints the gaps `transparency()` measured, and what they mean."""

    def numbers(values):
        return ", ".join(f"{v:.1e}" for v in values)

    print("\n== replicas vs one device (same initial weights, same global batches) ==")
    if "float64" in transparency:
        check = transparency["float64"]
        print(
            f"float64, first {check['steps']} steps: largest weight difference "
            f"after each step {numbers(check['max_weight_difference_per_step'])}"
        )
    float32 = transparency["float32"]
    print(
        "float32, largest weight difference after each epoch: "
        f"{numbers(float32['max_weight_difference_per_epoch'])}"
    )
    print(
        "float32, relative weight difference (L2) after each epoch: "
        f"{numbers(float32['relative_weight_difference_per_epoch'])}"
    )
    curves = transparency["largest_curve_difference"]
    print(
        "largest difference of the per-epoch curves: "
        + ", ".join(f"{key} {value:.4f}" for key, value in curves.items())
    )
    if "float64" in transparency:
        check = transparency["float64"]["max_weight_difference_per_epoch"]
        first = float32["max_weight_difference_per_epoch"][0]
        if check and first > 0:
            print(
                "after the first epoch, float64 gap / float32 gap: "
                f"{check[0] / first:.1e}"
            )
    print(
        "The replicas compute what one device computes: in float64 they agree to "
        "rounding. In float32 a split batch sums in another order (~1e-7 per "
        "operation), and batch norm and LARS' trust ratios amplify that rounding "
        "step after step, so the weights drift apart; the training curves stay "
        "together, and the validation curves show how far a rounding-level "
        "difference moves a model still training."
    )


def max_difference(a, b) -> float:
    """The largest absolute difference between two lists of weight arrays."""
    import numpy as np

    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


def relative_difference(a, b) -> float:
    """`||a - b|| / ||b||` over all weights together."""
    import numpy as np

    difference = sum(float(np.sum(np.square(x - y))) for x, y in zip(a, b))
    norm = sum(float(np.sum(np.square(y))) for y in b)
    return float(np.sqrt(difference / norm)) if norm else 0.0


def float64_gaps(
    runs, build, initial, train_batches, args, steps_per_epoch
) -> list[float]:
    """Trains the first `args.check_epochs` epochs in float64 on each strategy.

    Same initial weights (cast), same shuffled batches and learning-rate schedule as
    the float32 runs. Returns the largest weight difference after each step.
    """
    per_run = []
    with _float64_policy():
        for label, strategy in runs:
            with strategy.scope():
                model = build()
            model.set_weights([w.astype("float64") for w in initial])
            step_weights = epoch_weights_callback(every_step=True)
            start = time.perf_counter()
            model.fit(
                train_batches(),
                epochs=args.check_epochs,
                steps_per_epoch=steps_per_epoch,
                callbacks=[step_weights],
                verbose=0,
            )
            print(f"{label}: {time.perf_counter() - start:.1f} s")
            per_run.append(step_weights.weights)
    return [max_difference(a, b) for a, b in zip(*per_run)]


@contextlib.contextmanager
def _float64_policy():
    import keras

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float64")
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)
