"""The gradient reduction rule: stock contract in plain loops, averaging in ours.

Code written for stock tf.distribute (a `strategy.run` loop whose loss is divided by
the global batch, optimizers built lazily inside the replica step, a model with a
custom `train_step` and no `call`) must give one device's numbers under our
strategies unchanged; `kr.wrap_optimizer` opts a per-replica-mean loop into
averaging. Two replicas on logical CPUs, float32, tolerance 1e-6.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_replicator as kr

GLOBAL_BATCH = 8
TOLERANCE = 1e-6


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(24, 3)).astype("float32"), np.ones((24, 1), "float32")


def _model():
    return keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(1, kernel_initializer="ones", bias_initializer="zeros"),
        ]
    )


def _train(strategy, loss_convention, *, wrap=False, build_first=True):
    """A TF-tutorial custom loop; returns (weights, per-step reported losses)."""
    x, y = _data()
    with strategy.scope():
        model = _model()
        # SGD with momentum (it has slots to build lazily), not Adam: Adam's
        # update barely depends on the gradient's scale, so a sum where a mean
        # belongs (2x on 2 replicas) would pass unnoticed.
        optimizer = keras.optimizers.SGD(0.1, momentum=0.5)
        if wrap:
            optimizer = kr.wrap_optimizer(optimizer)
        if build_first:
            optimizer.build(model.trainable_variables)
        per_example = keras.losses.MeanSquaredError(reduction="none")
        keras_mean = keras.losses.MeanSquaredError()

    def step(inputs):
        xb, yb = inputs
        with tf.GradientTape() as tape:
            prediction = model(xb, training=True)
            if loss_convention == "compute_average_loss":
                loss = tf.nn.compute_average_loss(
                    per_example(yb, prediction), global_batch_size=GLOBAL_BATCH
                )
            elif loss_convention == "keras_loss_object":
                loss = keras_mean(yb, prediction)
            else:  # per-replica mean, TF-Replicator's contract
                loss = tf.reduce_mean(per_example(yb, prediction))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @tf.function
    def distributed_step(inputs):
        losses = strategy.run(step, args=(inputs,))
        return strategy.reduce("SUM", losses, axis=None)

    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    losses = [
        float(distributed_step(batch))
        for batch in strategy.experimental_distribute_dataset(dataset)
    ]
    return model.get_weights(), losses


def _max_diff(a, b):
    return max(float(np.max(np.abs(p - q))) for p, q in zip(a, b))


def _one_device(loss_convention):
    return _train(tf.distribute.get_strategy(), loss_convention)


@pytest.mark.parametrize(
    "loss_convention", ["compute_average_loss", "keras_loss_object"]
)
def test_stock_contract_loop_matches_one_device(loss_convention):
    # The learning rate was halved on 2 replicas when the optimizer averaged here.
    expected_weights, expected_losses = _one_device(loss_convention)
    weights, losses = _train(kr.MultiDeviceReplicator(num_replicas=2), loss_convention)
    assert _max_diff(weights, expected_weights) < TOLERANCE
    # A Keras loss object summed with strategy.reduce("SUM") reported N x the loss.
    np.testing.assert_allclose(losses, expected_losses, rtol=TOLERANCE)


def test_wrap_optimizer_averages_a_per_replica_mean_loop():
    expected, _ = _one_device("replica_mean")
    weights, _ = _train(
        kr.MultiDeviceReplicator(num_replicas=2), "replica_mean", wrap=True
    )
    assert _max_diff(weights, expected) < TOLERANCE


def test_the_comparison_sees_a_sum_where_a_mean_belongs():
    # Without wrap_optimizer, a per-replica-mean loop gets the stock sum: twice the
    # one-device gradient on 2 replicas. The tests above must be able to see that.
    expected, _ = _one_device("replica_mean")
    weights, _ = _train(kr.MultiDeviceReplicator(num_replicas=2), "replica_mean")
    assert _max_diff(weights, expected) > 100 * TOLERANCE


def test_optimizer_built_lazily_inside_strategy_run():
    # TF's custom_training tutorial: the first apply_gradients builds the slots.
    # Stock strategies fail there ("You must feed a value for placeholder tensor").
    expected, _ = _one_device("compute_average_loss")
    weights, _ = _train(
        kr.MultiDeviceReplicator(num_replicas=2),
        "compute_average_loss",
        build_first=False,
    )
    assert _max_diff(weights, expected) < TOLERANCE


class _NoCallGAN(keras.Model):
    """The keras-io custom train step GAN's shape: a `train_step`, no `call`."""

    def __init__(self):
        super().__init__()
        self.discriminator = keras.Sequential(
            [keras.Input((3,)), keras.layers.Dense(1, kernel_initializer="ones")]
        )
        self.generator = keras.Sequential(
            [keras.Input((2,)), keras.layers.Dense(3, kernel_initializer="ones")]
        )
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")

    def compile(self, d_optimizer, g_optimizer):
        super().compile()
        self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer
        self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    @property
    def metrics(self):
        return [self.d_loss_tracker]

    def train_step(self, real):
        n = tf.shape(real)[0]
        latent = tf.tile(real[:, :1], [1, 2])  # deterministic "noise"
        fake = self.generator(latent)
        images = tf.concat([fake, real], 0)
        labels = tf.concat([tf.ones((n, 1)), tf.zeros((n, 1))], 0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(images))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(
            zip(grads, self.discriminator.trainable_weights)
        )
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(
                tf.zeros((n, 1)), self.discriminator(self.generator(latent))
            )
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        self.d_loss_tracker.update_state(d_loss)
        return {"d_loss": self.d_loss_tracker.result()}


