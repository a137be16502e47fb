"""Model shapes DTensor trains wrong without an error, found before the first step.

A `Concatenate` whose output feeds a layer whose kernel is split by its input
rows over a non-batch axis (a Megatron "row" split of the layer right after
the concatenation) trains wrong: with the optimizer's update in the step,
DTensor's layout propagation splits the concatenation's own axis. Stock
TensorFlow refuses that step ("Concat op SPMD with concat dimension in sharded
dimension is not supported"); the same step built by Keras runs, and its loss
was 0.02-0.03 off one device's (weights up to 0.01 off after one step; evaluation and
prediction are right). Measured on hashed-string and dense features
concatenated before a Dense split ("model", None) on a 2x2 mesh; splitting
that Dense by columns, (None, "model"), or keeping it whole, is exact.

DTensor offers no way to pin the concatenation's layout from outside the
layer, so a Keras functional model with this shape gets a warning naming the
layers and the way out (`ModelParallelReplicator.run`, once per model).
"""

from __future__ import annotations

import keras
from tensorflow.experimental import dtensor


def rows_split_after_concatenation(model, layout_of, batch_axis: str) -> list[str]:
    """Names of layers whose row-split kernel reads a `Concatenate`'s output.

    Args:
        model: A Keras model; only functional graphs are walked.
        layout_of: The DTensor layout of a variable (`strategy.layout_of`).
        batch_axis: The mesh's batch axis (a split over it is fully sharded,
            gathered before use, and so not affected).

    Example:
    >>> import keras
    >>> a, b = keras.Input((2,)), keras.Input((2,))
    >>> joined = keras.layers.Concatenate()([a, b])
    >>> model = keras.Model([a, b], keras.layers.Dense(3, name="out")(joined))
    >>> rows_split_after_concatenation(model, lambda v: None, "batch")
    []
    """
    producers = {}
    for layer in model.layers:
        try:
            producers[id(layer.output)] = layer
        except (AttributeError, ValueError):
            continue  # a layer called several times, or not in the graph
    names = []
    for layer in model.layers:
        kernel = getattr(layer, "kernel", None)
        if kernel is None or not _rows_split(layout_of(kernel), batch_axis):
            continue
        try:
            source = producers.get(id(layer.input))
        except (AttributeError, ValueError):
            continue
        if isinstance(source, keras.layers.Concatenate):
            names.append(f"{layer.name} (after {source.name})")
    return names


def _rows_split(layout, batch_axis: str) -> bool:
    if not isinstance(layout, dtensor.Layout) or not layout.sharding_specs:
        return False
    first = layout.sharding_specs[0]
    return first not in (dtensor.UNSHARDED, batch_axis)
