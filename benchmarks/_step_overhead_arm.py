"""One process of one arm of `step_overhead.py`: trains, prints `RESULT {json}`.

Run as `python -m benchmarks.step_overhead --arm ARM --model MODEL --steps N
[--diagnose]` (worker 0 prints, under worker processes). The step is the median
interval between `on_train_batch_end` stamps after batch `STEADY_AFTER`; the first
step runs from `fit` to the end of batch 0.

`--diagnose` stamps `on_train_batch_begin` too: begin to end is the
`train_function` call, end to the next begin is Keras' loop and callbacks. It
also reads every thread's CPU time (`/proc/self/task/*/stat`, utime + stime) at
batch `STEADY_AFTER` and at the last batch, grouped by thread name: the cost of
background threads (tf.data, gRPC, the ring) that an op-time profile of the
compute threads does not show.
"""

from __future__ import annotations

import json
import os
import statistics
import time

from benchmarks import harness
from benchmarks._models import build_model

GLOBAL_BATCH = {"mlp": 256, "small_mlp": 128, "resnet20": 256}
STEPS = {"mlp": 40, "small_mlp": 60, "resnet20": 24}
INPUT_SHAPE = {"mlp": (784,), "small_mlp": (784,), "resnet20": (32, 32, 3)}
STEADY_AFTER = 10
NO_COMMUNICATION = "ours 2 workers, no communication"
BUCKETS_16MB = "ours 2 workers, 16 MB buckets"
LOCKSTEP = "2 plain processes, in lockstep"
TWO_PROCESS_ARMS = (
    "ours 2 workers",
    "stock 2 workers",
    "2 plain processes",
    NO_COMMUNICATION,
    BUCKETS_16MB,
    LOCKSTEP,
)


def thread_group(name: str, is_main: bool, process_name: str = "python") -> str:
    """The group a thread's CPU time is reported under, from its name (`comm`).

    `unnamed` threads kept the process's name (`process_name`): here, with 2
    threads, mostly the intra-op pool that runs the matmuls; Python's own threads
    (the socket ring's sender) land there too. `tf_Compute` is the inter-op pool,
    which runs the ops itself with 1 thread.
    """
    if is_main:
        return "python main"
    if name == process_name:
        return "unnamed"
    for prefix, group in (
        ("tf_Compute", "tf_Compute"),
        ("tf_data", "tf_data"),
        ("collective_ops", "collectives"),
        ("grpc", "grpc"),
        ("event_engine", "grpc"),
        ("default-exec", "grpc"),
        ("resolver-exec", "grpc"),
        ("tf_", "tf other"),
    ):
        if name.startswith(prefix):
            return group
    return "other"


def _ticks(stat: str) -> int:
    # utime and stime are fields 14 and 15; `comm` (field 2) may hold spaces, so
    # count from the ")" that closes it (field 3 is the first after it).
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def thread_cpu_seconds() -> dict:
    """CPU seconds of this process: per live thread id, and the whole process."""
    tick = os.sysconf("SC_CLK_TCK")
    with open("/proc/self/comm") as file:
        process_name = file.read().strip()
    threads = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as file:
                name = file.read().strip()
            with open(f"/proc/self/task/{tid}/stat") as file:
                seconds = _ticks(file.read()) / tick
        except OSError:  # the thread exited meanwhile
            continue
        group = thread_group(name, int(tid) == os.getpid(), process_name)
        threads[tid] = {"name": name, "group": group, "seconds": seconds}
    with open("/proc/self/stat") as file:
        total = _ticks(file.read()) / tick
    return {"threads": threads, "total": total}


def cpu_per_step(before: dict, after: dict, steps: int, by: str = "group") -> dict:
    """CPU seconds per step by thread `group` (or `name`) between two samples.

    `before` and `after` are `thread_cpu_seconds()`. Threads started in between
    count from zero; the time of threads that exited in between is only in the
    process total, reported as `exited threads`.
    """
    found: dict[str, float] = {}
    for tid, thread in after["threads"].items():
        start = before["threads"].get(tid, {"seconds": 0.0})["seconds"]
        key = thread[by]
        found[key] = found.get(key, 0.0) + thread["seconds"] - start
    total = after["total"] - before["total"]
    found["exited threads"] = max(0.0, total - sum(found.values()))
    found["total"] = total
    return {key: seconds / steps for key, seconds in found.items()}


def _skip_the_rings_sums() -> None:
    """Diagnostic only (wrong numbers): each ring all-reduce returns this worker's
    own values, as if the other had sent zeros, and a doubled count. Everything a
    2-worker step does but communicate: what stays of the gap to the ceiling is
    not the ring's."""
    import numpy as np

    from keras_replicator.communication.ring import _socket_ring

    def own_values(self, *arrays, divide_by=None, counts=None):
        if counts is None:
            return list(arrays)
        return [*arrays, np.asarray(counts, np.float32).reshape(-1) * self.size]

    _socket_ring.SocketRing.all_reduce = own_values


def _time_the_rings_calls() -> list:
    """Records `(start, end)` of each socket-ring all-reduce of this process."""
    from keras_replicator.communication.ring import _socket_ring

    calls: list = []
    all_reduce = _socket_ring.SocketRing.all_reduce

    def timed(self, *arrays, **kwargs):
        start = time.perf_counter()
        try:
            return all_reduce(self, *arrays, **kwargs)
        finally:
            calls.append((start, time.perf_counter()))

    _socket_ring.SocketRing.all_reduce = timed
    return calls


