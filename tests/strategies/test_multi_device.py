import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_replicator as kr
from keras_replicator.testing import _workloads


def test_num_replicas_picks_logical_cpus():
    strategy = kr.MultiDeviceReplicator(num_replicas=2)
    assert strategy.num_replicas_in_sync == 2
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    assert "MultiDeviceReplicator(num_replicas=2" in repr(strategy)


def test_accepts_the_parents_device_list():
    strategy = kr.MultiDeviceReplicator(["/cpu:0", "/cpu:2"])
    assert strategy.num_replicas_in_sync == 2


@pytest.mark.parametrize("bad", [0, -1])
def test_non_positive_num_replicas_is_a_value_error(bad):
    with pytest.raises(ValueError, match=f"Received: num_replicas={bad}"):
        kr.MultiDeviceReplicator(num_replicas=bad)


def test_non_integer_num_replicas_is_a_type_error():
    with pytest.raises(TypeError, match="Received: num_replicas='2'"):
        kr.MultiDeviceReplicator(num_replicas="2")


def test_num_replicas_that_cannot_be_made_after_tf_started():
    with pytest.raises(ValueError, match="cannot be made") as error:
        kr.MultiDeviceReplicator(num_replicas=8)
    assert "num_replicas<=4" in str(error.value)


def test_devices_and_num_replicas_must_agree():
    with pytest.raises(ValueError, match="must match the number of `devices`"):
        kr.MultiDeviceReplicator(["/cpu:0"], num_replicas=2)


def _all_reduce_sum(strategy):
    @tf.function
    def step():
        def replica_fn():
            context = tf.distribute.get_replica_context()
            return context.all_reduce("sum", tf.constant(1.0))

        return strategy.experimental_local_results(strategy.run(replica_fn))[0]

    return float(step())


def test_two_strategies_with_different_device_sets_in_one_process():
    # Stock MirroredStrategy instances share collective group keys and abort here.
    two = kr.MultiDeviceReplicator(num_replicas=2)
    four = kr.MultiDeviceReplicator(num_replicas=4)
    assert _all_reduce_sum(two) == 2.0
    assert _all_reduce_sum(four) == 4.0
    assert _all_reduce_sum(two) == 2.0


def test_model_built_outside_the_scope_is_a_clear_error():
    model = _workloads.mlp()
    x, y = _workloads.classification_data(64)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)  # built on one device
    with kr.MultiDeviceReplicator(num_replicas=2).scope():
        with pytest.raises(ValueError, match="created outside the scope"):
            model.fit(x, y, batch_size=32, epochs=1, verbose=0)


def test_global_batch_smaller_than_replica_count_is_a_clear_error():
    strategy = kr.MultiDeviceReplicator(num_replicas=4)
    with strategy.scope():
        model = _workloads.mlp()
    x, y = _workloads.classification_data(32)
    with pytest.raises(ValueError, match="at least one sample per replica") as error:
        model.fit(x, y, batch_size=2, epochs=1, verbose=0)
    assert "batch size of at least 4" in str(error.value)


def test_uneven_batches_match_one_device_where_stock_drifts():
    x, y = _workloads.classification_data(1001)

    def train(strategy):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = _workloads.mlp()
        model.set_weights(initial)
        model.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0)
        return model.get_weights()

    keras.utils.set_random_seed(0)
    initial = _workloads.mlp().get_weights()
    reference = train(tf.distribute.get_strategy())
    ours = train(kr.MultiDeviceReplicator(num_replicas=4))
    worst = max(float(np.max(np.abs(a - b))) for a, b in zip(reference, ours))
    assert worst < 1e-5
