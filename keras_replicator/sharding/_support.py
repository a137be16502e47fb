"""Which optimizers a sharded update runs exactly, and the error for the others.

A replica holds one piece of each variable and of each of its slots, so the
update must compute every element from the same element of the gradient, the
variable and the slots (plus scalars: the step, the learning rate). Keras'
`SGD` (momentum, Nesterov), `Adam` (AMSGrad), `AdamW`, `Adamax`, `Nadam`,
`Adagrad`, `Adadelta`, `RMSprop` (centered), `Ftrl` and `Lion` do. Optimizers
whose step needs a whole variable's norms (Keras' `Lamb`,
`kr.optimizers.LARS`, or any optimizer defining `sharded_partial_squares` /
`sharded_finish`) run in two halves around one small all-reduce of the
pieces' sums of squares (`_norm_rules`). Any other optimizer reads a whole
variable in a way a piece cannot give (a factored moment: Adafactor; an
orthogonalization: Muon) or the whole list (Neumann, NLCG), so it gets an
error naming it instead of a silently different update.

Only these exact classes are trusted: a subclass may override `update_step`
with anything. `LossScaleOptimizer` is judged by the optimizer it wraps.
Clipping (`clipnorm`, `global_clipnorm`, `clipvalue`), decoupled weight decay,
EMA and gradient accumulation happen in Keras' `BaseOptimizer` before and after
the update on whole variables, exactly as without sharding.
"""

from __future__ import annotations

import keras

from keras_replicator import _compat
from keras_replicator.communication import _strategy_transport
from keras_replicator.sharding import _norm_rules

ELEMENT_WISE = (
    keras.optimizers.SGD,
    keras.optimizers.Adam,
    keras.optimizers.AdamW,
    keras.optimizers.Adamax,
    keras.optimizers.Nadam,
    keras.optimizers.Adagrad,
    keras.optimizers.Adadelta,
    keras.optimizers.RMSprop,
    keras.optimizers.Ftrl,
    keras.optimizers.Lion,
)


def updating_optimizer(optimizer):
    """The optimizer whose `update_step` runs: a `LossScaleOptimizer`'s inner one."""
    while isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer
    return optimizer


def check_supported(optimizer) -> None:
    """Raises a `ValueError` naming `optimizer` if its update is not element-wise.

    Example:
    >>> import keras
    >>> check_supported(keras.optimizers.Adam())
    >>> check_supported(keras.optimizers.Lamb())
    >>> check_supported(keras.optimizers.Adafactor())
    Traceback (most recent call last):
    ...
    ValueError: ...
    """
    inner = updating_optimizer(optimizer)
    if type(inner) in ELEMENT_WISE or _norm_rules.rule_for(inner) is not None:
        return
    names = ", ".join(cls.__name__ for cls in ELEMENT_WISE)
    raise ValueError(
        "`AllReduceOptions(shard_weight_update=True)` runs the optimizer on one "
        "piece of each variable per replica, which is exact only for optimizers "
        "whose update is element-wise or that combine per-variable norms over "
        "the pieces. Received: optimizer="
        f"{type(inner).__name__} (name={inner.name!r}), which is not one of "
        f"{names}, Lamb or kr.optimizers.LARS, and defines no "
        "`sharded_partial_squares` / `sharded_finish` (docs/"
        "weight_update_sharding.md). Use one of those, or build the strategy "
        "with `kr.AllReduceOptions(shard_weight_update=False)` (the default)."
    )


def shards(optimizer) -> bool:
    """Whether `optimizer`'s updates are sharded: its strategy is a Replicator
    built with `shard_weight_update=True` and more than one replica."""
    strategy = _compat.optimizer.optimizer_strategy(optimizer)
    return (
        _compat.is_replicator(strategy)
        and _strategy_transport.options_of(strategy).shard_weight_update
        and strategy.num_replicas_in_sync > 1
    )
