"""Keras' optimizer and loss internals: loss scaling, the gradient all-reduce, lazy
build. Each patch below says why no public hook serves (`keras_integration/` answers).

Also the internals `optimizers/_whole_list.py` (Neumann, NLCG) reads to update every
variable at once: Keras' per-step hook `_backend_update_step` (overridden there, so
`check_upstream` verifies Keras still calls it), the optimizer's strategy and variable
list and its gradient all-reduce (TF's `maybe_merge_call` is in `_compat.strategy`).
No upstream issue asks for a public whole-list update; Keras' own `Nadam` overrides
the same hook.
"""

from __future__ import annotations

import inspect

import keras
import tensorflow as tf
from keras.src.backend.tensorflow import optimizer as _tf_optimizer
from keras.src.losses import loss as _loss_module
from keras.src.optimizers import base_optimizer as _base_optimizer
from keras.src.optimizers import loss_scale_optimizer as _loss_scale_optimizer

from keras_replicator._compat._patching import changed_digests, replace, unpatched

# Source digests of the internals we replace, for keras==3.15.1.
DIGESTS = {
    "loss.scale_loss_for_distribution": "143cd8a5efb6cb17",
    "loss.unscale_loss_for_distribution": "3903c7ed7f69c5ac",
    "TFOptimizer._all_reduce_sum_gradients": "953512efa56c9680",
    "BaseOptimizer.scale_loss": "65f5300733dfc146",
    "BaseOptimizer.apply": "43097be63b919d03",
    "LossScaleOptimizer.apply": "1cc61fb4c21edb7a",
    # Overridden, not patched, by `optimizers/_whole_list.py`, which mirrors its
    # steps (all-reduce, then one merge_call): a change here must be mirrored there.
    "TFOptimizer._backend_update_step": "00bd759c099a6b72",
    # Replaced under weight-update sharding; the slot naming of the base version
    # is mirrored by `sharding/_slots.add_piece_slot`.
    "TFOptimizer.add_variable_from_reference": "fa3499082002f562",
    "BaseOptimizer.add_variable_from_reference": "00c77a731b5a12c9",
    # Not replaced: a sharded slot (`sharding/_saving.PieceSlot`) is saved and
    # loaded whole because these call its public `numpy()` and `assign()`.
    "BaseOptimizer.save_own_variables": "5c789905e2679bf5",
    "BaseOptimizer.load_own_variables": "a6e0c5e7e88c4d33",
}

#: The private Keras method `optimizers/_whole_list.py` overrides (checked below).
UPDATE_STEP_HOOK = "_backend_update_step"


def _upstream_objects():
    return {
        "loss.scale_loss_for_distribution": unpatched(
            _loss_module.scale_loss_for_distribution
        ),
        "loss.unscale_loss_for_distribution": unpatched(
            _loss_module.unscale_loss_for_distribution
        ),
        "TFOptimizer._all_reduce_sum_gradients": unpatched(
            _tf_optimizer.TFOptimizer._all_reduce_sum_gradients
        ),
        "BaseOptimizer.scale_loss": unpatched(_base_optimizer.BaseOptimizer.scale_loss),
        "BaseOptimizer.apply": unpatched(_base_optimizer.BaseOptimizer.apply),
        "LossScaleOptimizer.apply": unpatched(
            _loss_scale_optimizer.LossScaleOptimizer.apply
        ),
        "TFOptimizer._backend_update_step": unpatched(
            _tf_optimizer.TFOptimizer._backend_update_step
        ),
        "TFOptimizer.add_variable_from_reference": unpatched(
            _tf_optimizer.TFOptimizer.add_variable_from_reference
        ),
        "BaseOptimizer.add_variable_from_reference": unpatched(
            _base_optimizer.BaseOptimizer.add_variable_from_reference
        ),
        "BaseOptimizer.save_own_variables": unpatched(
            _base_optimizer.BaseOptimizer.save_own_variables
        ),
        "BaseOptimizer.load_own_variables": unpatched(
            _base_optimizer.BaseOptimizer.load_own_variables
        ),
    }


