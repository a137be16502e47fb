"""Every touch of TensorFlow / Keras internals, in one place.

Each entry names the upstream issue it works around. `check_upstream()` compares the
internals we replace or read against the pinned versions, and the test
`tests/test_compat.py` fails loudly when they change, so a Keras or TensorFlow upgrade
cannot silently route around our fixes.

This module is a leaf: it imports nothing from keras_replicator. The Keras patches are
installed once (`install(hooks)`, called by `strategies/_keras_integration.install()`
from every Replicator strategy's constructor); they ask `hooks` what to do, and only
change behaviour when the model's strategy is a Replicator strategy: stock strategies
keep stock Keras behaviour, which is what lets the conformance suite compare the two
side by side.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import threading

import tensorflow as tf
from keras.src.backend.tensorflow import optimizer as _tf_optimizer
from keras.src.backend.tensorflow import trainer as _tf_trainer
from keras.src.layers.normalization import batch_normalization as _bn_module
from keras.src.losses import loss as _loss_module
from keras.src.optimizers import base_optimizer as _base_optimizer

# Source digests of the Keras internals we replace, for keras==3.15.1. A mismatch means
# upstream changed code we stand in for: re-read it and update the patch and digest.
UPSTREAM_DIGESTS = {
    "TensorFlowTrainer.make_train_function": "a9703da4a49beb28",
    "TensorFlowTrainer.make_test_function": "ad5e9155b9298ef1",
    "TensorFlowTrainer.make_predict_function": "a772a2efdd906f9a",
    "TensorFlowTrainer._maybe_symbolic_build": "92a504f5eba9b29f",
    "TensorFlowTrainer.train_step": "debf0efab9d5794b",
    "TensorFlowTrainer.test_step": "a8f04a25512e74e2",
    "loss.scale_loss_for_distribution": "143cd8a5efb6cb17",
    "loss.unscale_loss_for_distribution": "3903c7ed7f69c5ac",
    "TFOptimizer._all_reduce_sum_gradients": "953512efa56c9680",
    "BaseOptimizer.scale_loss": "65f5300733dfc146",
    "BaseOptimizer.apply": "43097be63b919d03",
    # callbacks/model_checkpoint.py overrides the one method Keras writes in and
    # calls the two that decide what to write (no public hook exists).
    "ModelCheckpoint._save_model": "a9be0a24277ff179",
    "ModelCheckpoint._get_file_path": "06ba05ff7e06b736",
    "ModelCheckpoint._should_save_model": "279f32db535b0f09",
}

_install_lock = threading.Lock()
_installed = False
_collective_key_bases = itertools.count(start=1)
_COLLECTIVE_KEY_STRIDE = 100_000


def _upstream_objects():
    trainer = _tf_trainer.TensorFlowTrainer
    return {
        "TensorFlowTrainer.make_train_function": _original(trainer.make_train_function),
        "TensorFlowTrainer.make_test_function": _original(trainer.make_test_function),
        "TensorFlowTrainer.make_predict_function": _original(
            trainer.make_predict_function
        ),
        "TensorFlowTrainer._maybe_symbolic_build": _original(
            trainer._maybe_symbolic_build
        ),
        "TensorFlowTrainer.train_step": trainer.train_step,
        "TensorFlowTrainer.test_step": trainer.test_step,
        "loss.scale_loss_for_distribution": _original(
            _loss_module.scale_loss_for_distribution
        ),
        "loss.unscale_loss_for_distribution": _original(
            _loss_module.unscale_loss_for_distribution
        ),
        "TFOptimizer._all_reduce_sum_gradients": _original(
            _tf_optimizer.TFOptimizer._all_reduce_sum_gradients
        ),
        "BaseOptimizer.scale_loss": _original(_base_optimizer.BaseOptimizer.scale_loss),
        "BaseOptimizer.apply": _original(_base_optimizer.BaseOptimizer.apply),
        "ModelCheckpoint._save_model": _original(_stock_checkpoint()._save_model),
        "ModelCheckpoint._get_file_path": _stock_checkpoint()._get_file_path,
        "ModelCheckpoint._should_save_model": _stock_checkpoint()._should_save_model,
    }


def _stock_checkpoint():
    import keras

    return keras.callbacks.ModelCheckpoint


def _original(function):
    return getattr(function, "__kr_original__", function)


def _digest(function) -> str:
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]


def check_upstream() -> dict[str, str]:
    """Returns {name: what changed} for every upstream internal we rely on."""
    changed = {}
    for name, function in _upstream_objects().items():
        found = _digest(function)
        if UPSTREAM_DIGESTS[name] != found:
            changed[name] = f"source digest {UPSTREAM_DIGESTS[name]} != {found}"
    from tensorflow.python.distribute import (
        collective_all_reduce_strategy,
        mirrored_strategy,
    )

    for module in (mirrored_strategy, collective_all_reduce_strategy):
        if "container_strategy._collective_key_base" not in inspect.getsource(module):
            changed[module.__name__] = "no longer reads `_collective_key_base`"
    extended = mirrored_strategy.MirroredExtended
    if not callable(getattr(extended, "_in_multi_worker_mode", None)):
        changed["MirroredExtended._in_multi_worker_mode"] = "missing"
    from keras.src.trainers.data_adapters import tf_dataset_adapter

    length = inspect.getsource(
        _original(tf_dataset_adapter.TFDatasetAdapter.num_batches.fget)
    )
    if "self._dataset.cardinality" not in length:
        changed["TFDatasetAdapter.num_batches"] = "no longer reads cardinality"
    from tensorflow.python.distribute import input_lib

    if "self._strategy = strategy" not in inspect.getsource(input_lib):
        changed["input_lib DistributedDataset._strategy"] = "attribute renamed"
    if "self._initial_epoch or initial_epoch" not in inspect.getsource(
        _tf_trainer.TensorFlowTrainer.fit
    ):
        changed["TensorFlowTrainer.fit"] = "no longer resumes from _initial_epoch"
    import keras

    if not callable(getattr(keras.optimizers.Optimizer, "_get_variable_index", None)):
        changed["Optimizer._get_variable_index"] = "missing"
    bn_call = inspect.getsource(_bn_module.BatchNormalization.call)
    if "self._moments(inputs, mask)" not in bn_call:
        changed["BatchNormalization.call"] = "no longer calls self._moments"
    if "self._loss_tracker" not in inspect.getsource(_tf_trainer.TensorFlowTrainer):
        changed["TensorFlowTrainer._loss_tracker"] = "no longer used by train_step"
    if "self._distributed_dataset = dataset" not in inspect.getsource(
        _tf_trainer.TFEpochIterator
    ):
        changed["TFEpochIterator._distributed_dataset"] = "attribute renamed"
    from tensorflow.python.distribute import values as _values

    if "self._value_specs" not in inspect.getsource(_values.PerReplicaSpec):
        changed["PerReplicaSpec._value_specs"] = "attribute renamed"
    from keras.src.trainers import trainer as _base_trainer

    if "def to_symbolic_input" not in inspect.getsource(
        _base_trainer.Trainer._symbolic_build
    ):
        changed["Trainer._symbolic_build"] = "no longer maps the batch to specs"
    changed.update(check_worker_files_upstream())
    changed.update(check_parameter_server_upstream())
    return changed


def is_replicator(strategy) -> bool:
    return getattr(strategy, "_kr_is_replicator", False)


def is_replicator_current() -> bool:
    """Whether the current (scope or replica context) strategy is one of ours."""
    return is_replicator(tf.distribute.get_strategy())


def next_collective_key_base() -> int:
    """A process-unique base for a new strategy's collective group/instance keys.

    TF gives every MirroredStrategy the same collective group key (1), so a second
    strategy over a different device set joins the first one's group and the first
    all-reduce aborts ("joining a group with size 4, but that group has size 2").
    `_collective_key_base` is TF's own knob for this (mirrored_strategy.py, "only set
    this in tests"). Workers build strategies in the same order, so the bases agree
    across workers.
    """
    return next(_collective_key_bases) * _COLLECTIVE_KEY_STRIDE


def in_multi_worker_mode(strategy) -> bool:
    """Whether `strategy` spans several workers (no public API says so)."""
    return strategy.extended._in_multi_worker_mode()


def in_keras_symbolic_build() -> bool:
    """Whether Keras is inferring output shapes (functional model construction).

    Keras exports `keras.SymbolicScope` but no way to ask whether one is active.
    Our collectives need to know: during shape inference they run outside any
    replica and must only produce the right shapes.
    """
    from keras.src.backend.common.symbolic_scope import in_symbolic_scope

    return in_symbolic_scope()


def optimizer_variable_index(optimizer, variable) -> int:
    """The slot index of `variable` in a Keras optimizer (what `update_step` needs).

    Under a strategy `update_step` receives a per-device copy of the variable; only
    `Optimizer._get_variable_index` maps it back to its slots. Keras' own optimizer
    subclassing guide uses it; there is no public name for it.
    """
    return optimizer._get_variable_index(variable)


def set_initial_epoch(model, epoch: int) -> None:
    """Makes the next `fit()` start at `epoch`: how Keras' own BackupAndRestore
    resumes (`model._initial_epoch`); no public API lets a callback do it."""
    model._initial_epoch = epoch


def loss_tracker(model):
    """The `loss` Mean metric Keras' default `train_step` updates."""
    return model._loss_tracker


