"""`ParameterServerReplicator`: asynchronous training with parameter servers."""

from __future__ import annotations

import tensorflow as tf

from keras_replicator import _replicator_state, _tf_config
from keras_replicator.parameter_server import _serving
from keras_replicator.strategies import _cluster_config


class ParameterServerReplicator(tf.distribute.ParameterServerStrategy):
    """Asynchronous data parallelism: workers step independently, variables on ps.

    A `tf.distribute.ParameterServerStrategy` on which Keras 3 `fit`, `evaluate`
    and `predict` work from the chief (stock Keras 3 fails on it: its epoch
    iterator cannot use a per-worker dataset). Each training step is a function
    the chief's `tf.distribute.experimental.coordinator.ClusterCoordinator`
    schedules on whichever worker is free; a slow worker does not hold the others
    back, and the steps of a worker that dies are run again on the others.

    The same script runs on every task. On the `chief` the constructor returns a
    strategy; on `worker` and `ps` tasks it starts the task's server and blocks
    until the job ends (SIGTERM, which `keras-replicator launch --ps K` sends when
    the chief exits), then exits the process with code 0.

    Async training is not bit-exact: gradients are computed on weights other
    workers have since changed (staleness), and training logs are read from
    metric variables several workers update at once. See `docs/async.md`.

    Args:
        cluster_resolver: A `tf.distribute.cluster_resolver.ClusterResolver`.
            Defaults to `None`: read `TF_CONFIG` (validated first, with errors
            naming the malformed field); it must list `chief`, `worker` and `ps`.
        variable_partitioner: Passed to `tf.distribute.ParameterServerStrategy`,
            e.g. `tf.distribute.experimental.partitioners.MinSizePartitioner()`,
            to shard large `tf.Variable`s over the parameter servers. Keras 3
            cannot train a sharded variable, so a Keras variable it would shard
            is refused with a `ValueError` when the layer builds. Defaults to
            `None`: every variable lives whole on one ps, round-robin.

    Example:
    >>> import keras_replicator as kr
    >>> strategy = kr.ParameterServerReplicator()  # doctest: +SKIP
    >>> with strategy.scope():  # doctest: +SKIP
    ...     model = build_model()
    ...     model.compile("adam", "sparse_categorical_crossentropy")
    >>> model.fit(x, y, batch_size=32, epochs=3)  # doctest: +SKIP
    """

    def __init__(self, cluster_resolver=None, variable_partitioner=None):
        if cluster_resolver is None:
            config = _tf_config.read_tf_config()
            _cluster_config.check_parameter_server_cluster(config)
            cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        if cluster_resolver.task_type in _serving.SERVING_TASKS:
            _serving.serve_forever(cluster_resolver)
        super().__init__(cluster_resolver, variable_partitioner=variable_partitioner)
        _replicator_state.register(
            self,
            _replicator_state.ReplicatorState(
                is_parameter_server=True,
                partitioner=variable_partitioner,
                resolver=cluster_resolver,
            ),
        )
        from keras_replicator.parameter_server import _keras

        _keras.install()

    @property
    def coordinator(self):
        """The `ClusterCoordinator` that schedules work on the workers (one per job)."""
        # One per strategy: TensorFlow keeps it on the strategy, so no cache here.
        return tf.distribute.experimental.coordinator.ClusterCoordinator(self)

    @property
    def num_workers(self) -> int:
        """How many worker tasks execute the scheduled steps."""
        resolver = _replicator_state.own_state(self).resolver
        return len(resolver.cluster_spec().as_dict().get("worker", []))

    def distribute_input(self, input_fn):
        """`input_fn(input_context)` → a per-worker dataset (one pipeline per worker).

        Iterate it with `iter(...)` and pass the iterator to `run_steps`.
        """
        from keras_replicator.parameter_server import _steps

        return _steps.distribute_input(self, input_fn)

    def run_steps(self, step_fn, inputs, *, num_steps: int = 1):
        """Schedules `num_steps` calls of `step_fn(batch)` on a free worker.

        Returns a `RemoteValue` of the last step's outputs (`.fetch()` it); call
        `strategy.coordinator.join()` to wait for every scheduled step.
        """
        from keras_replicator.parameter_server import _steps

        return _steps.run_steps(self, step_fn, inputs, num_steps=num_steps)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_workers={self.num_workers})"
