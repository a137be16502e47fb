"""Keras' own saving on several workers (issue 11): model files, export,
ModelCheckpoint, BackupAndRestore, TensorBoard routed to the chief / scratch.

Model files and exports are routed where Keras writes them (`saving_lib`,
`legacy_h5_format`, `Model.export`). The three callbacks are routed per instance,
from the one place every callback `fit` runs meets its model
(`CallbackList.set_model`): their classes stay Keras' own.
"""

from __future__ import annotations

import types

from keras_replicator._compat._patching import changed_digests, replace, unpatched

# callbacks/model_checkpoint.py (and, per instance, `_patch_stock_callbacks`)
# overrides the one method Keras writes in and calls the two that decide what to
# write (no public hook exists); keras==3.15.1.
CHECKPOINT_DIGESTS = {
    "ModelCheckpoint._save_model": "a9be0a24277ff179",
    "ModelCheckpoint._get_file_path": "06ba05ff7e06b736",
    "ModelCheckpoint._should_save_model": "279f32db535b0f09",
}

# Source digests of what `_patch_worker_files` / `_patch_stock_callbacks` replace,
# stand in for per instance, or rely on (keras==3.15.1): the BackupAndRestore
# events the engine answers, TensorBoard's `set_model` reading `log_dir` once.
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
    "CallbackList.set_model": "8513cc850af1dbbf",
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
        **{
            f"BackupAndRestore.{event}": getattr(backup, event)
            for event in _BACKUP_EVENTS
        },
        "TensorBoard.set_model": board.set_model,
        "TensorBoard.on_train_end": board.on_train_end,
        "CallbackList.set_model": unpatched(keras.callbacks.CallbackList.set_model),
    }


def _checkpoint_upstream():
    import keras

    stock = keras.callbacks.ModelCheckpoint
    return {
        "ModelCheckpoint._save_model": stock._save_model,
        "ModelCheckpoint._get_file_path": stock._get_file_path,
        "ModelCheckpoint._should_save_model": stock._should_save_model,
    }


def check_upstream() -> dict[str, str]:
    """{name: what changed} for the saving internals replaced or read here."""
    changed = changed_digests(CHECKPOINT_DIGESTS, _checkpoint_upstream())
    changed.update(changed_digests(WORKER_FILES_DIGESTS, _worker_files_upstream()))
    return changed


def install(hooks) -> None:
    """Routes Keras' own file writes to `hooks` (see `_patch_worker_files` and
    `_patch_stock_callbacks`)."""
    _patch_worker_files(hooks)
    _patch_stock_callbacks(hooks)


def _patch_worker_files(hooks):
    # Keras has no notion of a chief (tensorflow/tensorflow#38635, #31070; tf_keras
    # had `distributed_file_utils`, Keras 3 dropped it): under
    # MultiWorkerMirroredStrategy every worker writes the user's path and two h5
    # writers crash ("unable to lock file"). Every worker must still run the
    # save (reading on-read variables is a collective), so under our multi-worker
    # strategies the hooks send the chief's write to the real path, atomically,
    # and the others' to scratch (_files/worker_files.py). Keras offers no
    # hook for where a model is written.
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


def _patch_stock_callbacks(hooks):
    """Routes Keras' ModelCheckpoint, BackupAndRestore and TensorBoard per instance."""
    # Keras' ModelCheckpoint makes its directory unguarded and writes on every
    # worker, its BackupAndRestore writes weights and then the epoch in place (a
    # crash in between resumes from a torn state), its TensorBoard logs on every
    # worker into one directory. Keras offers no hook for where a callback
    # writes, but every callback `fit` runs gets its model from
    # `CallbackList.set_model`: one patch there routes each of those callbacks
    # the user handed to `fit`, on that instance only (no callback class is
    # touched; subclasses that override a routed method keep theirs).
    import keras

    backup_type = keras.callbacks.BackupAndRestore
    checkpoint_type = keras.callbacks.ModelCheckpoint
    board_type = keras.callbacks.TensorBoard

    # BackupAndRestore: under our multi-worker strategies every event goes to the
    # atomic, chief-writes engine (the one `keras_replicator.callbacks.
    # BackupAndRestore` is); elsewhere to Keras' own method.
    def backup_event(event):
        stock = getattr(backup_type, event)

        def handler(self, *args, **kwargs):
            engine = hooks.backup_engine(self)
            if engine is None:
                return stock(self, *args, **kwargs)
            return getattr(engine, event)(*args, **kwargs)

        return handler

    backup_handlers = {event: backup_event(event) for event in _BACKUP_EVENTS}

    # ModelCheckpoint: keep Keras' decisions (`_get_file_path`,
    # `_should_save_model`); replace its unguarded `makedirs` and the write.
    def save_checkpoint(self, epoch, batch, logs):
        if not hooks.routes_worker_files(self.model):
            return checkpoint_type._save_model(self, epoch, batch, logs)
        filepath = self._get_file_path(epoch, batch, logs)
        if self._should_save_model(epoch, batch, logs, filepath):
            hooks.save_checkpoint(self.model, filepath, self.save_weights_only)

    # TensorBoard: a non-chief logs to scratch (its `set_model` fixes every
    # directory it writes to from `log_dir`), deleted when training ends.
    def end_board(self, logs=None):
        type(self).on_train_end(self, logs)
        hooks.remove_scratch(getattr(self, "_log_write_dir", None))

    def route(callback, model):
        """Routes one callback; returns its `log_dir` to put back, or None."""
        cls = type(callback)
        if isinstance(callback, backup_type):
            own = [e for e in _BACKUP_EVENTS if _overrides(cls, backup_type, e)]
            if not own:
                _forward(callback, backup_handlers)
            elif len(own) < len(_BACKUP_EVENTS) and hooks.routes_worker_files(model):
                raise ValueError(_partial_backup_message(callback, own))
        elif isinstance(callback, checkpoint_type):
            if not _overrides(cls, checkpoint_type, "_save_model"):
                _forward(callback, {"_save_model": save_checkpoint})
        elif isinstance(callback, board_type):
            _forward(callback, {"on_train_end": end_board})
            log_dir = hooks.log_dir_for_worker(model, callback.log_dir)
            if log_dir != callback.log_dir:
                user_log_dir, callback.log_dir = callback.log_dir, log_dir
                return user_log_dir
        return None

    def set_model(original):
        def set_model(self, model):
            if not model:
                return original(self, model)
            put_back = []
            try:
                for callback in self.callbacks:
                    log_dir = route(callback, model)
                    if log_dir is not None:
                        put_back.append((callback, log_dir))
                return original(self, model)
            finally:
                for callback, log_dir in put_back:
                    callback.log_dir = log_dir

        return set_model

    replace(keras.callbacks.CallbackList, "set_model", set_model)


def _overrides(cls, stock, name) -> bool:
    """Whether `cls` (a subclass of `stock`) has its own `name`."""
    return getattr(cls, name) is not getattr(stock, name)


def _forward(callback, handlers) -> None:
    # Instance attributes, looked up before the class's methods: this callback
    # only, whatever else shares its class.
    for name, handler in handlers.items():
        setattr(callback, name, types.MethodType(handler, callback))


def _partial_backup_message(callback, own) -> str:
    return (
        "A subclass of `keras.callbacks.BackupAndRestore` that overrides some of "
        f"its events ({', '.join(own)}) cannot be routed to the chief on several "
        "workers: its own events would still write in place on every worker. "
        f"Received: callback={type(callback).__name__}(...). Subclass "
        "`keras_replicator.callbacks.BackupAndRestore` instead (same arguments)."
    )
