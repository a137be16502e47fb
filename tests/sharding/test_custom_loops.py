"""Sharded updates outside `fit`: `run_steps`, wrapped optimizers, plain loops.

Each loop is compared with the same loop unsharded (float64, SGD with momentum:
a wrong reduction scale shows in SGD, where Adam would hide it).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.sharding import _training as t


def _setup(shard, replicas=2):
    strategy = t.strategy(replicas, shard)
    model = t.model_in(strategy, lambda: keras.optimizers.SGD(0.1, momentum=0.9))
    return strategy, model


def _batches(strategy):
    x, y = t.data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(t.BATCH)
    return iter(strategy.experimental_distribute_dataset(dataset))


def _run_steps(shard):
    strategy, model = _setup(shard)

    def step(batch):
        x, y = batch
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        model.optimizer.apply(grads, model.trainable_variables)
        return loss

    strategy.run_steps(step, _batches(strategy), num_steps=9)
    return model


def _plain_loop(shard, wrapped):
    strategy, model = _setup(shard)
    optimizer = model.optimizer
    if wrapped:
        import keras_replicator as kr

        kr.wrap_optimizer(optimizer)

    @tf.function
    def train(batch):
        def step(x, y):
            with tf.GradientTape() as tape:
                error = tf.reduce_sum(tf.square(model(x) - y), axis=-1)
                if wrapped:  # a per-replica mean, as for one device
                    loss = tf.reduce_mean(error)
                else:  # the stock contract: a share of the global mean
                    loss = tf.nn.compute_average_loss(error, global_batch_size=t.BATCH)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)

        strategy.run(step, args=batch)

    batches = _batches(strategy)
    for _ in range(9):
        train(next(batches))
    return model


@pytest.mark.parametrize(
    "loop",
    [
        _run_steps,
        pytest.param(
            lambda shard: _plain_loop(shard, wrapped=True), marks=pytest.mark.slow
        ),
        pytest.param(
            lambda shard: _plain_loop(shard, wrapped=False), marks=pytest.mark.slow
        ),
    ],
    ids=["run_steps", "wrap_optimizer", "stock_sum"],
)
def test_the_loop_sharded_equals_the_loop_unsharded(loop):
    plain, sharded = loop(False), loop(True)
    t.assert_same_training(plain, sharded, 1e-12)
    assert not np.allclose(t.weights(sharded)[0], t.weights(_setup(False)[1])[0])


def test_an_update_outside_the_replicas_is_refused():
    strategy, model = _setup(True)
    t.fit(model, epochs=1)  # builds the sharded state
    grads = [tf.zeros_like(v) for v in model.trainable_variables]
    with pytest.raises(RuntimeError, match="only update inside a replica step"):
        with strategy.scope():
            model.optimizer.apply(grads, model.trainable_variables)
