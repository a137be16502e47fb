"""What `keras-replicator launch` tells each worker through its environment.

The launcher imports no TensorFlow and the workers' training code does, so the
names they share live here, in a module of the standard library only.

- `KERAS_REPLICATOR_PREEMPTED_FILE`: a path the worker creates when it stops after
  a preemption backup (`BackupAndRestore`), so that the launcher can tell "exited
  0 because training finished" from "exited 0 because it was preempted" and start
  the group again instead of reporting success.
- `KERAS_REPLICATOR_SLOT`: in an elastic launch with `discover`, the name of the
  slot (one line of the discovery command's output) this worker runs in, e.g. a
  GPU index to put in `CUDA_VISIBLE_DEVICES`.

- `KERAS_REPLICATOR_SHARED_GPUS`: `1` when the launcher made workers share GPUs
  (fewer GPUs than workers): NCCL refuses two ranks on one GPU, so the workers
  keep TensorFlow's RING collectives (`strategies/multi_worker.py`).

Example:
>>> from keras_replicator._worker_env import PREEMPTED_FILE_ENV
>>> PREEMPTED_FILE_ENV
'KERAS_REPLICATOR_PREEMPTED_FILE'
"""

PREEMPTED_FILE_ENV = "KERAS_REPLICATOR_PREEMPTED_FILE"
SLOT_ENV = "KERAS_REPLICATOR_SLOT"
SHARED_GPUS_ENV = "KERAS_REPLICATOR_SHARED_GPUS"
