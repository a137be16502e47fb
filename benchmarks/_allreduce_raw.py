"""The all-reduce between worker processes: stock packings, our options, a raw socket.

One `--worker` process per worker times every configuration of `configurations()`
on the ResNet-50 gradient set, interleaved round by round, next to a raw loopback
socket exchange of the bytes a ring all-reduce moves (the transport's ceiling);
`report` prints the table and `plot` draws the bars, as % of that socket rate.
"""

from __future__ import annotations

import os
import re
import threading
import time

from benchmarks import harness
from benchmarks._allreduce_common import MB, resnet50_gradients


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
    grads, total_bytes = resnet50_gradients(strategy)

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
            "tensors": len(grads),
            "seconds": harness.medians(times),
        }
        harness.emit_result(result)


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


def plot(tables, path):
    size = (6 * len(tables), 4)
    with harness.figure(path, size=size, panels=len(tables)) as (_, axes):
        for ax, (n, rows) in zip(axes, tables.items()):
            names = [r[0] for r in rows]
            ax.barh(names, [100 * r[2] for r in rows])
            ax.axvline(50, color="k", ls="--", lw=1)
            ax.set_xlabel("effective rate, % of raw socket exchange")
            ax.set_title(f"ResNet-50 gradients, {n} workers on 127.0.0.1")
            ax.invert_yaxis()
    print(f"saved {path}")
