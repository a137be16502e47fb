"""Gradient all-reduce speed: stock packings vs `kr.AllReduceOptions`, vs a raw socket.

The gradient set has the shapes of Keras' ResNet-50 trainable weights (214 tensors,
25.6M float32 values, 102 MB). Between N worker processes on 127.0.0.1 (started by
`keras_replicator.launch.run_workers`, one `MultiWorkerReplicator` each) it times,
interleaved round by round (median over rounds):

* `raw socket`: the same processes exchange the bytes a ring all-reduce moves
  (2(N-1)/N of the buffer out to the right neighbour and in from the left) over
  plain loopback TCP, with no arithmetic: the transport's ceiling on this machine;
* `stock per-tensor`: one `ReplicaContext.all_reduce` per tensor;
* `stock 1 pack`: the whole list in one call (TensorFlow's default);
* `stock pack=XMB`: one call with `CommunicationOptions(bytes_per_pack=X MB)`;
* `ours default`: `_all_reduce.all_reduce_sum` with `kr.AllReduceOptions()`
  on a `MultiWorkerReplicator` built with the defaults (which picks the socket
  ring for CPU workers, checked);
* `collective ...`: the same with `transport="collective"` (TensorFlow's
  collectives) and each bucket size / compression;
* `ours local_then_global g=2` / `ours 2d g=2`: the hierarchical schemes with
  rows of 2 workers (one row on 2 workers, a 2 x 2 grid on 4);
* `socket ...`: the same with `transport="socket"` (our TCP ring).

`--devices N` instead times, in one process with N logical CPUs, a flat
all-reduce against both hierarchies with rows of N/2 devices (and a memcpy of
the bytes for scale).

Reports time, effective rate (float32 bytes / time), bus bandwidth
(2(N-1)/N x bytes / time, NCCL's convention) and the effective rate / socket rate.

`--fit` then measures Keras `fit` of a 6.3M-parameter MLP (784-2048-2048-256-10,
25 MB of gradients a step, global batch 256) on 2 worker processes (1 intra-op
thread each) and of ResNet-20 (`--fit-model resnet20` or `both`: 0.27M parameters,
compute-bound) against one process with 2 threads, and against two processes that
train on half the batch each at the same time with no communication at all (the
ceiling of any transport on these cores), for stock
packing (our strategy with `bucket_mb=0`: one pack, as stock; stock
`MultiWorkerMirroredStrategy` itself cannot run Keras 3 `fit`, keras-team/keras#20585)
and our strategy per option. Steady state only: the
median time of steps 10..N of a `fit` call (a callback timestamps every batch);
the time to the first step (tracing, setup) is reported separately. Each
configuration is a fresh process group; configurations alternate over `--rounds`.

    python benchmarks/allreduce.py [--workers 2 4] [--rounds 5] [--fit]
    python benchmarks/allreduce.py --devices 4
    python benchmarks/allreduce.py --fit-only --fit-model resnet20
    python benchmarks/allreduce.py --timeline benchmarks/allreduce_timeline.png
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MB = 1e6


def resnet50_shapes():
    """The trainable weight shapes of `keras.applications.ResNet50(weights=None)`."""
    import keras

    model = keras.applications.ResNet50(weights=None)
    return [tuple(w.shape) for w in model.trainable_weights]


def configurations():
    import functools

    import keras_replicator as kr

    socket = functools.partial(kr.AllReduceOptions, transport="socket")
    collective = functools.partial(kr.AllReduceOptions, transport="collective")
    hierarchy = functools.partial(kr.AllReduceOptions, group_size=2)
    return {
        "stock per-tensor": ("per_tensor", None),
        "stock 1 pack": ("stock", 0),
        "stock pack=4MB": ("stock", 4),
        "stock pack=32MB": ("stock", 32),
        "ours default": ("ours", kr.AllReduceOptions()),
        "collective 16MB": ("ours", collective()),
        "collective 4MB": ("ours", collective(bucket_mb=4)),
        "collective 1 pack": ("ours", collective(bucket_mb=0)),
        "collective bf16": ("ours", collective(compression="bf16")),
        "collective fp16": ("ours", collective(compression="fp16")),
        # Rows of 2 workers: on 2 workers one row (row collectives only), on 4 a
        # 2 x 2 grid. With 1 device per worker every link is the same loopback.
        "ours local_then_global g=2": (
            "ours",
            hierarchy(hierarchy="local_then_global"),
        ),
        "ours 2d g=2": ("ours", hierarchy(hierarchy="2d")),
        "socket 1 pack": ("ours", socket(bucket_mb=0)),
        "socket 4MB": ("ours", socket(bucket_mb=4)),
        "socket bf16": ("ours", socket(compression="bf16")),
        "socket fp16": ("ours", socket(compression="fp16")),
    }


# --------------------------------------------------------------------------- socket
def _socket_pair(strategy, rank, size):
    """Connects rank r to r+1 (send) and r-1 (receive); ports agreed by all-reduce."""
    import socket

    import tensorflow as tf

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    ports = tf.one_hot(rank, size, dtype=tf.float32) * server.getsockname()[1]
    ports = strategy.reduce("SUM", strategy.run(lambda: tf.identity(ports)), None)
    right = int(ports.numpy()[(rank + 1) % size])
    out = socket.create_connection(("127.0.0.1", right))
    inbound, _ = server.accept()
    for s in (out, inbound):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return out, inbound


def _socket_exchange(out, inbound, send, receive):
    """Sends `send` out while receiving `receive` in, concurrently."""

    def reader():
        view, got = memoryview(receive), 0
        while got < len(view):
            got += inbound.recv_into(view[got:])

    thread = threading.Thread(target=reader)
    thread.start()
    out.sendall(send)
    thread.join()


# --------------------------------------------------------------------------- worker
def worker(args) -> None:
    import numpy as np
    import tensorflow as tf

    import keras_replicator as kr
    from keras_replicator.communication import _all_reduce

    strategy = kr.MultiWorkerReplicator(collective_timeout=300)
    if strategy.all_reduce_options.transport != "socket":
        raise SystemExit("the default transport here should be the socket ring")
    rank = int(os.environ["KERAS_REPLICATOR_WORKER_INDEX"])
    size = strategy.num_replicas_in_sync
    shapes = resnet50_shapes()
    with strategy.scope():
        grads = [
            tf.Variable(tf.random.normal(s, seed=i), trainable=False)
            for i, s in enumerate(shapes)
        ]
    total_bytes = 4 * sum(int(np.prod(s)) for s in shapes)

    def make(kind, setting):
        def replica_fn():
            values = [g.read_value() for g in grads]
            sum_op = tf.distribute.ReduceOp.SUM
            context = tf.distribute.get_replica_context()
            if kind == "per_tensor":
                out = [context.all_reduce(sum_op, v) for v in values]
            elif kind == "stock":
                options = tf.distribute.experimental.CommunicationOptions(
                    bytes_per_pack=int(setting * MB)
                )
                out = context.all_reduce(sum_op, values, options=options)
            else:
                out, _ = _all_reduce.all_reduce_sum(values, options=setting)
            return tf.add_n([tf.reshape(o, [-1])[0] for o in out])

        return tf.function(lambda: strategy.run(replica_fn))

    functions = {
        name: make(*c)
        for name, c in configurations().items()
        if args.only is None or re.search(args.only, name)
    }
    for f in functions.values():
        f()  # trace + warm up
    out, inbound = _socket_pair(strategy, rank, size)
    ring_bytes = int(total_bytes * 2 * (size - 1) / size)
    send = np.ones(ring_bytes, np.uint8)
    receive = np.empty(ring_bytes, np.uint8)
    _socket_exchange(out, inbound, send, receive)  # warm up
    times = {name: [] for name in ["raw socket", *functions]}
    token = tf.function(
        lambda: strategy.run(
            lambda: tf.distribute.get_replica_context().all_reduce("sum", 1.0)
        )
    )
    for _ in range(args.rounds):
        for name in times:
            token()  # line the workers up before each timing
            start = time.perf_counter()
            if name == "raw socket":
                _socket_exchange(out, inbound, send, receive)
            else:
                functions[name]()
            times[name].append(time.perf_counter() - start)
    if rank == 0:
        result = {
            "workers": size,
            "bytes": total_bytes,
            "tensors": len(shapes),
            "seconds": {k: statistics.median(v) for k, v in times.items()},
        }
        print("RESULT " + json.dumps(result), flush=True)


# --------------------------------------------------------------------------- fit
FIT_CONFIGS = {
    "one process, 2 threads": None,
    "2 processes, no communication": "independent",
    "2 one-worker strategies, no communication": "solo",
    "2 stock one-device MirroredStrategies, no communication": "mirrored",
    "ours default (socket ring, 16 MB)": {},
    "collective 1 pack (stock packing)": {"transport": "collective", "bucket_mb": 0},
    "collective 16MB": {"transport": "collective"},
    "collective bf16": {"transport": "collective", "compression": "bf16"},
    "socket 1MB": {"transport": "socket", "bucket_mb": 1},
    "socket bf16": {"transport": "socket", "compression": "bf16"},
}


TIMELINE_CONFIGS = {
    "socket 1MB": {"transport": "socket", "bucket_mb": 1},
    "socket 1 pack": {"transport": "socket", "bucket_mb": 0},
}


def _trace_ring_calls() -> list:
    """Records (start, end, bytes) of every socket-ring call in this process."""
    from keras_replicator.communication import _socket_ring

    calls = []
    original = _socket_ring.SocketRing.all_reduce

    def traced(self, *arrays):
        start = time.perf_counter()
        out = original(self, *arrays)
        calls.append((start, time.perf_counter(), sum(a.nbytes for a in arrays)))
        return out

    _socket_ring.SocketRing.all_reduce = traced
    return calls


RESNET20_CONFIGS = (
    "one process, 2 threads",
    "2 processes, no communication",
    "2 one-worker strategies, no communication",
    "ours default (socket ring, 16 MB)",
    "collective 1 pack (stock packing)",
    "collective 16MB",
)


def resnet20(keras):
    """He et al.'s CIFAR ResNet-20: 3 stages of 3 basic blocks, 16/32/64 filters."""
    inputs = keras.Input((32, 32, 3))

    def conv_bn(x, filters, strides=1, relu=True):
        x = keras.layers.Conv2D(filters, 3, strides, padding="same", use_bias=False)(x)
        x = keras.layers.BatchNormalization()(x)
        return keras.layers.ReLU()(x) if relu else x

    x = conv_bn(inputs, 16)
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(3):
            strides = 2 if stage and not block else 1
            shortcut = x
            y = conv_bn(x, filters, strides)
            y = conv_bn(y, filters, relu=False)
            if strides != 1:
                shortcut = keras.layers.Conv2D(filters, 1, strides, use_bias=False)(x)
            x = keras.layers.ReLU()(keras.layers.Add()([shortcut, y]))
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(10)(x))