def check_upstream() -> dict[str, str]:
    """{name: what changed} for the optimizer internals replaced or read here."""
    changed = changed_digests(DIGESTS, _upstream_objects())
    optimizer = keras.optimizers.Optimizer
    for name in ("_get_variable_index", UPDATE_STEP_HOOK, "_all_reduce_sum_gradients"):
        if not callable(getattr(optimizer, name, None)):
            changed[f"Optimizer.{name}"] = "missing"
    changed.update(_check_update_step_hook(optimizer))
    index = inspect.getsource(_base_optimizer.BaseOptimizer._get_variable_index)
    if "self._trainable_variables_indices[self._var_key(variable)]" not in index:
        changed["BaseOptimizer._get_variable_index"] = (
            "no longer reads `_trainable_variables_indices` (alias_variable)"
        )
    readers = inspect.getsource(unpatched(_base_optimizer.BaseOptimizer.apply))
    if readers.count("_trainable_variables_indices") != 1:
        changed["BaseOptimizer.apply"] = (
            "reads `_trainable_variables_indices` differently (alias_variable)"
        )
    init = inspect.getsource(_tf_optimizer.TFOptimizer.__init__)
    if "self._distribution_strategy = tf.distribute.get_strategy()" not in init:
        changed["TFOptimizer.__init__"] = "no longer sets `_distribution_strategy`"
    add = inspect.getsource(_base_optimizer.BaseOptimizer.add_variable)
    if "self._track_variable(variable)" not in add:
        changed["BaseOptimizer.add_variable"] = (
            "no longer tracks through `_track_variable` (track_variable)"
        )
    build = inspect.getsource(_base_optimizer.BaseOptimizer.build)
    if "self._trainable_variables = variables[:]" not in build:
        changed["BaseOptimizer.build"] = "no longer sets `_trainable_variables`"
    changed.update(_check_sharded_routes())
    return changed


def _check_sharded_routes() -> dict[str, str]:
    # Weight-update sharding runs its update where Keras all-reduces, and Keras'
    # per-variable update then runs over the pairs the all-reduce returned
    # (none); its slots are saved through their own `numpy()` / `assign()`.
    changed = {}
    tf_optimizer = _tf_optimizer.TFOptimizer
    update = inspect.getsource(unpatched(tf_optimizer._backend_update_step))
    if "grads_and_vars = self._all_reduce_sum_gradients(grads_and_vars)" not in (
        update
    ):
        changed["TFOptimizer._backend_update_step: all-reduce"] = (
            "no longer updates from what `_all_reduce_sum_gradients` returns"
        )
    per_variable = inspect.getsource(tf_optimizer._distributed_tf_update_step)
    if "for grad, var in grads_and_vars:" not in per_variable:
        changed["TFOptimizer._distributed_tf_update_step"] = (
            "no longer updates exactly the pairs it is given"
        )
    base = _base_optimizer.BaseOptimizer
    save = inspect.getsource(unpatched(base.save_own_variables))
    if "store[str(i)] = variable.numpy()" not in save:
        changed["BaseOptimizer.save_own_variables: numpy"] = (
            "no longer writes `variable.numpy()` (sharding/_saving.PieceSlot)"
        )
    load = inspect.getsource(unpatched(base.load_own_variables))
    if "variable.assign(store[str(i)])" not in load:
        changed["BaseOptimizer.load_own_variables: assign"] = (
            "no longer loads through `variable.assign` (sharding/_saving.PieceSlot)"
        )
    return changed


def _check_update_step_hook(optimizer) -> dict[str, str]:
    # `apply` -> `_backend_apply_gradients` -> `self._backend_update_step(grads,
    # trainable_variables, learning_rate)`, once per update, in the replica context,
    # after clipping, weight decay, gradient accumulation and loss-scale unscaling.
    changed = {}
    apply = inspect.getsource(unpatched(optimizer.apply))
    if "self._backend_apply_gradients(grads, trainable_variables)" not in apply:
        changed["BaseOptimizer.apply"] = "no longer calls _backend_apply_gradients"
    apply_gradients = inspect.getsource(unpatched(optimizer._backend_apply_gradients))
    calls = apply_gradients.count(f"self.{UPDATE_STEP_HOOK}(")
    if calls != 2 or "grads, trainable_variables, self.learning_rate" not in (
        apply_gradients
    ):
        changed["BaseOptimizer._backend_apply_gradients"] = (
            f"no longer calls self.{UPDATE_STEP_HOOK}(grads, trainable_variables, "
            f"self.learning_rate) on both paths (found {calls} calls)"
        )
    hook = getattr(optimizer, UPDATE_STEP_HOOK, None)
    if callable(hook):
        parameters = list(inspect.signature(hook).parameters)
        if parameters != ["self", "grads", "trainable_variables", "learning_rate"]:
            changed[f"Optimizer.{UPDATE_STEP_HOOK}"] = f"signature is {parameters}"
    return changed


