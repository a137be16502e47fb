import copy

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_replicator as kr
from keras_replicator.optimizers import Neumann, UseTrueWeights
from tests.optimizers import _fit_helpers
from tests.optimizers._numpy_neumann import NumpyNeumann


def _problem(seed=0, num_steps=20):
    rng = np.random.default_rng(seed)
    weights = [rng.normal(size=(4, 3)), rng.normal(size=(3,)), rng.normal(size=(2,))]
    steps = [[rng.normal(size=w.shape) for w in weights] for _ in range(num_steps)]
    return weights, steps


def _variables(weights, dtype="float64"):
    return [
        keras.Variable(w.astype(dtype), name=f"v{i}") for i, w in enumerate(weights)
    ]


def test_reduces_exactly_to_nesterov_sgd():
    weights, steps = _problem()
    ours, theirs = _variables(weights), _variables(weights)
    optimizer = Neumann(
        0.125, alpha=0.0, beta=0.0, mu_min=0.75, mu_max=0.75, reset_steps=None
    )
    sgd = keras.optimizers.SGD(0.125, momentum=0.75, nesterov=True)
    for grads in steps:
        optimizer.apply_gradients(zip(grads, ours))
        sgd.apply_gradients(zip(grads, theirs))
        for a, b in zip(ours, theirs):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
        for m, velocity in zip(optimizer._iterates, sgd.momentums):
            np.testing.assert_array_equal(m.numpy(), velocity.numpy())


VARIANTS = {
    "defaults": {},
    "global_norm": {"regularizer_norm": "global"},
    "gradient_reset": {"reset_mode": "gradient"},
    "mu_since_reset": {"mu_since_reset": True},
    "no_reset": {"reset_steps": None, "burn_in_steps": 0},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_steps_match_the_numpy_transcription(variant):
    weights, steps = _problem(num_steps=24)
    kwargs = {
        "alpha": 1e-2,
        "beta": 1e-4,
        "gamma": 0.9,
        "mu_min": 0.5,
        "mu_max": 0.9,
        "reset_steps": 3,
        "reset_growth": 1.5,
        "burn_in_steps": 3,
        "mu_steps": 2.0,
    }
    kwargs.update(VARIANTS[variant])
    variables = _variables(weights)
    optimizer = Neumann(0.0625, **kwargs)
    reference = NumpyNeumann(weights, lr=0.0625, **kwargs)
    for grads in steps:
        optimizer.apply(grads, variables)
        reference.apply(grads)
        for got, want in zip(variables, reference.w):
            np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)
        for got, want in zip(optimizer._averages, reference.v):
            np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)
        for got, want in zip(optimizer.true_weights(), reference.true_weights()):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        assert optimizer.current_mu == reference.mu
    # The run covered the burn-in, a rising momentum and (but for "no_reset")
    # resets at geometrically growing periods: t = 0, 3, 7, 13 (K = 3, 4, 6).
    assert max(abs(w).max() for w in reference.w) < 100
    if kwargs["reset_steps"] is not None:
        assert reference.resets == [0, 3, 7, 13]
    assert 0.5 < reference.mu <= 0.9


def test_learning_rate_schedule_and_float32_variables():
    weights, steps = _problem(num_steps=8)
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay([3], [0.125, 0.0625])
    variables = _variables(weights, "float32")
    optimizer = Neumann(schedule, reset_steps=2, burn_in_steps=1, mu_steps=1.0)
    reference = NumpyNeumann(
        weights,
        lr=lambda step: float(schedule(step)),
        reset_steps=2,
        burn_in_steps=1,
        mu_steps=1.0,
    )
    for grads in steps:
        optimizer.apply([g.astype("float32") for g in grads], variables)
        reference.apply(grads)
    for got, want in zip(variables, reference.w):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


def test_gradient_accumulation_updates_once_per_cycle():
    weights, steps = _problem(num_steps=12)
    variables = _variables(weights)
    optimizer = Neumann(
        0.0625, reset_steps=2, burn_in_steps=1, gradient_accumulation_steps=2
    )
    reference = NumpyNeumann(weights, lr=0.0625, reset_steps=2, burn_in_steps=1)
    for first, second in zip(steps[::2], steps[1::2]):
        optimizer.apply(first, variables)
        optimizer.apply(second, variables)
        reference.apply([(a + b) / 2 for a, b in zip(first, second)])
    for got, want in zip(variables, reference.w):
        np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)


