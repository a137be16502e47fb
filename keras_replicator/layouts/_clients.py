"""Several worker processes as one mesh: DTensor's multi-client mode.

One `ModelParallelReplicator` can span worker processes (on one machine or
several): each process is a DTensor *client* that owns its local devices, the
mesh holds every client's devices, and DTensor's collectives cross processes
over gRPC. TensorFlow brings the engine (`dtensor.initialize_accelerator_system`
starts the server, the collectives and the coordination service); what it
lacks is a way to find the cluster other than its own `DTENSOR_*` variables.
Here the cluster comes from what launchers already set:

- `DTENSOR_JOBS` (and `DTENSOR_CLIENT_ID`, `DTENSOR_JOB_NAME`): DTensor's own
  variables, used as they are;
- else a `TF_CONFIG` with two or more `chief` / `worker` tasks (what
  `keras-replicator launch`, `kr.launch.launch_function`, Slurm and cluster
  managers set): the clients are the chief, then the workers, in order, each
  serving on its `TF_CONFIG` address.

The devices must be made before TensorFlow starts, so `kr.devices(n)` starts
the clients: `n / clients` devices each, named globally
(`/job:worker/replica:0/task:1/device:CPU:0`), task by task.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from keras_replicator import _tf_config

_JOBS = "DTENSOR_JOBS"
_CLIENT_ID = "DTENSOR_CLIENT_ID"
_NUM_CLIENTS = "DTENSOR_NUM_CLIENTS"
_JOB_NAME = "DTENSOR_JOB_NAME"
_SYNCHRONOUS_TASKS = ("chief", "worker")


@dataclasses.dataclass(frozen=True)
class Clients:
    """The DTensor clients of a cluster, and which one this process is.

    Attributes:
        addresses: Each client's `host:port`, in client order.
        index: This process's client id.
        job: The TensorFlow job name the clients share.
    """

    addresses: tuple[str, ...]
    index: int
    job: str = "worker"

    @property
    def count(self) -> int:
        return len(self.addresses)

    def environment(self) -> dict[str, str]:
        """The `DTENSOR_*` variables DTensor reads for this cluster."""
        return {
            _JOBS: ",".join(self.addresses),
            _CLIENT_ID: str(self.index),
            _NUM_CLIENTS: str(self.count),
            _JOB_NAME: self.job,
        }


def cluster_clients(environ: Mapping[str, str] | None = None) -> Clients | None:
    """The clients `environ` describes, or `None` for a single process.

    Example:
    >>> config = ('{"cluster": {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]},'
    ...           ' "task": {"type": "worker", "index": 1}}')
    >>> cluster_clients({"TF_CONFIG": config})
    Clients(addresses=('127.0.0.1:2222', '127.0.0.1:2223'), index=1, job='worker')
    >>> cluster_clients({}) is None
    True
    """
    environ = os.environ if environ is None else environ
    if environ.get(_JOBS, "").strip():
        return _from_dtensor_variables(environ)
    config = _tf_config.read_tf_config(environ)
    if config is None:
        return None
    cluster, task = config["cluster"], config["task"]
    others = sorted(set(cluster) - set(_SYNCHRONOUS_TASKS))
    if others or task["type"] not in _SYNCHRONOUS_TASKS:
        raise ValueError(
            "A `ModelParallelReplicator` cluster has chief and worker tasks only "
            f"(every process holds part of the mesh). Received: TF_CONFIG with "
            f"tasks {sorted(cluster)} and this task {task['type']!r}. Launch "
            "workers only, e.g. `keras-replicator launch --workers 2`."
        )
    addresses = tuple(
        address for kind in _SYNCHRONOUS_TASKS for address in cluster.get(kind, ())
    )
    if len(addresses) < 2:
        return None
    chiefs = len(cluster.get("chief", ())) if task["type"] == "worker" else 0
    index = task["index"] + chiefs
    return Clients(addresses, index)


def _from_dtensor_variables(environ: Mapping[str, str]) -> Clients:
    addresses = tuple(a.strip() for a in environ[_JOBS].split(","))
    raw = environ.get(_CLIENT_ID, "0").strip()
    if not raw.isdigit() or int(raw) >= len(addresses):
        raise ValueError(
            f"`{_CLIENT_ID}` must be this process's index in `{_JOBS}`, from 0 to "
            f"{len(addresses) - 1}. Received: {_CLIENT_ID}={raw!r} with "
            f"{_JOBS}={environ[_JOBS]!r}."
        )
    return Clients(addresses, int(raw), environ.get(_JOB_NAME) or "worker")


# Set once the clients have started: DTensor offers no public way to ask.
_started: dict[str, object] = {}


def start_clients(clients: Clients, count: int, device_type: str) -> list[str]:
    """Starts this process's DTensor client; the mesh's global device names.

    Args:
        clients: The cluster (`cluster_clients()`).
        count: Devices of the whole mesh; each client holds `count / clients`.
        device_type: `"CPU"` (the host split into logical CPUs) or `"GPU"`.

    Raises:
        ValueError: `count` is not a multiple of the clients, TensorFlow has
            already started, or the clients already started with other devices.
    """
    if count % clients.count:
        raise ValueError(
            f"`count` must be a multiple of the {clients.count} worker processes, "
            f"so that each holds as many devices. Received: count={count}. Pass "
            f"e.g. count={clients.count * max(count // clients.count, 1)}."
        )
    local = count // clients.count
    wanted = (clients, local, device_type)
    if _started and _started["wanted"] != wanted:
        raise ValueError(
            "This worker's devices are already made: "
            f"{_started['wanted'][1]} {_started['wanted'][2]} device(s) of "
            f"{clients.count} workers. Received: count={count}. Every "
            "`kr.devices()` call of a multi-worker run must ask for the same count."
        )
    if not _started:
        _initialize(clients, local, device_type)
        _started["wanted"] = wanted
    return global_device_names(clients.job, clients.count, local, device_type)


def global_device_names(
    job: str, workers: int, local: int, device_type: str
) -> list[str]:
    """Every worker's devices, worker by worker, as DTensor numbers them.

    Example:
    >>> global_device_names("worker", 2, 2, "CPU")[2]
    '/job:worker/replica:0/task:1/device:CPU:0'
    """
    return [
        f"/job:{job}/replica:0/task:{task}/device:{device_type}:{i}"
        for task in range(workers)
        for i in range(local)
    ]


def _initialize(clients: Clients, local: int, device_type: str) -> None:
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    os.environ.update(clients.environment())
    try:
        dtensor.initialize_accelerator_system(
            device_type, num_logical_cpu_devices=local if device_type == "CPU" else None
        )
    except ValueError as error:
        raise ValueError(
            f"The devices of worker {clients.index} of {clients.count} cannot be "
            f"made: {error} Received: count={local * clients.count}. Call "
            "`kr.devices(n)` before any other TensorFlow call of the worker (it "
            "joins the workers into one mesh), and only once."
        ) from None
    available = len(tf.config.list_logical_devices(device_type))
    if available < local:
        raise ValueError(
            f"Worker {clients.index} has {available} {device_type} device(s), "
            f"fewer than the {local} it must hold. Received: count="
            f"{local * clients.count} over {clients.count} workers. Pass "
            f"count={available * clients.count}, or give each worker "
            f"{local} devices."
        )
