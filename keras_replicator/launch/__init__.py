"""Starting and supervising worker processes (no TensorFlow imported here)."""

from keras_replicator.launch._ports import free_ports
from keras_replicator.launch._runner import (
    LaunchResult,
    WorkerResult,
    run_workers,
    tf_configs,
)

__all__ = ["LaunchResult", "WorkerResult", "free_ports", "run_workers", "tf_configs"]
