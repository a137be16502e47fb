"""Keras' `Trainer._compute_loss`: where `fit` hands the loss to optimizers using it.

Keras optimizers never receive the training loss: `apply_gradients` takes gradients
only, and Keras' `train_step` keeps the loss to itself (keras-team/keras#14062,
"Accessing the value of the loss from within the optimizer", closed without an
API). NLCG's step control needs the loss of every step, and asking users to write a
`train_step` just to forward it would make `fit` useless with it.

`Trainer._compute_loss` is the one place every Keras `train_step` (and
`test_step`) gets its total loss from: it dispatches to `compute_loss`, so a model
that overrides `compute_loss` (the Keras guides' way to customize the loss) is
covered too, and the value is the full loss that gets differentiated. Wrapping the
public `compute_loss` instead would see the partial loss of an override that calls
`super().compute_loss()` and then adds terms. A custom `train_step` that calls
`compute_loss` directly bypasses the wrapper and calls
`keras_replicator.optimizers.observe_loss` itself (documented there).

This module stays a leaf: it knows where to listen, never what to do. The observer
(`optimizers/_loss_aware.py`) registers itself with `install(observer)` when an
optimizer that uses the loss is created, and is called as
`observer(model, x, loss)` with the loss as Keras computed it, i.e. divided by
the replica count under stock strategies (`replica_mean_loss` undoes that exactly
as Keras' own `train_step` does for its loss tracker).

Not called inside a Keras `StatelessScope` (the library's XLA train step computes
the loss in a compiled, stateless function where no variable can be written and no
collective can run): a step that does so calls `observe_training_loss` after its
compiled part instead.
"""

from __future__ import annotations

import inspect

from keras import tree
from keras.src.backend.common import stateless_scope as _stateless_scope
from keras.src.backend.tensorflow import trainer as _tf_trainer
from keras.src.losses import loss as _loss_module
from keras.src.trainers import trainer as _trainer

from keras_replicator._compat import _installer
from keras_replicator._compat._patching import changed_digests, replace, unpatched

# Source digests of the internals we wrap or rely on, for keras==3.15.1.
DIGESTS = {
    "Trainer._compute_loss": "13153b89c765b0d6",
}

_observer = None


def _upstream_objects():
    return {"Trainer._compute_loss": unpatched(_trainer.Trainer._compute_loss)}


def check_upstream() -> dict[str, str]:
    """{name: what changed} for the loss internals wrapped or read here."""
    changed = changed_digests(DIGESTS, _upstream_objects())
    # Keras' TF `train_step` must still take its loss from `_compute_loss(...,
    # training=True)` inside the tape, before `apply_gradients`.
    source = inspect.getsource(_tf_trainer.TensorFlowTrainer.train_step)
    loss_at = source.find("loss = self._compute_loss(")
    apply_at = source.find("self.optimizer.apply_gradients(")
    if loss_at < 0 or apply_at < loss_at or "training=True" not in source:
        changed["TensorFlowTrainer.train_step"] = (
            "no longer computes its loss with self._compute_loss(..., training=True) "
            "before apply_gradients"
        )
    if not callable(getattr(_stateless_scope, "in_stateless_scope", None)):
        changed["stateless_scope.in_stateless_scope"] = "missing"
    return changed


def install(observer) -> None:
    """Calls `observer(model, x, loss)` for every training loss `fit` computes.

    Idempotent; the first observer stays (there is one, in `optimizers/`).
    """

    def install_observer():
        global _observer
        _observer = observer
        replace(_trainer.Trainer, "_compute_loss", _observing)

    _installer.install_once(_installer.LOSS_HOOK, install_observer)


def installed() -> bool:
    """Whether `fit` hands its training losses to an observer."""
    return _installer.installed(_installer.LOSS_HOOK)


def _observing(original):
    def _compute_loss(
        self, x=None, y=None, y_pred=None, sample_weight=None, training=True
    ):
        loss = original(
            self,
            x=x,
            y=y,
            y_pred=y_pred,
            sample_weight=sample_weight,
            training=training,
        )
        if training and not _stateless_scope.in_stateless_scope():
            observe_training_loss(self, x, loss)
        return loss

    return _compute_loss


def observe_training_loss(model, x, loss) -> None:
    """Hands one training step's loss (as Keras computed it) to the observer.

    For train steps that compute the loss where the wrapper cannot observe it
    (inside a stateless, compiled function): call it in the replica context with
    the same `x` and `loss`, before `apply_gradients`.
    """
    if _observer is not None and loss is not None:
        _observer(model, x, loss)


def replica_mean_loss(loss):
    """This replica's mean loss from the value `compute_loss` returned.

    Keras divides each loss by the replica count under tf.distribute
    (`scale_loss_for_distribution`); its `train_step` multiplies back with
    `unscale_loss_for_distribution` for the loss tracker, and so do we. Under the
    library's strategies both are the identity inside their steps.
    """
    return _loss_module.unscale_loss_for_distribution(loss)


def first_input(x):
    """The first non-None leaf of `x` (Keras' `train_step` counts samples on it)."""
    return next((leaf for leaf in tree.flatten(x) if leaf is not None), None)
