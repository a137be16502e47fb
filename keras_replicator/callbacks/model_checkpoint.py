"""`ModelCheckpoint` that is safe on several workers: the chief writes, atomically.

Stock Keras 3 under `MultiWorkerMirroredStrategy` has every worker write the same
file: two workers pointed at one path crash with an h5 lock error
(`BlockingIOError`), and a worker killed mid-write leaves a truncated file behind
that the next run fails to load.

Here every worker still runs the save (whatever collectives saving may need stay
in step on all workers), but only the chief's goes to `filepath`: it is written to
a hidden temporary name in the same directory, flushed to disk, then renamed over
`filepath` (`os.replace`, atomic on POSIX filesystems), so a reader sees the old
file or the new one, never half of one. Other workers write to a private scratch
directory that is deleted right away. The chief is the `chief` task, else worker 0
(`strategy.extended.should_checkpoint`, TensorFlow's own rule, via
`keras_replicator.strategies._roles`).

Remote paths (`gs://...`) are written directly: object stores publish an object
only once its upload completes, which is already atomic.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable

import keras

from keras_replicator.strategies import _roles

# Keras picks the file format from these endings, so temporary names keep them.
_KERAS_SUFFIXES = (".weights.h5", ".keras", ".h5", ".json")
TEMP_MARKER = ".kr-tmp-"


def is_chief(model) -> bool:
    """Whether this worker writes the real checkpoint files for `model`."""
    return _roles.is_chief(model.distribute_strategy)


def temporary_sibling(path: str) -> str:
    """A hidden, unique name next to `path` that keeps its Keras file ending."""
    directory, name = os.path.split(path)
    suffix = next((s for s in _KERAS_SUFFIXES if name.endswith(s)), "")
    stem = name[: len(name) - len(suffix)]
    token = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return os.path.join(directory, f".{stem}{TEMP_MARKER}{token}{suffix}")


def write_atomically(path: str, write: Callable[[str], None]) -> None:
    """Calls `write(temporary_path)`, then renames the result to `path` atomically.

    If `write` fails (or the process dies), `path` keeps its previous content and
    the temporary file is removed (or, after a hard kill, left hidden with
    `.kr-tmp-` in its name).
    """
    if "://" in path:
        write(path)
        return
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    temporary = temporary_sibling(path)
    try:
        write(temporary)
        _fsync_file(temporary)
        os.replace(temporary, path)
        _fsync_file(directory)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def write_to_scratch(path: str, write: Callable[[str], None], index: int) -> None:
    """Runs `write` into a private scratch directory and deletes it (non-chiefs)."""
    scratch = tempfile.mkdtemp(prefix=f"kr-worker{index}-scratch-")
    try:
        write(os.path.join(scratch, os.path.basename(path) or "checkpoint"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def save_for_worker(model, path: str, write: Callable[[str], None]) -> None:
    """The chief writes `path` atomically; other workers write to scratch."""
    if is_chief(model):
        write_atomically(path, write)
    else:
        write_to_scratch(path, write, _roles.worker_index(model.distribute_strategy))


def _fsync_file(path: str) -> None:
    """Flushes a file (or a directory entry) to disk, where the OS allows it."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # some filesystems cannot fsync a directory; the rename still holds
    finally:
        os.close(descriptor)


class ModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Saves the model or its weights, safely when training runs on several workers.

    Same arguments and behaviour as `keras.callbacks.ModelCheckpoint`, plus:

    - On several workers (`MultiWorkerReplicator`, or any
      `tf.distribute` strategy), only the chief writes `filepath`; the others
      save to a scratch directory that is deleted, so pointing every worker at
      the same path just works (stock Keras crashes with an h5 lock error).
    - Every write is atomic: a temporary file in the same directory, renamed
      over `filepath` once complete. A crash mid-save leaves the previous file.

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
        if os.path.isdir(filepath):
            raise IsADirectoryError(
                "`filepath` must name a file, not an existing directory. "
                f"Received: filepath={filepath!r}. Use e.g. "
                f"{os.path.join(filepath, 'model.keras')!r}."
            )
        if self.save_weights_only:

            def write(path):
                self.model.save_weights(path, overwrite=True)
        else:

            def write(path):
                self.model.save(path, overwrite=True)

        save_for_worker(self.model, filepath, write)
        if self.verbose > 0 and is_chief(self.model):
            print(f"\nEpoch {epoch + 1}: finished saving model to {filepath}")
