"""Keras' `gradient_accumulation_steps` under our strategies.

Stock tf.distribute fails at trace time (a `merge_call` inside Keras' update /
accumulate `tf.cond`). Under our strategies: `k` accumulation steps at a per-step
global batch `B` give one device's weights at the effective batch `k * B`, the
accumulators stay per replica, and the gradients are all-reduced once per update.
Two replicas on logical CPUs (and two worker processes), float64, SGD for the
reduction checks.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_replicator as kr
from keras_replicator.communication import _all_reduce
from keras_replicator.launch import launch_function
from keras_replicator.optimizers import LARS, NLCG, Neumann

TOLERANCE = 1e-10
STEPS = 2
BATCH = 12  # per step, global


def _data(n=48):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 5)), rng.normal(size=(n, 1))


def _model(optimizer):
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(4, activation="tanh"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer, "mse")
    return model


def _sgd(accumulation=None):
    return keras.optimizers.SGD(
        0.1, momentum=0.5, gradient_accumulation_steps=accumulation
    )


def _fit(strategy, make_optimizer, batch, epochs=2):
    x, y = _data()
    if strategy is None:
        model = _model(make_optimizer())
    else:
        with strategy.scope():
            model = _model(make_optimizer())
    model.fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0)
    return model


def _assert_close(got, want, tolerance=TOLERANCE):
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=0, atol=tolerance)


@pytest.mark.parametrize(
    "shard_weight_update", [False, pytest.param(True, marks=pytest.mark.slow)]
)
def test_fit_with_accumulation_equals_one_device_at_the_effective_batch(
    float64, shard_weight_update
):
    strategy = kr.MultiDeviceReplicator(
        num_replicas=2,
        all_reduce=kr.AllReduceOptions(shard_weight_update=shard_weight_update),
    )
    ours = _fit(strategy, lambda: _sgd(STEPS), BATCH)
    effective = _fit(None, _sgd, STEPS * BATCH)
    keras_accumulating = _fit(None, lambda: _sgd(STEPS), BATCH)
    assert int(ours.optimizer.iterations.numpy()) == 4
    _assert_close(ours.get_weights(), effective.get_weights())
    _assert_close(ours.get_weights(), keras_accumulating.get_weights())


@pytest.mark.slow
def test_an_uneven_cycle_weighs_every_sample_the_same(float64):
    # 42 samples: micro-batches of 12, 12 | 12, 6. The second update is the mean
    # over its 18 samples (one device at batch 24), not Keras' one-device mean of
    # the two micro-batch means, which weighs the 6 samples twice.
    x, y = _data(42)

    def fit(strategy, make_optimizer, batch):
        with strategy.scope():
            model = _model(make_optimizer())
        model.fit(x, y, batch_size=batch, shuffle=False, verbose=0)
        return model.get_weights()

    ours = fit(kr.MultiDeviceReplicator(num_replicas=2), lambda: _sgd(STEPS), BATCH)
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    _assert_close(ours, fit(one, _sgd, STEPS * BATCH))
    keras_accumulating = fit(one, lambda: _sgd(STEPS), BATCH)
    assert max(np.abs(a - b).max() for a, b in zip(ours, keras_accumulating)) > 1e-4


class _CountingAllReduce:
    """Counts runs of the gradient all-reduce (one per replica per call)."""

    def __init__(self, monkeypatch):
        self.runs = []
        original = _all_reduce.all_reduce_sum

        def counting(gradients, *args, **kwargs):
            summed, exact = original(gradients, *args, **kwargs)
            tick = tf.numpy_function(self._tick, [], tf.int64)
            with tf.control_dependencies([tick]):
                summed = [tf.identity(g) for g in summed]
            return summed, exact

        monkeypatch.setattr(_all_reduce, "all_reduce_sum", counting)

    def _tick(self):
        self.runs.append(1)
        return np.int64(len(self.runs))


def test_gradients_are_all_reduced_once_per_update(float64, monkeypatch):
    counter = _CountingAllReduce(monkeypatch)
    strategy = kr.MultiDeviceReplicator(num_replicas=2)
    model = _fit(strategy, lambda: _sgd(4), BATCH, epochs=1)  # 4 micro-steps
    assert int(model.optimizer.iterations.numpy()) == 1
    assert len(counter.runs) == 2  # one update, on each of the 2 replicas


def test_a_custom_loop_accumulates_as_one_device(float64):
    """TF's custom-training contract (loss divided by the global batch, summed
    gradients), `strategy.run` and `optimizer.apply`; a last batch of 6."""
    x, y = _data(42)

    def train(strategy):
        with strategy.scope():
            model = _model(_sgd(STEPS))
            optimizer = model.optimizer
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)

        def step(xb, yb):
            with tf.GradientTape() as tape:
                per_example = keras.losses.mean_squared_error(yb, model(xb))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=BATCH)
            variables = model.trainable_variables
            optimizer.apply(tape.gradient(loss, variables), variables)

        @tf.function
        def train_step(batch):
            strategy.run(step, args=batch)

        for batch in strategy.experimental_distribute_dataset(dataset):
            train_step(batch)
        return model.get_weights(), int(optimizer.iterations.numpy())

    ours, iterations = train(kr.MultiDeviceReplicator(num_replicas=2))
    one, one_iterations = train(tf.distribute.OneDeviceStrategy("/cpu:0"))
    assert iterations == one_iterations == 2
    _assert_close(ours, one)


OPTIMIZERS = {
    "adam": lambda k: keras.optimizers.Adam(0.01, gradient_accumulation_steps=k),
    "lars": lambda k: LARS(0.5, weight_decay=1e-3, gradient_accumulation_steps=k),
    "neumann": lambda k: Neumann(
        0.05, reset_steps=2, burn_in_steps=1, gradient_accumulation_steps=k
    ),
    "nlcg": lambda k: NLCG(0.05, step_control_period=2, gradient_accumulation_steps=k),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_other_optimizers_accumulate_as_on_one_device(name, float64):
    make = OPTIMIZERS[name]
    ours = _fit(kr.MultiDeviceReplicator(num_replicas=2), lambda: make(STEPS), BATCH)
    one = _fit(None, lambda: make(STEPS), BATCH)
    initial = _model(make(STEPS)).get_weights()
    assert any(np.abs(a - b).max() > 1e-3 for a, b in zip(one.get_weights(), initial))
    _assert_close(ours.get_weights(), one.get_weights(), 1e-9)


def _fit_on_a_worker(initial):
    """Per worker: 4 micro-steps of 12 accumulated in pairs, then 2 plain steps
    of 24, from the `initial` weights; the weights and the ring's bytes of each."""
    import keras

    import keras_replicator as kr
    from keras_replicator._replicator_state import replicator_state

    keras.backend.set_floatx("float64")
    strategy = kr.MultiWorkerReplicator(collective_timeout=30)
    ring = replicator_state(strategy).transport.ring
    x, y = _data()
    results = {}
    for name, accumulation, batch, steps in [
        ("accumulating", STEPS, BATCH, 4),
        ("plain", None, STEPS * BATCH, 2),
    ]:
        with strategy.scope():
            model = _model(_sgd(accumulation))
        model.set_weights(initial)
        sent = ring.bytes_sent
        model.fit(
            x, y, batch_size=batch, steps_per_epoch=steps, shuffle=False, verbose=0
        )
        results[name] = (model.get_weights(), ring.bytes_sent - sent)
    return results


@pytest.mark.slow(
    reason="covered in the default run by: "
    "conformance multi-worker-2 gradient_accumulation"
)
@pytest.mark.multi_worker
@pytest.mark.timeout(300)
def test_two_workers_accumulate_locally_and_match_one_device(float64):
    initial = _model(_sgd()).get_weights()
    chief, other = launch_function(
        _fit_on_a_worker, 2, args=(initial,), echo=False, timeout=240
    )
    one = _fit(None, _sgd, STEPS * BATCH, epochs=1)
    weights, sent = chief["accumulating"]
    _assert_close(weights, one.get_weights())
    for a, b in zip(weights, other["accumulating"][0]):
        np.testing.assert_array_equal(a, b)
    # Two updates: the ring carried exactly what two plain steps carry.
    plain_weights, plain_sent = chief["plain"]
    _assert_close(weights, plain_weights)
    assert sent == plain_sent > 0