def test_true_weights_round_trip_and_redisplacement():
    weights, steps = _problem(num_steps=10)
    variables = _variables(weights)
    kwargs = {"reset_steps": 4, "burn_in_steps": 2, "mu_steps": 1.0}
    optimizer = Neumann(0.0625, **kwargs)
    reference = NumpyNeumann(weights, lr=0.0625, **kwargs)
    for grads in steps[:6]:
        optimizer.apply(grads, variables)
        reference.apply(grads)
    assert optimizer.displaced
    stored = [v.numpy() for v in variables]
    optimizer.use_true_weights()
    assert not optimizer.displaced
    for got, want in zip(variables, reference.true_weights()):
        np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)
    optimizer.use_true_weights()  # idempotent
    optimizer.use_displaced_weights()
    assert optimizer.displaced
    _fit_helpers.assert_weights_close([v.numpy() for v in variables], stored, 1e-15)
    optimizer.use_displaced_weights()  # idempotent
    optimizer.use_true_weights()
    # Not moved back: the next update refuses (its gradient was taken at the true
    # weights) and changes nothing.
    with pytest.raises(tf.errors.InvalidArgumentError, match="use_displaced_weights"):
        optimizer.apply(steps[6], variables)
    for got, want in zip(variables, reference.true_weights()):
        np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)
    optimizer.use_displaced_weights()
    for grads in steps[6:]:
        optimizer.apply(grads, variables)
        reference.apply(grads)
    assert optimizer.displaced
    for got, want in zip(variables, reference.w):
        np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)


def _neumann():
    return Neumann(0.25, reset_steps=5, burn_in_steps=2, mu_steps=4.0, beta=1e-7)


class _Probe(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.displaced_at_test = []
        self.true_at_last_epoch = None

    def on_test_begin(self, logs=None):
        self.displaced_at_test.append(self.model.optimizer.displaced)

    def on_epoch_end(self, epoch, logs=None):
        self.true_at_last_epoch = self.model.optimizer.true_weights()


def test_fit_ends_with_true_weights_and_evaluates_them():
    x, y = _fit_helpers.data(64)
    net = _fit_helpers.model(_neumann)
    probe = _Probe()
    net.fit(
        x,
        y,
        batch_size=16,
        epochs=2,
        shuffle=False,
        verbose=0,
        validation_data=(x, y),
        callbacks=[UseTrueWeights(), probe],
    )
    assert probe.displaced_at_test == [False, False]
    assert not net.optimizer.displaced
    _fit_helpers.assert_weights_close(
        net.trainable_weights and [v.numpy() for v in net.trainable_weights],
        probe.true_at_last_epoch,
        atol=1e-15,
    )
    # Evaluating inside fit did not change the training trajectory.
    plain = _fit_helpers.model(_neumann)
    plain.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    _fit_helpers.assert_weights_close(net.get_weights(), plain.get_weights(), 1e-12)


def test_use_true_weights_refuses_other_optimizers():
    x, y = _fit_helpers.data(16)
    net = _fit_helpers.model(lambda: keras.optimizers.SGD(0.1))
    with pytest.raises(ValueError, match="needs an optimizer with displaced"):
        net.fit(x, y, epochs=1, verbose=0, callbacks=[UseTrueWeights()])


def test_config_round_trip():
    optimizer = Neumann(
        keras.optimizers.schedules.CosineDecay(0.5, decay_steps=100),
        alpha=1e-6,
        beta=2e-5,
        gamma=0.95,
        mu_min=0.6,
        mu_max=0.8,
        reset_steps=50,
        reset_growth=1.5,
        burn_in_steps=10,
        mu_steps=20.0,
        regularizer_norm="global",
        reset_mode="gradient",
        mu_since_reset=True,
        global_clipnorm=1.0,
    )
    config = optimizer.get_config()
    restored = Neumann.from_config(copy.deepcopy(config))
    assert restored.get_config() == config
    revived = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert isinstance(revived, Neumann) and revived.get_config() == config


def test_save_load_continue_matches_an_uninterrupted_run(tmp_path):
    x, y = _fit_helpers.data(80)
    fit = {"batch_size": 16, "shuffle": False, "verbose": 0}
    whole = _fit_helpers.model(_neumann)
    whole.fit(x, y, epochs=4, **fit)

    first = _fit_helpers.model(_neumann)
    first.fit(x, y, epochs=2, **fit)
    first.save(tmp_path / "neumann.keras")
    loaded = keras.models.load_model(tmp_path / "neumann.keras")
    assert isinstance(loaded.optimizer, Neumann)
    assert not loaded.optimizer.displaced
    for a, b in zip(first.optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    first.fit(x, y, epochs=2, callbacks=[UseTrueWeights()], **fit)
    loaded.fit(x, y, epochs=2, callbacks=[UseTrueWeights()], **fit)
    for a, b in zip(first.get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(a, b)
    # The 4-epoch fit never left the displaced weights: the only difference is the
    # rounding of undoing and redoing the displacement at the end of epoch 2.
    _fit_helpers.assert_weights_close(whole.get_weights(), loaded.get_weights(), 1e-12)


def _replica_run(strategy):
    x, y = _fit_helpers.data(100)  # batches of 32, 32, 32, 4
    net = _fit_helpers.model(_neumann, strategy)
    net.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0)
    return net.get_weights()


@pytest.mark.parametrize("num_replicas", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_replicas_train_as_one_device(num_replicas):
    one = _replica_run(tf.distribute.get_strategy())
    many = _replica_run(kr.MultiDeviceReplicator(num_replicas=num_replicas))
    _fit_helpers.assert_weights_close(one, many, atol=1e-10)


def test_mixed_precision_with_loss_scale_optimizer():
    x, y = _fit_helpers.data(64)
    x = x.astype("float32")
    keras.utils.set_random_seed(3)
    inputs = keras.Input((x.shape[1],))
    hidden = keras.layers.Dense(8, "tanh", dtype="mixed_float16")(inputs)
    outputs = keras.layers.Dense(3, dtype="float32")(hidden)
    net = keras.Model(inputs, outputs)
    net.compile(
        keras.optimizers.LossScaleOptimizer(_neumann()),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    losses = net.fit(x, y, batch_size=16, epochs=4, verbose=0).history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert not net.optimizer.inner_optimizer.displaced


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"learning_rate": -0.1}, ValueError, "Received: learning_rate=-0.1"),
        ({"alpha": -1.0}, ValueError, "Received: alpha=-1.0"),
        ({"beta": "1e-5"}, TypeError, "Received: beta='1e-5'"),
        ({"gamma": 1.5}, ValueError, "Received: gamma=1.5"),
        ({"mu_min": 0.9, "mu_max": 0.5}, ValueError, "`mu_max` must be >= `mu_min`"),
        ({"reset_steps": 0}, ValueError, "Received: reset_steps=0"),
        ({"reset_steps": 2.5}, TypeError, "Received: reset_steps=2.5"),
        ({"reset_growth": 0.5}, ValueError, "Received: reset_growth=0.5"),
        ({"burn_in_steps": -1}, ValueError, "Received: burn_in_steps=-1"),
        ({"mu_steps": 0}, ValueError, r"`mu_steps` must be > 0.0"),
        ({"regularizer_norm": "layer"}, ValueError, "regularizer_norm='layer'"),
        ({"reset_mode": "none"}, ValueError, "reset_mode='none'"),
        ({"mu_since_reset": 1}, TypeError, "Received: mu_since_reset=1"),
    ],
)
def test_bad_arguments_fail_in_the_constructor(kwargs, error, message):
    kwargs = {"learning_rate": 0.1, **kwargs}
    with pytest.raises(error, match=message):
        Neumann(**kwargs)


