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
with those signatures, in the class that defines its `update_step` or below it
(`kr.optimizers.LARS` does; a subclass overriding `update_step` alone is not
trusted); Keras' `Lamb` gets its halves
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
    """`optimizer`'s two-half step, or None (element-wise, or not shardable).

    Example:
    >>> import keras, keras_replicator as kr
    >>> rule_for(keras.optimizers.Adam()) is None
    True
    >>> rule_for(kr.optimizers.LARS(0.1)) is not None
    True
    """
    if type(optimizer) is keras.optimizers.Lamb:
        return NormRule(
            partial=lambda g, v: _compat.lamb.partial_squares(optimizer, g, v),
            finish=lambda g, v, lr, s, state: _compat.lamb.finish(
                optimizer, g, v, lr, s, state
            ),
        )
    if not _defines_its_halves(type(optimizer)):
        return None
    return NormRule(
        partial=optimizer.sharded_partial_squares, finish=optimizer.sharded_finish
    )


def _defines_its_halves(cls) -> bool:
    """Whether the class that defines `cls`' `update_step` also defines both
    halves: a subclass that overrides `update_step` (and not the halves) would
    otherwise be run by its parent's halves, silently ignoring its own step."""
    owners = {}
    for name in ("update_step", "sharded_partial_squares", "sharded_finish"):
        owners[name] = next((k for k in cls.__mro__ if name in vars(k)), None)
    if owners["sharded_partial_squares"] is None or owners["sharded_finish"] is None:
        return False
    step = owners["update_step"]
    return all(
        issubclass(owner, step)
        for owner in (owners["sharded_partial_squares"], owners["sharded_finish"])
    )
