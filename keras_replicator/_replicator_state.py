"""What the library knows about a strategy: one typed object, one accessor.

Our strategies subclass TensorFlow's, and Keras, `_compat`'s patches and half the
packages ask them questions: which transport (with its all-reduce options,
collective timeout and keys), whether they span workers, cached step functions. That
state used to be stamped on the strategy (and on optimizers) as `_kr_*` attributes
with `setattr` and read back with `getattr` from six packages. It now lives in one
`ReplicatorState` per strategy, registered by our strategies' constructors and read
with `replicator_state`.

The state is held by the strategy itself, in the one attribute our strategies'
constructors set (`register`), so it lives and dies with its strategy: a global
weak registry was tried, but its values (compiled `run_steps` loops, whose input
signatures name the strategy) refer back to their key and kept every strategy
alive. Nothing else is written on a TensorFlow object; a stock strategy has no
state (`None`: "not one of ours"). (`_compat`, a leaf that imports nothing of
ours, tells our synchronous strategies by the class attribute `ReplicatorMixin`
declares instead.)

The optimizers that `kr.wrap_optimizer` marks to average are kept the same way
(`mark_averaging`, `marked_averaging`): a weak set, not an attribute that Keras
would track.

This module imports nothing else from keras_replicator, so every layer may use it.

Example:
>>> import tensorflow as tf
>>> replicator_state(tf.distribute.get_strategy()) is None
True
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Any

_AVERAGING: weakref.WeakSet = weakref.WeakSet()
_LOCK = threading.Lock()


@dataclasses.dataclass(eq=False)
class SampleCount:
    """One replica step's declared sample count (`keras_integration/_sample_count`).

    Attributes:
        count: The replica's number of samples, a float32 scalar tensor.
        loss_scaled: Whether its loss already carries `count`
            (`optimizer.scale_loss`), so the gradient all-reduce only sums.
        equal_weights: Whether replicas weigh equally in the mean instead of by
            `count`: the loss is N times the replica's share of a global loss
            whose divisor the user fixed (`tf.nn.compute_average_loss(...,
            global_batch_size=...)`, `_compat/average_loss.py`).
    """

    count: Any
    loss_scaled: bool = False
    equal_weights: bool = False

    def take_scaled_loss(self) -> bool:
        """True, once, if the loss carries the count: the first all-reduce of the
        step consumes the mark (a second one, a `LossScaleOptimizer`'s inner
        optimizer, sees gradients that are already the global mean)."""
        scaled, self.loss_scaled = self.loss_scaled, False
        return scaled


@dataclasses.dataclass(eq=False)
class ReplicatorState:
    """Everything the library keeps about one strategy.

    Two kinds of state, apart: how the replicas communicate (`transport`: the
    options, the ring or the collectives, their timeout and keys, all in one
    object built by the constructor), and what the strategy runs with and
    remembers between steps (the rest).

    Attributes:
        transport: The strategy's one `communication._transport.Transport`
            (its `options` are the resolved `kr.AllReduceOptions`), or None (a
            `ParameterServerReplicator`: no all-reduce).
        is_multi_worker: Whether the strategy spans several worker processes.
        is_parameter_server: A `ParameterServerReplicator` (asynchronous; not a
            synchronous Replicator, so Keras' steps are not rerouted).
        partitioner: A parameter-server strategy's `variable_partitioner`.
        resolver: A parameter-server strategy's cluster resolver.
        platform: `"CPU"`, `"GPU"` or `"TPU"`: what the replicas run on, set by
            the constructor where the devices are known (`keras_replicator.
            _platform`), or None (read from the strategy's devices).
        nccl: Whether the collectives may run NCCL: GPU replicas, each on a
            GPU of its own (not logical GPUs split from one, nor GPUs the
            launcher made workers share), or None (`_platform.nccl_usable`).
        step_functions: Compiled `run_steps` loops, by their arguments.
        sample_counts: Declared sample counts by replica (the one side channel of
            the step: see `keras_integration/_sample_count`).
        resume_batches: Batches of the next `fit`'s first epoch that a mid-epoch
            backup (a preemption, an integer `save_freq`) already trained on
            (`_files/backup`, issue 38): its epoch iterator skips them, then
            sets this back to 0.
    """

    # A `Transport`, typed where it is read (`_strategy_transport.transport_for`):
    # this module stays a leaf, even for the type checker's imports.
    transport: Any = None
    is_multi_worker: bool = False
    is_parameter_server: bool = False
    partitioner: Any = None
    resolver: Any = None
    platform: str | None = None
    nccl: bool | None = None
    step_functions: dict = dataclasses.field(default_factory=dict)
    sample_counts: dict = dataclasses.field(default_factory=dict)
    resume_batches: int = 0
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)


_ATTRIBUTE = "_replicator_state"  # set once, by our own constructors


def register(strategy, state: ReplicatorState | None = None) -> ReplicatorState:
    """Makes `state` (default: a new one) `strategy`'s; our constructors call it."""
    state = ReplicatorState() if state is None else state
    setattr(strategy, _ATTRIBUTE, state)
    return state


def replicator_state(strategy) -> ReplicatorState | None:
    """`strategy`'s state, or None if it is not one of our strategies."""
    state = getattr(strategy, _ATTRIBUTE, None)
    return state if isinstance(state, ReplicatorState) else None


def own_state(strategy) -> ReplicatorState:
    """The state of one of our strategies (for its own methods): never None."""
    state = replicator_state(strategy)
    if state is None:
        raise RuntimeError(
            f"{type(strategy).__name__} was not registered: its constructor must call "
            "`_replicator_state.register` before the strategy is used."
        )
    return state


def mark_averaging(optimizer) -> None:
    """Marks `optimizer` (and a `LossScaleOptimizer`'s inner one) as averaging."""
    with _LOCK:
        _AVERAGING.add(optimizer)
        inner = getattr(optimizer, "inner_optimizer", None)
        if inner is not None:
            _AVERAGING.add(inner)


def marked_averaging(optimizer) -> bool:
    """Whether `kr.wrap_optimizer` marked `optimizer` to average over replicas."""
    try:
        return optimizer in _AVERAGING
    except TypeError:
        return False
