"""Gradient clipping acts on the gradient one device would clip (issue 53).

Keras clips in the replica step, before the all-reduce; under our strategies the
clipping waits for the reduced gradient (`communication/_clipping`). Float64,
2 replicas on logical CPUs, a threshold every step exceeds, SGD (whose step is
proportional to the gradient, so a wrong clip shows), tolerance 1e-10. Two
workers: the conformance suite's `gradient_clipping` (tests/testing).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_replicator as kr

TOLERANCE = 1e-10
OPTIONS = {
    "clipnorm": {"clipnorm": 0.5},
    "global_clipnorm": {"global_clipnorm": 0.5},
    "clipvalue": {"clipvalue": 0.05},
}


pytestmark = pytest.mark.usefixtures("float64")


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(36, 5)), rng.normal(size=(36, 1)) * 10


def _fit(strategy, optimizer_kwargs, accumulation=None):
    x, y = _data()  # 36 / 8: an uneven last batch
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential(
            [
                keras.Input((5,)),
                keras.layers.Dense(3, activation="tanh"),
                keras.layers.Dense(1),
            ]
        )
        optimizer = keras.optimizers.SGD(
            0.1, gradient_accumulation_steps=accumulation, **optimizer_kwargs
        )
        model.compile(optimizer, "mse")
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    return model.get_weights()


def _two_replicas(shard=False):
    return kr.MultiDeviceReplicator(
        ["/cpu:0", "/cpu:1"],
        all_reduce=kr.AllReduceOptions(shard_weight_update=shard),
    )


def _max_difference(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


SETUPS = ["plain", "accumulation", "sharded", "sharded-accumulation"]
# One case per setup stays in the default run, and every option with it; the
# other pairs are left to `make test-slow`.
DEFAULT_CASES = {
    ("plain", "clipnorm"),
    ("accumulation", "clipvalue"),
    ("sharded", "global_clipnorm"),
    ("sharded-accumulation", "clipnorm"),
}


def _clipping_case(setup, option):
    marks = []
    if (setup, option) not in DEFAULT_CASES:
        same_setup = next(o for s, o in sorted(DEFAULT_CASES) if s == setup)
        same_option = next(s for s, o in sorted(DEFAULT_CASES) if o == option)
        marks.append(
            pytest.mark.slow(
                reason="covered in the default run by: "
                f"test_clipping_equals_one_device[{setup}-{same_setup}] and "
                f"test_clipping_equals_one_device[{same_option}-{option}]"
            )
        )
    return pytest.param(option, setup, id=f"{setup}-{option}", marks=marks)


@pytest.mark.parametrize(
    "option, setup",
    [_clipping_case(setup, option) for setup in SETUPS for option in sorted(OPTIONS)],
)
def test_clipping_equals_one_device(option, setup):
    accumulation = 2 if "accumulation" in setup else None
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    one_device = _fit(one, OPTIONS[option], accumulation)
    ours = _fit(_two_replicas("sharded" in setup), OPTIONS[option], accumulation)
    unclipped = _fit(one, {}, accumulation)
    assert _max_difference(one_device, unclipped) > 1e-3  # the clip is active
    assert _max_difference(ours, one_device) < TOLERANCE


def test_a_custom_loop_clips_the_summed_gradient():
    """TensorFlow's contract (the optimizer sums shares of the global loss):
    clipped after the sum, as one device clips its gradient."""
    x, y = _data()

    def train(strategy):
        with strategy.scope():
            keras.utils.set_random_seed(1)
            model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(1)])
            optimizer = keras.optimizers.SGD(0.1, global_clipnorm=0.5)
            optimizer.build(model.trainable_variables)

        def step(xb, yb):
            with tf.GradientTape() as tape:
                per_example = tf.square(model(xb, training=True) - yb)[:, 0]
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=12)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))

        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(12)
        for xb, yb in strategy.experimental_distribute_dataset(dataset):
            tf.function(lambda a, b: strategy.run(step, args=(a, b)))(xb, yb)
        return model.get_weights()

    one_device = train(tf.distribute.OneDeviceStrategy("/cpu:0"))
    assert _max_difference(train(_two_replicas()), one_device) < TOLERANCE


def test_float32_lora_kernels_in_a_float64_model_clip_like_one_device():
    """keras-hub's LoRA fine-tuning with `global_clipnorm` in float64: Keras keeps
    LoRA kernels float32 (`Dense.enable_lora`); only they train."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 6)), rng.normal(size=(32, 1))

    def fit(strategy):
        with strategy.scope():
            keras.utils.set_random_seed(1)
            dense, head = keras.layers.Dense(8), keras.layers.Dense(1)
            inputs = keras.Input((6,))
            model = keras.Model(inputs, head(dense(inputs)))
            dense.enable_lora(2)
            head.trainable = False
            dense.bias.trainable = False
            model.compile(keras.optimizers.SGD(0.1, global_clipnorm=0.01), "mse")
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        assert {w.dtype for w in model.trainable_weights} == {"float32"}
        return model.get_weights()

    one_device = fit(tf.distribute.OneDeviceStrategy("/cpu:0"))
    assert _max_difference(fit(_two_replicas()), one_device) < 1e-6


def test_a_global_norm_over_two_dtypes_clips_like_the_formula():
    """A float64 model whose LoRA kernels Keras keeps float32, beside a trainable
    float64 bias (keras-hub's GPT-2 + LoRA in float64): Keras' own
    `clip_by_global_norm` raises on one device; ours clips one step exactly as
    the formula says, with the norm summed in float64."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 6)), rng.normal(size=(8, 1))
    with _two_replicas().scope():
        keras.utils.set_random_seed(1)
        dense = keras.layers.Dense(1)
        inputs = keras.Input((6,))
        model = keras.Model(inputs, dense(inputs))
        dense.enable_lora(2)
        model.compile(keras.optimizers.SGD(0.1, global_clipnorm=0.01), "mse")
    before = [w.numpy() for w in model.trainable_weights]
    assert {w.dtype for w in model.trainable_weights} == {"float32", "float64"}
    with tf.GradientTape() as tape:
        loss = keras.losses.MeanSquaredError()(y, model(x))
    gradients = tape.gradient(loss, model.trainable_weights)
    norm = np.sqrt(
        sum(np.sum(np.square(g.numpy().astype("float64"))) for g in gradients)
    )
    assert norm > 0.01  # the clip is active
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    for w, b, g in zip(model.trainable_weights, before, gradients):
        expected = b - 0.1 * g.numpy() * (0.01 / norm)
        np.testing.assert_allclose(w.numpy(), expected, rtol=1e-6, atol=1e-9)
