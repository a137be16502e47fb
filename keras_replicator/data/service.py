"""The tf.data service: preprocessing on processes (or hosts) beside training.

When one host's CPUs cannot decode and augment as fast as its accelerators train,
Ying et al. (2018) add input hosts. tf.data's answer is the *tf.data service*: a
dispatcher and any number of service workers run the input pipeline; training
processes only receive finished batches over gRPC
(`tf.data.experimental.service.distribute`). This module wraps it in three small
pieces and hand-writes nothing tf.data already does:

- `distribute(dataset, service, processing_mode=..., job_name=...)` applies the
  transformation with checked arguments. Everything before it runs on the
  service workers; everything after it (prefetch, `InputWait.watch`) runs in the
  training process.
- `service_address()` reads `KERAS_REPLICATOR_DATA_SERVICE`, the dispatcher
  address `keras-replicator launch --data-service-workers N` gives every training
  worker, so one script runs with the service when launched with it and without
  it otherwise (`data_service=kr.data.service_address()`).
- `start_local_service(num_workers)` starts a dispatcher and workers inside this
  process, on loopback (tests, notebooks, benchmarks). `keras-replicator launch`
  starts them as processes of their own (`_service_main.py`).

**Processing modes** (`processing_mode`), what each guarantees:

- `"distributed_epoch"` (the default): the dispatcher hands out the *splits* of
  the dataset's source (here: one TFRecord file, or one image file, at a time) to
  the service workers as they ask, so one pass over the source is split among
  them, and consumers sharing a job (the same `job_name`) share that pass. Each
  example is produced **exactly once per epoch** over all service workers and all
  consumers while no service worker fails (at most once if one does: the splits
  it held are lost for that epoch). The source must be splittable: TFRecord
  files and image folders are; a TFDS source is not (use `"parallel_epochs"`).
  This matches per-worker file sharding without it, so it is what
  `image_pipeline` uses by default.
- `"parallel_epochs"`: every service worker runs the *whole* pipeline on its own,
  and consumers get elements from all of them. Nothing is coordinated, any
  dataset works, and a lost service worker only removes a stream; but one "epoch"
  of the job is `num_workers` passes over the data and no example is guaranteed
  within any window: fine for an endless shuffled training stream, wrong for
  evaluation.

In both modes the order is not deterministic, and a consumer of a shared job
receives whole batches (the batch size of the dataset, per consumer).

**Jobs.** Consumers with the same `job_name` share one job: that is how several
training workers split one stream. They must all build the *same* dataset (same
files, seed and arguments): a consumer whose dataset differs from the job's gets
an empty stream rather than an error, so `image_pipeline` requires a `seed` with
the service and names its job after a hash of its arguments. Iterating the same
dataset object again starts the next epoch of the job.

Security: like TensorFlow's other gRPC servers, the dispatcher and workers
listen on all interfaces and have no authentication; the launcher only starts
them with loopback addresses (`127.0.0.1`), and `start_local_service` likewise.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os

import tensorflow as tf

from keras_replicator import _environment
from keras_replicator._arguments import check_int

SERVICE_ENV = _environment.DATA_SERVICE
PROCESSING_MODES = ("distributed_epoch", "parallel_epochs")
LOOPBACK = "127.0.0.1"


def service_address(environ=None) -> str | None:
    """The dispatcher address the launcher gave this process, or `None`.

    Args:
        environ: Where to look. Defaults to `None`: `os.environ`.

    Returns:
        `"grpc://127.0.0.1:PORT"` under `keras-replicator launch
        --data-service-workers N`, else `None`.

    Example:
    >>> service_address({"KERAS_REPLICATOR_DATA_SERVICE": "grpc://127.0.0.1:5050"})
    'grpc://127.0.0.1:5050'
    >>> service_address({}) is None
    True
    """
    environ = os.environ if environ is None else environ
    raw = environ.get(SERVICE_ENV, "").strip()
    return check_address(raw, name=SERVICE_ENV) if raw else None


def check_address(service, name: str = "data_service") -> str:
    """`service` as `"grpc://host:port"`; raises naming `name` if it is not one."""
    if not isinstance(service, str):
        raise TypeError(
            f"`{name}` must be a dispatcher address string such as "
            f"'grpc://127.0.0.1:5050'. Received: {name}={service!r}."
        )
    address = service if "://" in service else f"grpc://{service}"
    protocol, _, rest = address.partition("://")
    host, _, port = rest.rpartition(":")
    valid_port = port.isdigit() and 0 < int(port) < 65536
    if protocol != "grpc" or not host or not valid_port:
        raise ValueError(
            f"`{name}` must be a dispatcher address 'grpc://HOST:PORT' (or "
            f"'HOST:PORT'). Received: {name}={service!r}. Use the address "
            "`keras-replicator launch --data-service-workers N` exports as "
            f"{SERVICE_ENV}, or `start_local_service().address`."
        )
    return address


def check_processing_mode(processing_mode) -> str:
    if processing_mode not in PROCESSING_MODES:
        raise ValueError(
            f"`processing_mode` must be one of {PROCESSING_MODES}. Received: "
            f"processing_mode={processing_mode!r}. 'distributed_epoch' gives every "
            "example once per epoch; 'parallel_epochs' runs the whole pipeline on "
            "every service worker (see keras_replicator.data.service)."
        )
    return processing_mode


def distribute(
    dataset: tf.data.Dataset,
    service: str,
    *,
    processing_mode: str = "distributed_epoch",
    job_name: str | None = None,
) -> tf.data.Dataset:
    """Runs `dataset` on the tf.data service at `service`; returns the consumer side.

    Args:
        dataset: The pipeline to run on the service workers (usually ending in
            `batch`).
        service: The dispatcher address, `"grpc://host:port"` or `"host:port"`.
        processing_mode: `"distributed_epoch"` or `"parallel_epochs"` (see the
            module docstring for what each guarantees). Defaults to
            `"distributed_epoch"`.
        job_name: Consumers with the same name share one job (and split its
            elements). Defaults to `None`: a job of this consumer's own.

    Returns:
        A dataset whose elements are produced by the service workers.

    Example:
    >>> import tensorflow as tf
    >>> from keras_replicator.data import service
    >>> local = service.start_local_service(num_workers=2)
    >>> dataset = service.distribute(tf.data.Dataset.range(6), local.address)
    >>> sorted(int(value) for value in dataset.as_numpy_iterator())
    [0, 1, 2, 3, 4, 5]
    """
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(
            f"`dataset` must be a tf.data.Dataset. Received: dataset={dataset!r}."
        )
    address = check_address(service, name="service")
    check_processing_mode(processing_mode)
    if job_name is not None and (not isinstance(job_name, str) or not job_name):
        raise ValueError(
            f"`job_name` must be a non-empty string or None. Received: "
            f"job_name={job_name!r}."
        )
    return dataset.apply(
        tf.data.experimental.service.distribute(
            processing_mode=processing_mode, service=address, job_name=job_name
        )
    )


def job_name_for(*parts) -> str:
    """A job name that is the same wherever the same `parts` are given."""
    digest = hashlib.sha256(repr(parts).encode()).hexdigest()[:16]
    return f"keras_replicator-{digest}"


@dataclasses.dataclass(frozen=True)
class LocalDataService:
    """A dispatcher and workers running in this process, on loopback.

    Attributes:
        address: The dispatcher's `"grpc://127.0.0.1:PORT"`.
        dispatcher: The `tf.data.experimental.service.DispatchServer`.
        workers: The `tf.data.experimental.service.WorkerServer`s.
    """

    address: str
    dispatcher: object
    workers: tuple


def start_local_service(num_workers: int = 2) -> LocalDataService:
    """Starts a tf.data service dispatcher and `num_workers` workers in-process.

    Every server listens on a free port and advertises `127.0.0.1`. They serve
    while the returned object is referenced (tf.data stops a server when its
    Python object is garbage collected, and offers no other public stop). For
    service workers in processes of their own, use `keras-replicator launch
    --data-service-workers N`.

    Args:
        num_workers: Service workers to start. Defaults to `2`.

    Returns:
        A `LocalDataService`; pass its `address` as `data_service=`.

    Example:
    >>> from keras_replicator.data import service
    >>> service.start_local_service(1).address.startswith("grpc://127.0.0.1:")
    True
    """
    check_int("num_workers", num_workers)
    api = tf.data.experimental.service
    dispatcher = api.DispatchServer(api.DispatcherConfig(port=0))
    port = int(dispatcher.target.rpartition(":")[2])
    workers = tuple(
        api.WorkerServer(
            api.WorkerConfig(
                dispatcher_address=f"{LOOPBACK}:{port}",
                worker_address=f"{LOOPBACK}:%port%",
                port=0,
            )
        )
        for _ in range(num_workers)
    )
    return LocalDataService(f"grpc://{LOOPBACK}:{port}", dispatcher, workers)
