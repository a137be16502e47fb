"""One measurement of the GPipe benchmark, in its own process (`--worker CONFIG`).

Builds the model a config names (plain or as `kr.pipeline.GPipe` on 2 logical
CPUs), trains a few steps and returns samples/s and the peak memory of those steps:
from TF's BFC allocator statistics when it is on, else the process's peak RSS.
Thread counts are set before anything else runs, which is why every measurement
is a fresh process.
"""

from __future__ import annotations

import os
import pathlib
import time


def build(kind: str, depth: int | None = None, width: int = 512):
    import keras

    keras.utils.set_random_seed(0)
    if kind in ("mlp", "deep_mlp"):
        depth = depth or (16 if kind == "mlp" else 24)
        layers = [keras.Input((width,))]
        layers += [keras.layers.Dense(width, activation="relu") for _ in range(depth)]
        layers += [keras.layers.Dense(10)]
        return keras.Sequential(layers), (width,), 10
    if kind == "resnet":
        layers = [keras.Input((32, 32, 3)), keras.layers.Conv2D(32, 3, padding="same")]
        layers += [ResidualBlock(32) for _ in range(8)]
        layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)]
        return keras.Sequential(layers), (32, 32, 3), 10
    raise ValueError(kind)


def _residual_block_class():
    import keras

    class ResidualBlock(keras.layers.Layer):
        def __init__(self, filters, **kwargs):
            super().__init__(**kwargs)
            self.conv1 = keras.layers.Conv2D(filters, 3, padding="same")
            self.bn1 = keras.layers.BatchNormalization()
            self.conv2 = keras.layers.Conv2D(filters, 3, padding="same")
            self.bn2 = keras.layers.BatchNormalization()

        def call(self, x, training=None):
            h = keras.activations.relu(self.bn1(self.conv1(x), training=training))
            h = self.bn2(self.conv2(h), training=training)
            return keras.activations.relu(x + h)

    return ResidualBlock


def worker(config: dict) -> dict:
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(config["intra"])
    tf.config.threading.set_inter_op_parallelism_threads(2)
    import keras_replicator as kr

    kr.split_cpu(2)
    import keras
    import numpy as np

    global ResidualBlock
    ResidualBlock = _residual_block_class()
    model, shape, classes = build(
        config["model"], config.get("depth"), config.get("width", 512)
    )
    if config["pipeline"]:
        n = len(model.layers)
        model = kr.pipeline.GPipe(
            model,
            balance=[n // 2, n - n // 2],
            num_microbatches=config["M"],
            checkpoint=config["checkpoint"],
        )
    model.compile(
        optimizer=keras.optimizers.SGD(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    batch = config["batch"]
    rng = np.random.default_rng(0)
    x = tf.constant(rng.random((batch, *shape)).astype("float32"))
    y = tf.constant(rng.integers(0, classes, batch))
    try:
        for _ in range(2):
            model.train_on_batch(x, y)
    except tf.errors.ResourceExhaustedError:
        return {**config, "trains": False}
    pathlib.Path("/proc/self/clear_refs").write_text("5")  # resets the peak RSS
    before = _status("VmRSS")
    allocator = _allocator_tracks_memory(tf)
    if allocator:
        tf.config.experimental.reset_memory_stats("CPU:0")
        held = tf.config.experimental.get_memory_info("CPU:0")["current"]
    start = time.perf_counter()
    for _ in range(config["steps"]):
        model.train_on_batch(x, y)
    seconds = time.perf_counter() - start
    result = {
        **config,
        "trains": True,
        "samples_per_second": batch * config["steps"] / seconds,
        "rss_mb": (_status("VmHWM") - before) / 1024,
    }
    if allocator:
        peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
        result["allocator_mb"] = (peak - held) / 2**20
    return result


def _allocator_tracks_memory(tf) -> bool:
    """True when TF's CPU allocator is the BFC allocator, which keeps statistics.

    Both logical CPU devices allocate from the one process-wide CPU allocator, so
    `CPU:0`'s statistics cover both stages; checked here by allocating on `/cpu:1`.
    """
    if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC") != "true":
        return False
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    with tf.device("/cpu:1"):
        probe = tf.zeros((1024, 256))
    after = tf.config.experimental.get_memory_info("CPU:0")["current"]
    if after - before < probe.shape[0] * probe.shape[1] * 4:
        raise RuntimeError("CPU:0's allocator statistics do not cover /cpu:1")
    return True


def _status(field: str) -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)
