"""Small models and data sets the conformance checks train on (deterministic)."""

from __future__ import annotations

import numpy as np

NUM_FEATURES = 8
NUM_CLASSES = 3


def classification_data(num_samples: int, seed: int = 0):
    """Features `(n, 8)` float32 and integer labels `(n,)` from a fixed rule."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_samples, NUM_FEATURES)).astype("float32")
    y = (np.argmax(x[:, :NUM_CLASSES] + 0.3 * x[:, 3:6], axis=1)).astype("int32")
    return x, y


def mlp(
    *,
    batch_norm=None,
    jit_compile=False,
    steps_per_execution=1,
    model_class=None,
    metrics=("accuracy",),
):
    """A compiled 2-layer classifier; `batch_norm`: None, "local" or "synchronized"."""
    import keras

    inputs = keras.Input((NUM_FEATURES,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    if batch_norm is not None:
        hidden = keras.layers.BatchNormalization(
            synchronized=batch_norm == "synchronized"
        )(hidden)
    outputs = keras.layers.Dense(NUM_CLASSES, dtype="float32")(hidden)
    model = (model_class or keras.Model)(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.SGD(0.1, momentum=0.5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=list(metrics),
        jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
    )
    return model


def true_positives_metric():
    """A `keras.metrics.Metric` subclass as the Keras guide "training with built-in
    methods" writes it: `result()` returns its Keras variable itself."""
    import keras

    class CategoricalTruePositives(keras.metrics.Metric):
        def __init__(self, name="categorical_true_positives", **kwargs):
            super().__init__(name=name, **kwargs)
            self.true_positives = self.add_variable(
                shape=(), name="ctp", initializer="zeros"
            )

        def update_state(self, y_true, y_pred, sample_weight=None):
            y_pred = keras.ops.reshape(keras.ops.argmax(y_pred, axis=1), (-1, 1))
            y_true = keras.ops.reshape(y_true, (-1, 1))
            values = keras.ops.cast(y_true, "int32") == keras.ops.cast(y_pred, "int32")
            values = keras.ops.cast(values, "float32")
            if sample_weight is not None:
                sample_weight = keras.ops.reshape(
                    keras.ops.cast(sample_weight, "float32"), (-1, 1)
                )
                values = keras.ops.multiply(values, sample_weight)
            self.true_positives.assign_add(keras.ops.sum(values))

        def result(self):
            return self.true_positives

        def reset_state(self):
            self.true_positives.assign(0)

    return CategoricalTruePositives()


def string_dict_model():
    """A classifier over a dict of a string feature and a float feature."""
    import keras

    word = keras.Input((1,), dtype="string", name="word")
    value = keras.Input((4,), name="value")
    hashed = keras.layers.Hashing(num_bins=16)(word)
    embedded = keras.layers.Flatten()(keras.layers.Embedding(16, 4)(hashed))
    hidden = keras.layers.Dense(8, activation="relu")(
        keras.layers.Concatenate()([embedded, value])
    )
    outputs = keras.layers.Dense(NUM_CLASSES)(hidden)
    model = keras.Model({"word": word, "value": value}, outputs)
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def string_dict_data(num_samples: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    words = np.array(["alpha", "beta", "gamma", "delta", "omega"])
    picks = rng.integers(0, len(words), num_samples)
    value = rng.normal(size=(num_samples, 4)).astype("float32")
    y = ((picks + (value[:, 0] > 0)) % NUM_CLASSES).astype("int32")
    word = words[picks].astype(bytes).reshape(-1, 1)
    return {"word": word, "value": value}, y


def mean_loss_train_step_class():
    """A Model subclass whose `train_step` uses a hand-written per-replica mean loss."""
    import keras
    import tensorflow as tf

    class MeanLossModel(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                logits = self(x, training=True)
                loss = tf.reduce_mean(
                    keras.losses.sparse_categorical_crossentropy(
                        y, logits, from_logits=True
                    )
                )
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply(gradients, self.trainable_variables)
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, logits)
            return {metric.name: metric.result() for metric in self.metrics}

    return MeanLossModel


def custom_train_step_class():
    """A Model subclass with a `train_step` written as the Keras guide shows."""
    import keras
    import tensorflow as tf

    class CustomStepModel(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(x=x, y=y, y_pred=y_pred, training=True)
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply(gradients, self.trainable_variables)
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)
            return {metric.name: metric.result() for metric in self.metrics}

    return CustomStepModel