def register_batch_norm_moments_hook() -> None:
    """Documents (and checks) that SyncBatchNormalization overrides `_moments`.

    Keras' `BatchNormalization.call` asks `self._moments(inputs, mask)` for the
    training moments; no public hook exists, and overriding it keeps Keras' moving
    statistics, masking and mixed-precision handling (keras-team/keras has no
    grouped synchronisation; the TF-only `synchronized=True` uses all replicas).
    """
    source = inspect.getsource(_bn_module.BatchNormalization.call)
    if "self._moments(inputs, mask)" not in source:
        raise ImportError(
            "keras.layers.BatchNormalization.call no longer calls "
            "`self._moments(inputs, mask)`; update "
            "keras_replicator/layers/sync_batch_normalization.py."
        )


def install(hooks) -> None:
    """Routes Keras' internals to `hooks`, once per process.

    This module stays a leaf: it knows which internals to replace, never what our
    replacements do. `hooks` (`strategies/_keras_integration.KerasHooks`) answers
    for the library; `strategies/_keras_integration.install()` is the caller.
    """
    global _installed
    with _install_lock:
        if _installed:
            return
        _patch_trainer(hooks)
        _patch_loss_scaling(hooks)
        _patch_gradient_all_reduce(hooks)
        _patch_optimizer_loss_scaling(hooks)
        _patch_progress_bar(hooks)
        _patch_distributed_dataset_length()
        _patch_lazy_optimizer_build(hooks)
        _patch_worker_files(hooks)
        _installed = True