def fit_worker(
    config: str,
    trace: bool = False,
    inter_op: int | None = None,
    model_name: str = "mlp",
) -> None:
    calls = _trace_ring_calls() if trace else None
    setting = {**FIT_CONFIGS, **TIMELINE_CONFIGS}[config]
    independent = setting in ("independent", "solo", "mirrored")
    if setting == "solo":  # this worker alone: a cluster of one, no peers
        task = json.loads(os.environ["TF_CONFIG"])
        address = task["cluster"]["worker"][task["task"]["index"]]
        os.environ["TF_CONFIG"] = json.dumps(
            {"cluster": {"worker": [address]}, "task": {"type": "worker", "index": 0}}
        )
    import tensorflow as tf

    threads = 2 if setting is None else 1
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(inter_op or threads)
    import keras
    import numpy as np

    import keras_replicator as kr

    if setting is None or setting == "independent":
        strategy = tf.distribute.get_strategy()
    elif setting == "solo":
        strategy = kr.MultiWorkerReplicator()
    elif setting == "mirrored":
        strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    else:
        strategy = kr.MultiWorkerReplicator(all_reduce=kr.AllReduceOptions(**setting))
    # The dataset's batch is the global batch (tf.distribute splits it). Two
    # independent processes each train on half of it, with no communication: the
    # ceiling of any data-parallel transport on these cores; as one-worker
    # strategies, the ceiling of any transport under tf.distribute.
    steps = 40 if model_name == "mlp" else 22
    global_batch = 128 if independent else 256
    shape = (784,) if model_name == "mlp" else (32, 32, 3)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(global_batch * steps, *shape)).astype("float32")
    y = rng.integers(0, 10, len(x))
    with strategy.scope():
        if model_name == "mlp":
            model = keras.Sequential(
                [
                    keras.Input((784,)),
                    keras.layers.Dense(2048, activation="relu"),
                    keras.layers.Dense(2048, activation="relu"),
                    keras.layers.Dense(256, activation="relu"),
                    keras.layers.Dense(10),
                ]
            )
        else:
            model = resnet20(keras)
        model.compile(
            keras.optimizers.SGD(0.01),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    stamps = []

    class Stamp(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            stamps.append(time.perf_counter())

    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    if isinstance(setting, dict):
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.OFF
        )
        data = data.with_options(options)
    start = time.perf_counter()
    model.fit(data, epochs=1, verbose=0, callbacks=[Stamp()])
    steady = [b - a for a, b in zip(stamps[10:], stamps[11:])]
    if int(os.environ.get("KERAS_REPLICATOR_WORKER_INDEX", "0")) == 0:
        result = {
            "first_step": stamps[0] - start,
            "step": statistics.median(steady),
            "params": model.count_params(),
        }
        if calls is not None:
            result["stamps"], result["calls"] = stamps, calls
        print("RESULT " + json.dumps(result), flush=True)


def fit_benchmark(rounds: int, model_name: str = "mlp") -> None:
    import subprocess

    from keras_replicator.launch import run_workers

    names = list(FIT_CONFIGS) if model_name == "mlp" else list(RESNET20_CONFIGS)
    samples = {name: [] for name in names}
    first = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            setting = FIT_CONFIGS[name]
            command = [sys.executable, __file__, "--fit-worker", name]
            command += ["--fit-model", model_name]
            if setting is None:  # "independent" runs 2 processes, as the workers
                done = subprocess.run(
                    command, capture_output=True, text=True, timeout=600
                )
                output = done.stdout
            else:
                output = (
                    run_workers(command, 2, timeout=600, echo=False).workers[0].output
                )
            lines = [ln for ln in output.splitlines() if ln.startswith("RESULT ")]
            if not lines:
                raise SystemExit(f"fit run {name!r} failed:\n{output[-3000:]}")
            result = json.loads(lines[-1][len("RESULT ") :])
            samples[name].append(256 / result["step"])
            first[name].append(result["first_step"])
    base = statistics.median(samples["one process, 2 threads"])
    title = {
        "mlp": "MLP 6.3M parameters (25 MB gradients)",
        "resnet20": "ResNet-20 on 32x32x3, 0.27M parameters (1.1 MB gradients)",
    }[model_name]
    print(f"\nfit, {title}, global batch 256, steady state")
    print(
        f"{'configuration':<24} {'examples/s':>11} {'/ 1 process':>12} "
        f"{'1st step s':>11}"
    )
    for name in names:
        speed = statistics.median(samples[name])
        print(
            f"{name:<24} {speed:>11,.0f} {speed / base:>12.2f} "
            f"{statistics.median(first[name]):>11.1f}"
        )


def timeline(png: str) -> None:
    """When do the gradient buckets travel, relative to the training step?

    Runs the MLP's `fit` on 2 workers with the socket ring twice: 1 MB buckets
    (each layer's gradients travel on their own) and one pack (one call, which can
    only start once the whole backward pass is done). Ring calls are chained in
    program order and otherwise wait only for their bucket's gradients, so a call
    that starts before the one-pack call's start travelled while the backward pass
    was still computing earlier layers' gradients: that is the overlap.
    """
    from keras_replicator.launch import run_workers

    steps = {}
    runs = [(name, inter) for inter in (1, 2) for name in TIMELINE_CONFIGS]
    for name, inter in runs:
        command = [sys.executable, __file__, "--fit-worker", name, "--trace"]
        command += ["--inter-op", str(inter)]
        name = f"{name}, {inter} inter-op thread{'s' if inter > 1 else ''}"
        output = run_workers(command, 2, timeout=600, echo=False).workers[0].output
        lines = [ln for ln in output.splitlines() if ln.startswith("RESULT ")]
        if not lines:
            raise SystemExit(f"timeline run {name!r} failed:\n{output[-3000:]}")
        result = json.loads(lines[-1][len("RESULT ") :])
        stamps, calls = result["stamps"], result["calls"]
        rows = []
        for step in range(10, len(stamps) - 1):  # steady steps: (start, end]
            begin, end = stamps[step], stamps[step + 1]
            inside = [(a - begin, b - begin, n) for a, b, n in calls if begin < a < end]
            rows.append({"step": end - begin, "calls": inside})
        steps[name] = rows
    print("\nfit timeline, socket ring, 2 workers (ms from the previous batch end;")
    print("median over steady steps; a call is one bucket)")
    summary = {}
    for name, rows in steps.items():
        count = statistics.mode(len(r["calls"]) for r in rows)
        rows = [r for r in rows if len(r["calls"]) == count]
        starts = [
            statistics.median(r["calls"][k][0] for r in rows) for k in range(count)
        ]
        ends = [statistics.median(r["calls"][k][1] for r in rows) for k in range(count)]
        sizes = [rows[0]["calls"][k][2] / MB for k in range(count)]
        step = statistics.median(r["step"] for r in rows)
        summary[name] = (step, starts, ends, sizes)
        print(f"{name}: step {step * 1e3:.0f} ms, {count} ring calls")
        for k in range(count):
            print(
                f"  call {k + 1}: {sizes[k]:6.2f} MB  {starts[k] * 1e3:6.1f} -> "
                f"{ends[k] * 1e3:6.1f} ms"
            )
    for inter in ("1 inter-op thread", "2 inter-op threads"):
        starts, ends = summary[f"socket 1MB, {inter}"][1:3]
        gaps = [s - e for s, e in zip(starts[1:], ends)]
        # A call that starts well after the previous one ended was waiting for its
        # gradients: every call before the last such wait travelled while the
        # backward pass was still computing.
        waits = [k for k, g in enumerate(gaps) if g > 0.002]
        overlapped = (
            sum(ends[k] - starts[k] for k in range(waits[-1] + 1)) if waits else 0.0
        )
        print(
            f"{inter}, 1 MB buckets: gaps between calls "
            f"{', '.join(f'{g * 1e3:.1f}' for g in gaps)} ms; "
            f"{overlapped * 1e3:.1f} ms of ring time before the last wait for "
            "gradients (travelled during the backward pass)"
        )
    _plot_timeline(summary, png)


def _plot_timeline(summary, png):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 3.6), layout="constrained")
    for y, (step, starts, ends, _) in enumerate(summary.values()):
        ax.broken_barh(
            [(s * 1e3, (e - s) * 1e3) for s, e in zip(starts, ends)],
            (y - 0.3, 0.6),
            facecolors=["C0", "C1"] * len(starts),
        )
        ax.plot([step * 1e3] * 2, [y - 0.4, y + 0.4], "k--")
    ax.set_yticks(range(len(summary)), list(summary))
    ax.set_xlabel("ms from the previous batch end (dashed: the step's end)")
    ax.set_title("socket-ring calls inside a steady fit step, MLP, 2 workers")
    fig.savefig(png, dpi=100)


