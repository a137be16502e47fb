"""Keras 3 on `ParameterServerStrategy` (issue 14): fit / evaluate / predict routed
to `parameter_server/`, and Keras variables' `assign_add` / `assign_sub` made atomic
on the parameter servers (issue 22).
"""

from __future__ import annotations

import inspect

import tensorflow as tf
from keras.src.backend.common import stateless_scope as _stateless_scope
from keras.src.backend.common import variables as _common_variables
from keras.src.backend.tensorflow import core as _tf_core
from keras.src.backend.tensorflow import trainer as _tf_trainer

from keras_replicator._compat import _installer
from keras_replicator._compat._patching import replace, unpatched


def install_parameter_server(hooks) -> None:
    """Routes `Model.fit` / `evaluate` / `predict` to `hooks` under PS training.

    Keras 3's TF trainer cannot train on `ParameterServerStrategy`: its epoch
    iterator calls `experimental_distribute_dataset`, which that strategy refuses
    ("you need to pass this dataset to ClusterCoordinator.create_per_worker_dataset";
    keras-team/keras has no ClusterCoordinator support, tf_keras had it in
    `Model.fit`). Only models whose strategy `hooks.routes(model)` accepts (a
    `ParameterServerReplicator`) are routed; everything else keeps stock Keras.
    Also makes Keras variables' increments atomic where `hooks.atomic_updates()`
    says so (`install_atomic_updates`).
    """
    _installer.install_once(
        _installer.PARAMETER_SERVER, lambda: _install_parameter_server(hooks)
    )


def _install_parameter_server(hooks) -> None:
    trainer = _tf_trainer.TensorFlowTrainer
    for name in ("fit", "evaluate", "predict"):

        def make(original, name=name):
            def routed(self, *args, **kwargs):
                if not hooks.routes(self):
                    return original(self, *args, **kwargs)
                return getattr(hooks, name)(self, *args, **kwargs)

            return routed

        replace(trainer, name, make)
    install_atomic_updates(hooks)


def install_atomic_updates(hooks) -> None:
    """Makes Keras' `Variable.assign_add` / `assign_sub` one op on the variable.

    Keras 3's `assign_add(value)` is `assign(self + value)`: a read, then a write
    (keras-team/keras `KerasVariable.assign_add`; tf_keras used the TF
    variable's own op). Under parameter-server training several workers update
    the same variable on a ps at once, and each loses the others' increments
    made between its read and its write: `optimizer.iterations` and metric
    counters (`Mean.count`, `Accuracy.total`) undercount (15-17 of 20 in TF's PS
    tutorial). When `hooks.atomic_updates()` is true (the current strategy is a
    `ParameterServerReplicator`) the update is the TF variable's own
    `AssignAddVariableOp` / `AssignSubVariableOp`, which the ps applies
    atomically. Everywhere else, and in a stateless scope, Keras' code runs.
    """
    for name in ("assign_add", "assign_sub"):

        def make(original, name=name):
            def update(self, value):
                target = getattr(self, "_value", None)
                if (
                    target is None
                    or _stateless_scope.in_stateless_scope()
                    or not hooks.atomic_updates()
                ):
                    return original(self, value)
                return getattr(target, name)(tf.cast(value, target.dtype))

            return update

        replace(_tf_core.Variable, name, make)

    def check_created(original):
        def initialize(self, value):
            original(self, value)
            hooks.check_variable(self, sharded_parts(self))

        return initialize

    replace(_tf_core.Variable, "_initialize", check_created)


def sharded_parts(variable) -> int:
    """How many parts a Keras variable's TF variable is split into (1: whole).

    A `variable_partitioner` makes `ParameterServerStrategy` create a
    `ShardedVariable` where Keras asked for a `tf.Variable`. Keras 3 cannot
    train one: `GradientTape` reads the Keras variable's `handle`, which a
    `ShardedVariable` does not have ("'ShardedVariable' object has no attribute
    'handle'", stock Keras 3 too). The class is not public API.
    """
    from tensorflow.python.distribute import sharded_variable

    value = getattr(variable, "_value", None)
    if isinstance(value, sharded_variable.ShardedVariable):
        return len(value.variables)
    return 1


