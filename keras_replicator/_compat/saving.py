"""Keras' own saving on several workers (issue 11): model files, export,
ModelCheckpoint, BackupAndRestore, TensorBoard routed to the chief / scratch.
"""

from __future__ import annotations

from keras_replicator._compat._patching import changed_digests, replace, unpatched

# callbacks/model_checkpoint.py overrides the one method Keras writes in and calls
# the two that decide what to write (no public hook exists); keras==3.15.1.
CHECKPOINT_DIGESTS = {
    "ModelCheckpoint._save_model": "a9be0a24277ff179",
    "ModelCheckpoint._get_file_path": "06ba05ff7e06b736",
    "ModelCheckpoint._should_save_model": "279f32db535b0f09",
}

# Source digests of what `_patch_worker_files` replaces or relies on (keras==3.15.1).
WORKER_FILES_DIGESTS = {
    "saving_api.save_model": "40d9c6f3a9b45c35",
    "saving_api.save_weights": "38966258038dc2e8",
    "saving_lib.save_model": "0b360baae4175255",
    "saving_lib.save_weights_only": "649839a5ed3a5df6",
    "legacy_h5_format.save_model_to_hdf5": "089058ee0d3223d6",
    "Model.export": "f11ed3b71eb342ea",
    "BackupAndRestore.on_train_begin": "dfdb7eac4983f490",
    "BackupAndRestore.on_epoch_begin": "bacdda51dcb91fd5",
    "BackupAndRestore.on_epoch_end": "6703014b0a783529",
    "BackupAndRestore.on_train_batch_end": "cb4fdcc29daf210b",
    "BackupAndRestore.on_train_end": "3a3f33285b2c46b0",
    "TensorBoard.set_model": "36b4c489a66848e9",
    "TensorBoard.on_train_end": "29f4f0e47170770b",
}
_BACKUP_EVENTS = (
    "on_train_begin",
    "on_epoch_begin",
    "on_epoch_end",
    "on_train_batch_end",
    "on_train_end",
)


def _worker_files_upstream():
    import keras
    from keras.src.legacy.saving import legacy_h5_format
    from keras.src.saving import saving_api, saving_lib

    backup = keras.callbacks.BackupAndRestore
    board = keras.callbacks.TensorBoard
    return {
        # `model.save`, `keras.saving.save_model` and `save_weights` all end in
        # these module functions, looked up at call time by saving_api.
        "saving_api.save_model": saving_api.save_model,
        "saving_api.save_weights": saving_api.save_weights,
        "saving_lib.save_model": unpatched(saving_lib.save_model),
        "saving_lib.save_weights_only": unpatched(saving_lib.save_weights_only),
        "legacy_h5_format.save_model_to_hdf5": unpatched(
            legacy_h5_format.save_model_to_hdf5
        ),
        "Model.export": unpatched(keras.Model.export),
        "BackupAndRestore.on_train_begin": unpatched(backup.on_train_begin),
        "BackupAndRestore.on_epoch_begin": unpatched(backup.on_epoch_begin),
        "BackupAndRestore.on_epoch_end": unpatched(backup.on_epoch_end),
        "BackupAndRestore.on_train_batch_end": unpatched(backup.on_train_batch_end),
        "BackupAndRestore.on_train_end": unpatched(backup.on_train_end),
        "TensorBoard.set_model": unpatched(board.set_model),
        "TensorBoard.on_train_end": unpatched(board.on_train_end),
    }


def _checkpoint_upstream():
    import keras

    stock = keras.callbacks.ModelCheckpoint
    return {
        "ModelCheckpoint._save_model": unpatched(stock._save_model),
        "ModelCheckpoint._get_file_path": stock._get_file_path,
        "ModelCheckpoint._should_save_model": stock._should_save_model,
    }


def check_upstream() -> dict[str, str]:
    """{name: what changed} for the saving internals replaced or read here."""
    changed = changed_digests(CHECKPOINT_DIGESTS, _checkpoint_upstream())
    changed.update(changed_digests(WORKER_FILES_DIGESTS, _worker_files_upstream()))
    return changed


