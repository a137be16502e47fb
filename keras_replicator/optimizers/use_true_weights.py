"""`UseTrueWeights`: evaluate (and checkpoint) Neumann's true weights inside `fit`.

Neumann keeps displaced weights `w + mu * m` in the model while it trains (see
`neumann.py`). `fit` ends with the true weights on its own (Keras calls the
optimizer's `finalize_variable_values`), but Keras calls nothing on the optimizer
when the next `fit` starts: this callback, in the style of Keras' `SwapEMAWeights`,
puts the displaced weights back before each epoch (after `BackupAndRestore` and
other callbacks restored a state in `on_train_begin`), so a run continued after
`fit`, `load_model` or `load_weights` takes its first gradient where the
uninterrupted run would. Inside `fit` it moves the model to the true weights
before the validation pass of each epoch, a `predict` from a callback (and, with
`on_epoch_end=True`, a `ModelCheckpoint`), and back before training resumes. A
`fit` that continues without it fails at its first update (`neumann.py`), rather
than train from the wrong point. It lives next to the optimizer it serves and
works with any optimizer that has `use_true_weights()` and
`use_displaced_weights()`.
"""

from __future__ import annotations

import keras


def _innermost(optimizer):
    while hasattr(optimizer, "inner_optimizer"):
        optimizer = optimizer.inner_optimizer
    return optimizer


class UseTrueWeights(keras.callbacks.Callback):
    """Evaluates true weights during `fit` and trains on displaced ones.

    Pass it to every `fit` of a `Neumann` model: it puts the displaced weights
    back before training (a `fit` that continues a run without it fails at its
    first update), and validation and callbacks see the true weights.

    Args:
        on_epoch_end: Also move at the end of every epoch, so that callbacks placed
            after this one (e.g. `ModelCheckpoint`) see the true weights. Defaults
            to `False`.

    Raises:
        ValueError: At the start of training, if the optimizer (or the one a
            `LossScaleOptimizer` wraps) has no `use_true_weights()` method.

    Example:
    >>> import keras, numpy as np
    >>> from keras_replicator.optimizers import Neumann, UseTrueWeights
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(Neumann(0.05), loss="mse")
    >>> x, y = np.ones((8, 2)), np.ones((8, 1))
    >>> _ = model.fit(x, y, validation_data=(x, y), epochs=2, verbose=0,
    ...               callbacks=[UseTrueWeights()])
    """

    def __init__(self, on_epoch_end: bool = False):
        super().__init__()
        if not isinstance(on_epoch_end, bool):
            raise TypeError(
                "`on_epoch_end` must be a bool. Received: "
                f"on_epoch_end={on_epoch_end!r}. Pass True or False."
            )
        self.move_on_epoch_end = on_epoch_end
        self._training = False

    def _optimizer(self):
        optimizer = _innermost(self.model.optimizer)
        if not hasattr(optimizer, "use_displaced_weights"):
            raise ValueError(
                "`UseTrueWeights` needs an optimizer with displaced weights, such "
                "as `keras_replicator.optimizers.Neumann`. Received: optimizer="
                f"{type(optimizer).__name__}. Remove the callback."
            )
        return optimizer

    def _move(self, to_true: bool):
        optimizer = self._optimizer()
        if not optimizer.built:
            return
        if to_true:
            optimizer.use_true_weights()
        else:
            optimizer.use_displaced_weights()

    def on_train_begin(self, logs=None):
        # Checks the optimizer; `on_epoch_begin` re-displaces (not here: callbacks
        # after this one may still restore a state, and a `fit` that runs no
        # epoch then moves nothing).
        self._optimizer()
        self._training = True

    def on_train_end(self, logs=None):
        self._training = False

    def on_epoch_begin(self, epoch, logs=None):
        self._move(to_true=False)

    def on_epoch_end(self, epoch, logs=None):
        if self.move_on_epoch_end:
            self._move(to_true=True)

    def on_test_begin(self, logs=None):
        self._move(to_true=True)

    def on_test_end(self, logs=None):
        if self._training:
            self._move(to_true=False)

    def on_predict_begin(self, logs=None):
        self._move(to_true=True)

    def on_predict_end(self, logs=None):
        if self._training:
            self._move(to_true=False)