def install(hooks) -> None:
    """Routes loss scaling, the gradient all-reduce and the lazy build to `hooks`."""
    _patch_loss_scaling(hooks)
    _patch_gradient_all_reduce(hooks)
    _patch_optimizer_loss_scaling(hooks)
    _patch_lazy_optimizer_build(hooks)
    _patch_sharded_slots(hooks)


def optimizer_variable_index(optimizer, variable) -> int:
    """The slot index of `variable` in a Keras optimizer (what `update_step` needs).

    Under a strategy `update_step` receives a per-device copy of the variable; only
    `Optimizer._get_variable_index` maps it back to its slots. Keras' own optimizer
    subclassing guide uses it; there is no public name for it.
    """
    return optimizer._get_variable_index(variable)


def optimizer_strategy(optimizer) -> tf.distribute.Strategy:
    """The strategy a Keras (TF backend) optimizer was created under.

    `TFOptimizer.__init__` stores `tf.distribute.get_strategy()` as
    `_distribution_strategy` and routes its own updates through it; an optimizer
    moving weights outside a step (Neumann's true weights) must use the same one,
    which the scope at call time need not be. No public attribute exposes it.
    """
    return optimizer._distribution_strategy


def trainable_variables_of(optimizer) -> list:
    """The model variables `optimizer` was built with, in build order.

    `BaseOptimizer.build` keeps them as `_trainable_variables` (what `apply` uses
    when no variables are passed); Keras has no public name for the list.
    """
    return list(optimizer._trainable_variables)


def variable_key(optimizer, variable):
    """The key a Keras optimizer files `variable`'s slots under (`_var_key`)."""
    return optimizer._var_key(variable)


def alias_variable(optimizer, alias, variable) -> None:
    """Makes `update_step(grad, alias, lr)` use `variable`'s slots.

    Keras finds a variable's slots through `_trainable_variables_indices`
    (`_get_variable_index`); weight-update sharding updates a piece of each
    variable held in another variable, which must find the same slots. No public
    API maps one variable to another's slots.
    """
    index = optimizer._get_variable_index(variable)
    optimizer._trainable_variables_indices[optimizer._var_key(alias)] = index


def track_variable(optimizer, variable) -> None:
    """Adds `variable` to `optimizer.variables`, as `add_variable` does.

    Keras' `add_variable` creates a `keras.Variable` and tracks it
    (`_track_variable`); a slot of our own `keras.Variable` subclass (weight-update
    sharding's `PieceSlot`) is created by us and tracked the same way. Keras has
    no public method that tracks a variable it did not create.
    """
    optimizer._track_variable(variable)


def remove_alias(optimizer, alias) -> None:
    """Undoes `alias_variable`: Keras counts `_trainable_variables_indices` as the
    optimizer's variables (`apply(grads)` without variables checks its length)."""
    optimizer._trainable_variables_indices.pop(optimizer._var_key(alias), None)


def override_checkpointing(variable, serialize, restore) -> None:
    """Makes `tf.train.Checkpoint` save `variable` as `serialize()` returns and
    restore it with `restore(tensors)`.

    TensorFlow's object-based checkpoints ask a trackable for its tensors through
    `_serialize_to_tensors` / `_restore_from_tensors` and honour per-object
    overrides (`saveable_object_util.trackable_has_serialize_to_tensor` looks in
    the instance's `__dict__` first); there is no public protocol.
    """
    variable._serialize_to_tensors = serialize
    variable._restore_from_tensors = restore


def reduced_gradients(optimizer, grads, variables) -> list:
    """`grads` all-reduced over replicas exactly as Keras' TF optimizer does it.

    `TFOptimizer._all_reduce_sum_gradients` is the reduction every Keras optimizer's
    update goes through (replaced under our strategies by `_patch_gradient_all_reduce`
    with the sample-weighted mean): a whole-list update must reduce the same way.
    `variables` are the raw `tf.Variable`s; `None` gradients stay `None`.
    """
    pairs = optimizer._all_reduce_sum_gradients(list(zip(grads, variables)))
    return [gradient for gradient, _ in pairs]


