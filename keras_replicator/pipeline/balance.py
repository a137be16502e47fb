"""Automatic balance: how many layers each stage gets.

A pipeline runs at the speed of its slowest stage, so the cut should equalize the
stages' costs. The cost of a layer is its parameter count (`balance_by_size`, which
also equalizes weight memory) or its measured forward + backward time on a sample
batch (`balance_by_time`). Given the costs, the contiguous split minimizing the
largest stage cost is found exactly by dynamic programming.
"""

from __future__ import annotations

import time

import keras
import numpy as np
import tensorflow as tf

from keras_replicator._arguments import check_int
from keras_replicator.pipeline._partition import chain_of_layers


def balance_by_size(model_or_layers, num_stages: int) -> list[int]:
    """Layers per stage that equalize the stages' parameter counts.

    Args:
        model_or_layers: a built `Sequential`, single-chain functional model or
            list of built layers.
        num_stages: K, the number of stages.

    Returns:
        A list of K layer counts for `GPipe(balance=...)`.

    Example:
    >>> import keras
    >>> model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(100),
    ...                           keras.layers.Dense(1), keras.layers.Dense(1)])
    >>> balance_by_size(model, 2)
    [1, 2]
    """
    layers = chain_of_layers(model_or_layers)
    _check_stages(num_stages, len(layers))
    for layer in layers:
        if not layer.built:
            raise ValueError(
                "`model_or_layers` must be built to balance by size: layer "
                f"{layer.name!r} has no weights yet. Received: an unbuilt layer. "
                "Build the model first (e.g. give it a `keras.Input`)."
            )
    costs = [float(layer.count_params()) for layer in layers]
    return partition_costs(costs, num_stages)


def balance_by_time(
    model_or_layers, num_stages: int, sample, repeats: int = 3
) -> list[int]:
    """Layers per stage that equalize measured forward + backward times.

    Each layer's time is the best of `repeats` eager forward + backward runs on
    the activations `sample` produces, so measure with a batch of the size one
    micro-batch will have.

    Args:
        model_or_layers: a `Sequential`, single-chain functional model or list of
            layers.
        num_stages: K, the number of stages.
        sample: an input batch.
        repeats: timed runs per layer. Defaults to `3`.

    Returns:
        A list of K layer counts for `GPipe(balance=...)`.

    Example:
    >>> import keras, numpy as np
    >>> model = keras.Sequential([keras.layers.Dense(8), keras.layers.Dense(1)])
    >>> balance_by_time(model, 2, np.ones((4, 3), "float32"))
    [1, 1]
    """
    layers = chain_of_layers(model_or_layers)
    _check_stages(num_stages, len(layers))
    check_int("repeats", repeats)
    x = tf.convert_to_tensor(sample)
    costs = []
    for layer in layers:
        best = float("inf")
        for _ in range(repeats + 1):  # the first run builds the layer
            start = time.perf_counter()
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = layer(x, training=True)
            grads = tape.gradient(
                y,
                [x, *layer.trainable_variables],
                unconnected_gradients=tf.UnconnectedGradients.ZERO,
            )
            keras.ops.convert_to_numpy(grads[0])
            best = min(best, time.perf_counter() - start)
        costs.append(best)
        x = tf.stop_gradient(y)
    return partition_costs(costs, num_stages)


def partition_costs(costs: list[float], num_stages: int) -> list[int]:
    """The contiguous split of `costs` into `num_stages` minimizing the largest sum.

    Example:
    >>> partition_costs([1, 1, 1, 3], 2)
    [3, 1]
    """
    n = len(costs)
    _check_stages(num_stages, n)
    prefix = np.concatenate([[0.0], np.cumsum(costs)])
    # best[k][j]: the smallest largest-stage cost of the first j layers in k stages.
    best = np.full((num_stages + 1, n + 1), np.inf)
    cut = np.zeros((num_stages + 1, n + 1), dtype=int)
    best[0][0] = 0.0
    for k in range(1, num_stages + 1):
        for j in range(k, n + 1):
            for i in range(k - 1, j):
                value = max(best[k - 1][i], prefix[j] - prefix[i])
                if value < best[k][j]:
                    best[k][j], cut[k][j] = value, i
    balance, j = [], n
    for k in range(num_stages, 0, -1):
        balance.append(int(j - cut[k][j]))
        j = int(cut[k][j])
    return balance[::-1]


def _check_stages(num_stages, num_layers: int) -> None:
    check_int("num_stages", num_stages)
    if num_stages > num_layers:
        raise ValueError(
            f"`num_stages` must be at most the {num_layers} layers. "
            f"Received: num_stages={num_stages}."
        )
