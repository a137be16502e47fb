"""Keras' `CallbackList`: where `fit` tells the optimizer its first step is next.

Keras calls nothing on the optimizer when `fit` starts; its only call is
`finalize_variable_values` when `fit` ends. An optimizer that trains on weights
other than the ones it evaluates (Neumann's displaced weights, which `fit` ends by
replacing with the true ones) must put the training weights back before the next
gradient, or a continued or reloaded run takes its first gradient at the wrong
point. There is no upstream issue or API for it; Keras' own `SwapEMAWeights` is a
callback the user must pass to every `fit`.

The seam is the public `keras.callbacks.CallbackList`, which Keras' `fit` builds
around the user's callbacks: `on_train_begin` marks the list, and its next
`on_train_batch_begin` (which `fit` calls right before each `train_function` call,
after every callback's own hooks) calls `listener(model)` once. It is lazy on
purpose: callbacks that load a state in `on_train_begin` (`BackupAndRestore`) have
run, a `fit` that takes no step changes nothing, and a callback that evaluates in
`on_train_begin` still sees what `fit` ended with. Callbacks run in Python in the
cross-replica context, so the listener runs the same way on one device and under
every strategy. `train_on_batch` and custom loops that use no `CallbackList` are
not covered (they move the weights themselves).

This module stays a leaf: it knows when, never what. The listener
(`optimizers/use_true_weights.py`) registers itself with `install(listener)`.
"""

from __future__ import annotations

import inspect
import weakref

from keras.src.backend.tensorflow import trainer as _tf_trainer
from keras.src.callbacks import callback_list as _callback_list

from keras_replicator._compat import _installer
from keras_replicator._compat._patching import changed_digests, replace, unpatched

# Source digests of the internals we wrap, for keras==3.15.1.
DIGESTS = {
    "CallbackList.on_train_begin": "c01ea7a54c554841",
    "CallbackList.on_train_batch_begin": "d2ff091ad71d2dad",
}

_listener = None
# The callback lists whose `fit` has begun and not yet taken its first step.
_pending = weakref.WeakSet()


def _upstream_objects():
    callbacks = _callback_list.CallbackList
    return {
        "CallbackList.on_train_begin": unpatched(callbacks.on_train_begin),
        "CallbackList.on_train_batch_begin": unpatched(callbacks.on_train_batch_begin),
    }


def check_upstream() -> dict[str, str]:
    """{name: what changed} for the callback internals wrapped or read here."""
    changed = changed_digests(DIGESTS, _upstream_objects())
    # Keras' TF `fit` must still call `on_train_begin` once and then
    # `on_train_batch_begin` right before every `train_function` call.
    # `unpatched`: the parameter-server routing may have wrapped `fit` already.
    source = inspect.getsource(unpatched(_tf_trainer.TensorFlowTrainer.fit))
    begin_at = source.find("callbacks.on_train_begin()")
    batch_at = source.find("callbacks.on_train_batch_begin(begin_step)")
    step_at = source.find("self.train_function(iterator)")
    if not 0 <= begin_at < batch_at < step_at:
        changed["TensorFlowTrainer.fit"] = (
            "no longer calls callbacks.on_train_begin() and then "
            "callbacks.on_train_batch_begin right before self.train_function"
        )
    return changed


def install(listener) -> None:
    """Calls `listener(model)` before the first training step of every `fit`.

    Idempotent; the first listener stays (there is one, in `optimizers/`).
    """

    def install_listener():
        global _listener
        _listener = listener
        callbacks = _callback_list.CallbackList
        replace(callbacks, "on_train_begin", _marking)
        replace(callbacks, "on_train_batch_begin", _announcing)

    _installer.install_once(_installer.TRAIN_BEGIN, install_listener)


def installed() -> bool:
    """Whether `fit` announces its first training step to a listener."""
    return _installer.installed(_installer.TRAIN_BEGIN)


def _marking(original):
    def on_train_begin(self, logs=None):
        original(self, logs)
        _pending.add(self)

    return on_train_begin


def _announcing(original):
    def on_train_batch_begin(self, batch, logs=None):
        original(self, batch, logs=logs)
        if self in _pending:
            _pending.discard(self)
            model = getattr(self, "model", None)
            if model is not None:
                _listener(model)

    return on_train_batch_begin
