"""A backup that is safe on several workers and never restores a torn state.

Stock Keras writes the backup as two files, `latest.weights.h5` and
`training_metadata.json` (the epoch), in place, on every worker. On several
workers sharing `backup_dir` that is an h5 lock error; after a crash between the
two writes (or during one) the next run restores weights of one epoch with the
epoch counter of another, or fails to read a truncated file.

Here a backup is committed in three steps, by the chief only:

1. the weights go to a new file, `state-e<epoch>-b<batch>-<token>.weights.h5`,
   written under a temporary name and renamed when complete;
2. `training_metadata.json` (epoch, batch and the name of that weights file) is
   replaced atomically the same way: this rename is the commit;
3. weights files no backup refers to any more are deleted, and
   `latest.weights.h5` becomes a hard link to the new weights, so stock Keras can
   resume from the directory too (it reads that name and the epoch).

A crash at any point leaves the previous backup whole, so a restart resumes from
the last committed epoch exactly. A `training_metadata.json` that is damaged
anyway (truncated or edited by something else, e.g. a full disk or a copy that
stopped halfway) is never read as "no epoch": that would restart at epoch 0 with
the latest weights. With `double_checkpoint=True` the previous backup is
restored (an exact resume from the epoch before); otherwise restoring stops with
an error naming the file, before anything in `backup_dir` is deleted.

Other workers save to a scratch directory (so collectives inside saving stay in
step) and restore from the chief's files, which therefore must be on a
filesystem every worker sees, as with stock Keras. A backup written by stock
Keras (`latest.weights.h5`) is still restored.

With `save_freq="epoch"` (the default) and a deterministic input order
(`shuffle=False`), resuming gives the same final weights as an uninterrupted run.
With an integer `save_freq`, each backup also records the batch to resume
from, so under our strategies a resumed run goes on mid-epoch exactly like a
preempted one (below); under a stock strategy it restarts the interrupted epoch
from mid-epoch weights, as stock Keras does (with a warning).

Preemption (issue 38, `keras_replicator._worker.preemption`): while `fit` runs, SIGTERM
(or `preemption_signals`) on any worker stops every worker after the same step,
which is backed up with the batch to resume from (`resume_batch` in the
metadata); the next start resumes there, mid-epoch, under our strategies: Keras'
epoch iterator skips the batches already trained on (`_compat.data`), so with a
deterministic input order the final weights are an uninterrupted run's. Then the
process exits with 0 (`exit_on_preemption`). Between workers the agreement on
the step rides the training steps' own all-reduce, read one step late (an
epoch's last before its validation): no host sync per batch (`StepAgreement`).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import uuid
import warnings

import keras

from keras_replicator import _compat
from keras_replicator._files.atomic_publish import TEMP_MARKER, write_atomically
from keras_replicator._files.backup_fields import check_fields, damaged_message
from keras_replicator._files.backup_files import (
    METADATA_FILE,
    PREVIOUS_SUFFIX,
    STOCK_WEIGHTS_FILE,
)
from keras_replicator._files.backup_files import STATE_FILE as _STATE_FILE
from keras_replicator._files.backup_files import DamagedMetadata as _DamagedMetadata
from keras_replicator._files.backup_files import load_metadata as _load_metadata
from keras_replicator._files.backup_files import readable_h5 as _readable_h5
from keras_replicator._files.backup_files import write_json as _write_json
from keras_replicator._files.backup_metrics import metric_state, restore_metric_state
from keras_replicator._files.backup_removal import remove_finished_backup
from keras_replicator._files.worker_files import is_chief, save_for_worker
from keras_replicator._replicator_state import replicator_state
from keras_replicator._worker import preemption as _preemption

__all__ = [
    "METADATA_FILE",
    "PREVIOUS_SUFFIX",
    "STOCK_WEIGHTS_FILE",
    "AtomicBackupAndRestore",
]


class AtomicBackupAndRestore(keras.callbacks.BackupAndRestore):
    """The engine of `keras_replicator.callbacks.BackupAndRestore` (see there).

    Also what Keras' own `BackupAndRestore` forwards its events to under our
    multi-worker strategies (`keras_integration._hooks.KerasHooks.backup_engine`),
    so both behave the same there; it lives below `callbacks/` and
    `keras_integration/` so that neither imports the other for it.
    """

    def __init__(
        self,
        backup_dir,
        save_freq="epoch",
        double_checkpoint=False,
        delete_checkpoint=True,
        *,
        preemption_signals=(signal.SIGTERM,),
        exit_on_preemption=True,
    ):
        if save_freq is not False and save_freq != "epoch":
            if isinstance(save_freq, bool) or not isinstance(save_freq, int):
                raise ValueError(
                    "`save_freq` must be 'epoch', a positive number of batches or "
                    f"False. Received: save_freq={save_freq!r}. Use 'epoch'."
                )
            if save_freq < 1:
                raise ValueError(
                    "`save_freq` must be 'epoch', a positive number of batches or "
                    f"False. Received: save_freq={save_freq}. Use 'epoch' or 100."
                )
        super().__init__(
            backup_dir,
            save_freq=save_freq,
            double_checkpoint=double_checkpoint,
            delete_checkpoint=delete_checkpoint,
        )
        self._kr_epochs_done = 0
        self._kr_last_batch = -1
        self._kr_batches_since_backup = 0
        self._kr_preemption = _preemption.Preemption(
            _preemption.signal_numbers(preemption_signals)
        )
        self.exit_on_preemption = bool(exit_on_preemption)
        self._kr_epoch = 0  # the epoch in progress
        self._kr_resume = None  # (epoch, batch) a preempted run resumes at
        self._kr_resume_metrics = None  # the metrics' state there
        self._kr_stopped_at = None  # (epoch, batch) of a preemption's backup
        self._kr_agreement = _preemption.LocalAgreement(self._kr_preemption)
        self._kr_batch = -1  # the last batch that ran

    # Restore ------------------------------------------------------------------

    def on_train_begin(self, logs=None):
        model = self.model
        if not model.built:
            raise ValueError(
                "`BackupAndRestore` needs a built model to restore into. "
                f"Received: an unbuilt model {model}. Build it first, e.g. by "
                "calling it on a batch or with `keras.Input` in its definition."
            )
        # Read first: a damaged backup stops here, before any file is deleted.
        state = self._kr_read_backup()
        if is_chief(model):
            self._kr_remove_orphans(keep=self._kr_referenced_files())
        self._kr_stopped_at = None
        self._kr_preemption.listen()
        self._kr_agreement = _preemption.agree(model, self._kr_preemption)
        if state is None:
            return
        epoch, weights_path, resume_batch, self._kr_resume_metrics = state
        if weights_path is not None:
            if model.optimizer is not None and not model.optimizer.built:
                model.optimizer.build(model.trainable_variables)
            model.load_weights(weights_path)
        if epoch is not None:
            # Keras' fit() starts from `model._initial_epoch` when it is set; it
            # is how the stock BackupAndRestore resumes, and there is no public
            # way for a callback to move the first epoch.
            _compat.set_initial_epoch(model, epoch)
            self._kr_epochs_done = epoch
        if epoch is not None and resume_batch:
            self._kr_resume_at(epoch, resume_batch)

    @property
    def preempted(self) -> bool:
        """Whether a preemption stopped the last `fit`."""
        return self._kr_stopped_at is not None

    def _kr_resume_at(self, epoch: int, batch: int) -> None:
        """Makes the first epoch (`epoch`) start at `batch`: a mid-epoch backup."""
        strategy = self.model.distribute_strategy
        state = replicator_state(strategy)
        if state is None:
            warnings.warn(
                f"The backup in {self.backup_dir!r} was made before batch {batch} "
                f"of epoch {epoch} (a preemption or an integer `save_freq`); "
                "resuming mid-epoch needs one of keras_replicator's data-parallel "
                "strategies (MultiDeviceReplicator, MultiWorkerReplicator, "
                f"TPUReplicator), and the model's is {type(strategy).__name__}, "
                "so this run restarts that epoch from its first batch with the "
                "backed-up weights: its final weights differ from an "
                "uninterrupted run's. Use `save_freq='epoch'` to resume exactly.",
                stacklevel=3,
            )
            return
        state.resume_batches = batch  # skipped by the epoch iterator
        self._kr_resume = (epoch, batch)

    def _kr_read_backup(self):
        """`(epoch, weights path, resume batch, metrics)` of the newest backup.

        None when there is no backup.
        """
        candidates = [self._kr_path(METADATA_FILE)]
        if self.double_checkpoint:
            candidates.append(self._kr_path(METADATA_FILE + PREVIOUS_SUFFIX))
        errors, damaged = [], []
        for metadata_path in candidates:
            try:
                metadata = _load_metadata(metadata_path)
            except _DamagedMetadata as error:
                damaged.append(str(error))
                continue
            if metadata is None:
                continue
            check_fields(metadata, metadata_path, self.backup_dir, self.params)
            name = metadata.get("weights")
            weights = self._kr_path(name) if name else None
            if weights is not None and _readable_h5(weights, errors):
                return (
                    metadata.get("epoch"),
                    weights,
                    metadata.get("resume_batch"),
                    metadata.get("metrics"),
                )
            if weights is None:
                stock = self._kr_path(STOCK_WEIGHTS_FILE)
                stock = stock if os.path.exists(stock) else None
                return metadata.get("epoch"), stock, None, None
        if damaged:
            raise OSError(damaged_message(self.backup_dir, damaged, errors))
        if errors:
            raise OSError(
                f"The backup in `backup_dir`={self.backup_dir!r} cannot be read "
                f"({errors[0]}). Delete the directory to start over."
            )
        stock = self._kr_path(STOCK_WEIGHTS_FILE)
        return (None, stock, None, None) if os.path.exists(stock) else None

    # Back up ------------------------------------------------------------------

    def on_epoch_begin(self, epoch, logs=None):
        self._kr_epoch, self._kr_in_epoch = epoch, True
        self._kr_agreement.forget()
        self._kr_last_batch = -1
        if self._kr_resume is not None and self._kr_resume[0] == epoch:
            self._kr_last_batch = self._kr_resume[1] - 1  # batches before: skipped
            if self._kr_resume_metrics is not None and not restore_metric_state(
                self.model, self._kr_resume_metrics
            ):
                warnings.warn(
                    f"The backup in {self.backup_dir!r} holds the state of other "
                    "metrics than this model's (compiled differently?): the "
                    f"logs of epoch {epoch} cover the batches after the resume only.",
                    stacklevel=2,
                )
        self._kr_resume = self._kr_resume_metrics = None

    def on_train_batch_end(self, batch, logs=None):
        self._kr_batch = batch
        if self._kr_agreement.stop_after_this_step():
            self._kr_stop_for_preemption(batch)
            return
        if self.save_freq in ("epoch", False):
            return
        step = batch - self._kr_last_batch if batch > self._kr_last_batch else 1
        self._kr_last_batch = batch
        self._kr_batches_since_backup += step
        if self._kr_batches_since_backup >= self.save_freq:
            self._kr_batches_since_backup = 0
            self._kr_back_up(self._kr_epochs_done, batch, resume_batch=batch + 1)

    def _kr_stop_for_preemption(self, batch: int) -> None:
        self._kr_back_up(self._kr_epoch, batch, resume_batch=batch + 1)
        self._kr_stopped_at = (self._kr_epoch, batch)
        self.model.stop_training = True
        self._kr_agreement.end()

    def on_test_begin(self, logs=None):
        if getattr(self, "_kr_in_epoch", False):  # `fit`'s validation
            self.on_epoch_end(self._kr_epoch, None, stop_only=True)

    def on_epoch_end(self, epoch, logs=None, stop_only=False):
        self._kr_in_epoch = stop_only
        if not self.preempted and self._kr_agreement.stop_at_epoch_end():
            self._kr_stop_for_preemption(self._kr_batch)  # as after the last step
        if self.preempted or stop_only:
            return  # backed up at the step; the epoch did not end
        self._kr_epochs_done = epoch + 1
        if self.save_freq == "epoch":
            self._kr_back_up(epoch + 1, 0)

    def _kr_back_up(self, epoch: int, batch: int, resume_batch=None) -> None:
        name = f"state-e{epoch}-b{batch}-{uuid.uuid4().hex[:8]}.weights.h5"
        weights = self._kr_path(name)

        def write(path):
            self.model.save_weights(path, overwrite=True)

        save_for_worker(self.model, weights, write)
        # Mid-epoch: the epoch's metrics go on from here (every worker reads).
        metrics = metric_state(self.model) if resume_batch is not None else None
        if not is_chief(self.model):
            return
        metadata_path = self._kr_path(METADATA_FILE)
        try:
            previous = _load_metadata(metadata_path)
        except _DamagedMetadata:
            previous = None  # not a backup to fall back to
        if self.double_checkpoint and previous is not None:
            _write_json(metadata_path + PREVIOUS_SUFFIX, previous)
        metadata = {"epoch": epoch, "batch": batch, "weights": name}
        if resume_batch is not None:
            metadata["resume_batch"] = resume_batch
            metadata["metrics"] = metrics
        _write_json(metadata_path, metadata)
        self._kr_link_for_stock_keras(weights)
        self._kr_remove_orphans(keep=self._kr_referenced_files())

    def _kr_link_for_stock_keras(self, weights: str) -> None:
        """Points `latest.weights.h5` at the committed weights (a hard link).

        Stock Keras' `BackupAndRestore` reads that name: without it, a directory
        written here would make it resume at the saved epoch with fresh weights.
        """

        def write(temporary):
            try:
                os.link(weights, temporary)
            except OSError:  # no hard links on this filesystem
                shutil.copyfile(weights, temporary)

        write_atomically(self._kr_path(STOCK_WEIGHTS_FILE), write)

    def on_train_end(self, logs=None):
        self._kr_agreement.end()
        if self.preempted:
            self._kr_exit_preempted()
            return
        if self.delete_checkpoint and is_chief(self.model):
            remove_finished_backup(self.backup_dir)  # crash-safe order

    def _kr_exit_preempted(self) -> None:
        epoch, batch = self._kr_stopped_at
        where = f"epoch {epoch}, after batch {batch}"
        number = self._kr_preemption.received
        cause = signal.Signals(number).name if number else "another worker's signal"
        print(
            f"keras_replicator: preempted ({cause}): backed up at {where} in "
            f"{self.backup_dir!r}; start the same job again to resume there.",
            file=sys.stderr,
            flush=True,
        )
        _preemption.mark_preempted(where)
        if self.exit_on_preemption:
            raise SystemExit(0)

    # Files --------------------------------------------------------------------

    def _kr_path(self, name: str) -> str:
        return os.path.join(self.backup_dir, name)

    def _kr_referenced_files(self) -> set[str]:
        names = set()
        for suffix in ("", PREVIOUS_SUFFIX):
            try:
                metadata = _load_metadata(self._kr_path(METADATA_FILE + suffix))
            except _DamagedMetadata:
                continue
            if metadata and metadata.get("weights"):
                names.add(metadata["weights"])
        return names

    def _kr_remove_orphans(self, keep: set[str]) -> None:
        """Deletes unreferenced weights and leftovers of interrupted writes."""
        if not os.path.isdir(self.backup_dir):
            return
        for name in os.listdir(self.backup_dir):
            orphan = _STATE_FILE.match(name) and name not in keep
            path = self._kr_path(name)
            if TEMP_MARKER in name and os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)  # a staging directory
            elif orphan or TEMP_MARKER in name:
                try:
                    os.remove(path)
                except OSError:
                    pass  # removed concurrently, or a directory: not ours
