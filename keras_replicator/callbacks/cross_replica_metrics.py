"""`CrossReplicaMetrics`: per-step logs that mean the global batch, on every worker.

Keras' per-step logs under tf.distribute are each replica's running metric averaged
over replicas with equal weights, so a replica (or worker) with fewer samples counts
as much as a full one, and the numbers differ from what one device would show
(horovod#1095, keras-team/keras#19891). The metric *variables*, however, are sums
(totals and counts) kept per replica: summed over every replica and worker they are
exactly the one-device state.

This callback asks the keras_replicator step functions to do that sum every
`every_n_steps` steps, inside the compiled step (one small fused all-reduce; see
`keras_integration/_global_metrics.py`), and to log the resulting values: no extra call
into TensorFlow, no host round trip, and no batch hooks of its own. Keras'
epoch-end logs are already global under keras_replicator strategies (they read the
summed variables).
"""

from __future__ import annotations

import keras

from keras_replicator import _compat
from keras_replicator.keras_integration import _global_metrics


class CrossReplicaMetrics(keras.callbacks.Callback):
    """Makes per-step metric logs exact global-batch values every N steps.

    Each logged Keras metric (the loss and compiled metrics) becomes the value one
    device would report after the same samples: totals and counts summed over every
    replica of every worker (sample-weighted: a worker with fewer samples weighs
    less). All workers log the same numbers. Logs that are not Keras metrics (a
    custom `train_step`'s extra outputs) keep the replicas' mean. Steps in between
    log that mean too, as Keras does.

    Requires a keras_replicator strategy (on one device logs are already exact).

    Args:
        every_n_steps: Make the logs global every this many step-function calls
            (batches; executions when `steps_per_execution > 1`). Defaults to `10`.
        training: Apply during `fit`. Defaults to `True`.
        evaluation: Apply during `evaluate` and validation. Defaults to `True`.

    Example:
    >>> import keras_replicator as kr
    >>> callback = kr.callbacks.CrossReplicaMetrics(every_n_steps=10)
    """

    def __init__(
        self, every_n_steps: int = 10, training: bool = True, evaluation: bool = True
    ):
        super().__init__()
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int):
            raise TypeError(
                "`every_n_steps` must be a positive integer. "
                f"Received: every_n_steps={every_n_steps!r}."
            )
        if every_n_steps < 1:
            raise ValueError(
                "`every_n_steps` must be a positive integer. "
                f"Received: every_n_steps={every_n_steps}. Use 1 for every batch."
            )
        self.every_n_steps = every_n_steps
        self.training = training
        self.evaluation = evaluation

    def _set(self, phase, enabled):
        strategy = self.model.distribute_strategy
        if strategy.num_replicas_in_sync == 1:
            return
        if not _compat.is_replicator(strategy):
            raise ValueError(
                "`CrossReplicaMetrics` needs a keras_replicator strategy. Received: "
                f"a model under {type(strategy).__name__}. Build the model under "
                "`kr.MultiDeviceReplicator`, `kr.MultiWorkerReplicator` or "
                "`kr.auto()`."
            )
        _global_metrics.set_cadence(
            self.model, phase, self.every_n_steps if enabled else None
        )

    def on_train_begin(self, logs=None):
        if self.training:
            self._set("train", True)

    def on_train_end(self, logs=None):
        if self.training:
            self._set("train", False)

    def on_test_begin(self, logs=None):
        if self.evaluation:
            self._set("test", True)

    def on_test_end(self, logs=None):
        if self.evaluation:
            self._set("test", False)

    def get_config(self):
        return {
            "every_n_steps": self.every_n_steps,
            "training": self.training,
            "evaluation": self.evaluation,
        }
