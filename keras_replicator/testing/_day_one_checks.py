"""Conformance checks drawn from code users run on their first day (issue 33).

Each workload is written as its authors write it (keras-io's "Text classification
with Transformer", TensorFlow's mixed-precision guide, Keras 3's
`gradient_accumulation_steps`, `run_eagerly=True`, gradient clipping, a
`train_step` written to TensorFlow's loss contract), shrunk to run in seconds, and
compared with one device like every other check (`_harness.compare_to_one_device`).
Where Keras itself is wrong on one device (Adam on an `IndexedSlices` gradient), the
reference is the one-device model with the mathematically dense gradient: what our
strategies promise (docs/keras_behaviours.md).
"""

from __future__ import annotations

import numpy as np

from keras_replicator.testing._harness import CheckFailure, compare_to_one_device

BATCH = 64
VOCABULARY = 40
SEQUENCE = 8
NUM_CLASSES = 3


def token_data(num_samples: int, seed: int = 0):
    """Token ids `(n, 8)` in [0, 40) with many repeats, and labels from a rule."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCABULARY, size=(num_samples, SEQUENCE)).astype("int32")
    labels = (tokens[:, 0] + tokens[:, -1]) % NUM_CLASSES
    return tokens, labels.astype("int32")


def _compile(model, optimizer, **kwargs):
    import keras

    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        **kwargs,
    )
    return model


def transformer_classifier():
    """keras-io's Transformer text classifier, small and without dropout.

    Token and position embeddings, one block of multi-head self-attention and a
    feed-forward network with residual layer norms, global average pooling.
    """
    import keras
    from keras import layers

    class TokenAndPositionEmbedding(layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.token_embedding = layers.Embedding(VOCABULARY, 8)
            self.position_embedding = layers.Embedding(SEQUENCE, 8)

        def call(self, tokens):
            positions = keras.ops.arange(0, keras.ops.shape(tokens)[-1])
            return self.token_embedding(tokens) + self.position_embedding(positions)

    tokens = keras.Input((SEQUENCE,), dtype="int32")
    embedded = TokenAndPositionEmbedding()(tokens)
    attended = layers.MultiHeadAttention(num_heads=2, key_dim=4)(embedded, embedded)
    hidden = layers.LayerNormalization(epsilon=1e-6)(embedded + attended)
    feed_forward = layers.Dense(8)(layers.Dense(16, activation="relu")(hidden))
    hidden = layers.LayerNormalization(epsilon=1e-6)(hidden + feed_forward)
    pooled = layers.GlobalAveragePooling1D()(hidden)
    outputs = layers.Dense(NUM_CLASSES)(layers.Dense(8, activation="relu")(pooled))
    return _compile(keras.Model(tokens, outputs), keras.optimizers.SGD(0.05))


def _bag_of_embeddings(embedding):
    import keras
    from keras import layers

    tokens = keras.Input((SEQUENCE,), dtype="int32")
    pooled = layers.GlobalAveragePooling1D()(embedding(tokens))
    outputs = layers.Dense(NUM_CLASSES)(pooled)
    return _compile(keras.Model(tokens, outputs), keras.optimizers.Adam(0.01))


def _dense_gradient_embedding_class():
    import keras

    class DenseGradientEmbedding(keras.layers.Layer):
        """An embedding lookup as a one-hot product: its gradient is dense."""

        def build(self, input_shape):
            self.embeddings = self.add_weight(
                shape=(VOCABULARY, 8), initializer="uniform", name="embeddings"
            )

        def call(self, tokens):
            one_hot = keras.ops.one_hot(tokens, VOCABULARY, dtype=self.compute_dtype)
            return keras.ops.matmul(one_hot, self.embeddings)

    return DenseGradientEmbedding


def _fit_weights(num_samples, epochs=2, data=token_data, **fit_kwargs):
    x, y = data(num_samples)

    def workload(model):
        model.fit(
            x,
            y,
            batch_size=BATCH,
            epochs=epochs,
            shuffle=False,
            verbose=0,
            **fit_kwargs,
        )
        return {"weights": model.get_weights()}

    return workload


def transformer_embeddings(strategy):
    return compare_to_one_device(
        strategy, transformer_classifier, _fit_weights(512), tolerance=1e-5
    )


def adam_on_embeddings(strategy):
    import keras

    dense_class = _dense_gradient_embedding_class()
    return compare_to_one_device(
        strategy,
        lambda: _bag_of_embeddings(keras.layers.Embedding(VOCABULARY, 8)),
        _fit_weights(512),
        reference_build=lambda: _bag_of_embeddings(dense_class()),
        tolerance=1e-5,
    )


def _small_mlp(optimizer, **compile_kwargs):
    import keras

    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    outputs = keras.layers.Dense(NUM_CLASSES, dtype="float32")(hidden)
    return _compile(keras.Model(inputs, outputs), optimizer, **compile_kwargs)


def _features(num_samples, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_samples, 8)).astype("float32")
    y = np.argmax(x[:, :NUM_CLASSES], axis=1).astype("int32")
    return x, y


def _overflowing_features(num_samples):
    x, y = _features(num_samples)
    # The first step's last sample: in the last replica's share on any number of
    # replicas (Keras once took the flag from the first replica only).
    x[BATCH - 1] = 6.0e4
    return x, y


def mixed_float16_overflow(strategy):
    import keras

    def workload(model):
        x, y = _overflowing_features(512)
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        scale = float(keras.ops.convert_to_numpy(model.optimizer.dynamic_scale))
        if not scale < model.optimizer.initial_scale:
            raise CheckFailure(f"no step overflowed (loss scale {scale})")
        weights = model.get_weights()
        if not all(np.all(np.isfinite(v)) for v in weights):
            raise CheckFailure(
                "an overflowing step was applied: weights are not finite"
            )
        return {"weights": weights, "loss_scale": np.float32(scale)}

    return compare_to_one_device(
        strategy,
        lambda: _small_mlp(keras.optimizers.SGD(0.1)),
        workload,
        policy="mixed_float16",
        tolerance=1e-3,
    )


def gradient_accumulation(strategy):
    import keras

    def build():
        optimizer = keras.optimizers.SGD(
            0.1, momentum=0.5, gradient_accumulation_steps=2
        )
        return _small_mlp(optimizer)

    return compare_to_one_device(
        strategy, build, _fit_weights(1024, data=_features), tolerance=1e-5
    )


def run_eagerly(strategy):
    import keras

    return compare_to_one_device(
        strategy,
        lambda: _small_mlp(keras.optimizers.SGD(0.1), run_eagerly=True),
        _fit_weights(256, epochs=1, data=_features),
        tolerance=1e-5,
    )


def _merged(results):
    errors = {
        f"{name}.{key}": value
        for name, (_, per_key) in results.items()
        for key, value in per_key.items()
    }
    return max(worst for worst, _ in results.values()), errors


def gradient_clipping(strategy):
    """`clipnorm`, `global_clipnorm`, `clipvalue` as set in Transformer recipes,
    tight enough to clip every step: one device clips the global-batch gradient."""
    import keras

    options = {
        "clipnorm": {"clipnorm": 0.05},
        "global_clipnorm": {"global_clipnorm": 0.05},
        "clipvalue": {"clipvalue": 0.002},
    }
    return _merged(
        {
            name: compare_to_one_device(
                strategy,
                lambda kwargs=kwargs: _small_mlp(keras.optimizers.SGD(0.5, **kwargs)),
                _fit_weights(1001, epochs=1, data=_features),
                tolerance=1e-5,
            )
            for name, kwargs in options.items()
        }
    )


def _average_loss_train_step_class(global_batch_size):
    """A `train_step` written to TensorFlow's custom-loop contract (its
    distributed-training guide): `tf.nn.compute_average_loss` and
    `tf.nn.scale_regularization_loss`."""
    import keras
    import tensorflow as tf

    class AverageLossModel(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                logits = self(x, training=True)
                per_example = keras.losses.sparse_categorical_crossentropy(
                    y, logits, from_logits=True
                )
                loss = tf.nn.compute_average_loss(
                    per_example, global_batch_size=global_batch_size
                )
                loss += tf.nn.scale_regularization_loss(tf.add_n(self.losses))
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
            return {"loss": loss}

    return AverageLossModel


def custom_train_step_average_loss(strategy):
    """TensorFlow's loss contract in a `train_step`, with a fixed global batch
    and without, over an uneven last batch (1001 / 64)."""
    import keras

    def build(global_batch_size):
        inputs = keras.Input((8,))
        hidden = keras.layers.Dense(
            16, activation="relu", kernel_regularizer=keras.regularizers.L2(1e-2)
        )(inputs)
        outputs = keras.layers.Dense(NUM_CLASSES, dtype="float32")(hidden)
        model_class = _average_loss_train_step_class(global_batch_size)
        model = model_class(inputs, outputs)
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.5))
        return model

    return _merged(
        {
            name: compare_to_one_device(
                strategy,
                lambda size=size: build(size),
                _fit_weights(1001, data=_features),
                tolerance=1e-5,
            )
            for name, size in (("global_batch_size", BATCH), ("none", None))
        }
    )


CHECKS = {
    "transformer_embeddings": (
        transformer_embeddings,
        "keras-io's Transformer classifier (embeddings, attention)",
    ),
    "adam_on_embeddings": (
        adam_on_embeddings,
        "Adam on an embedding: the dense-gradient one-device model",
    ),
    "mixed_float16_overflow": (
        mixed_float16_overflow,
        "float16 overflow in one replica: the step is skipped on all",
    ),
    "gradient_accumulation": (
        gradient_accumulation,
        "gradient_accumulation_steps=2",
    ),
    "run_eagerly": (run_eagerly, "fit(run_eagerly=True)"),
    "gradient_clipping": (
        gradient_clipping,
        "clipnorm, global_clipnorm, clipvalue: the global gradient's",
    ),
    "custom_train_step_average_loss": (
        custom_train_step_average_loss,
        "train_step with tf.nn.compute_average_loss (TensorFlow's contract)",
    ),
}