def _replace(owner, name, make_replacement):
    original = getattr(owner, name)
    replacement = make_replacement(original)
    replacement.__kr_original__ = original
    replacement.__name__ = getattr(original, "__name__", name)
    replacement.__doc__ = getattr(original, "__doc__", None)
    setattr(owner, name, replacement)


def _patch_trainer(hooks):
    # keras-team/keras#20585, tensorflow/tensorflow#72388, keras-team/keras#21172:
    # the stock step functions break under MultiWorkerMirroredStrategy, with
    # steps_per_execution > 1 and jit_compile=True under MirroredStrategy, and with
    # string inputs; see strategies/_keras_steps.py for what replaces them.
    trainer = _tf_trainer.TensorFlowTrainer

    def make_train(original):
        def make_train_function(self, force=False):
            if not is_replicator(self.distribute_strategy):
                return original(self, force)
            if self.train_function is None or force:
                self.train_function = hooks.make_train_function(self)
            return self.train_function

        return make_train_function

    def make_test(original):
        def make_test_function(self, force=False):
            if not is_replicator(self.distribute_strategy):
                return original(self, force)
            if self.test_function is None or force:
                self.test_function = hooks.make_test_function(self)
            return self.test_function

        return make_test_function

    def make_predict(original):
        def make_predict_function(self, force=False):
            if not is_replicator(self.distribute_strategy):
                return original(self, force)
            if self.predict_function is None or force:
                self.predict_function = hooks.make_predict_function(self)
            return self.predict_function

        return make_predict_function

    def symbolic_build(original):
        # The stock version MEAN-reduces a distributed input batch just to read its
        # shapes, which fails for strings and on MultiWorkerMirroredStrategy
        # (keras-team/keras#20585, #21172). The first replica's batch has the shapes.
        def _maybe_symbolic_build(self, iterator=None, data_batch=None):
            strategy = self.distribute_strategy
            if not is_replicator(strategy):
                return original(self, iterator=iterator, data_batch=data_batch)
            hooks.check_model_in_scope(self, strategy)
            if not hooks.can_build_symbolically(self):
                return
            if self._distribute_strategy is None or iterator is None:
                return original(self, iterator=iterator, data_batch=data_batch)
            # Build from the input's specs when they are plain tensors: taking a
            # batch would start an extra pass over the dataset, and a seeded
            # `shuffle` then gives every epoch the order of the next one (one
            # device does not peek, so its epochs differ from the replicas').
            data_batch = _replica_input_specs(iterator)
            if data_batch is not None:
                batch_size = getattr(iterator.data_adapter, "batch_size", None)
                hooks.check_global_batch_size(batch_size, strategy)
            else:
                for _, _, it in iterator:
                    batch = next(it)
                    hooks.check_batch_covers_replicas(batch, strategy)
                    data_batch = tf.nest.map_structure(
                        lambda v: (
                            strategy.experimental_local_results(v)[0]
                            if isinstance(v, tf.distribute.DistributedValues)
                            else v
                        ),
                        batch,
                    )
                    break
            with strategy.scope():
                self._symbolic_build(data_batch=data_batch)

        return _maybe_symbolic_build

    _replace(trainer, "make_train_function", make_train)
    _replace(trainer, "make_test_function", make_test)
    _replace(trainer, "make_predict_function", make_predict)
    _replace(trainer, "_maybe_symbolic_build", symbolic_build)


