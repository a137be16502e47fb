"""The keras-io guide "Customizing what happens in fit() with TensorFlow"
(keras.io/guides/custom_train_step_in_tensorflow), under a strategy.

The guide's models, built and compiled in the scope: a `train_step` using
`compute_loss` and the compiled metrics; a lower-level one with its own loss object
and metric trackers; one supporting `sample_weight`; a custom `test_step`; and the
GAN, a `keras.Model` subclass with a custom `train_step`, two optimizers and no
`call()`.

The GAN's random draws (latent vectors, label noise) come with the data: random
numbers drawn inside a replica step depend on how the batch is split, on any
strategy, so a run on 2 replicas cannot be compared with one device otherwise.
"""

from tests.clients._data import digits, flat_digits
from tests.clients._registry import client_case

GLOBAL_BATCH = 64
EPOCHS = 2


def _regression_data():
    (x, y), _ = flat_digits()
    return x, (y.astype("float32") / 9.0)[:, None]


def _compile_and_fit(strategy, model_fn, *, compile_kwargs, sample_weight=False):
    """Builds and compiles in the scope (`compile_kwargs()` makes the arguments)."""
    import numpy as np

    x, y = _regression_data()
    with strategy.scope():
        model = model_fn()
        model.compile(**compile_kwargs())
    weights = np.linspace(0.5, 1.5, len(x)).astype("float32") if sample_weight else None
    history = model.fit(
        x, y, sample_weight=weights, batch_size=GLOBAL_BATCH, epochs=EPOCHS, verbose=0
    )
    return model, history.history


def _functional(model_class):
    import keras

    inputs = keras.Input(shape=(64,))
    hidden = keras.layers.Dense(32, activation="relu")(inputs)
    outputs = keras.layers.Dense(1)(hidden)
    return model_class(inputs, outputs)


@client_case(
    "keras-io guide custom_train_step: train_step with compute_loss and the "
    "compiled metrics"
)
def kerasio_train_step_compute_loss(strategy, workdir):
    import keras
    import tensorflow as tf

    class CustomModel(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred)
            trainable_vars = self.trainable_variables
            gradients = tape.gradient(loss, trainable_vars)
            self.optimizer.apply(gradients, trainable_vars)
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}

    model, history = _compile_and_fit(
        strategy,
        lambda: _functional(CustomModel),
        compile_kwargs=lambda: {"optimizer": "adam", "loss": "mse", "metrics": ["mae"]},
    )
    return {"weights": model.get_weights(), "history": history}


@client_case(
    "keras-io guide custom_train_step: lower level, own loss object and "
    "metric trackers, compile() with an optimizer only"
)
def kerasio_train_step_lower_level(strategy, workdir):
    import keras
    import tensorflow as tf

    class CustomModel(keras.Model):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.loss_tracker = keras.metrics.Mean(name="loss")
            self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")
            self.loss_fn = keras.losses.MeanSquaredError()

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.loss_fn(y, y_pred)
            trainable_vars = self.trainable_variables
            gradients = tape.gradient(loss, trainable_vars)
            self.optimizer.apply(gradients, trainable_vars)
            self.loss_tracker.update_state(loss)
            self.mae_metric.update_state(y, y_pred)
            return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

        @property
        def metrics(self):
            return [self.loss_tracker, self.mae_metric]

    model, history = _compile_and_fit(
        strategy,
        lambda: _functional(CustomModel),
        compile_kwargs=lambda: {"optimizer": keras.optimizers.Adam(learning_rate=0.01)},
    )
    return {"weights": model.get_weights(), "history": history}


@client_case("keras-io guide custom_train_step: sample_weight and a custom test_step")
def kerasio_train_step_sample_weight(strategy, workdir):
    import keras
    import tensorflow as tf

    class CustomModel(keras.Model):
        def train_step(self, data):
            x, y, sample_weight = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(
                    y=y, y_pred=y_pred, sample_weight=sample_weight
                )
            trainable_vars = self.trainable_variables
            gradients = tape.gradient(loss, trainable_vars)
            self.optimizer.apply(gradients, trainable_vars)
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred, sample_weight=sample_weight)
            return {m.name: m.result() for m in self.metrics}

        def test_step(self, data):
            x, y = data
            y_pred = self(x, training=False)
            loss = self.compute_loss(y=y, y_pred=y_pred)
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}

    model, history = _compile_and_fit(
        strategy,
        lambda: _functional(CustomModel),
        compile_kwargs=lambda: {"optimizer": "adam", "loss": "mse", "metrics": ["mae"]},
        sample_weight=True,
    )
    x, y = _regression_data()
    evaluation = model.evaluate(x, y, batch_size=GLOBAL_BATCH, verbose=0)
    return {"weights": model.get_weights(), "history": history, "evaluate": evaluation}