def _fit_gan(strategy):
    with strategy.scope():
        gan = _NoCallGAN()
        gan.compile(keras.optimizers.Adam(0.01), keras.optimizers.Adam(0.01))
    x, _ = _data()
    history = gan.fit(
        tf.data.Dataset.from_tensor_slices(x).batch(GLOBAL_BATCH), epochs=2, verbose=0
    )
    return gan.get_weights(), history.history["d_loss"]


def test_model_without_call_trains_as_on_one_device():
    expected_weights, expected_losses = _fit_gan(tf.distribute.get_strategy())
    weights, losses = _fit_gan(kr.MultiDeviceReplicator(num_replicas=2))
    assert _max_diff(weights, expected_weights) < TOLERANCE
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-6)


def _mixed_precision_guide_loop(strategy):
    """TF's mixed_precision guide, custom loop: `LossScaleOptimizer` created in
    scope, built by its first `apply_gradients` inside `strategy.run`."""
    x, y = _data()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        with strategy.scope():
            model = _model()
            # A scale that never overflows here: a skipped step depends on each
            # replica's partial gradient, so steps would not compare one to one.
            optimizer = keras.optimizers.LossScaleOptimizer(
                keras.optimizers.SGD(0.1, momentum=0.5), initial_scale=64.0
            )
            per_example = keras.losses.MeanSquaredError(reduction="none")

        def step(inputs):
            xb, yb = inputs
            with tf.GradientTape() as tape:
                prediction = tf.cast(model(xb, training=True), "float32")
                loss = tf.nn.compute_average_loss(
                    per_example(yb, prediction), global_batch_size=GLOBAL_BATCH
                )
                scaled_loss = optimizer.scale_loss(loss)
            gradients = tape.gradient(scaled_loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            return loss

        @tf.function
        def distributed_step(inputs):
            strategy.run(step, args=(inputs,))

        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
        for batch in strategy.experimental_distribute_dataset(dataset):
            distributed_step(batch)
        return model.get_weights(), int(optimizer.iterations.numpy())
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_loss_scale_optimizer_built_lazily_inside_strategy_run():
    # Stock strategies fail here too ("You must feed a value for placeholder
    # tensor"): LossScaleOptimizer builds in its own `apply`.
    expected, expected_steps = _mixed_precision_guide_loop(tf.distribute.get_strategy())
    weights, steps = _mixed_precision_guide_loop(
        kr.MultiDeviceReplicator(num_replicas=2)
    )
    assert steps == expected_steps == 3
    assert _max_diff(weights, expected) < 1e-3  # float16 activations
