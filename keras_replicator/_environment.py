"""Every `KERAS_REPLICATOR_*` environment variable, by name, in one place.

Environment variables are an interface: users set some of them (timeouts, opt-outs),
and `keras-replicator launch` sets others for the workers it starts, whose training
code (with TensorFlow) reads them while the launcher (without TensorFlow) never
imports that code. A name spelled out in two modules drifts; here each is a
constant, with who sets it and who reads it, and every other module imports the
constant (`tests/test_environment_names.py` fails on a `KERAS_REPLICATOR_` string
anywhere else). The values are public: documentation and scripts spell them out,
so a value never changes.

One mirror: `_compat` is a leaf (it imports nothing of ours outside itself,
`tests/test_compat.py`), so `_compat/_versions.py` keeps its own copy of
`ALLOW_UNSUPPORTED`, which the test checks equals the one here.

Standard library only (nothing at all), so the launcher, `_compat`'s neighbours
and every worker can import it first.

Example:
>>> from keras_replicator import _environment
>>> _environment.WORKER_INDEX
'KERAS_REPLICATOR_WORKER_INDEX'
>>> all(name.startswith("KERAS_REPLICATOR_") for name in _environment.NAMES)
True
"""

# What `keras-replicator launch` tells each worker.

WORKER_INDEX = "KERAS_REPLICATOR_WORKER_INDEX"
"""This worker's rank: set by `launch/_runner.py` and `launch/_cluster.py`; read by
`launch/_function_worker.py`, `testing/_worker.py` and users' scripts."""

NUM_WORKERS = "KERAS_REPLICATOR_NUM_WORKERS"
"""How many workers the group has: set by `launch/_runner.py` and
`launch/_cluster.py`; read by users' scripts."""

TASK_TYPE = "KERAS_REPLICATOR_TASK_TYPE"
"""`chief`, `worker` or `ps` in a parameter-server group: set by
`launch/_cluster.py`; read by users' scripts."""

RESTART_COUNT = "KERAS_REPLICATOR_RESTART_COUNT"
"""How many times the group was started before (0 on the first run, as torchrun's
`TORCHELASTIC_RESTART_COUNT`): set by `launch/_launcher.py`; read by users'
scripts."""

LAUNCHER_PID = "KERAS_REPLICATOR_LAUNCHER_PID"
"""The launcher's pid: set by `launch/_runner.py`; read by `_worker/watchdog.py`
(a serving task ends when its launcher is gone)."""

PREEMPTED_FILE = "KERAS_REPLICATOR_PREEMPTED_FILE"
"""A path the worker creates when it stops after a preemption backup, so that the
launcher tells "exited 0: finished" from "exited 0: preempted": set by
`launch/_launcher.py`, created by `_worker/preemption.py`, looked for by
`launch/_runner.py`."""

SLOT = "KERAS_REPLICATOR_SLOT"
"""In an elastic launch with `discover`, the slot (one line of the discovery
command's output, e.g. a GPU index) this worker runs in: set by
`launch/_launcher.py`; read by users' scripts."""

SHARED_GPUS = "KERAS_REPLICATOR_SHARED_GPUS"
"""`1` when workers share GPUs (fewer GPUs than workers; NCCL refuses two ranks on
one GPU): set by `launch/_gpus.py`; read by `strategies/multi_worker.py`, which
then keeps TensorFlow's RING collectives."""

DATA_SERVICE = "KERAS_REPLICATOR_DATA_SERVICE"
"""The tf.data service dispatcher's address: set by `launch/_cluster.py`
(`--data-service`) or the user; read by `data/service.py` (`service_address()`)."""

# What users set to tune or opt out.

COLLECTIVE_TIMEOUT = "KERAS_REPLICATOR_COLLECTIVE_TIMEOUT"
"""Seconds a collective may wait for a peer: set by users; read by
`strategies/multi_worker.py`."""

PS_TIMEOUT = "KERAS_REPLICATOR_PS_TIMEOUT"
"""Seconds a parameter-server closure may wait (`inf`: forever): set by users;
read by `parameter_server/_faults.py`."""

GPU_MEMORY_MB = "KERAS_REPLICATOR_GPU_MEMORY_MB"
"""Megabytes per logical GPU when one GPU is split into replicas: set by users;
read by `strategies/_devices.py`."""

NUM_REPLICAS = "KERAS_REPLICATOR_NUM_REPLICAS"
"""How many local replicas `kr.auto()` builds: set by users; read by
`strategies/_auto.py`."""

RING_SHARED_MEMORY = "KERAS_REPLICATOR_RING_SHARED_MEMORY"
"""`0` keeps the socket ring off shared memory between workers on one machine:
set by users; read by `communication/ring/_shared_memory.py`."""

RING_HIERARCHY = "KERAS_REPLICATOR_RING_HIERARCHY"
"""`0` keeps the flat ring instead of rows and columns across machines: set by
users; read by `communication/ring/_hierarchical.py`."""

VERBOSE = "KERAS_REPLICATOR_VERBOSE"
"""Non-empty: a failed conformance check prints its traceback: set by users; read
by `testing/_worker.py`."""

ALLOW_UNSUPPORTED = "KERAS_REPLICATOR_ALLOW_UNSUPPORTED"
"""`1` downgrades an unsupported TensorFlow/Keras version to a warning: set by
users; read by `_compat/_versions.py` (through its own checked copy, see above)."""

NAMES = (
    WORKER_INDEX,
    NUM_WORKERS,
    TASK_TYPE,
    RESTART_COUNT,
    LAUNCHER_PID,
    PREEMPTED_FILE,
    SLOT,
    SHARED_GPUS,
    DATA_SERVICE,
    COLLECTIVE_TIMEOUT,
    PS_TIMEOUT,
    GPU_MEMORY_MB,
    NUM_REPLICAS,
    RING_SHARED_MEMORY,
    RING_HIERARCHY,
    VERBOSE,
    ALLOW_UNSUPPORTED,
)
"""Every name above, in order."""