def install(hooks) -> None:
    """Routes Keras' own file writes to `hooks` (see `_patch_worker_files`)."""
    _patch_worker_files(hooks)


def _patch_worker_files(hooks):
    # Keras has no notion of a chief (tensorflow/tensorflow#38635, #31070; tf_keras
    # had `distributed_file_utils`, Keras 3 dropped it): under
    # MultiWorkerMirroredStrategy every worker writes the user's path and two h5
    # writers crash ("unable to lock file"). Every worker must still run the
    # save (reading on-read variables is a collective), so under our multi-worker
    # strategies the hooks send the chief's write to the real path, atomically,
    # and the others' to scratch (_files/worker_files.py). Keras offers no
    # hook for where a model, a checkpoint callback or TensorBoard writes.
    import keras
    from keras.src.legacy.saving import legacy_h5_format
    from keras.src.saving import saving_lib

    # Where every `model.save(...)`, `keras.saving.save_model(...)` and
    # `save_weights(...)` writes (after saving_api's checks and its overwrite
    # prompt): patched here, a script's earlier `from keras.saving import
    # save_model` is routed too.
    def write_model_file(original):
        def write(model, filepath, *args, **kwargs):
            if not hooks.routes_worker_files(model):
                return original(model, filepath, *args, **kwargs)
            hooks.save_model_file(
                model, filepath, lambda path: original(model, path, *args, **kwargs)
            )

        return write

    replace(saving_lib, "save_model", write_model_file)
    replace(saving_lib, "save_weights_only", write_model_file)
    replace(legacy_h5_format, "save_model_to_hdf5", write_model_file)

    def export(original):
        def export(self, filepath, *args, **kwargs):
            if not hooks.routes_worker_files(self):
                return original(self, filepath, *args, **kwargs)
            hooks.save_model_file(
                self, filepath, lambda path: original(self, path, *args, **kwargs)
            )

        return export

    replace(keras.Model, "export", export)

    # ModelCheckpoint: keep Keras' decisions (`_get_file_path`,
    # `_should_save_model`); replace its unguarded `makedirs` and the write.
    def checkpoint(original):
        def _save_model(self, epoch, batch, logs):
            if not hooks.routes_worker_files(self.model):
                return original(self, epoch, batch, logs)
            filepath = self._get_file_path(epoch, batch, logs)
            if self._should_save_model(epoch, batch, logs, filepath):
                hooks.save_checkpoint(self.model, filepath, self.save_weights_only)

        return _save_model

    replace(keras.callbacks.ModelCheckpoint, "_save_model", checkpoint)

    # BackupAndRestore writes weights and then the epoch in place, so a crash in
    # between resumes from a torn state; under our multi-worker strategies every
    # event goes to the atomic, chief-writes engine instead (the same one
    # `keras_replicator.callbacks.BackupAndRestore` is).
    def backup_event(event):
        def make(original):
            def handler(self, *args, **kwargs):
                engine = hooks.backup_engine(self)
                if engine is None:
                    return original(self, *args, **kwargs)
                return getattr(engine, event)(*args, **kwargs)

            return handler

        return make

    for event in _BACKUP_EVENTS:
        replace(keras.callbacks.BackupAndRestore, event, backup_event(event))

    # TensorBoard: non-chiefs log to scratch (`set_model` fixes every directory
    # the callback writes to, from `log_dir`), deleted when training ends.
    def set_model(original):
        def set_model(self, model):
            log_dir = hooks.log_dir_for_worker(model, self.log_dir)
            if log_dir == self.log_dir:
                return original(self, model)
            user_log_dir, self.log_dir = self.log_dir, log_dir
            try:
                return original(self, model)
            finally:
                self.log_dir = user_log_dir

        return set_model

    def on_train_end(original):
        def on_train_end(self, logs=None):
            original(self, logs)
            hooks.remove_scratch(getattr(self, "_log_write_dir", None))

        return on_train_end

    replace(keras.callbacks.TensorBoard, "set_model", set_model)
    replace(keras.callbacks.TensorBoard, "on_train_end", on_train_end)