def ring_seconds(calls: list, ends: list, steady_after: int) -> dict:
    """Seconds in ring calls: in the first step, and per steady step.

    `calls` are `(start, end)` pairs and `ends` the batches' end stamps; a call
    belongs to the step it ended in. The steady steps are those after
    `ends[steady_after]`, as for the step time.
    """
    first = sum(b - a for a, b in calls if b <= ends[0])
    steady = [b - a for a, b in calls if b > ends[steady_after]]
    return {
        "ring_first_step": first,
        "ring_per_step": sum(steady) / (len(ends) - 1 - steady_after),
    }


def lockstep_barrier(address: str, index: int):
    """A callback that starts each batch on two processes together.

    Process `index` 0 listens on `address` ("host:port"), 1 connects; before
    every batch each sends one byte and waits for the other's. They share
    nothing else: two plain `fit`s paced like a synchronous step, without its
    communication (the arm uses worker 0's `TF_CONFIG` port, which plain
    processes leave unused).
    """
    import socket

    import keras

    host, port = address.rsplit(":", 1)
    if index == 0:
        with socket.create_server((host, int(port))) as server:
            server.settimeout(120)
            peer, _ = server.accept()
    else:
        deadline = time.monotonic() + 120
        while True:
            try:
                peer = socket.create_connection((host, int(port)), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    peer.settimeout(120)
    peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    class Lockstep(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            peer.sendall(b"x")
            if not peer.recv(1):
                raise ConnectionError("the other process of the lockstep pair left")

    return Lockstep()


def run_arm(arm: str, model_name: str, steps: int, diagnose: bool) -> None:
    """One process of one arm: trains and prints `RESULT {json}` (worker 0)."""
    import tensorflow as tf

    threads = 1 if arm in TWO_PROCESS_ARMS else 2
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    import keras
    import numpy as np

    import keras_replicator as kr

    strategy = {
        "plain": tf.distribute.get_strategy,
        "2 plain processes": tf.distribute.get_strategy,
        LOCKSTEP: tf.distribute.get_strategy,
        "stock 1 device": lambda: tf.distribute.MirroredStrategy(["/cpu:0"]),
        "ours 1 device": lambda: kr.MultiDeviceReplicator(devices=["/cpu:0"]),
        "ours 2 workers": kr.MultiWorkerReplicator,
        NO_COMMUNICATION: kr.MultiWorkerReplicator,
        BUCKETS_16MB: lambda: kr.MultiWorkerReplicator(
            all_reduce=kr.AllReduceOptions(bucket_mb=16)
        ),
        "stock 2 workers": lambda: kr.MultiWorkerReplicator(
            all_reduce=kr.AllReduceOptions(transport="collective", bucket_mb=0)
        ),
    }[arm]()
    if arm == NO_COMMUNICATION:
        _skip_the_rings_sums()
    ring_calls = _time_the_rings_calls() if diagnose else []
    # The dataset's batch is the global batch (tf.distribute splits it between
    # workers); two plain processes each train on half of it.
    batch = GLOBAL_BATCH[model_name]
    batch = batch // 2 if arm in ("2 plain processes", LOCKSTEP) else batch
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * steps, *INPUT_SHAPE[model_name])).astype("float32")
    y = rng.integers(0, 10, len(x))
    with strategy.scope():
        model = build_model(keras, model_name)
        model.compile(
            keras.optimizers.SGD(0.01),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    ends: list[float] = []
    begins: list[float] = []
    cpu: list[dict] = []

    class Stamp(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            ends.append(time.perf_counter())

    class DiagnoseStamp(keras.callbacks.Callback):
        # Read /proc before the stamp at STEADY_AFTER, after it at the end, so
        # no steady interval holds the read.
        def on_train_batch_begin(self, batch, logs=None):
            begins.append(time.perf_counter())

        def on_train_batch_end(self, batch, logs=None):
            if batch == STEADY_AFTER:
                cpu.append(thread_cpu_seconds())
            ends.append(time.perf_counter())
            if batch == steps - 1:
                cpu.append(thread_cpu_seconds())

    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
    if arm in ("ours 2 workers", "stock 2 workers", BUCKETS_16MB):
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.DATA
        )
        data = data.with_options(options)
    callbacks = [DiagnoseStamp() if diagnose else Stamp()]
    if arm == LOCKSTEP:
        config = json.loads(os.environ["TF_CONFIG"])
        address = config["cluster"]["worker"][0]
        callbacks.insert(0, lockstep_barrier(address, config["task"]["index"]))
    start = time.perf_counter()
    model.fit(data, epochs=1, verbose=0, callbacks=callbacks)
    steady = [b - a for a, b in zip(ends[STEADY_AFTER:], ends[STEADY_AFTER + 1 :])]
    result = {"first_step": ends[0] - start, "step": statistics.median(steady)}
    if diagnose:
        calls = [e - b for b, e in zip(begins, ends)][STEADY_AFTER + 1 :]
        loops = [b - e for e, b in zip(ends[STEADY_AFTER:], begins[STEADY_AFTER + 1 :])]
        result["call"] = statistics.median(calls)
        result["loop"] = statistics.median(loops)
        result["cpu_per_step"] = cpu_per_step(cpu[0], cpu[1], len(steady))
        result["cpu_per_step_by_name"] = cpu_per_step(
            cpu[0], cpu[1], len(steady), by="name"
        )
        if ring_calls:
            result.update(ring_seconds(ring_calls, ends, STEADY_AFTER))
    if int(os.environ.get("KERAS_REPLICATOR_WORKER_INDEX", "0")) == 0:
        harness.emit_result(result)
