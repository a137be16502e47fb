"""The library's state lives in one typed object per strategy, not on framework objects.

Issue 35: nine `_kr_*` attributes used to be stamped on strategies and optimizers
with `setattr` and read back with `getattr` from six packages.
"""

import ast
import pathlib

import keras
import numpy as np
import tensorflow as tf

import keras_replicator as kr
from keras_replicator import _compat
from keras_replicator._replicator_state import ReplicatorState, replicator_state
from keras_replicator.communication._collective_transport import CollectiveTransport

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "keras_replicator"


def _stamped(obj) -> list[str]:
    return sorted(name for name in vars(obj) if name.startswith("_kr_"))


def test_training_stamps_no_attribute_on_the_strategy_or_the_optimizer():
    strategy = kr.MultiDeviceReplicator(num_replicas=2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        optimizer = kr.wrap_optimizer(keras.optimizers.SGD(0.1))
        model.compile(optimizer, "mse")
    model.fit(np.ones((8, 3)), np.ones(8), batch_size=4, verbose=0)
    dataset = strategy.distribute_input(
        lambda context: tf.data.Dataset.from_tensors(tf.ones([2, 3])).repeat()
    )
    strategy.run_steps(lambda batch: tf.reduce_sum(batch), iter(dataset))

    assert _stamped(strategy) == []
    assert _stamped(optimizer) == []
    state = replicator_state(strategy)
    assert isinstance(state, ReplicatorState)
    # The communication state is the one transport object, apart from the run state.
    assert isinstance(state.transport, CollectiveTransport)
    assert state.transport.options == strategy.all_reduce_options
    assert state.transport.options.transport == "collective"
    assert not state.is_multi_worker and not state.is_parameter_server
    assert len(state.step_functions) == 1


def test_stock_strategies_have_no_state():
    stock = tf.distribute.get_strategy()
    assert replicator_state(stock) is None
    assert not _compat.is_replicator(stock)
    assert _compat.is_replicator(kr.MultiDeviceReplicator(num_replicas=1))


def test_sharding_imports_nothing_from_keras_integration():
    """The reduction rule lives below both (`communication/_reduction.py`)."""
    found = []
    for path in sorted((PACKAGE / "sharding").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and "keras_integration" in (
                node.module or ""
            ):
                found.append(f"{path.name}: {node.module}")
    assert found == []


def test_the_state_does_not_keep_its_strategy_alive():
    # A cached `run_steps` loop refers to its strategy (its input signature names
    # it): held in a global weak registry, it kept the strategy alive for good.
    import gc
    import weakref

    strategy = kr.MultiDeviceReplicator(num_replicas=2)
    dataset = strategy.distribute_input(
        lambda context: tf.data.Dataset.from_tensors(tf.ones([2, 3])).repeat()
    )
    strategy.run_steps(lambda batch: tf.reduce_sum(batch), iter(dataset))
    assert replicator_state(strategy).step_functions
    gone = weakref.ref(strategy)
    del strategy, dataset
    gc.collect()
    assert gone() is None