def _replica_input_specs(epoch_iterator):
    """One replica's `tf.TensorSpec` structure of the distributed input, or None.

    None when the input is not a distributed dataset of plain tensors (ragged or
    sparse components, generators): the caller then takes a real batch.
    """
    dataset = getattr(epoch_iterator, "_distributed_dataset", None)
    if dataset is None:
        return None
    try:
        spec = dataset.element_spec
    except (AttributeError, NotImplementedError):
        return None
    leaves = []
    for leaf in tf.nest.flatten(spec):
        # `PerReplicaSpec` keeps each replica's spec in `_value_specs` (no public
        # accessor; tensorflow/python/distribute/values.py).
        per_replica = getattr(leaf, "_value_specs", None)
        leaf = per_replica[0] if per_replica else leaf
        if type(leaf) is not tf.TensorSpec:
            return None
        leaves.append(leaf)
    return tf.nest.pack_sequence_as(spec, leaves)


def _patch_loss_scaling(hooks):
    # Keras divides each replica's mean loss by the replica count and sums gradients,
    # which weighs an uneven last batch wrongly and logs a custom train_step's
    # `compute_loss` result divided by the replica count. Inside our steps (where a
    # sample count is declared) losses stay per-replica means and the gradient
    # all-reduce weights replicas by their sample counts instead
    # (strategies/_gradients.py). Elsewhere (a plain `strategy.run` loop) the stock
    # contract holds: its optimizer sums, so the loss keeps its 1/N.
    def scale(original):
        def scale_loss_for_distribution(value):
            if hooks.keeps_replica_mean_loss():
                return value
            return original(value)

        return scale_loss_for_distribution

    _replace(_loss_module, "scale_loss_for_distribution", scale)
    _replace(_loss_module, "unscale_loss_for_distribution", scale)


