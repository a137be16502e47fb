"""`scaled_learning_rate`: the linear scaling rule of Goyal et al. (2017)."""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    import tensorflow as tf


def scaled_learning_rate(
    base_learning_rate: float,
    global_batch_size: int | None = None,
    base_batch_size: int = 256,
    *,
    per_replica_batch_size: int | None = None,
    strategy: tf.distribute.Strategy | None = None,
) -> float:
    """Scales a learning rate tuned at `base_batch_size` to a larger global batch.

    The linear scaling rule: when the minibatch size is multiplied by k, multiply the
    learning rate by k (Goyal et al. 2017, who trained ResNet-50 at batch 8k this way,
    with gradual warmup, see `keras_replicator.schedules.Warmup`). Under our
    strategies the gradient is the mean over the *global* batch, so the global batch
    is what counts, not the per-replica one:

    ```python
    base_learning_rate * global_batch_size / base_batch_size
    ```

    Pass either `global_batch_size`, or `per_replica_batch_size` and the global batch
    is `per_replica_batch_size * strategy.num_replicas_in_sync`.

    Args:
        base_learning_rate: Float > 0, the learning rate tuned at `base_batch_size`.
        global_batch_size: Int > 0, the batch summed over all replicas (what you pass
            to `fit(batch_size=...)` under a strategy). Defaults to `None`.
        base_batch_size: Int > 0, the batch at which `base_learning_rate` was tuned.
            Defaults to `256` (Goyal et al.: 0.1 per 256 images).
        per_replica_batch_size: Int > 0, the batch of one replica, instead of
            `global_batch_size`. Defaults to `None`.
        strategy: The `tf.distribute.Strategy` whose replica count multiplies
            `per_replica_batch_size`. Defaults to `None`: the strategy whose
            `scope()` is active.

    Returns:
        The scaled learning rate, a Python float.

    Raises:
        ValueError: If not exactly one of `global_batch_size` and
            `per_replica_batch_size` is given, a value is not positive, or
            `strategy` is given with `global_batch_size`.
        RuntimeError: If `per_replica_batch_size` is given outside a strategy scope
            and without `strategy`.

    Example:
    >>> from keras_replicator.schedules import scaled_learning_rate
    >>> scaled_learning_rate(0.1, global_batch_size=8192)
    3.2
    >>> import keras_replicator as kr
    >>> strategy = kr.MultiDeviceReplicator(num_replicas=2)
    >>> scaled_learning_rate(0.1, per_replica_batch_size=256, strategy=strategy)
    0.2

    References:
        - [Goyal et al., 2017. Accurate, Large Minibatch SGD: Training ImageNet in
          1 Hour](https://arxiv.org/abs/1706.02677)
    """
    _check_positive("base_learning_rate", base_learning_rate, float)
    _check_positive("base_batch_size", base_batch_size, int)
    if (global_batch_size is None) == (per_replica_batch_size is None):
        raise ValueError(
            "Pass exactly one of `global_batch_size` and `per_replica_batch_size`. "
            f"Received: global_batch_size={global_batch_size}, "
            f"per_replica_batch_size={per_replica_batch_size}."
        )
    if global_batch_size is not None:
        _check_positive("global_batch_size", global_batch_size, int)
        if strategy is not None:
            raise ValueError(
                "`strategy` is only used with `per_replica_batch_size`. Received: "
                f"global_batch_size={global_batch_size}, strategy={strategy!r}. "
                "Drop `strategy`, or pass per_replica_batch_size instead."
            )
    else:
        _check_positive("per_replica_batch_size", per_replica_batch_size, int)
        per_replica = cast(int, per_replica_batch_size)  # checked above: not None
        global_batch_size = int(per_replica) * _replicas(strategy)
    return float(base_learning_rate) * (int(global_batch_size) / int(base_batch_size))


def _replicas(strategy) -> int:
    import tensorflow as tf

    if strategy is None:
        if not tf.distribute.has_strategy():
            raise RuntimeError(
                "`per_replica_batch_size` needs the number of replicas, but no "
                "strategy scope is active and no `strategy` was passed. Call inside "
                "`strategy.scope()`, pass `strategy=...`, or pass "
                "`global_batch_size` instead."
            )
        strategy = tf.distribute.get_strategy()
    return strategy.num_replicas_in_sync


def _check_positive(name: str, value, kind: type) -> None:
    accepted = numbers.Real if kind is float else numbers.Integral
    if not isinstance(value, accepted) or isinstance(value, bool):
        raise TypeError(
            f"`{name}` must be {'a number' if kind is float else 'an int'}. "
            f"Received: {name}={value!r} (of type {type(value).__name__})."
        )
    if value <= 0:
        raise ValueError(f"`{name}` must be > 0. Received: {name}={value}.")
