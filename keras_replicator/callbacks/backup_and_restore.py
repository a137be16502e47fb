"""`BackupAndRestore` that is safe on several workers and never restores a torn state.

Stock Keras writes the backup as two files, `latest.weights.h5` and
`training_metadata.json` (the epoch), in place, on every worker. On several
workers sharing `backup_dir` that is an h5 lock error; after a crash between the
two writes (or during one) the next run restores weights of one epoch with the
epoch counter of another, or fails to read a truncated file.

Here a backup is committed atomically by the chief (the three steps and the
recovery are `keras_replicator/_files/backup.py`'s, the engine Keras' own
`BackupAndRestore` is routed to under `MultiWorkerReplicator` too), so a restart
resumes from the last committed epoch exactly. Other workers save to a scratch
directory and restore from the chief's files, which therefore must be on a
filesystem every worker sees, as with stock Keras.
"""

from __future__ import annotations

from keras_replicator._files.backup import (
    METADATA_FILE,
    PREVIOUS_SUFFIX,
    STOCK_WEIGHTS_FILE,
    AtomicBackupAndRestore,
)

__all__ = [
    "METADATA_FILE",
    "PREVIOUS_SUFFIX",
    "STOCK_WEIGHTS_FILE",
    "BackupAndRestore",
]


class BackupAndRestore(AtomicBackupAndRestore):
    """Backs up and restores the training state, safely on several workers.

    Keras' `keras.callbacks.BackupAndRestore` arguments, and two of its own
    for preemption (keyword-only). Differences:

    - Only the chief writes to `backup_dir`; every worker restores from it, so
      all workers can be given the same `backup_dir` (stock Keras crashes;
      under `MultiWorkerReplicator` Keras' own `BackupAndRestore` is routed to
      this class, so both behave the same there).
    - Also atomic on one device and under stock `tf.distribute` strategies,
      where Keras' own keeps its in-place writes.
    - A backup is committed atomically (see the module docstring): a crash
      while backing up leaves the previous backup, and a restart resumes from
      it with the same weights and epoch a run without the crash would have had.
    - `double_checkpoint=True` keeps the previous backup too, and restores it
      if the latest weights cannot be read.
    - Preemption (docs/preemption.md): while `fit` runs, SIGTERM on any worker
      stops every worker after the same step, backs up there, and exits the
      process with 0; the next start resumes at the next batch (mid-epoch, under
      keras_replicator's strategies), as if never stopped. Not on a
      `ModelParallelReplicator` whose mesh spans workers (they cannot agree on a
      step): there it warns and does not listen.

    Args:
        backup_dir: Directory for the backup, on storage every worker can read.
            Do not share it with other callbacks or runs.
        save_freq: `"epoch"`, a number of batches, or `False` (never back up).
            Defaults to `"epoch"`.
        double_checkpoint: Keep the previous backup as a fallback. Defaults to
            `False`.
        delete_checkpoint: Delete `backup_dir` when training finishes.
            Defaults to `True`.
        preemption_signals: Signals (numbers or names, e.g. `"SIGUSR1"`) that
            mean "preempted"; `None` or `()` to not listen. Defaults to
            `(signal.SIGTERM,)`.
        exit_on_preemption: After a preemption's backup, exit the process with
            0 (`SystemExit` from `fit`). False: `fit` returns and `preempted`
            is True. Defaults to `True`.

    Attributes:
        preempted: Whether a preemption stopped the last `fit`.

    Example:
    >>> import os, tempfile, numpy as np, keras
    >>> from keras_replicator.callbacks import BackupAndRestore
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile("sgd", "mse")
    >>> backup = BackupAndRestore(tempfile.mkdtemp(), delete_checkpoint=False)
    >>> _ = model.fit(np.ones((8, 4)), np.ones((8, 1)), epochs=2, verbose=0,
    ...               callbacks=[backup])
    >>> sorted(os.listdir(backup.backup_dir))[-1]
    'training_metadata.json'
    """
