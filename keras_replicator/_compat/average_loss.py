"""TensorFlow's loss helpers for custom loops, inside our `fit` steps.

`tf.nn.compute_average_loss` and `tf.nn.scale_regularization_loss` make each
replica's loss a share of the global loss (divided by the global batch, or by
the replica count) for an optimizer that *sums* replica gradients, TensorFlow's
custom-loop contract. Inside our steps (`fit`, `evaluate`, `run_steps`: a
replica's sample count is declared) gradients are averaged instead, so a custom
`train_step` written to TensorFlow's contract trained at 1/N of one device's
step (issue 53). Keras' own loss objects have the same 1/N, which
`_compat/optimizer.py` already undoes there (`scale_loss_for_distribution`).

There is no hook in these public functions, so both are wrapped where users
reach them, `tf.nn` (TensorFlow and Keras never call them internally, so the
private `nn_impl_distribute` module they are defined in is left alone; its
functions are read for the digests): inside our steps the result is multiplied
back by the
replica count (`hooks.loss_helper_factor`), making it a per-replica quantity
whose mean over replicas is the one-device loss, which is also what a loss
tracker then logs; a fixed `global_batch_size` also tells the reduction to weigh
replicas equally (`hooks.loss_helper_factor(fixed_global_batch=True)`), exact
for an uneven last batch too. Elsewhere (a plain `strategy.run` loop, stock
strategies) both are TensorFlow's unchanged.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.ops import nn_impl_distribute as _nn_distribute

from keras_replicator._compat._patching import changed_digests, replace, unpatched

# Source digests of the functions we wrap, for tensorflow==2.21.0.
DIGESTS = {
    "nn.compute_average_loss": "3683ca7a96dd88ea",
    "nn.scale_regularization_loss": "2adedb87d51320b2",
}


def _upstream_objects():
    return {
        "nn.compute_average_loss": _nn_distribute.compute_average_loss,
        "nn.scale_regularization_loss": _nn_distribute.scale_regularization_loss,
    }


def check_upstream() -> dict[str, str]:
    """{name: what changed} for the TensorFlow loss helpers wrapped here."""
    changed = changed_digests(DIGESTS, _upstream_objects())
    for name in ("compute_average_loss", "scale_regularization_loss"):
        if unpatched(getattr(tf.nn, name)) is not unpatched(
            getattr(_nn_distribute, name)
        ):
            changed[f"tf.nn.{name}"] = "is no longer nn_impl_distribute's"
    return changed


def install(hooks) -> None:
    """Routes both helpers' results through `hooks.loss_helper_factor`."""

    def averaging(original):
        def compute_average_loss(
            per_example_loss, sample_weight=None, global_batch_size=None
        ):
            loss = original(per_example_loss, sample_weight, global_batch_size)
            factor = hooks.loss_helper_factor(global_batch_size is not None)
            return loss if factor is None else loss * tf.cast(factor, loss.dtype)

        return compute_average_loss

    def regularizing(original):
        def scale_regularization_loss(regularization_loss):
            loss = original(regularization_loss)
            factor = hooks.loss_helper_factor(False)
            return loss if factor is None else loss * tf.cast(factor, loss.dtype)

        return scale_regularization_loss

    replace(tf.nn, "compute_average_loss", averaging)
    replace(tf.nn, "scale_regularization_loss", regularizing)
