"""The TF-Replicator form: `distribute_input` + `run_steps` + `wrap_optimizer`."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_replicator as kr
from keras_replicator.testing import _workloads as w

GLOBAL_BATCH = 64


def _input_fn(x, y):
    def input_fn(context):
        batch = context.get_per_replica_batch_size(GLOBAL_BATCH)
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
        return dataset.shard(context.num_input_pipelines, context.input_pipeline_id)

    return input_fn


def _step_fn(model, optimizer):
    def step_fn(batch):
        x, y = batch
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.reduce_mean(
                keras.losses.sparse_categorical_crossentropy(
                    y, logits, from_logits=True
                )
            )
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    return step_fn


def _one_device_weights(initial, x, y):
    model = w.mlp()
    model.set_weights(initial)
    optimizer = keras.optimizers.SGD(0.1)
    step = tf.function(_step_fn(model, optimizer))
    for start in range(0, len(x), GLOBAL_BATCH):
        step((x[start : start + GLOBAL_BATCH], y[start : start + GLOBAL_BATCH]))
    return model.get_weights()


def _max_diff(a, b):
    return max(float(np.max(np.abs(p - q))) for p, q in zip(a, b))


@pytest.mark.parametrize("num_replicas", [2, 4])
def test_custom_loop_matches_one_device_with_uneven_last_batch(num_replicas):
    x, y = w.classification_data(1000)  # last global batch: 40 rows
    keras.utils.set_random_seed(0)
    initial = w.mlp().get_weights()
    strategy = kr.MultiDeviceReplicator(num_replicas=num_replicas)
    with strategy.scope():
        model = w.mlp()
        optimizer = kr.wrap_optimizer(keras.optimizers.SGD(0.1))
    model.set_weights(initial)
    iterator = iter(strategy.distribute_input(_input_fn(x, y)))
    step_fn = _step_fn(model, optimizer)
    losses = []
    with pytest.raises(tf.errors.OutOfRangeError):
        while True:
            losses.append(
                float(strategy.run_steps(step_fn, iterator, num_steps=4, reduce="mean"))
            )
    assert len(losses) == 4  # 16 steps in calls of 4
    assert _max_diff(model.get_weights(), _one_device_weights(initial, x, y)) < 1e-5


def test_wrap_optimizer_averages_on_a_stock_strategy():
    x, y = w.classification_data(1024)
    keras.utils.set_random_seed(0)
    initial = w.mlp().get_weights()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = w.mlp()
        optimizer = kr.wrap_optimizer(keras.optimizers.SGD(0.1))
    model.set_weights(initial)
    step_fn = _step_fn(model, optimizer)

    @tf.function
    def step(batch):
        strategy.run(step_fn, args=(batch,))

    for batch in strategy.distribute_datasets_from_function(_input_fn(x, y)):
        step(batch)
    assert _max_diff(model.get_weights(), _one_device_weights(initial, x, y)) < 1e-5


def test_wrap_optimizer_is_identity_under_our_strategies():
    strategy = kr.MultiDeviceReplicator(num_replicas=2)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.1)
        assert kr.wrap_optimizer(optimizer) is optimizer


def test_wrap_optimizer_rejects_non_keras_optimizers():
    with pytest.raises(TypeError, match="keras.optimizers.Optimizer"):
        kr.wrap_optimizer("sgd")


def test_outputs_per_replica_and_reduced():
    strategy = kr.MultiDeviceReplicator(num_replicas=2)

    def input_fn(context):
        batch = context.get_per_replica_batch_size(4)
        return (
            tf.data.Dataset.range(8).map(lambda v: tf.cast(v, tf.float32)).batch(batch)
        )

    def step_fn(batch):
        return tf.reduce_sum(batch)

    per_replica = strategy.run_steps(step_fn, iter(strategy.distribute_input(input_fn)))
    assert [float(v) for v in strategy.experimental_local_results(per_replica)] == [
        1,
        5,
    ]
    iterator = iter(strategy.distribute_input(input_fn))
    assert float(strategy.run_steps(step_fn, iterator, reduce="sum")) == 6
    assert float(strategy.run_steps(step_fn, iterator, reduce="first")) == 9
    concat = strategy.run_steps(
        lambda b: b, iter(strategy.distribute_input(input_fn)), reduce="concat"
    )
    assert concat.numpy().tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"num_steps": 0}, ValueError, "num_steps=0"),
        ({"reduce": "avg"}, ValueError, "reduce='avg'"),
    ],
)
def test_bad_run_steps_arguments(kwargs, error, match):
    strategy = kr.MultiDeviceReplicator(num_replicas=2)
    dataset = strategy.distribute_input(lambda c: tf.data.Dataset.range(4).batch(2))
    with pytest.raises(error, match=match):
        strategy.run_steps(lambda b: b, iter(dataset), **kwargs)
    with pytest.raises(TypeError, match="must be an iterator"):
        strategy.run_steps(lambda b: b, dataset)
