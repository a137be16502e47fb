"""The training losses an optimizer was handed since its last update (NLCG).

A loss arrives once per training step, before `apply_gradients`: `fit` hands it
through `optimizer.scale_loss` (Keras' `train_step` asks the optimizer to scale
the loss it differentiates), custom loops through `observe_loss`. Some steps hand
it twice: a custom `train_step` that calls both, and the library's XLA step,
which scales a placeholder inside the compiled function and hands the real loss
after it. So an observation replaces the earlier one of the same step (same
`iterations`): every step counts once, and the steps between two updates
(`gradient_accumulation_steps`) are averaged.

The state lives in optimizer variables with Keras' `"only_first_replica"`
aggregation, so even a wrongly-passed local loss cannot make replicas disagree.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_replicator.optimizers._whole_list import _raw


class ObservedLosses:
    """The losses of the steps since the last update, one per step.

    Args:
        optimizer: The Keras optimizer that owns the state (its variables are
            made here, in its constructor: the first loss precedes the first
            `apply_gradients`, which is when Keras builds the optimizer).
        prefix: Prefix of the variable names.
    """

    def __init__(self, optimizer, prefix: str):
        self._iterations = optimizer.iterations

        def scalar(name, dtype="float64", value=0.0):
            return optimizer.add_variable(
                shape=(),
                dtype=dtype,
                initializer=keras.initializers.Constant(value),
                aggregation="only_first_replica",
                name=f"{prefix}_{name}",
            )

        # The steps before the latest one, their count (the latest included),
        # the latest step's loss and that step's `iterations`.
        self._sum = scalar("loss_sum")
        self._count = scalar("loss_count")
        self._last = scalar("loss_last")
        self._step = scalar("loss_step", "int64", -1)
        #: Whether a loss was ever handed over (checked when a step is traced).
        self.given = False

    def add(self, loss) -> None:
        """Records `loss` (a float64 scalar) as the current step's loss."""
        count = tf.convert_to_tensor(_raw(self._count))
        step = tf.cast(tf.convert_to_tensor(_raw(self._iterations)), "int64")
        pending = count > 0
        same_step = tf.logical_and(
            pending, tf.equal(tf.convert_to_tensor(_raw(self._step)), step)
        )
        last = tf.convert_to_tensor(_raw(self._last))
        folded = tf.logical_and(pending, tf.logical_not(same_step))
        self._sum.assign_add(tf.where(folded, last, tf.zeros_like(last)))
        one = tf.ones((), "float64")
        self._count.assign_add(tf.where(same_step, tf.zeros_like(one), one))
        self._last.assign(loss)
        self._step.assign(step)
        self.given = True

    def mean(self, default):
        """The mean loss of the steps since the last update, `default` if none."""
        count = tf.convert_to_tensor(_raw(self._count))
        total = tf.convert_to_tensor(_raw(self._sum))
        last = tf.convert_to_tensor(_raw(self._last))
        total += tf.where(count > 0, last, tf.zeros_like(last))
        return tf.where(count > 0, total / tf.maximum(count, 1.0), default)

    def reset(self) -> list:
        """`(variable, value)` pairs that start the next update's record."""
        zero = tf.zeros((), "float64")
        return [(self._sum, zero), (self._count, zero)]