def _patch_optimizer_loss_scaling(hooks):
    # Weighting replicas by sample count after differentiation is wrong when the
    # forward pass communicates (synchronized batch norm): a collective's backward
    # pass sums the other replicas' unweighted upstream gradients. Keras' train_step
    # (and our XLA step) ask the optimizer to scale the loss inside the tape, so under
    # our strategies that is where each replica's loss gets its sample count
    # (strategies/_sample_count.py). No upstream issue: stock Keras divides by the
    # replica count there, which is equally inexact for uneven splits.
    def scale(original):
        def scale_loss(self, loss):
            return hooks.scale_loss(original(self, loss))

        return scale_loss

    # Not LossScaleOptimizer's: multiplying a float16 model's already loss-scaled
    # loss by the sample count overflows its gradients (steps get skipped), so
    # mixed_float16 keeps weighting after differentiation (exact unless the forward
    # pass communicates and the split is uneven).
    _replace(_base_optimizer.BaseOptimizer, "scale_loss", scale)


def _patch_gradient_all_reduce(hooks):
    # Keras sums replica gradients in `TFOptimizer._all_reduce_sum_gradients` and
    # offers no hook to change how (strategies/_gradients.py: the reduction rule).
    def all_reduce(original):
        def _all_reduce_sum_gradients(self, grads_and_vars):
            reduced = hooks.all_reduce_gradients(self, grads_and_vars)
            if reduced is None:
                return original(self, grads_and_vars)
            return reduced

        return _all_reduce_sum_gradients

    _replace(_tf_optimizer.TFOptimizer, "_all_reduce_sum_gradients", all_reduce)


def _patch_progress_bar(hooks):
    # N workers would print N progress bars (keras-team/keras has no notion of a
    # chief). Under our multi-worker strategies only the chief prints; its numbers
    # are the global ones.
    import keras

    def silence_non_chief(original):
        def on_begin(self, logs=None):
            model = getattr(self, "model", None)
            if model is not None and hooks.silences_output(model):
                self.verbose = 0
            return original(self, logs)

        return on_begin

    for event in ("on_train_begin", "on_test_begin", "on_predict_begin"):
        _replace(keras.callbacks.ProgbarLogger, event, silence_non_chief)


def _patch_lazy_optimizer_build(hooks):
    # TF's custom_training tutorial creates the optimizer in scope and lets its first
    # `apply_gradients` inside `strategy.run` build the slots. In a `tf.function`
    # replica context Keras 3 then creates the slot variables inside the traced
    # graph and the step fails ("You must feed a value for placeholder tensor",
    # under stock MirroredStrategy too; keras-team/keras has no issue for it).
    # `BaseOptimizer.apply` is where Keras builds lazily: under our strategies the
    # hook builds first, outside the graph and in the strategy's scope.
    def build_first(original):
        def apply(self, grads, trainable_variables=None):
            if not self.built and trainable_variables is not None:
                trainable_variables = list(trainable_variables)
                hooks.build_optimizer_outside_replicas(self, trainable_variables)
            return original(self, grads, trainable_variables)

        return apply

    _replace(_base_optimizer.BaseOptimizer, "apply", build_first)


