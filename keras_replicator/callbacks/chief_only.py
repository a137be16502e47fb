"""`ChiefOnly`: run a callback on the chief worker only.

Output callbacks (CSV loggers, printing) run on every worker by default, so N
workers write N copies to the same place. Wrapping one in `ChiefOnly` gives it the
model and forwards every event to it on the chief only; elsewhere it never runs.
(Under keras_replicator strategies Keras' progress bar is silenced on non-chief
workers, and Keras' own `TensorBoard`, `ModelCheckpoint` and `BackupAndRestore`
given to `fit` write from the chief only, automatically.) Do not wrap callbacks
that run collectives (`CrossReplicaMetrics`, `ReplicaConsistencyCheck`,
`Throughput`): every worker must call those.
"""

from __future__ import annotations

import keras

from keras_replicator import _roles

_EVENTS = [
    f"on_{phase}_{edge}"
    for phase in ("train", "test", "predict", "epoch")
    for edge in ("begin", "end")
] + [
    f"on_{phase}_batch_{edge}"
    for phase in ("train", "test", "predict")
    for edge in ("begin", "end")
]


class ChiefOnly(keras.callbacks.Callback):
    """Forwards every callback event to `callback` on the chief worker only.

    Args:
        callback: A `keras.callbacks.Callback`, e.g. `keras.callbacks.TensorBoard`.

    Example:
    >>> import keras, keras_replicator as kr
    >>> board = kr.callbacks.ChiefOnly(keras.callbacks.TensorBoard("logs"))
    """

    def __init__(self, callback):
        super().__init__()
        if not isinstance(callback, keras.callbacks.Callback):
            raise TypeError(
                "`callback` must be a `keras.callbacks.Callback`. Received: "
                f"callback={callback!r} of type {type(callback).__name__}."
            )
        self.callback = callback
        for event in _EVENTS:
            setattr(self, event, self._forwarder(event))

    def set_model(self, model):
        super().set_model(model)
        # Some callbacks write already here (TensorBoard writes the model graph).
        if _roles.is_chief(model.distribute_strategy):
            self.callback.set_model(model)

    def set_params(self, params):
        super().set_params(params)
        self.callback.set_params(params)

    def _forwarder(self, event):
        def forward(*args, **kwargs):
            if _roles.is_chief(self.model.distribute_strategy):
                return getattr(self.callback, event)(*args, **kwargs)
            return None

        return forward
