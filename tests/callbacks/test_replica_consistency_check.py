import pytest
import tensorflow as tf

import keras_replicator as kr
from keras_replicator.callbacks.replica_consistency_check import (
    ReplicaConsistencyCheck,
    ReplicaDivergenceError,
)
from keras_replicator.testing import _workloads as w


@pytest.fixture(scope="module")
def trained():
    strategy = kr.MultiDeviceReplicator(num_replicas=4)
    with strategy.scope():
        model = w.mlp()
    x, y = w.classification_data(512)
    model.fit(
        x,
        y,
        batch_size=64,
        epochs=1,
        verbose=0,
        callbacks=[ReplicaConsistencyCheck(every_n_steps=2)],
    )
    return strategy, model, x, y


def test_identical_replicas_pass(trained):
    _, model, _, _ = trained
    check = ReplicaConsistencyCheck()
    check.set_model(model)
    check.check()


def test_a_diverged_replica_is_named(trained):
    strategy, model, x, y = trained
    bias = model.layers[2].bias
    local = strategy.experimental_local_results(bias.value)
    original = local[3].numpy()
    local[3].assign(original + 1e-7)
    try:
        with pytest.raises(ReplicaDivergenceError) as error:
            model.fit(
                x,
                y,
                batch_size=64,
                epochs=1,
                verbose=0,
                callbacks=[ReplicaConsistencyCheck(every_n_steps=1)],
            )
        message = str(error.value)
        assert bias.path in message
        assert "replicas [[0, 1, 2], [3]]" in message
        assert model.layers[1].kernel.path not in message
    finally:
        for value in strategy.experimental_local_results(bias.value):
            value.assign(local[0])


def test_optimizer_slots_are_checked(trained):
    strategy, model, _, _ = trained
    slot = next(v for v in model.optimizer.variables if "momentum" in v.path)
    local = strategy.experimental_local_results(slot.value)
    local[1].assign(local[1] + 1.0)
    check = ReplicaConsistencyCheck()
    check.set_model(model)
    try:
        with pytest.raises(ReplicaDivergenceError, match="momentum"):
            check.check()
        without_slots = ReplicaConsistencyCheck(include_optimizer=False)
        without_slots.set_model(model)
        without_slots.check()
    finally:
        local[1].assign(local[0])


def test_one_device_has_nothing_to_compare():
    model = w.mlp()
    check = ReplicaConsistencyCheck()
    check.set_model(model)
    check.check()
    assert tf.distribute.get_strategy().num_replicas_in_sync == 1


def test_bad_cadence():
    with pytest.raises(ValueError, match="every_n_steps=0"):
        ReplicaConsistencyCheck(every_n_steps=0)