LATENT_DIM = 16


def _discriminator():
    import keras

    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(16, 3, strides=2, padding="same"),
            keras.layers.LeakyReLU(negative_slope=0.2),
            keras.layers.Conv2D(32, 3, strides=2, padding="same"),
            keras.layers.LeakyReLU(negative_slope=0.2),
            keras.layers.GlobalMaxPooling2D(),
            keras.layers.Dense(1),
        ],
        name="discriminator",
    )


def _generator():
    import keras

    return keras.Sequential(
        [
            keras.Input((LATENT_DIM,)),
            keras.layers.Dense(4 * 4 * 16),
            keras.layers.LeakyReLU(negative_slope=0.2),
            keras.layers.Reshape((4, 4, 16)),
            keras.layers.Conv2DTranspose(16, 4, strides=2, padding="same"),
            keras.layers.LeakyReLU(negative_slope=0.2),
            keras.layers.Conv2D(1, 3, padding="same", activation="sigmoid"),
        ],
        name="generator",
    )


@client_case(
    "keras-io guide custom_train_step: the GAN, a Model subclass with train_step, "
    "two optimizers and no call()"
)
def kerasio_gan_without_call(strategy, workdir):
    import keras
    import numpy as np
    import tensorflow as tf

    class GAN(keras.Model):
        def __init__(self, discriminator, generator, latent_dim):
            super().__init__()
            self.discriminator = discriminator
            self.generator = generator
            self.latent_dim = latent_dim
            self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
            self.g_loss_tracker = keras.metrics.Mean(name="g_loss")

        def compile(self, d_optimizer, g_optimizer, loss_fn):
            super().compile()
            self.d_optimizer = d_optimizer
            self.g_optimizer = g_optimizer
            self.loss_fn = loss_fn

        @property
        def metrics(self):
            return [self.d_loss_tracker, self.g_loss_tracker]

        def train_step(self, data):
            real_images, random_latent_vectors, label_noise = data
            generated_images = self.generator(random_latent_vectors)
            combined_images = tf.concat([generated_images, real_images], axis=0)
            batch_size = tf.shape(real_images)[0]
            labels = tf.concat(
                [tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0
            )
            # The guide's trick: add noise to the labels.
            labels += 0.05 * tf.concat([label_noise[:, :1], label_noise[:, 1:]], 0)
            with tf.GradientTape() as tape:
                predictions = self.discriminator(combined_images)
                d_loss = self.loss_fn(labels, predictions)
            grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
            self.d_optimizer.apply_gradients(
                zip(grads, self.discriminator.trainable_weights)
            )
            misleading_labels = tf.zeros((batch_size, 1))
            with tf.GradientTape() as tape:
                predictions = self.discriminator(self.generator(random_latent_vectors))
                g_loss = self.loss_fn(misleading_labels, predictions)
            grads = tape.gradient(g_loss, self.generator.trainable_weights)
            self.g_optimizer.apply_gradients(
                zip(grads, self.generator.trainable_weights)
            )
            self.d_loss_tracker.update_state(d_loss)
            self.g_loss_tracker.update_state(g_loss)
            return {
                "d_loss": self.d_loss_tracker.result(),
                "g_loss": self.g_loss_tracker.result(),
            }

    (x, _), _ = digits()
    images = (x / 16.0).astype("float32")
    rng = np.random.default_rng(0)
    latent = rng.normal(size=(len(images), LATENT_DIM)).astype("float32")
    noise = rng.uniform(size=(len(images), 2)).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((images, latent, noise)).batch(
        GLOBAL_BATCH
    )
    with strategy.scope():
        gan = GAN(_discriminator(), _generator(), latent_dim=LATENT_DIM)
        gan.compile(
            d_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
            g_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
            loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
        )
    history = gan.fit(dataset, epochs=EPOCHS, verbose=0)
    return {
        "discriminator": gan.discriminator.get_weights(),
        "generator": gan.generator.get_weights(),
        "history": history.history,
    }