def test_true_weights_before_build_is_a_clear_error():
    with pytest.raises(ValueError, match="not built yet"):
        Neumann(0.1).true_weights()


def test_update_step_is_not_the_entry_point():
    with pytest.raises(NotImplementedError, match="all variables at once"):
        Neumann(0.1).update_step(None, None, None)


def test_sparse_gradients_update_like_their_dense_form():
    sparse = tf.IndexedSlices(
        tf.constant([[1.0, 2.0], [3.0, 4.0], [0.5, 0.5]], "float64"),
        indices=tf.constant([1, 1, 3]),
        dense_shape=tf.constant([4, 2]),
    )
    results = []
    for gradient in (sparse, tf.convert_to_tensor(sparse)):
        variable = keras.Variable(np.arange(8.0).reshape(4, 2), name="embeddings")
        optimizer = Neumann(0.125, reset_steps=2)
        for _ in range(3):
            optimizer.apply([gradient], [variable])
        results.append(variable.numpy())
    np.testing.assert_array_equal(results[0], results[1])


def test_composes_with_warmup_and_scaled_learning_rate():
    schedule = kr.schedules.Warmup(kr.scaled_learning_rate(0.1, 1024), warmup_steps=5)
    optimizer = Neumann(schedule, reset_steps=10)
    config = optimizer.get_config()
    revived = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert revived.get_config() == config
    variable = keras.Variable(np.ones(3))
    for _ in range(3):
        revived.apply([tf.ones(3, "float64")], [variable])
    assert np.all(variable.numpy() < 1.0)
