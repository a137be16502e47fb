"""Who writes a file when every worker saves: the chief, atomically; others, scratch.

Keras has no notion of a chief: under `MultiWorkerReplicator` a script's
`model.save(path)`, Keras' `ModelCheckpoint`, `BackupAndRestore` and `TensorBoard`
run on every worker, all pointed at the same path. Two h5 writers of one file crash
(`BlockingIOError: unable to lock file`), two `makedirs` of one directory race
(`FileExistsError`), and the surviving worker then fails in its next collective.

Every worker must still run the save: reading a variable to write it can be a
collective (on-read synchronised variables all-reduce across workers), so a worker
that skipped it would leave the others waiting. So, as tf_keras did for Keras 2
(`distributed_file_utils`), every worker writes and only the chief's write reaches
the user's path:

- the chief writes into a hidden staging directory next to the target (same
  filesystem), then renames what was written into place: a reader sees the
  previous file or the new one, never half of one. Several files (sharded
  weights) are published index last; a directory (an unzipped `.keras`, a
  SavedModel export) replaces the previous one as a whole, and the path is
  never left missing; a symlink's target is replaced; leftovers of killed saves
  are removed by the next save (`atomic_publish`);
- other workers write into a private scratch directory, deleted right after (and
  at exit, for TensorBoard logs). One exception: a direct `model.save(...)` /
  `save_weights(...)` of a single local file is published by every worker, the
  same way, so a script that saves and then loads on every worker finds the
  file even when the workers do not share a disk (the copies are identical).

This applies to models whose strategy is a multi-worker Replicator or a
`ModelParallelReplicator` whose mesh spans workers (its saves gather every
weight from all workers: the same rule, chief = DTensor client 0); stock
strategies and one-process strategies keep Keras' behaviour
(`keras_replicator.callbacks.ModelCheckpoint` / `BackupAndRestore` use the same
writes under every strategy). Remote paths (`gs://...`) are written directly by
the chief: object stores publish an object only once its upload completes.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable

from keras_replicator import _compat, _roles
from keras_replicator._files.atomic_publish import TEMP_MARKER, write_atomically

__all__ = [
    "TEMP_MARKER",
    "is_chief",
    "log_dir_for_worker",
    "remove_scratch",
    "routes",
    "save_checkpoint",
    "save_for_worker",
    "save_model_file",
    "scratch_dir",
    "write_atomically",
    "write_to_scratch",
]
SCRATCH_PREFIX = "kr-worker{index}-scratch-"

_state = threading.local()
_scratch_dirs: set[str] = set()
_scratch_lock = threading.Lock()


def is_chief(model) -> bool:
    """Whether this worker writes the real files for `model`.

    Example:
    >>> import keras
    >>> from keras_replicator._files import worker_files
    >>> worker_files.is_chief(keras.Sequential())
    True
    """
    return _roles.is_chief(model.distribute_strategy)


def routes(model) -> bool:
    """Whether `model`'s saves are routed here: its strategy is a multi-worker
    Replicator, or a `ModelParallelReplicator` whose mesh spans workers.

    False inside a write already routed (`save_for_worker`), so the Keras call it
    makes runs as stock Keras would.
    """
    if getattr(_state, "writing", False):
        return False
    strategy = getattr(model, "distribute_strategy", None)
    if _roles.mesh_spans_workers(strategy):
        return True
    return _compat.is_replicator(strategy) and _compat.in_multi_worker_mode(strategy)


@contextlib.contextmanager
def _writing():
    previous = getattr(_state, "writing", False)
    _state.writing = True
    try:
        yield
    finally:
        _state.writing = previous


def save_for_worker(model, path, write: Callable[[str], None]) -> None:
    """The chief runs `write(p)` and publishes `p` as `path`; others use scratch.

    Args:
        model: The model being saved; its strategy says who the chief is.
        path: The user's path (`str` or `os.PathLike`).
        write: Writes the file (or directory) at the path it is given.
    """
    path = os.fspath(path)
    with _writing():
        if is_chief(model):
            write_atomically(path, write)
        else:
            write_to_scratch(
                path, write, _roles.worker_index(model.distribute_strategy)
            )


def save_model_file(model, path, write: Callable[[str], None]) -> None:
    """Keras' write of a model, its weights or an export, on every worker.

    `path` may also be an open file or buffer (Keras accepts some): that is the
    caller's own, so it is written as given.

    A non-chief that saves one local file (`.keras`, `.h5`, `.weights.h5`) also
    publishes its copy atomically: the copies are identical (variables are in
    sync), so a script that saves and then loads on every worker reads a complete,
    current file whether or not the workers share a filesystem. Directories,
    sharded weights and remote paths stay the chief's.
    """
    if not isinstance(path, (str, os.PathLike)):
        write(path)
        return
    path = os.fspath(path)
    if is_chief(model) or "://" in path:
        save_for_worker(model, path, write)
        return
    with _writing():
        write_atomically(path, write, single_file_only=True)


def save_checkpoint(model, path: str, save_weights_only: bool) -> None:
    """What `keras.callbacks.ModelCheckpoint` writes, on every worker."""
    if os.path.isdir(path):
        raise IsADirectoryError(
            "`filepath` must name a file, not an existing directory. "
            f"Received: filepath={path!r}. Use e.g. "
            f"{os.path.join(path, 'model.keras')!r}."
        )
    if save_weights_only:

        def write(target):
            model.save_weights(target, overwrite=True)
    else:

        def write(target):
            model.save(target, overwrite=True)

    save_for_worker(model, path, write)


def log_dir_for_worker(model, log_dir: str) -> str:
    """Where this worker's TensorBoard writes: `log_dir` on the chief, else scratch."""
    if not routes(model) or is_chief(model):
        return log_dir
    return scratch_dir(_roles.worker_index(model.distribute_strategy))


def scratch_dir(index: int) -> str:
    """A new private directory for worker `index`, removed at exit at the latest."""
    path = tempfile.mkdtemp(prefix=SCRATCH_PREFIX.format(index=index))
    with _scratch_lock:
        _scratch_dirs.add(path)
    return path


def remove_scratch(path: str) -> None:
    """Deletes `path` if `scratch_dir` made it; anything else is left alone."""
    with _scratch_lock:
        if path not in _scratch_dirs:
            return
        _scratch_dirs.discard(path)
    shutil.rmtree(path, ignore_errors=True)


@atexit.register
def _remove_all_scratch() -> None:
    for path in list(_scratch_dirs):
        remove_scratch(path)


def write_to_scratch(path: str, write: Callable[[str], None], index: int) -> None:
    """Runs `write` into a private scratch directory and deletes it (non-chiefs)."""
    scratch = scratch_dir(index)
    try:
        write(os.path.join(scratch, os.path.basename(path.rstrip("/")) or "output"))
    finally:
        remove_scratch(scratch)