# --------------------------------------------------------------------------- devices
def devices_worker(num_devices: int, rounds: int) -> None:
    """One process, `num_devices` logical CPUs: flat vs hierarchical all-reduce."""
    import numpy as np
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices
    )
    import keras_replicator as kr
    from keras_replicator.communication import _all_reduce

    strategy = kr.MultiDeviceReplicator(num_replicas=num_devices)
    shapes = resnet50_shapes()
    with strategy.scope():
        grads = [
            tf.Variable(tf.random.normal(s, seed=i), trainable=False)
            for i, s in enumerate(shapes)
        ]
    total_bytes = 4 * sum(int(np.prod(s)) for s in shapes)
    half = num_devices // 2
    configs = {
        "memcpy (concat)": None,
        "ours default (flat)": kr.AllReduceOptions(),
        f"local_then_global g={half}": kr.AllReduceOptions(
            hierarchy="local_then_global", group_size=half
        ),
        f"2d g={half}": kr.AllReduceOptions(hierarchy="2d", group_size=half),
    }

    def make(options):
        def replica_fn():
            values = [g.read_value() for g in grads]
            if options is None:  # every replica copies its bytes once
                return tf.concat([tf.reshape(v, [-1]) for v in values], 0)[0]
            out, _ = _all_reduce.all_reduce_sum(values, options=options)
            return tf.add_n([tf.reshape(o, [-1])[0] for o in out])

        return tf.function(lambda: strategy.run(replica_fn))

    functions = {name: make(o) for name, o in configs.items()}
    for f in functions.values():
        f()
    times = {name: [] for name in functions}
    for _ in range(rounds):
        for name, f in functions.items():
            start = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - start)
    print(
        f"\n{num_devices} logical CPU devices, one process, {total_bytes / MB:.0f} MB"
    )
    base = statistics.median(times["ours default (flat)"])
    print(f"{'method':<28} {'ms':>8} {'/ flat':>8}")
    for name, t in times.items():
        m = statistics.median(t)
        print(f"{name:<28} {m * 1e3:>8.1f} {m / base:>8.2f}")


