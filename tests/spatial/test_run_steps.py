"""A partitioned model in a custom loop: `tile_dataset` + `run_steps` = one device."""

import keras
import numpy as np
import tensorflow as tf

import keras_replicator as kr
from tests.spatial.test_partition import (
    BATCH,
    compile_sgd,
    conv_net,
    data,
    max_difference,
)


def test_run_steps_on_tiles_gives_the_weights_of_one_device(float64, strategies):
    x, y = data()
    steps = len(x) // BATCH
    plain = compile_sgd(conv_net("plain"))
    strategy = strategies[2]
    spatial = kr.spatial.partition(plain, 2, strategy=strategy)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step_fn(batch):
        images, labels = batch
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, spatial(images, training=True))
        variables = spatial.trainable_variables
        gradients = tape.gradient(loss, variables)
        spatial.optimizer.apply_gradients(zip(gradients, variables))
        return loss

    tiles = spatial.tile_dataset(x, y, batch_size=BATCH)
    assert tiles.element_spec[0].shape.as_list() == [None, 8, 6, 2]
    iterator = iter(strategy.experimental_distribute_dataset(tiles))
    losses = [
        float(strategy.run_steps(step_fn, iterator, reduce="mean"))
        for _ in range(steps)
    ]
    history = plain.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)

    assert max_difference(plain.get_weights(), spatial.get_weights()) < 1e-10
    np.testing.assert_allclose(np.mean(losses), history.history["loss"][0], rtol=1e-10)
