"""A Keras 3 optimizer base whose update sees every variable at once.

Keras' TensorFlow optimizer calls `update_step` once per variable (and per device
under a strategy), so a quantity that depends on *all* variables (a global dot
product, a global norm, one branch taken for the whole model) cannot be computed
there. Neumann's global regularizer norm and NLCG's conjugate-gradient scalars need
exactly that, so the optimizers in this package override the one method Keras'
TensorFlow optimizer routes every update through, `_backend_update_step`, and keep
its structure:

1. in the replica context, the gradients are all-reduced by
   `_all_reduce_sum_gradients` (under our strategies: the library's sample-weighted
   mean; stock strategies: Keras' sum), exactly as Keras' own optimizers do;
2. still in the replica context, the subclass computes the new value of every
   variable it updates (model and optimizer variables) from the reduced gradients,
   as a pure function. All replicas see the same gradients and the same state, so
   they compute the same values and take the same branches;
3. one `merge_call` assigns the values per device (`extended.update`), as Keras'
   `_distributed_tf_update_step` does.

Keras' clipping, decoupled weight decay, EMA, `gradient_accumulation_steps` and
loss-scale unscaling all happen in `BaseOptimizer` around step 1 and are unchanged.
The hook and what it uses (the all-reduce, the optimizer's strategy, TF's
`maybe_merge_call`, the slot index) are private Keras/TF names. The override must
live here, in the subclass; everything else is reached through
`keras_replicator._compat.optimizer` (and `_compat.strategy` for the per-device
assignment), whose `check_upstream()` (tests/test_compat.py) fails if a Keras
release stops calling the hook, changes its signature or changes
the `TFOptimizer` version this one mirrors.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_replicator import _compat


class WholeListOptimizer(keras.optimizers.Optimizer):
    """Base class: subclasses implement `_new_values` instead of `update_step`."""

    def _new_values(self, grads, variables, learning_rate):
        """Returns `[(variable, new_value), ...]` for one step (replica context).

        Args:
            grads: Dense, reduced gradients, one per entry of `variables`.
            variables: The model variables (Keras variables) being trained.
            learning_rate: The current learning rate (a scalar tensor).
        """
        raise NotImplementedError

    def update_step(self, gradient, variable, learning_rate):
        raise NotImplementedError(
            f"{type(self).__name__} updates all variables at once; "
            "call `apply()` or `apply_gradients()`, not `update_step()`."
        )

    # Keras' private per-update hook (`_compat.optimizer.UPDATE_STEP_HOOK`), with
    # the steps of `TFOptimizer`'s; `_compat.optimizer.check_upstream()` fails if
    # `apply` stops calling it or Keras changes the version this one mirrors.
    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        trainable_variables = list(trainable_variables)
        raw = [_raw(v) for v in trainable_variables]
        reduced = _compat.optimizer.reduced_gradients(self, grads, raw)
        dense = [_dense(g) for g in reduced]
        pairs = self._new_values(dense, trainable_variables, learning_rate)
        targets = [_raw(v) for v, _ in pairs]
        values = [value for _, value in pairs]
        _compat.strategy.assign_in_every_replica(
            _compat.optimizer.optimizer_strategy(self), targets, values
        )


def _raw(variable):
    return variable.value if isinstance(variable, keras.Variable) else variable


def _dense(gradient):
    # Global norms and dot products need the whole gradient: an Embedding's
    # IndexedSlices may repeat rows, so its values are not the gradient.
    if isinstance(gradient, tf.IndexedSlices):
        return tf.convert_to_tensor(gradient)
    return gradient
