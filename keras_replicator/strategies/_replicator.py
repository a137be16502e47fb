"""What every Replicator strategy adds to its stock TensorFlow parent.

The strategies subclass the stock ones (so Keras' own ``isinstance`` checks hold) and
mix this in: it installs the Keras integration fixes (``_compat.install``), gives each
instance its own collective keys, and answers the few questions our Keras step
builders ask of a strategy.
"""

from __future__ import annotations

from keras_replicator import _compat


class ReplicatorMixin:
    """Shared behaviour of `MultiDeviceReplicator`, `MultiWorkerReplicator`, ..."""

    _kr_is_replicator = True

    def _kr_prepare(self) -> None:
        """Call before the stock constructor: per-instance collective keys."""
        _compat.install()
        # Read by the stock Extended constructor through the container strategy.
        self._collective_key_base = _compat.next_collective_key_base()

    def _kr_is_multi_worker(self) -> bool:
        return _compat.in_multi_worker_mode(self)

    @property
    def num_workers(self) -> int:
        """Number of worker processes this strategy spans."""
        return self.num_replicas_in_sync // len(self.extended.worker_devices)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_replicas={self.num_replicas_in_sync}, "
            f"devices={list(self.extended.worker_devices)})"
        )
