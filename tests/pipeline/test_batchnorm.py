"""Deferred batch norm: moving statistics from the whole mini-batch."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_replicator.pipeline import GPipe, _batchnorm
from tests.pipeline import _models


@pytest.mark.parametrize("checkpoint", ["always", "never"])
def test_one_microbatch_trains_like_one_device(checkpoint):
    plain, other = _models.twin(_models.mlp, batch_norm=True)
    pipe = GPipe(other, balance=[2, 2], num_microbatches=1, checkpoint=checkpoint)
    x, y = _models.data()
    _models.train(plain, x, y, epochs=3)
    _models.train(pipe, x, y, epochs=3)
    assert _models.max_difference(plain.get_weights(), pipe.get_weights()) < 1e-5


def test_moving_statistics_move_once_with_the_whole_minibatch():
    plain, other = _models.twin(_models.mlp, batch_norm=True)
    pipe = GPipe(other, balance=[2, 2], num_microbatches=4)
    x, y = _models.data(n=16)
    for model in (plain, pipe):
        model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
        model.train_on_batch(x, y)
    bn_plain, bn_pipe = plain.layers[1], pipe.chain[1]
    for a, b in zip(bn_plain.non_trainable_weights, bn_pipe.non_trainable_weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-6)


def test_training_forward_is_ghost_batch_norm_per_microbatch():
    plain, other = _models.twin(_models.mlp, batch_norm=True)
    pipe = GPipe(other, balance=[2, 2], num_microbatches=3)
    x, _ = _models.data(n=12)
    expected = np.concatenate([plain(c, training=True) for c in np.split(x, 3)])
    np.testing.assert_allclose(pipe(x, training=True), expected, atol=1e-6)


def test_combine_is_the_statistics_of_the_concatenation():
    rng = np.random.default_rng(0)
    parts = [rng.normal(size=(n, 3)) for n in (2, 5, 1)]
    layer = keras.layers.BatchNormalization()
    stats = [_batchnorm.moments(layer, tf.constant(p)) for p in parts]
    count, mean, variance = _batchnorm.combine(stats)
    whole = np.concatenate(parts)
    assert float(count) == 8
    np.testing.assert_allclose(mean, whole.mean(0), atol=1e-12)
    np.testing.assert_allclose(variance, whole.var(0), atol=1e-12)
