"""One measurement of the spatial benchmark, in its own process (`--worker CONFIG`).

Trains `kr.models.small_resnet` on large random images for a few steps, whole
(one replica, `parts=1`) or split along the height over `parts` replicas with
`kr.spatial.partition`, and returns the steady step time and the peak memory of
the steps above what is held before each (weights, optimizer state, the dataset).

Memory comes from TF's BFC CPU allocator (`TF_CPU_ALLOCATOR_USE_BFC=true`), the
only CPU allocator that keeps statistics. Every logical CPU of a process
allocates from that one allocator, so with `parts` logical CPUs in one process the
peak covers all the group's replicas at once; as worker processes (one replica
each) the peak is one replica's. A fresh process per measurement, because the
peak and the logical CPU split are per process and fixed at start-up.
"""

from __future__ import annotations

import json
import os
import statistics
import time


def worker(config: dict) -> dict:
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf

    if config.get("intra"):
        tf.config.threading.set_intra_op_parallelism_threads(config["intra"])
    import keras
    import numpy as np

    import keras_replicator as kr

    parts, processes = config["parts"], config["processes"]
    if processes > 1 or config.get("multi_worker"):
        strategy = kr.MultiWorkerReplicator(collective_timeout=120)
    else:
        kr.split_cpu(parts)
        strategy = kr.MultiDeviceReplicator(num_replicas=parts)
    if strategy.num_replicas_in_sync != parts:
        raise RuntimeError(f"{strategy.num_replicas_in_sync} replicas for {config}")
    allocator = _allocator_tracks_memory(tf, parts if processes == 1 else 1)

    keras.utils.set_random_seed(0)
    size, batch = config["size"], config["batch"]
    with strategy.scope():
        model = kr.models.small_resnet((size, size, 3), 10, bn_group_size=1)
        model.compile(
            keras.optimizers.SGD(0.01),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    if parts > 1 or config.get("partitioned"):
        model = kr.spatial.partition(model, parts, strategy=strategy)
    steps = config["warmup"] + config["steps"]
    rng = np.random.default_rng(0)
    x = rng.random((steps * batch, size, size, 3), dtype="float32")
    y = rng.integers(0, 10, len(x))

    record = _record_class()(tf, allocator)  # a Keras class: made after import
    model.fit(x, y, batch_size=batch, shuffle=False, verbose=0, callbacks=[record])
    steady = slice(config["warmup"], None)
    result = {
        **config,
        "step_seconds": statistics.median(record.seconds[steady]),
        "step_seconds_all": record.seconds,
        "losses": record.losses,
        "worker": int(os.environ.get("KERAS_REPLICATOR_WORKER_INDEX", "0")),
    }
    if allocator:
        peaks = record.peaks[steady]
        result["peak_mb"] = max(peaks) / 2**20
        result["peak_mb_all"] = [p / 2**20 for p in record.peaks]
        result["held_mb"] = record.held / 2**20
    return result


def _record_class():
    import keras

    class Record(keras.callbacks.Callback):
        """Per step: seconds, and the allocator's peak above the bytes held before."""

        def __init__(self, tf, allocator):
            super().__init__()
            self.tf, self.allocator = tf, allocator
            self.seconds, self.peaks, self.losses, self.held = [], [], [], 0

        def on_train_batch_begin(self, batch, logs=None):
            if self.allocator:
                self.tf.config.experimental.reset_memory_stats("CPU:0")
                info = self.tf.config.experimental.get_memory_info("CPU:0")
                self.held = info["current"]
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            loss = float(logs["loss"])  # waits for the step to finish
            self.seconds.append(time.perf_counter() - self.start)
            self.losses.append(loss)
            if self.allocator:
                peak = self.tf.config.experimental.get_memory_info("CPU:0")["peak"]
                self.peaks.append(peak - self.held)

    return Record


def _allocator_tracks_memory(tf, devices: int) -> bool:
    """True when TF's CPU allocator is the BFC allocator, which keeps statistics.

    With several logical CPUs, checks that `CPU:0`'s statistics also count an
    allocation on the last one (one process-wide allocator).
    """
    if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC") != "true":
        return False
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    with tf.device(f"/cpu:{devices - 1}"):
        probe = tf.zeros((1024, 256))
    after = tf.config.experimental.get_memory_info("CPU:0")["current"]
    if after - before < probe.shape[0] * probe.shape[1] * 4:
        raise RuntimeError(f"CPU:0's allocator statistics miss /cpu:{devices - 1}")
    return True


if __name__ == "__main__":
    import sys

    from benchmarks import harness

    harness.emit_result(worker(json.loads(sys.argv[1])))
