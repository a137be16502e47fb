"""`wrap_optimizer`: opt a hand-written replica step into exact gradient averaging.

TF-Replicator's `wrap_optimizer` let a step written with an ordinary per-replica mean
loss train like one device at the global batch. Stock tf.distribute optimizers *sum*
replica gradients instead (the loss is expected to be divided by the global batch),
and so do ours in a plain `strategy.run` loop, so that code written for stock keeps
its numbers (see `communication/_reduction` for the whole rule). Wrapping marks the
optimizer (in a weak registry, `_replicator_state.mark_averaging`: nothing is set on
it) so its gradient all-reduce becomes the sample-weighted mean, under our strategies
and stock ones alike; the optimizer object itself is returned, so it still saves,
loads and passes `isinstance` checks.
"""

from __future__ import annotations

import keras

from keras_replicator import _replicator_state
from keras_replicator.keras_integration import _hooks


def wrap_optimizer(optimizer):
    """Makes `optimizer` average gradients across replicas, weighted by samples.

    Use it in a custom loop whose step computes a per-replica *mean* loss (as for
    one device). Inside `fit` and `run_steps` every optimizer already averages.

    Args:
        optimizer: A `keras.optimizers.Optimizer`.

    Returns:
        `optimizer` itself, now averaging in any strategy's replica context.

    Raises:
        TypeError: If `optimizer` is not a Keras optimizer.

    Example:
    >>> import keras, keras_replicator as kr
    >>> optimizer = kr.wrap_optimizer(keras.optimizers.SGD(0.1))
    >>> isinstance(optimizer, keras.optimizers.SGD)
    True
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            "`optimizer` must be a `keras.optimizers.Optimizer`. Received: "
            f"optimizer={optimizer!r} of type {type(optimizer).__name__}."
        )
    _hooks.install()
    _replicator_state.mark_averaging(optimizer)
    return optimizer