def _patch_distributed_dataset_length():
    # A distributed dataset's `cardinality` is this worker's count of batches. Keras
    # takes it as the epoch length, so with unequal worker shards the workers stop
    # after different numbers of steps and their collectives mismatch ("Collective
    # instance ... expected data_type 9 but got data_type 1"). Across workers the
    # length is unknown to Keras; the iterator's end is synchronised across workers
    # (TF pads exhausted workers with empty batches), so iterate until it.
    from keras.src.trainers.data_adapters import tf_dataset_adapter

    adapter = tf_dataset_adapter.TFDatasetAdapter
    original = adapter.num_batches

    def num_batches(self):
        dataset = self._dataset
        if isinstance(dataset, tf.distribute.DistributedDataset):
            strategy = getattr(dataset, "_strategy", None)
            if is_replicator(strategy) and in_multi_worker_mode(strategy):
                return None
        return original.fget(self)

    adapter.num_batches = property(num_batches, doc=original.__doc__)
    adapter.num_batches.fget.__kr_original__ = original.fget


# Keras' own saving on several workers (issue 11) ---------------------------------

# Source digests of what `_patch_worker_files` replaces or relies on (keras==3.15.1).
WORKER_FILES_DIGESTS = {
    "saving_api.save_model": "40d9c6f3a9b45c35",
    "saving_api.save_weights": "38966258038dc2e8",
    "saving_lib.save_model": "0b360baae4175255",
    "saving_lib.save_weights_only": "649839a5ed3a5df6",
    "legacy_h5_format.save_model_to_hdf5": "089058ee0d3223d6",
    "Model.export": "f11ed3b71eb342ea",
    "BackupAndRestore.on_train_begin": "dfdb7eac4983f490",
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
        "saving_lib.save_model": _original(saving_lib.save_model),
        "saving_lib.save_weights_only": _original(saving_lib.save_weights_only),
        "legacy_h5_format.save_model_to_hdf5": _original(
            legacy_h5_format.save_model_to_hdf5
        ),
        "Model.export": _original(keras.Model.export),
        "BackupAndRestore.on_train_begin": _original(backup.on_train_begin),
        "BackupAndRestore.on_epoch_end": _original(backup.on_epoch_end),
        "BackupAndRestore.on_train_batch_end": _original(backup.on_train_batch_end),
        "BackupAndRestore.on_train_end": _original(backup.on_train_end),
        "TensorBoard.set_model": _original(board.set_model),
        "TensorBoard.on_train_end": _original(board.on_train_end),
    }


def check_worker_files_upstream() -> dict[str, str]:
    """`check_upstream()`'s part for `_patch_worker_files`."""
    changed = {}
    for name, function in _worker_files_upstream().items():
        found = _digest(function)
        if WORKER_FILES_DIGESTS[name] != found:
            changed[name] = f"source digest {WORKER_FILES_DIGESTS[name]} != {found}"
    return changed


def _patch_worker_files(hooks):
    # Keras has no notion of a chief (tensorflow/tensorflow#38635, #31070; tf_keras
    # had `distributed_file_utils`, Keras 3 dropped it): under
    # MultiWorkerMirroredStrategy every worker writes the user's path and two h5
    # writers crash ("unable to lock file"). Every worker must still run the
    # save (reading on-read variables is a collective), so under our multi-worker
    # strategies the hooks send the chief's write to the real path, atomically,
    # and the others' to scratch (strategies/_worker_files.py). Keras offers no
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

    _replace(saving_lib, "save_model", write_model_file)
    _replace(saving_lib, "save_weights_only", write_model_file)
    _replace(legacy_h5_format, "save_model_to_hdf5", write_model_file)

    def export(original):
        def export(self, filepath, *args, **kwargs):
            if not hooks.routes_worker_files(self):
                return original(self, filepath, *args, **kwargs)
            hooks.save_model_file(
                self, filepath, lambda path: original(self, path, *args, **kwargs)
            )

        return export

    _replace(keras.Model, "export", export)

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

    _replace(keras.callbacks.ModelCheckpoint, "_save_model", checkpoint)

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
        _replace(keras.callbacks.BackupAndRestore, event, backup_event(event))

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

    _replace(keras.callbacks.TensorBoard, "set_model", set_model)
    _replace(keras.callbacks.TensorBoard, "on_train_end", on_train_end)


