"""Named strategy factories: a name, how many workers, and a builder called late.

Nothing is built at import time (building a strategy fixes TensorFlow's devices), so
the registry can be listed, filtered and shipped to worker processes by name.
"""

from __future__ import annotations

import dataclasses
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
    """

    name: str
    build: Callable[[], object]
    num_workers: int = 1
    logical_cpus: int = 4
    stock: bool = False


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


FACTORIES: dict[str, StrategyFactory] = {
    f.name: f
    for f in [
        StrategyFactory("stock-mirrored-2", _mirrored(2), stock=True),
        StrategyFactory("stock-mirrored-4", _mirrored(4), stock=True),
        StrategyFactory(
            "stock-multi-worker-2", _stock_multi_worker, 2, logical_cpus=1, stock=True
        ),
        StrategyFactory("multi-device-2", _multi_device(2)),
        StrategyFactory("multi-device-4", _multi_device(4)),
        StrategyFactory("multi-worker-2", _multi_worker, 2, logical_cpus=1),
        StrategyFactory(
            "multi-worker-2-socket",
            _multi_worker_transport("socket"),
            2,
            logical_cpus=1,
        ),
        StrategyFactory(
            "multi-worker-2-collective",
            _multi_worker_transport("collective"),
            2,
            logical_cpus=1,
        ),
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
