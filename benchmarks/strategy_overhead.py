"""Does correctness cost speed? Keras fit throughput, ours vs stock, interleaved.

Measures `model.fit` examples/s of a small CIFAR-shaped ResNet and of a dense MLP on
2 logical CPU replicas with `MultiDeviceReplicator` and with stock
`tf.distribute.MirroredStrategy` (same devices, same global batch, same weights), and
on one device. Configurations are interleaved round by round so machine noise hits
all of them alike; the median over rounds is reported.

Steady state: a callback timestamps every batch, and the throughput is the median
interval between batches after the first two of each `fit` call (whole-call timings
of 8-32 steps were dominated by per-call setup and showed a 1.3x "overhead" that
steady-state steps do not have). The per-call setup (from `fit` to the end of the
first batch) is reported separately.

    python -m benchmarks.strategy_overhead [--rounds 5]

Prints ours/stock (target >= 0.98) and 2 replicas / 1 device.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import harness  # noqa: E402
from benchmarks._models import compiled  # noqa: E402


def resnet(keras):
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    for filters in (16, 32):
        shortcut = keras.layers.Conv2D(filters, 1, strides=2)(x)
        x = keras.layers.Conv2D(filters, 3, strides=2, padding="same")(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.Activation("relu")(x)
        x = keras.layers.Conv2D(filters, 3, padding="same")(x)
        x = keras.layers.Add()([x, shortcut])
        x = keras.layers.Activation("relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(10)(x))


def mlp(keras):
    return keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import keras_replicator as kr

    kr.split_cpu(2)
    import keras
    import numpy as np
    import tensorflow as tf

    stamp, stamps = harness.batch_end_stamps(keras)

    rng = np.random.default_rng(0)
    workloads = {
        "resnet": (resnet, rng.normal(size=(1536, 32, 32, 3)).astype("float32"), 64),
        "mlp": (mlp, rng.normal(size=(8192, 784)).astype("float32"), 256),
    }
    strategies = {
        "1 device": tf.distribute.get_strategy(),
        "stock 2": tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]),
        "ours 2": kr.MultiDeviceReplicator(num_replicas=2),
    }
    runs = {}
    for work, (build, x, batch) in workloads.items():
        y = rng.integers(0, 10, len(x))
        keras.utils.set_random_seed(0)
        initial = build(keras).get_weights()
        for name, strategy in strategies.items():
            model = compiled(keras, strategy, build, metrics=["accuracy"])
            model.set_weights(initial)
            model.fit(x, y, batch_size=batch, epochs=1, verbose=0)  # trace + warm up
            runs[(work, name)] = (model, x, y, batch, [], [])

    for _ in range(args.rounds):
        for model, x, y, batch, speeds, setups in runs.values():
            stamps.clear()
            start = time.perf_counter()
            model.fit(x, y, batch_size=batch, epochs=1, verbose=0, callbacks=[stamp])
            speeds.append(batch / harness.steady_interval(stamps, 2))
            setups.append(stamps[0] - start)

    print(f"{'workload':<8} {'strategy':<9} {'examples/s':>11} {'1st step ms':>12}")
    median = harness.medians({key: run[4] for key, run in runs.items()})
    for (work, name), speed in median.items():
        setup = statistics.median(runs[(work, name)][5])
        print(f"{work:<8} {name:<9} {speed:>11,.0f} {setup * 1e3:>12.0f}")
    for work in workloads:
        ours, stock = median[(work, "ours 2")], median[(work, "stock 2")]
        single = median[(work, "1 device")]
        print(
            f"{work}: ours/stock = {ours / stock:.3f} (target >= 0.98); "
            f"2 replicas / 1 device = {ours / single:.3f}"
        )


if __name__ == "__main__":
    main()
