"""`ModelCheckpoint` that is safe on several workers: the chief writes, atomically.

Stock Keras 3 under `MultiWorkerMirroredStrategy` has every worker write the same
file: two workers pointed at one path crash with an h5 lock error
(`BlockingIOError`), and a worker killed mid-write leaves a truncated file behind
that the next run fails to load.

Here every worker still runs the save (whatever collectives saving may need stay
in step on all workers), but only the chief's goes to `filepath`: it is written
into a hidden staging directory next to it, flushed to disk, then renamed over
`filepath` (`os.replace`, atomic on POSIX filesystems), so a reader sees the old
file or the new one, never half of one. Other workers write to a private scratch
directory that is deleted right away. The chief is the `chief` task, else worker 0
(`strategy.extended.should_checkpoint`, TensorFlow's own rule). The writes are
`keras_replicator._files.worker_files`', which also route Keras' own
`ModelCheckpoint` under `MultiWorkerReplicator`; this class does the same under
every strategy, one device included.

Remote paths (`gs://...`) are written directly: object stores publish an object
only once its upload completes, which is already atomic.
"""

from __future__ import annotations

import keras

from keras_replicator._files.worker_files import is_chief, save_checkpoint


class ModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Saves the model or its weights, safely when training runs on several workers.

    Same arguments and behaviour as `keras.callbacks.ModelCheckpoint`, plus:

    - On several workers (`MultiWorkerReplicator`, or any
      `tf.distribute` strategy), only the chief writes `filepath`; the others
      save to a scratch directory that is deleted, so pointing every worker at
      the same path just works (stock Keras crashes with an h5 lock error;
      under `MultiWorkerReplicator` Keras' own `ModelCheckpoint` is routed to
      the same writes).
    - Every write is atomic, under every strategy: written in a hidden staging
      directory next to `filepath`, renamed over it once complete. A crash
      mid-save leaves the previous file.

    Args:
        filepath: Where to save; may contain `{epoch}` and log keys, as in Keras.
            Must end in `.keras` (or `.weights.h5` with `save_weights_only=True`).
        monitor: The metric `save_best_only` compares. Defaults to `"val_loss"`.
        verbose: 1 prints a line per save. Defaults to `0`.
        save_best_only: Only save when `monitor` improved. Defaults to `False`.
        save_weights_only: Save weights (`.weights.h5`) instead of the whole
            model. Defaults to `False`.
        mode: `"auto"`, `"min"` or `"max"`, for `save_best_only`. Defaults to
            `"auto"`.
        save_freq: `"epoch"` or a number of batches. Defaults to `"epoch"`.
        initial_value_threshold: Starting "best" value for `save_best_only`.
            Defaults to `None`.

    Example:
    >>> import os, tempfile, numpy as np, keras
    >>> from keras_replicator.callbacks import ModelCheckpoint
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile("sgd", "mse")
    >>> path = os.path.join(tempfile.mkdtemp(), "model.weights.h5")
    >>> _ = model.fit(np.ones((8, 4)), np.ones((8, 1)), epochs=1, verbose=0,
    ...               callbacks=[ModelCheckpoint(path, save_weights_only=True)])
    >>> os.listdir(os.path.dirname(path))
    ['model.weights.h5']
    """

    # Keras' `_save_model(epoch, batch, logs)` is the one place ModelCheckpoint
    # writes; we keep its decisions (`_get_file_path`, `_should_save_model`) and
    # replace only how the file is written.
    def _save_model(self, epoch, batch, logs):
        filepath = self._get_file_path(epoch, batch, logs)
        if not self._should_save_model(epoch, batch, logs, filepath):
            return
        save_checkpoint(self.model, filepath, self.save_weights_only)
        if self.verbose > 0 and is_chief(self.model):
            print(f"\nEpoch {epoch + 1}: finished saving model to {filepath}")
