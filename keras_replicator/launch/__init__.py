"""Starting and supervising worker processes (no TensorFlow imported here).

`launch()` runs a command as a worker group (locally, or as one task of a
TF_CONFIG / Slurm cluster) and restarts it after failures; `launch_function()`
does the same for a Python function, from a notebook too; `run_workers()` is the
single-run supervisor both build on. `exit_with_launcher()` is for the worker
side: a task that serves until stopped calls it to end with its launcher.
"""

from keras_replicator._worker.watchdog import exit_with_launcher
from keras_replicator.launch._function import LaunchError, launch_function
from keras_replicator.launch._launcher import launch
from keras_replicator.launch._options import LaunchOptions
from keras_replicator.launch._ports import free_ports
from keras_replicator.launch._results import LaunchResult, WorkerResult
from keras_replicator.launch._runner import run_workers, tf_configs

__all__ = [
    "LaunchError",
    "LaunchOptions",
    "LaunchResult",
    "WorkerResult",
    "exit_with_launcher",
    "free_ports",
    "launch",
    "launch_function",
    "run_workers",
    "tf_configs",
]
