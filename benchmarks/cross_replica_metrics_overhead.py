"""What does `CrossReplicaMetrics` cost? fit step time with vs without, interleaved.

    python -m benchmarks.cross_replica_metrics_overhead [--every 10] [--cycles 450]

Trains a model on 2 logical CPU replicas in one long `fit` whose cadence of global
metrics is switched on and off as it runs, and compares the time of a full cadence
cycle: `every` consecutive training steps, exactly one of which computes the global
metrics. Three arms take turns every few cycles -- without, with (what
`CrossReplicaMetrics(every_n_steps=every)` switches on), and without again, the A/A
noise floor -- so each arm sees the same machine within a second of the others; whole
separate `fit` runs varied by +-25% between identical configurations on these 2
shared cores. The median cycle time of each arm is reported, so a descheduled step or
a garbage collection does not decide the result.

Two workloads: a dense MLP (steps of a few ms: the worst case for a fixed per-cycle
cost) and a small conv net. Also printed: the extra time of one global-metrics step.
Target: with/without >= 0.98 (at most 2% slower) at the default cadence.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import harness  # noqa: E402
from benchmarks._models import compiled  # noqa: E402

ARMS = ("without", "with", "without, again")


def mlp(keras):
    return keras.Sequential(
        [
            keras.Input((256,)),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def convnet(keras):
    return keras.Sequential(
        [
            keras.Input((8, 8, 3)),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10),
        ]
    )


def measure(name, build, feature_shape, strategy, args):
    import keras
    import numpy as np

    from keras_replicator.keras_integration import _global_metrics

    batch, every, block = 128, args.every, args.block
    rng = np.random.default_rng(0)
    steps = args.cycles * every + every  # + a first cycle of pipeline start-up
    x = rng.normal(size=(steps * batch, *feature_shape)).astype("float32")
    y = rng.integers(0, 10, len(x))

    model = compiled(keras, strategy, build, metrics=["accuracy"])

    class Arms(keras.callbacks.Callback):
        """Every `block` cycles hands the next arm the cadence; times each cycle."""

        def on_train_begin(self, logs=None):
            self.cycles = {arm: [] for arm in ARMS}
            self.arm, self.stamp, self.cycle = None, None, 0

        def on_train_batch_end(self, step, logs=None):
            if (step + 1) % every:
                return
            now = time.perf_counter()
            if self.arm is not None:
                self.cycles[self.arm].append(now - self.stamp)
            arm = ARMS[(self.cycle // block) % len(ARMS)]
            if arm != self.arm:
                # Exactly what `CrossReplicaMetrics` does at `on_train_begin`; the
                # step counter restarts, so the cycle's last step is the global one.
                _global_metrics.set_cadence(
                    self.model, "train", every if arm == "with" else None
                )
                self.arm = arm
            self.cycle += 1
            self.stamp = time.perf_counter()

    arms = Arms()
    model.fit(x[: 20 * batch], y[: 20 * batch], batch_size=batch, verbose=0)  # trace
    _global_metrics.set_cadence(model, "train", 1)
    model.fit(x[: 2 * batch], y[: 2 * batch], batch_size=batch, verbose=0)  # trace
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0, callbacks=[arms])
    _global_metrics.set_cadence(model, "train", None)

    cycle = harness.medians(arms.cycles)
    without = (cycle["without"] + cycle["without, again"]) / 2
    print(f"{name}: {every * batch / without:,.0f} examples/s without")
    print(
        f"  with/without = {without / cycle['with']:.3f} (every {every} steps, median "
        f"of {len(arms.cycles['with'])} cycles; target >= 0.98); noise floor (A/A) = "
        f"{cycle['without'] / cycle['without, again']:.3f}; one global step costs "
        f"{(cycle['with'] - without) * 1e3:+.2f} ms "
        f"({(cycle['with'] - without) / (without / every):+.1%} of a step)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--cycles", type=int, default=450, help="cycles per workload")
    parser.add_argument("--workloads", default="mlp,convnet")
    parser.add_argument("--block", type=int, default=3, help="cycles per arm turn")
    args = parser.parse_args()

    import keras_replicator as kr

    kr.split_cpu(2)
    strategy = kr.MultiDeviceReplicator(num_replicas=2)
    workloads = {"mlp": (mlp, (256,)), "convnet": (convnet, (8, 8, 3))}
    for name in args.workloads.split(","):
        build, shape = workloads[name]
        measure(name, build, shape, strategy, args)


if __name__ == "__main__":
    main()
