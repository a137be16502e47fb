"""Small float64 training runs shared by the Neumann and NLCG tests."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from keras_replicator.optimizers import observe_loss
from keras_replicator.testing import _workloads


class LossObservingModel(keras.Model):
    """Keras' default train step plus the `observe_loss` call (test-only wiring).

    The loss inside a replica is that replica's mean; `sample_count` makes
    `observe_loss` form the global-batch mean (what the library's step will pass).
    """

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
            )
            scaled = self.optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled, self.trainable_variables)
        observe_loss(self.optimizer, loss, sample_count=tf.shape(x)[0])
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def data(num_samples=100, seed=0):
    x, y = _workloads.classification_data(num_samples, seed)
    return x.astype("float64"), y


def model(optimizer_fn, strategy=None, seed=1, model_class=keras.Model):
    """A float64 two-layer classifier compiled with `optimizer_fn()`."""
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        keras.utils.set_random_seed(seed)
        inputs = keras.Input((_workloads.NUM_FEATURES,), dtype="float64")
        hidden = keras.layers.Dense(
            8, activation="tanh", dtype="float64", name="hidden"
        )(inputs)
        outputs = keras.layers.Dense(
            _workloads.NUM_CLASSES, dtype="float64", name="logits"
        )(hidden)
        net = model_class(inputs, outputs, name="net")
        net.compile(
            optimizer_fn(),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=False,
        )
    return net


def assert_weights_close(a, b, atol):
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=0, atol=atol)
