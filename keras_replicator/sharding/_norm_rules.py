"""Optimizers whose update needs whole-variable norms, cut in two for sharding.

A replica holds one piece of each variable, so a per-variable norm (LARS' and
Lamb's trust ratios) is a sum of squares over every replica's piece. Such an
optimizer's step is run in two halves around one small all-reduce per bucket:
`partial(gradient, piece) -> (squares, state)` computes this piece's sums of
squares (a vector) and whatever the second half needs; after the squares are
summed over the replicas, `finish(gradient, piece, learning_rate, squares,
state)` completes the step. Padding elements are zero in every piece, so they
add nothing to the sums.

An optimizer opts in by defining `sharded_partial_squares` and `sharded_finish`
with those signatures (`kr.optimizers.LARS` does); Keras' `Lamb` gets its halves
from `_compat.lamb`, which mirrors Keras' own step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import keras

from keras_replicator import _compat


@dataclasses.dataclass(frozen=True)
class NormRule:
    """The two halves of an optimizer's step around the summed squares."""

    partial: Callable
    finish: Callable


def rule_for(optimizer) -> NormRule | None:
    """`optimizer`'s two-half step, or None if it has none (element-wise or not
    shardable)."""
    if type(optimizer) is keras.optimizers.Lamb:
        return NormRule(
            partial=lambda g, v: _compat.lamb.partial_squares(optimizer, g, v),
            finish=lambda g, v, lr, s, state: _compat.lamb.finish(
                optimizer, g, v, lr, s, state
            ),
        )
    partial = getattr(optimizer, "sharded_partial_squares", None)
    finish = getattr(optimizer, "sharded_finish", None)
    if callable(partial) and callable(finish):
        return NormRule(partial=partial, finish=finish)
    return None