# --------------------------------------------------------------------------- parent
def report(result):
    n, total = result["workers"], result["bytes"]
    seconds = result["seconds"]
    socket_rate = total / seconds["raw socket"]
    print(
        f"\n{n} workers on 127.0.0.1, {result['tensors']} tensors, "
        f"{total / MB:.0f} MB float32 (median of rounds)"
    )
    print(f"{'method':<28} {'ms':>8} {'eff GB/s':>9} {'bus GB/s':>9} {'/ socket':>9}")
    rows = []
    for name, s in seconds.items():
        eff = total / s
        bus = eff * 2 * (n - 1) / n
        rows.append((name, s, eff / socket_rate))
        print(
            f"{name:<28} {s * 1e3:>8.1f} {eff / 1e9:>9.2f} {bus / 1e9:>9.2f} "
            f"{eff / socket_rate:>8.0%}"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, nargs="+", default=[2])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--png", default="benchmarks/allreduce.png")
    parser.add_argument("--only", default=None, help="regex of method names")
    parser.add_argument("--fit", action="store_true")
    parser.add_argument("--fit-rounds", type=int, default=2)
    parser.add_argument("--fit-only", action="store_true", help="skip the all-reduce")
    parser.add_argument(
        "--fit-model", choices=["mlp", "resnet20", "both"], default="mlp"
    )
    parser.add_argument(
        "--devices", type=int, default=0, help="only: N logical CPUs, one process"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fit-worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--inter-op", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--timeline",
        default=None,
        metavar="PNG",
        help="only: when the fit step's buckets travel (1 MB vs one pack), + PNG",
    )
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.fit_worker is not None:
        fit_worker(
            args.fit_worker,
            trace=args.trace,
            inter_op=args.inter_op,
            model_name=args.fit_model,
        )
        return
    if args.timeline:
        timeline(args.timeline)
        return
    if args.devices:
        devices_worker(args.devices, args.rounds)
        return

    from keras_replicator.launch import run_workers

    tables = {}
    for n in [] if args.fit_only else args.workers:
        command = [sys.executable, __file__, "--worker", "--rounds", str(args.rounds)]
        if args.only:
            command += ["--only", args.only]
        result = run_workers(command, n, timeout=900, echo=False)
        lines = [
            line
            for line in result.workers[0].output.splitlines()
            if line.startswith("RESULT ")
        ]
        if not result.ok or not lines:
            for w in result.workers:
                print(w.output[-3000:])
            raise SystemExit(f"{n}-worker run failed")
        tables[n] = report(json.loads(lines[-1][len("RESULT ") :]))
    if args.png and tables:
        _plot(tables, args.png)
    if args.fit or args.fit_only:
        models = ["mlp", "resnet20"] if args.fit_model == "both" else [args.fit_model]
        for model_name in models:
            fit_benchmark(args.fit_rounds, model_name)


def _plot(tables, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, len(tables), figsize=(6 * len(tables), 4), squeeze=False
    )
    for ax, (n, rows) in zip(axes[0], tables.items()):
        names = [r[0] for r in rows]
        ax.barh(names, [100 * r[2] for r in rows])
        ax.axvline(50, color="k", ls="--", lw=1)
        ax.set_xlabel("effective rate, % of raw socket exchange")
        ax.set_title(f"ResNet-50 gradients, {n} workers on 127.0.0.1")
        ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
