"""`keras-replicator demo`: distributed training on bundled data, next to one device.

Trains a small classifier on scikit-learn's handwritten digits (bundled with
scikit-learn, no download) with `keras_replicator.auto()` picking the strategy (here:
logical CPU replicas), then the same run on one device from the same initial weights,
and prints test accuracy, throughput and how far the two runs' weights are apart.
"""

from __future__ import annotations

import os
import time


def add_parser(subparsers):
    parser = subparsers.add_parser("demo", help="train on bundled data, N vs 1 replica")
    parser.add_argument("--replicas", type=int, default=2, help="default: %(default)s")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch")
    parser.add_argument("--epochs", type=int, default=20)
    parser.set_defaults(command=run)
    return parser


def _digits():
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int32")
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    split = int(0.8 * len(x))
    return (x[:split], y[:split]), (x[split:], y[split:])


def _model():
    import keras

    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def run(args) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras_replicator as kr

    strategy = kr.auto(num_replicas=args.replicas)
    import keras
    import numpy as np
    import tensorflow as tf

    (x, y), (x_test, y_test) = _digits()
    keras.utils.set_random_seed(0)
    initial = _model().get_weights()
    results = {}
    for name, current in (
        (f"{strategy.num_replicas_in_sync} replicas", strategy),
        ("1 device", tf.distribute.get_strategy()),
    ):
        with current.scope():
            model = _model()
        model.set_weights(initial)
        start = time.perf_counter()
        model.fit(
            x,
            y,
            batch_size=args.batch_size,
            epochs=args.epochs,
            verbose=0,
            shuffle=False,
        )
        seconds = time.perf_counter() - start
        _, accuracy = model.evaluate(x_test, y_test, verbose=0)
        results[name] = (model.get_weights(), accuracy, len(x) * args.epochs / seconds)
        print(
            f"{name:>12}: test accuracy {accuracy:.4f}, "
            f"{results[name][2]:,.0f} examples/s"
        )
    (ours, _, _), (single, _, _) = results.values()
    gap = max(float(np.max(np.abs(a - b))) for a, b in zip(ours, single))
    print(f"largest weight difference, replicas vs one device: {gap:.2e}")
    return 0
