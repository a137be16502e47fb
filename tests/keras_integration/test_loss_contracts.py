"""Every documented way of writing a custom `train_step`'s loss trains like one
device in `fit` (issue 53; docs/keras_behaviours.md, "Loss contracts").

Keras' forms (a plain mean, a Keras loss object, `compute_loss`, `scale_loss`)
and TensorFlow's custom-loop contract (`tf.nn.compute_average_loss` with and
without `global_batch_size`, plus `tf.nn.scale_regularization_loss`), float64,
2 replicas, an uneven last batch (36 / 8), SGD (a half step shows), 1e-10; the
logged loss too. Two workers: the conformance suite's
`custom_train_step_average_loss` (tests/testing).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_replicator as kr

TOLERANCE = 1e-10
GLOBAL_BATCH = 8


pytestmark = pytest.mark.usefixtures("float64")


def _loss(model, form, x, y):
    prediction = model(x, training=True)
    per_example = tf.reduce_mean(tf.square(prediction - y), axis=-1)
    regularization = tf.add_n(model.losses)
    if form == "plain_mean":
        return tf.reduce_mean(per_example) + regularization
    if form == "keras_loss_object":
        return keras.losses.MeanSquaredError()(y, prediction) + regularization
    if form == "compute_loss":
        return model.compute_loss(x=x, y=y, y_pred=prediction, training=True)
    if form == "scale_loss":
        loss = tf.reduce_mean(per_example) + regularization
        return model.optimizer.scale_loss(loss)
    global_batch = GLOBAL_BATCH if form == "average_loss_global_batch" else None
    loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
    return loss + tf.nn.scale_regularization_loss(regularization)


class FormModel(keras.Model):
    form = None

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = _loss(self, self.form, x, y)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        if self.form == "scale_loss":
            loss = loss / self.optimizer.scale_loss(tf.constant(1.0, loss.dtype))
        self.tracker.update_state(loss)
        return {"loss": self.tracker.result()}


def _fit(strategy, form):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(36, 5)), rng.normal(size=(36, 1))
    with strategy.scope():
        keras.utils.set_random_seed(1)
        inputs = keras.Input((5,))
        hidden = keras.layers.Dense(
            3, activation="tanh", kernel_regularizer=keras.regularizers.L2(0.1)
        )(inputs)
        model = FormModel(inputs, keras.layers.Dense(1)(hidden))
        model.form = form
        model.tracker = keras.metrics.Mean(name="loss")
        model.compile(keras.optimizers.SGD(0.1), "mse")
    history = model.fit(
        x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0
    )
    return model.get_weights(), history.history["loss"]


@pytest.mark.parametrize(
    "form",
    [
        "plain_mean",
        "keras_loss_object",
        "compute_loss",
        "scale_loss",
        "average_loss_global_batch",
        "average_loss",
    ],
)
def test_every_loss_form_trains_like_one_device(form):
    weights, losses = _fit(tf.distribute.OneDeviceStrategy("/cpu:0"), form)
    strategy = kr.MultiDeviceReplicator(["/cpu:0", "/cpu:1"])
    got_weights, got_losses = _fit(strategy, form)
    for got, want in zip(got_weights, weights):
        np.testing.assert_allclose(got, want, rtol=0, atol=TOLERANCE)
    if form != "average_loss_global_batch":
        # The last batch (4 samples) has 2 per replica: the mean over replicas
        # of their losses is one device's. With a fixed global batch that
        # holds for the 8-sample batches only (one device divides 4 by 8).
        np.testing.assert_allclose(got_losses, losses, rtol=1e-9)


def test_outside_fit_tensorflows_contract_is_unchanged():
    """A plain `strategy.run` loop keeps TensorFlow's numbers (the sum)."""
    strategy = kr.MultiDeviceReplicator(["/cpu:0", "/cpu:1"])

    def replica():
        return tf.nn.compute_average_loss(tf.ones((4,), tf.float64) * 3.0)

    per_replica = strategy.run(tf.function(replica))
    assert float(strategy.reduce("SUM", per_replica, axis=None)) == pytest.approx(3.0)
