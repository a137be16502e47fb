"""The worker half of `keras-replicator launch`: what runs inside each worker.

`launch/` starts and supervises the workers from a parent process without
TensorFlow; what it asks of the workers runs in them, from here:

- `watchdog`: `exit_with_launcher()`, a serving task (a parameter server, a
  tf.data service task) ends when its launcher is gone (standard library only).
- `preemption`: the signal handler that only records and the agreement on the
  step every worker stops after; `BackupAndRestore` (`_files/backup.py`) and the
  training step (`keras_integration/_steps.py`) use it, and it tells the
  launcher that the worker stopped for a preemption, not because training ended.

The names the two halves share through the environment are in
`keras_replicator/_environment.py`, with every other `KERAS_REPLICATOR_*` name.
The package sits below everything that uses it (it imports only
`_environment` and `_replicator_state` of ours), and this `__init__` imports
nothing, so the launcher can import `watchdog` without TensorFlow.
"""
