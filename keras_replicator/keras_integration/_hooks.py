"""What Keras asks our strategies, answered in one place; installs the routing.

`_compat/` knows which Keras internals to replace and nothing of this library;
this module is what the replacements call (`KerasHooks`) and the one place that
installs them (`install()`, called by every Replicator's constructor and by
`wrap_optimizer`). Each hook keeps stock Keras behaviour unless the model's (or the
current) strategy is a Replicator, which is how the conformance suite compares the
two side by side.
"""

from __future__ import annotations

import weakref

import keras
import tensorflow as tf

from keras_replicator import _compat, _roles
from keras_replicator._files import backup, worker_files
from keras_replicator._replicator_state import replicator_state
from keras_replicator.communication import _clipping, _reduction
from keras_replicator.keras_integration import (
    _accumulation,
    _fit_input,
    _sample_count,
    _steps,
    _validation,
)
from keras_replicator.sharding import _slots, _support, _update


class KerasHooks:
    """The answers `_compat`'s patches ask for; see each patch for the why."""

    @staticmethod
    def make_train_function(model):
        _print_on_the_chief_only(model)
        return _steps.make_train_function(model, _compat.loss_tracker(model))

    @staticmethod
    def make_test_function(model):
        _print_on_the_chief_only(model)
        return _steps.make_test_function(model, _compat.loss_tracker(model))

    @staticmethod
    def make_predict_function(model):
        _print_on_the_chief_only(model)
        return _steps.make_predict_function(model)

    # What Keras' epoch iterator iterates: plain tf.data with one replica per
    # worker (`_compat/data.py`).
    input_for_fit = staticmethod(_fit_input.input_for_fit)

    @staticmethod
    def take_resume_batches(strategy) -> int:
        """The batches of `fit`'s first epoch a mid-epoch backup already trained
        on (`_files/backup`; issue 38), or 0; once: later epochs start at 0."""
        state = replicator_state(strategy)
        if state is None:
            return 0
        batches, state.resume_batches = state.resume_batches, 0
        return batches

    check_model_in_scope = staticmethod(_validation.check_model_in_scope)
    check_global_batch_size = staticmethod(_validation.check_global_batch_size)
    check_batch_covers_replicas = staticmethod(_validation.check_batch_covers_replicas)

    @staticmethod
    def can_build_symbolically(model) -> bool:
        """False for a model without `call()` (a GAN with a custom `train_step`).

        Keras builds a model under a strategy by calling it on symbolic inputs,
        which such a model cannot do; on one device Keras skips that and lets the
        first traced step build. So do we: its layers are built, and optimizers
        it creates build outside the replicas (`build_optimizer_outside_replicas`).
        """
        return _overrides_call(type(model))

    @staticmethod
    def keeps_replica_mean_loss() -> bool:
        """True inside our steps: losses stay per-replica means (no 1/N)."""
        return _compat.is_replicator_current() and _sample_count.declared() is not None

    @staticmethod
    def scale_loss(loss):
        """`optimizer.scale_loss`: our steps put the sample count on the loss.

        Not with one replica in sync, whose gradient is never weighted (see
        `_reduction.single_replica`).
        """
        if _compat.is_replicator_current() and not _reduction.single_replica():
            return _sample_count.scale_loss_by_sample_count(loss)
        return loss

    @staticmethod
    def all_reduce_gradients(optimizer, grads_and_vars):
        """The reduction rule (`communication/_reduction`); None leaves Keras'
        stock sum. The step's sample count is read here, where Keras hands over,
        and passed down."""
        declared = _sample_count.declared()
        on_replicator = _compat.is_replicator_current()
        average = _reduction.averages(optimizer, on_replicator, declared)
        if not (on_replicator or average):
            return None
        reduced = _reduction.all_reduce(grads_and_vars, average, declared)
        if not _clipping.defers(optimizer):
            return reduced
        clipped = _clipping.clip(optimizer, [g for g, _ in reduced])
        return [(g, v) for g, (_, v) in zip(clipped, reduced)]

    @staticmethod
    def defers_clipping(optimizer) -> bool:
        """Keras clips each replica's gradient; ours clip the reduced one
        (`communication/_clipping`, `_compat/clipping.py`)."""
        return _clipping.defers(optimizer)

    @staticmethod
    def loss_helper_factor(fixed_global_batch: bool):
        """What `tf.nn.compute_average_loss` / `scale_regularization_loss` results
        are multiplied by inside our steps (`_compat/average_loss.py`), or None.

        The replica count, which undoes TensorFlow's 1/N share as Keras loss
        objects' is undone; with a fixed `global_batch_size` the replica's loss
        is then N times its share of the global loss, so the reduction weighs
        replicas equally (`SampleCount.equal_weights`) instead of by samples.
        """
        if not (
            _compat.is_replicator_current() and tf.distribute.get_replica_context()
        ):
            return None
        declared = _sample_count.declared()
        if declared is None or _reduction.single_replica():
            return None
        if fixed_global_batch:
            declared.equal_weights = True
        return tf.distribute.get_strategy().num_replicas_in_sync

    # Keras' `gradient_accumulation_steps`: local accumulators, one all-reduce per
    # update (`_compat/accumulation.py`, the rule in `_accumulation`).
    accumulates_per_replica = staticmethod(_accumulation.accumulates_per_replica)
    weigh_micro_batch = staticmethod(_accumulation.weigh_micro_batch)
    reducing_accumulated = staticmethod(_accumulation.reducing_accumulated)

    @staticmethod
    def agree_finite(finite):
        """`LossScaleOptimizer.check_finite`: finite only if every replica's is.

        Keras decides from the first local replica's un-reduced gradients
        (`_compat/loss_scale.py`); under our strategies, with several replicas,
        one scalar all-reduce makes every replica (and worker) take the same
        branch: an overflow anywhere skips the step everywhere.
        """
        context = tf.distribute.get_replica_context()
        if (
            context is None
            or not _compat.is_replicator_current()
            or _reduction.single_replica()
        ):
            return finite
        overflowed = tf.cast(tf.logical_not(finite), tf.float32)
        total = context.all_reduce(tf.distribute.ReduceOp.SUM, overflowed)
        return tf.equal(total, 0.0)

    @staticmethod
    def build_optimizer_outside_replicas(optimizer, variables) -> None:
        """Builds an unbuilt optimizer's slots before a replica step creates them.

        Under our strategies, in a replica context: once, in cross-replica context
        (`merge_call`, which every replica reaches, as each sees it unbuilt), and
        eagerly (`init_scope`), so the slots are mirrored variables that exist
        before the traced step reads them.
        """
        context = tf.distribute.get_replica_context()
        if context is None or not _compat.is_replicator(tf.distribute.get_strategy()):
            return

        def build(strategy):
            if optimizer.built:
                return
            with tf.init_scope(), strategy.scope():
                optimizer.build(variables)
            optimizer.built = True

        context.merge_call(build)

    # Weight-update sharding (`sharding/`): piece-shaped slots (saved whole by
    # their own `numpy()` / `assign()`), the sharded update in the all-reduce's
    # place.
    shards_weight_update = staticmethod(_support.shards)

    @staticmethod
    def sharded_update_step(optimizer, grads, trainable_variables, learning_rate):
        """The sharded update of `grads`, with the step's sample count."""
        return _update.sharded_update_step(
            optimizer,
            grads,
            trainable_variables,
            learning_rate,
            declared=_sample_count.declared(),
        )

    @staticmethod
    def make_sharded_slot(optimizer, reference, name, initializer):
        """A one-piece slot "like" `reference` if `optimizer` shards, else None."""
        if name in _slots.WHOLE_SLOT_NAMES or not _support.shards(optimizer):
            return None
        _support.check_supported(optimizer)
        strategy = _compat.optimizer.optimizer_strategy(optimizer)
        return _slots.add_piece_slot(optimizer, reference, name, initializer, strategy)

    # Keras' own saving on several workers: the chief writes, atomically
    # (`_files/worker_files`).
    routes_worker_files = staticmethod(worker_files.routes)
    save_model_file = staticmethod(worker_files.save_model_file)
    save_checkpoint = staticmethod(worker_files.save_checkpoint)
    log_dir_for_worker = staticmethod(worker_files.log_dir_for_worker)
    remove_scratch = staticmethod(worker_files.remove_scratch)

    @staticmethod
    def backup_engine(callback):
        """What Keras' `BackupAndRestore` forwards its events to, or None (stock).

        Under our multi-worker strategies: the engine of `keras_replicator.
        callbacks.BackupAndRestore` (`_files/backup`: chief-only, atomic
        commits) with the same arguments, one per Keras callback. On a
        `ModelParallelReplicator`'s mesh over several workers, without
        preemption handling: its workers cannot agree on a step to stop after
        (`_worker.preemption.agree`), and Keras' callback never promised it.
        """
        model = getattr(callback, "model", None)
        if model is None or not worker_files.routes(model):
            return None
        engine = _backup_engines.get(callback)
        if engine is None:
            agrees = not _roles.mesh_spans_workers(model.distribute_strategy)
            engine = backup.AtomicBackupAndRestore(
                callback.backup_dir,
                save_freq=callback.save_freq,
                double_checkpoint=callback.double_checkpoint,
                delete_checkpoint=callback.delete_checkpoint,
                **({} if agrees else {"preemption_signals": ()}),
            )
            _backup_engines[callback] = engine
        engine.set_model(model)
        engine.set_params(callback.params)
        return engine


_backup_engines = weakref.WeakKeyDictionary()


def _overrides_call(cls) -> bool:
    for klass in cls.__mro__:
        if klass is keras.Model:
            return False
        if "call" in vars(klass):
            return True
    return True


def _print_on_the_chief_only(model) -> None:
    """Progress bars print on the chief only: its numbers are the global ones.

    Keras has no chief (N workers would print N progress bars). Its public switch,
    `keras.config.disable_interactive_logging()`, sends Keras' own output
    (progress bars, `summary()`) to absl logging at INFO level, which is not
    shown unless the program turns INFO logging on; set once, on a non-chief
    worker, for the whole process.
    """
    if not _roles.is_chief(model.distribute_strategy):
        keras.config.disable_interactive_logging()


def install() -> None:
    """Routes Keras to our hooks (idempotent)."""
    _compat.install(KerasHooks)
