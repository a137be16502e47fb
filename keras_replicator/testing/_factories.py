"""Named strategy factories: a name, how many workers, and a builder called late.

Nothing is built at import time (building a strategy fixes TensorFlow's devices), so
the registry can be listed, filtered and shipped to worker processes by name.

Each factory says which devices it means, so a name means the same on every
machine: the CPU factories hide any GPU (`multi-device-2` is 2 logical CPUs on a
GPU machine too), and the GPU factories need GPUs. On a machine with fewer GPUs
than a factory needs, its rows say "not available" and why; they are never run on
the CPU instead nor counted as passed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class StrategyFactory:
    """How to build one strategy under test.

    Attributes:
        name: Short unique name, e.g. `"multi-device-4"`.
        build: Zero-argument callable returning the strategy (called in the
            process, or in every worker process, that runs the checks).
        num_workers: Worker processes the strategy spans. 1 for local strategies.
        logical_cpus: Logical CPU devices each process needs before TF starts.
        stock: Whether this is an unmodified TensorFlow strategy (for comparison).
        gpus: GPUs the machine must have for this factory (all its workers
            together; each worker gets its share of them). `0` hides the GPUs so
            that the strategy runs on the CPU on every machine. `None` leaves the
            devices as TensorFlow finds them. Defaults to `None`.
        layouts: Whether the strategy lays weights out over a mesh, so that
            the layout checks (`LAYOUT_CHECK_NAMES`) run on it by default too.
            Defaults to `False`.
    """

    name: str
    build: Callable[[], object]
    num_workers: int = 1
    logical_cpus: int = 4
    stock: bool = False
    gpus: int | None = None
    layouts: bool = False


def _mirrored(count):
    def build():
        import tensorflow as tf

        return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(count)])

    return build


def _multi_device(count):
    def build():
        import keras_replicator as kr

        return kr.MultiDeviceReplicator(num_replicas=count)

    return build


def _split_gpu(count):
    def build():
        import tensorflow as tf

        import keras_replicator as kr

        # The first GPU alone, so `num_replicas` splits it (a 1-GPU machine's case).
        tf.config.set_visible_devices(tf.config.get_visible_devices("GPU")[:1], "GPU")
        return kr.MultiDeviceReplicator(num_replicas=count)

    return build


def _every_gpu():
    import keras_replicator as kr

    return kr.MultiDeviceReplicator()


def _stock_multi_worker():
    import tensorflow as tf

    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=60)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def _multi_worker():
    import keras_replicator as kr

    return kr.MultiWorkerReplicator()


def _multi_worker_transport(transport):
    def build():
        import keras_replicator as kr

        options = kr.AllReduceOptions(transport=transport)
        return kr.MultiWorkerReplicator(all_reduce=options)

    return build


def _model_parallel(shape, fully_shard=False):
    def build():
        import keras

        import keras_replicator as kr

        axes = ["batch", "model"][: len(shape)]
        devices = kr.devices(math.prod(shape))
        mesh = keras.distribution.DeviceMesh(shape, axes, devices)
        layout_map = keras.distribution.LayoutMap(mesh)
        if "model" in axes:
            # Every Dense kernel of the workloads split by its input rows.
            layout_map[r".*dense(_\d+)?/kernel"] = ("model", None)
        return kr.ModelParallelReplicator(layout_map, fully_shard=fully_shard)

    return build


# gpus=0: CPU factories, the same strategy on every machine (GPUs hidden).
FACTORIES: dict[str, StrategyFactory] = {
    f.name: f
    for f in [
        StrategyFactory("stock-mirrored-2", _mirrored(2), stock=True, gpus=0),
        StrategyFactory("stock-mirrored-4", _mirrored(4), stock=True, gpus=0),
        StrategyFactory(
            "stock-multi-worker-2",
            _stock_multi_worker,
            2,
            logical_cpus=1,
            stock=True,
            gpus=0,
        ),
        StrategyFactory("multi-device-2", _multi_device(2), gpus=0),
        StrategyFactory("multi-device-4", _multi_device(4), gpus=0),
        StrategyFactory("multi-worker-2", _multi_worker, 2, logical_cpus=1, gpus=0),
        StrategyFactory(
            "multi-worker-2-socket",
            _multi_worker_transport("socket"),
            2,
            logical_cpus=1,
            gpus=0,
        ),
        StrategyFactory(
            "multi-worker-2-collective",
            _multi_worker_transport("collective"),
            2,
            logical_cpus=1,
            gpus=0,
        ),
        StrategyFactory(
            "model-parallel-2x2", _model_parallel((2, 2)), gpus=0, layouts=True
        ),
        StrategyFactory(
            "fully-sharded-2",
            _model_parallel((2,), fully_shard=True),
            gpus=0,
            layouts=True,
        ),
        # One 2x2 mesh over 2 worker processes of 2 logical CPUs each.
        StrategyFactory(
            "model-parallel-2x2-2-workers",
            _model_parallel((2, 2)),
            2,
            logical_cpus=2,
            gpus=0,
            layouts=True,
        ),
        # GPU factories: "not available" rows on a machine without enough GPUs.
        StrategyFactory("split-gpu-2", _split_gpu(2), gpus=1),
        StrategyFactory("multi-gpu", _every_gpu, gpus=2),
        StrategyFactory("multi-worker-gpu-2", _multi_worker, 2, logical_cpus=1, gpus=2),
    ]
}


def register_factory(factory: StrategyFactory) -> None:
    """Adds a user's strategy factory so `run_conformance` can check it by name."""
    if factory.name in FACTORIES:
        raise ValueError(
            f"`factory.name` must be unique; {factory.name!r} is taken. "
            f"Received: name={factory.name!r}. Pick another name."
        )
    FACTORIES[factory.name] = factory


def get_factory(name: str) -> StrategyFactory:
    try:
        return FACTORIES[name]
    except KeyError:
        raise ValueError(
            f"Unknown strategy factory. Received: name={name!r}. "
            f"Known: {sorted(FACTORIES)}."
        ) from None
