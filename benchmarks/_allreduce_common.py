"""What the all-reduce benchmarks share: the gradient set and the entry module.

Every measurement that starts processes starts `benchmarks.allreduce` itself (its
hidden `--worker` / `--fit-worker` flags), so the modules of this benchmark name
that module here rather than their own.
"""

from __future__ import annotations

MB = 1e6
# The module the worker processes run (this benchmark's entry point).
MODULE = "benchmarks.allreduce"


def resnet50_shapes():
    """The trainable weight shapes of `keras.applications.ResNet50(weights=None)`."""
    import keras

    model = keras.applications.ResNet50(weights=None)
    return [tuple(w.shape) for w in model.trainable_weights]


def resnet50_gradients(strategy) -> tuple[list, int]:
    """Random "gradients" of ResNet-50's shapes under `strategy`, and their bytes."""
    import numpy as np
    import tensorflow as tf

    shapes = resnet50_shapes()
    with strategy.scope():
        grads = [
            tf.Variable(tf.random.normal(s, seed=i), trainable=False)
            for i, s in enumerate(shapes)
        ]
    return grads, 4 * sum(int(np.prod(s)) for s in shapes)
