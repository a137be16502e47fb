"""Keras' TF trainer: the step functions, symbolic build, epoch state.

keras-team/keras#20585, tensorflow/tensorflow#72388 and keras-team/keras#21172: the
stock step functions break under MultiWorkerMirroredStrategy, with
`steps_per_execution > 1` and `jit_compile=True` under MirroredStrategy, and with
string inputs. Under our strategies `make_{train,test,predict}_function` and
`_maybe_symbolic_build` ask the hooks (`keras_integration/_hooks.py`) instead.
"""

from __future__ import annotations

import inspect

import tensorflow as tf
from keras.src.backend.tensorflow import trainer as _tf_trainer
from keras.src.losses import loss as _loss_module

from keras_replicator._compat._patching import changed_digests, replace, unpatched
from keras_replicator._compat.strategy import is_replicator

# Source digests of the trainer internals we replace, for keras==3.15.1. A mismatch
# means upstream changed code we stand in for: re-read it and update the patch.
DIGESTS = {
    "TensorFlowTrainer.make_train_function": "a9703da4a49beb28",
    "TensorFlowTrainer.make_test_function": "ad5e9155b9298ef1",
    "TensorFlowTrainer.make_predict_function": "a772a2efdd906f9a",
    "TensorFlowTrainer._maybe_symbolic_build": "92a504f5eba9b29f",
    "TensorFlowTrainer.train_step": "debf0efab9d5794b",
    "TensorFlowTrainer.test_step": "a8f04a25512e74e2",
}


def _upstream_objects():
    trainer = _tf_trainer.TensorFlowTrainer
    return {
        "TensorFlowTrainer.make_train_function": unpatched(trainer.make_train_function),
        "TensorFlowTrainer.make_test_function": unpatched(trainer.make_test_function),
        "TensorFlowTrainer.make_predict_function": unpatched(
            trainer.make_predict_function
        ),
        "TensorFlowTrainer._maybe_symbolic_build": unpatched(
            trainer._maybe_symbolic_build
        ),
        "TensorFlowTrainer.train_step": trainer.train_step,
        "TensorFlowTrainer.test_step": trainer.test_step,
    }


def check_upstream() -> dict[str, str]:
    """{name: what changed} for the trainer internals replaced or read here."""
    changed = changed_digests(DIGESTS, _upstream_objects())
    # `unpatched`: the parameter-server routing may have wrapped `fit` already.
    if "self._initial_epoch or initial_epoch" not in inspect.getsource(
        unpatched(_tf_trainer.TensorFlowTrainer.fit)
    ):
        changed["TensorFlowTrainer.fit"] = "no longer resumes from _initial_epoch"
    if "self._loss_tracker" not in inspect.getsource(_tf_trainer.TensorFlowTrainer):
        changed["TensorFlowTrainer._loss_tracker"] = "no longer used by train_step"
    # `fit` hands NLCG its loss through `optimizer.scale_loss` (optimizers/nlcg.py):
    # Keras' train step must still ask for it inside the tape, before the update.
    step = inspect.getsource(_tf_trainer.TensorFlowTrainer.train_step)
    scale_at = step.find("loss = self.optimizer.scale_loss(loss)")
    if not 0 <= scale_at < step.find("self.optimizer.apply_gradients("):
        changed["TensorFlowTrainer.train_step: scale_loss"] = (
            "no longer asks the optimizer to scale its loss before apply_gradients"
        )
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
    return changed


def install(hooks) -> None:
    """Routes the step functions and the symbolic build."""
    _patch_trainer(hooks)


def in_keras_symbolic_build() -> bool:
    """Whether Keras is inferring output shapes (functional model construction).

    Keras exports `keras.SymbolicScope` but no way to ask whether one is active.
    Our collectives need to know: during shape inference they run outside any
    replica and must only produce the right shapes.
    """
    from keras.src.backend.common.symbolic_scope import in_symbolic_scope

    return in_symbolic_scope()


def set_initial_epoch(model, epoch: int) -> None:
    """Makes the next `fit()` start at `epoch`: how Keras' own BackupAndRestore
    resumes (`model._initial_epoch`); no public API lets a callback do it."""
    model._initial_epoch = epoch


def loss_tracker(model):
    """The `loss` Mean metric Keras' default `train_step` updates."""
    return model._loss_tracker


def replica_mean_loss(loss):
    """This replica's mean loss from the loss a Keras train step computed.

    Keras divides each loss by the replica count under tf.distribute
    (`scale_loss_for_distribution`, no public name); its `train_step` multiplies
    back with `unscale_loss_for_distribution` for its loss tracker, and so do we.
    Inside the library's steps both are the identity (`_compat/optimizer.py`).
    """
    return _loss_module.unscale_loss_for_distribution(loss)


def initial_epoch_of(model) -> int | None:
    """The epoch Keras' BackupAndRestore asked the next `fit()` to start at.

    The read side of `set_initial_epoch` (`model._initial_epoch`, no public API).
    """
    return getattr(model, "_initial_epoch", None)


def _patch_trainer(hooks):
    # keras-team/keras#20585, tensorflow/tensorflow#72388, keras-team/keras#21172:
    # the stock step functions break under MultiWorkerMirroredStrategy, with
    # steps_per_execution > 1 and jit_compile=True under MirroredStrategy, and with
    # string inputs; see keras_integration/_steps.py for what replaces them.
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

    replace(trainer, "make_train_function", make_train)
    replace(trainer, "make_test_function", make_test)
    replace(trainer, "make_predict_function", make_predict)
    replace(trainer, "_maybe_symbolic_build", symbolic_build)


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