def symbolic_build(model, data_batch) -> None:
    """Builds a compiled model's metrics and loss from one batch, in its scope.

    `Trainer._symbolic_build` is what Keras' own `fit` calls for this; there is no
    public way to build compile metrics before the first step, and under PS
    training their variables must be created on the chief before any step runs.
    """
    model._maybe_symbolic_build(data_batch=data_batch)


def check_upstream() -> dict[str, str]:
    """`check_upstream()`'s part for parameter-server training."""
    changed = {}
    trainer = _tf_trainer.TensorFlowTrainer
    source = inspect.getsource(unpatched(trainer._maybe_symbolic_build))
    if "data_batch" not in source or "_symbolic_build" not in source:
        changed["TensorFlowTrainer._maybe_symbolic_build"] = "no data_batch path"
    for name in ("fit", "evaluate", "predict"):
        if not callable(getattr(trainer, name, None)):
            changed[f"TensorFlowTrainer.{name}"] = "missing"
    changed.update(check_coordinator_internals())
    changed.update(check_variable_internals())
    return changed


def check_variable_internals() -> dict[str, str]:
    """What `install_atomic_updates` relies on in Keras' TF variable."""
    changed = {}
    initialize = unpatched(_tf_core.Variable._initialize)  # may be wrapped here
    if "self._value = " not in inspect.getsource(initialize):
        changed["tensorflow Variable._value"] = "attribute renamed"
    for name in ("assign_add", "assign_sub"):
        if not callable(getattr(_common_variables.Variable, name, None)):
            changed[f"KerasVariable.{name}"] = "missing"
    from tensorflow.python.distribute import sharded_variable

    if not hasattr(sharded_variable, "ShardedVariable"):
        changed["sharded_variable.ShardedVariable"] = "missing"
    if "self._initialize(" not in inspect.getsource(_common_variables.Variable):
        changed["KerasVariable._initialize"] = "no longer called"
    if not callable(getattr(_stateless_scope, "in_stateless_scope", None)):
        changed["stateless_scope.in_stateless_scope"] = "missing"
    return changed


def closure_queue_state(coordinator):
    """(queued, in flight) closures of a `ClusterCoordinator`, or None.

    How the chief tells a hung task from a long epoch (`parameter_server/_faults`):
    progress is a change of these counts. `ClusterCoordinator` exposes only
    `done()` and `join()`, which cannot say whether anything moved.
    """
    try:
        closures = coordinator._cluster.closure_queue
        return (closures._queue.qsize(), closures._inflight_closure_count)
    except AttributeError:
        return None


def stop_coordinator(coordinator) -> None:
    """Cancels a coordinator's closures (no public API does; `join` would wait)."""
    coordinator._cluster.stop()


def check_coordinator_internals() -> dict[str, str]:
    """The coordinator internals `closure_queue_state` / `stop_coordinator` read."""
    from tensorflow.python.distribute.coordinator import cluster_coordinator

    changed = {}
    cluster_source = inspect.getsource(cluster_coordinator.Cluster)
    if "self.closure_queue = " not in cluster_source:
        changed["Cluster.closure_queue"] = "attribute renamed"
    if not callable(getattr(cluster_coordinator.Cluster, "stop", None)):
        changed["Cluster.stop"] = "missing"
    queue_source = inspect.getsource(cluster_coordinator._CoordinatedClosureQueue)
    for name in ("self._queue = ", "self._inflight_closure_count = "):
        if name not in queue_source:
            changed[f"_CoordinatedClosureQueue.{name[5:-3]}"] = "attribute renamed"
    if "self._cluster = " not in inspect.getsource(
        cluster_coordinator.ClusterCoordinator
    ):
        changed["ClusterCoordinator._cluster"] = "attribute renamed"
    return changed
