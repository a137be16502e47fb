"""What does `CrossReplicaMetrics` cost? fit throughput with vs without, interleaved.

    python benchmarks/cross_replica_metrics_overhead.py [--rounds 7] [--every 10]

Trains the same dense model on 2 logical CPU replicas with and without the callback
(default cadence: every 10 steps), alternating which goes first round by round, and
prints the median examples/s of each and their ratio (target: at most 2% slower,
ratio >= 0.98). Run it on an otherwise idle machine: an A/A run of two identical
models differed by 1.6x here while other TensorFlow jobs shared the 2 cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--every", type=int, default=10)
    args = parser.parse_args()

    import keras_replicator as kr

    kr.split_cpu(2)
    import keras
    import numpy as np

    from keras_replicator.callbacks.cross_replica_metrics import CrossReplicaMetrics

    rng = np.random.default_rng(0)
    x = rng.normal(size=(16384, 256)).astype("float32")
    y = rng.integers(0, 10, len(x))
    strategy = kr.MultiDeviceReplicator(num_replicas=2)

    def build():
        with strategy.scope():
            model = keras.Sequential(
                [
                    keras.Input((256,)),
                    keras.layers.Dense(256, activation="relu"),
                    keras.layers.Dense(10),
                ]
            )
            model.compile(
                "sgd",
                keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"],
            )
        return model

    runs = {
        "without": (build(), []),
        "with": (build(), [CrossReplicaMetrics(every_n_steps=args.every)]),
        "without, again": (build(), []),  # A/A: the noise floor of this run
    }
    speeds = {name: [] for name in runs}
    for model, callbacks in runs.values():  # trace and warm up
        model.fit(x, y, batch_size=128, epochs=1, verbose=0, callbacks=callbacks)
    for round_index in range(args.rounds):
        order = list(runs.items())
        shift = round_index % len(order)  # rotate who goes first: order effects cancel
        order = order[shift:] + order[:shift]
        for name, (model, callbacks) in order:
            start = time.perf_counter()
            model.fit(x, y, batch_size=128, epochs=1, verbose=0, callbacks=callbacks)
            speeds[name].append(len(x) / (time.perf_counter() - start))
    median = {name: statistics.median(values) for name, values in speeds.items()}
    for name, value in median.items():
        print(f"{name:>14} CrossReplicaMetrics: {value:,.0f} examples/s")
    without = (median["without"] + median["without, again"]) / 2
    print(
        f"with/without = {median['with'] / without:.3f} "
        f"(every {args.every} steps; target >= 0.98); noise floor (A/A): "
        f"{median['without, again'] / median['without']:.3f}"
    )


if __name__ == "__main__":
    main()