def _patch_loss_scaling(hooks):
    # Keras divides each replica's mean loss by the replica count and sums gradients,
    # which weighs an uneven last batch wrongly and logs a custom train_step's
    # `compute_loss` result divided by the replica count. Inside our steps (where a
    # sample count is declared) losses stay per-replica means and the gradient
    # all-reduce weights replicas by their sample counts instead
    # (keras_integration/_gradients.py). Elsewhere (a plain `strategy.run` loop)
    # the stock contract holds: its optimizer sums, so the loss keeps its 1/N.
    def scale(original):
        def scale_loss_for_distribution(value):
            if hooks.keeps_replica_mean_loss():
                return value
            return original(value)

        return scale_loss_for_distribution

    replace(_loss_module, "scale_loss_for_distribution", scale)
    replace(_loss_module, "unscale_loss_for_distribution", scale)


def _patch_optimizer_loss_scaling(hooks):
    # Weighting replicas by sample count after differentiation is wrong when the
    # forward pass communicates (synchronized batch norm): a collective's backward
    # pass sums the other replicas' unweighted upstream gradients. Keras' train_step
    # (and our XLA step) ask the optimizer to scale the loss inside the tape, so under
    # our strategies that is where each replica's loss gets its sample count
    # (keras_integration/_sample_count.py). No upstream issue: stock Keras divides
    # by the replica count there, which is equally inexact for uneven splits.
    def scale(original):
        def scale_loss(self, loss):
            return hooks.scale_loss(original(self, loss))

        return scale_loss

    # Not LossScaleOptimizer's: multiplying a float16 model's already loss-scaled
    # loss by the sample count overflows its gradients (steps get skipped), so
    # mixed_float16 keeps weighting after differentiation (exact unless the forward
    # pass communicates and the split is uneven).
    replace(_base_optimizer.BaseOptimizer, "scale_loss", scale)


def _patch_gradient_all_reduce(hooks):
    # Keras sums replica gradients in `TFOptimizer._all_reduce_sum_gradients` and
    # offers no hook to change how (keras_integration/_gradients.py: the
    # reduction rule).
    #
    # Weight-update sharding (issue 24) replaces the all-reduce itself: a
    # reduce-scatter, each replica's `update_step` on its pieces, an all-gather
    # into the whole variables (`sharding/_update.py`). Keras' TF
    # `_backend_update_step` is the all-reduce, then one `update_step` per pair it
    # returned; the sharded update returns none, so nothing is updated twice.
    # The learning rate is the one Keras passes on (`self.learning_rate`, both
    # paths of `_backend_apply_gradients`; `_check_update_step_hook`).

    def all_reduce(original):
        def _all_reduce_sum_gradients(self, grads_and_vars):
            if hooks.shards_weight_update(self):
                grads = [g for g, _ in grads_and_vars]
                variables = [v for _, v in grads_and_vars]
                hooks.sharded_update_step(self, grads, variables, self.learning_rate)
                return []
            reduced = hooks.all_reduce_gradients(self, grads_and_vars)
            if reduced is None:
                return original(self, grads_and_vars)
            return reduced

        return _all_reduce_sum_gradients

    replace(_tf_optimizer.TFOptimizer, "_all_reduce_sum_gradients", all_reduce)


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

    replace(_base_optimizer.BaseOptimizer, "apply", build_first)
    # `LossScaleOptimizer` overrides `apply` and builds itself (and its inner
    # optimizer) there, before any `BaseOptimizer.apply` runs: the mixed-precision
    # guide's custom loop failed the same way (issue 22).
    replace(_loss_scale_optimizer.LossScaleOptimizer, "apply", build_first)


def _patch_sharded_slots(hooks):
    # Weight-update sharding (issue 24) keeps one piece of each slot per replica.
    # Keras makes slots "like" a variable in `add_variable_from_reference`, from
    # each optimizer's `build` (which users and `compile_from_config` call
    # directly), with no public hook; Keras 3 shards optimizer state only on JAX
    # (`keras.distribution`). It answers stock unless the optimizer's strategy is
    # a Replicator built with `shard_weight_update=True`. The update and the
    # saving need no patch: see `_patch_gradient_all_reduce` and
    # `sharding/_saving.PieceSlot`.
    def slot(original):
        def add_variable_from_reference(
            self, reference_variable, name=None, initializer="zeros"
        ):
            piece = hooks.make_sharded_slot(self, reference_variable, name, initializer)
            if piece is not None:
                return piece
            return original(self, reference_variable, name, initializer)

        return add_variable_from_reference

    replace(_tf_optimizer.TFOptimizer, "add_variable_from_reference", slot)