# Parameter-server training (issue 14) -------------------------------------------

_ps_installed = False
_rescheduled_closures = [0]


def install_parameter_server(hooks) -> None:
    """Routes `Model.fit` / `evaluate` / `predict` to `hooks` under PS training.

    Keras 3's TF trainer cannot train on `ParameterServerStrategy`: its epoch
    iterator calls `experimental_distribute_dataset`, which that strategy refuses
    ("you need to pass this dataset to ClusterCoordinator.create_per_worker_dataset";
    keras-team/keras has no ClusterCoordinator support, tf_keras had it in
    `Model.fit`). Only models whose strategy `hooks.routes(model)` accepts (a
    `ParameterServerReplicator`) are routed; everything else keeps stock Keras.
    Also counts closures the coordinator puts back after a worker failure
    (`rescheduled_closures()`), which TF logs but does not expose.
    """
    global _ps_installed
    with _install_lock:
        if _ps_installed:
            return
        trainer = _tf_trainer.TensorFlowTrainer
        for name in ("fit", "evaluate", "predict"):

            def make(original, name=name):
                def routed(self, *args, **kwargs):
                    if not hooks.routes(self):
                        return original(self, *args, **kwargs)
                    return getattr(hooks, name)(self, *args, **kwargs)

                return routed

            _replace(trainer, name, make)
        from tensorflow.python.distribute.coordinator import cluster_coordinator

        def count(original):
            def put_back(self, closure):
                _rescheduled_closures[0] += 1
                return original(self, closure)

            return put_back

        _replace(cluster_coordinator._CoordinatedClosureQueue, "put_back", count)
        _ps_installed = True


def rescheduled_closures() -> int:
    """Closures put back in the coordinator's queue (worker failures) so far."""
    return _rescheduled_closures[0]


def symbolic_build(model, data_batch) -> None:
    """Builds a compiled model's metrics and loss from one batch, in its scope.

    `Trainer._symbolic_build` is what Keras' own `fit` calls for this; there is no
    public way to build compile metrics before the first step, and under PS
    training their variables must be created on the chief before any step runs.
    """
    model._maybe_symbolic_build(data_batch=data_batch)


def check_parameter_server_upstream() -> dict[str, str]:
    """`check_upstream()`'s part for parameter-server training."""
    changed = {}
    trainer = _tf_trainer.TensorFlowTrainer
    source = inspect.getsource(_original(trainer._maybe_symbolic_build))
    if "data_batch" not in source or "_symbolic_build" not in source:
        changed["TensorFlowTrainer._maybe_symbolic_build"] = "no data_batch path"
    for name in ("fit", "evaluate", "predict"):
        if not callable(getattr(trainer, name, None)):
            changed[f"TensorFlowTrainer.{name}"] = "missing"
    from tensorflow.python.distribute.coordinator import cluster_coordinator

    queue = getattr(cluster_coordinator, "_CoordinatedClosureQueue", None)
    if queue is None or not callable(getattr(queue, "put_back", None)):
        changed["_CoordinatedClosureQueue.put_back"] = "missing"
    elif "put_back(closure)" not in inspect.getsource(cluster_coordinator.Worker):
        changed["Worker put_back"] = "failed closures no longer put back"
    return changed


def initial_epoch_of(model) -> int | None:
    """The epoch Keras' BackupAndRestore asked the next `fit()` to start at.

    The read side of `set_initial_epoch` (`model._initial_epoch`, no public API).
    """
    return getattr(model, "_initial_epoch", None)
