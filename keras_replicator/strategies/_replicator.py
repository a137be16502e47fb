"""What every Replicator strategy adds to its stock TensorFlow parent.

The strategies subclass the stock ones (so Keras' own ``isinstance`` checks hold) and
mix this in: it installs the Keras integration fixes (``_hooks.install``),
gives each instance its own collective keys, and registers the instance's
`ReplicatorState` (`keras_replicator._replicator_state`): options, transport, flags and
caches live there, read with `replicator_state(strategy)`, never as attributes.
"""

from __future__ import annotations

from keras_replicator import _compat, _replicator_state
from keras_replicator.communication import _strategy_transport
from keras_replicator.keras_integration import _hooks
from keras_replicator.strategies import _step_api


class ReplicatorMixin:
    """Shared behaviour of `MultiDeviceReplicator`, `MultiWorkerReplicator`, ..."""

    # What `_compat.is_replicator` (a leaf, which cannot ask `_replicator_state`)
    # reads: declared by the class, never set on an instance.
    _kr_is_replicator = True

    def _register_state(self) -> _replicator_state.ReplicatorState:
        """Call before the stock constructor: per-instance collective keys and the
        strategy's (still empty) state, which the constructor then fills."""
        _hooks.install()
        # TensorFlow's own knob, read by the stock Extended constructor through the
        # container strategy (`_compat.next_collective_key_base`).
        self._collective_key_base = _compat.next_collective_key_base()
        return _replicator_state.register(self)

    def distribute_input(self, input_fn):
        """Distributes `input_fn(input_context)`'s per-replica batches.

        Args:
            input_fn: Takes a `tf.distribute.InputContext` and returns a
                `tf.data.Dataset` batched per replica
                (`input_context.get_per_replica_batch_size(global_batch)`) and
                sharded by worker (`dataset.shard(input_context.num_input_pipelines,
                input_context.input_pipeline_id)`, or files shard by worker).

        Returns:
            A distributed dataset; iterate it, or pass `iter(...)` to `run_steps`.
        """
        return _step_api.distribute_input(self, input_fn)

    def run_steps(self, step_fn, inputs, *, num_steps: int = 1, reduce=None):
        """Runs `step_fn(batch)` on every replica for `num_steps` batches.

        The loop is compiled once per `(step_fn, num_steps, reduce)`. Each replica
        declares its batch size, so Keras optimizers called in `step_fn` average
        gradients as one device would at the global batch.

        Args:
            step_fn: Called once per replica with that replica's batch; may call
                `keras_replicator.replica` collectives; returns tensors.
            inputs: An iterator over `distribute_input(...)` (or any distributed
                dataset iterator).
            num_steps: Steps to run in one compiled call. Defaults to `1`.
            reduce: How outputs of the last step come back: `None` (per-replica
                values), `"mean"`, `"sum"` (over all replicas and workers),
                `"concat"` (along axis 0, in replica order) or `"first"`.
                Defaults to `None`.

        Returns:
            The last step's outputs, reduced as asked.

        Raises:
            tf.errors.OutOfRangeError: When `inputs` is exhausted before the first
                step of the call.
        """
        return _step_api.run_steps(
            self, step_fn, inputs, num_steps=num_steps, reduce=reduce
        )

    @property
    def all_reduce_options(self):
        """The `kr.AllReduceOptions` in use, with the transport the strategy chose.

        Example:
        >>> import keras_replicator as kr
        >>> kr.MultiDeviceReplicator(num_replicas=2).all_reduce_options.transport
        'collective'
        """
        return _strategy_transport.options_of(self)

    @property
    def num_workers(self) -> int:
        """Number of worker processes this strategy spans."""
        return self.num_replicas_in_sync // len(self.extended.worker_devices)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_replicas={self.num_replicas_in_sync}, "
            f"devices={list(self.extended.worker_devices)})"
        )
