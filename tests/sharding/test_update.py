"""A sharded update equals the unsharded one (issue 24), on 2 and 4 logical CPUs.

Float64, 20 `fit` steps, an uneven last batch, variables whose sizes no replica
count divides: weights and optimizer state (gathered, as saved) must agree to
1e-12 with the unsharded run, and in float32 to 1e-5 with one device.
"""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_replicator as kr
from tests.sharding import _training as t

OPTIMIZERS = {
    "sgd_momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "nesterov": lambda: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adamw_excluding_biases": lambda: _excluding_biases(
        keras.optimizers.AdamW(0.01, weight_decay=0.1)
    ),
    "rmsprop_centered": lambda: keras.optimizers.RMSprop(0.01, centered=True),
    "adagrad": lambda: keras.optimizers.Adagrad(0.1),
    "lion": lambda: keras.optimizers.Lion(0.001),
    "nadam": lambda: keras.optimizers.Nadam(0.01),
    "adamax": lambda: keras.optimizers.Adamax(0.01),
    "adadelta": lambda: keras.optimizers.Adadelta(1.0),
    "ftrl": lambda: keras.optimizers.Ftrl(
        0.1, l1_regularization_strength=0.01, l2_shrinkage_regularization_strength=0.01
    ),
}


class _MyAdam(keras.optimizers.Adam):
    """A subclass may override `update_step` with anything: not trusted."""


class _MyLARS(kr.optimizers.LARS):
    """Overrides the step but not the halves: LARS' halves would ignore it."""

    def update_step(self, gradient, variable, learning_rate):
        super().update_step(2 * gradient, variable, learning_rate)


def _excluding_biases(optimizer):
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    return optimizer


def _run(name, replicas, shard):
    model = t.model_in(t.strategy(replicas, shard), OPTIMIZERS[name])
    return t.fit(model)


@pytest.mark.parametrize(
    "name, replicas",
    [
        ("sgd_momentum", 2),
        pytest.param(
            "adam",
            4,
            marks=pytest.mark.slow(
                reason="covered in the default run by: the same test's other cases"
            ),
        ),
        pytest.param("sgd_momentum", 4, marks=pytest.mark.slow),
        pytest.param("adam", 2, marks=pytest.mark.slow),
    ],
)
def test_weights_and_state_equal_the_unsharded_run(name, replicas):
    plain, sharded = _run(name, replicas, False), _run(name, replicas, True)
    t.assert_same_training(plain, sharded, 1e-12)
    assert int(sharded.optimizer.iterations.numpy()) == 20


# One in the default run; the rest with `make test-slow`.
_SWEEP = ["adamw_excluding_biases"]
_SLOW_SWEEP = [
    "nesterov",
    "rmsprop_centered",
    "ftrl",
    "adagrad",
    "lion",
    "nadam",
    "adamax",
    "adadelta",
]


@pytest.mark.parametrize(
    "name",
    _SWEEP + [pytest.param(n, marks=pytest.mark.slow) for n in _SLOW_SWEEP],
)
def test_every_element_wise_optimizer_matches(name):
    plain, sharded = _run(name, 2, False), _run(name, 2, True)
    t.assert_same_training(plain, sharded, 1e-12)


@pytest.mark.slow
def test_several_steps_per_execution_match():
    runs = [
        t.fit(
            t.model_in(t.strategy(2, shard), OPTIMIZERS["adam"], steps_per_execution=3)
        )
        for shard in (False, True)
    ]
    t.assert_same_training(*runs, 1e-12)


def test_float32_matches_one_device():
    def run(replicas, shard):
        model = t.model_in(
            t.strategy(replicas, shard), OPTIMIZERS["adam"], dtype="float32"
        )
        return t.weights(t.fit(model, dtype="float32"))

    assert t.max_difference(run(1, False), run(4, True)) <= 1e-5


@pytest.mark.parametrize("replicas", [4, pytest.param(2, marks=pytest.mark.slow)])
def test_each_replica_holds_one_piece_of_every_slot(replicas):
    model = _run("adam", replicas, True)
    sizes = [math.prod(v.shape) for v in model.trainable_variables]
    pieces = [math.ceil(n / replicas) for n in sizes]
    slots = [
        v
        for v in model.optimizer.variables
        if v.path.endswith(("momentum", "velocity"))
    ]
    assert len(slots) == 2 * len(sizes)
    held = 0
    for slot in slots:
        copies = slot.value.values  # one copy per replica, each a piece
        assert len(copies) == replicas
        assert {tuple(c.shape) for c in copies} == {(slot.shape[0],)}
        held += slot.shape[0]
    assert held == 2 * sum(pieces)
    assert held <= 2 * (sum(sizes) / replicas + len(sizes))  # 1/N plus padding
    # The copies differ: each replica keeps its own piece, not a replica.
    assert not np.array_equal(*[c.numpy() for c in slots[0].value.values[:2]])


def test_ema_weight_decay_and_clipping_behave_as_unsharded():
    def optimizer():
        return keras.optimizers.SGD(
            0.1,
            momentum=0.9,
            use_ema=True,
            ema_momentum=0.9,
            clipnorm=0.5,
            weight_decay=0.01,
        )

    runs = []
    for shard in (False, True):
        model = t.model_in(t.strategy(2, shard), optimizer)
        runs.append(t.fit(model))
    plain, sharded = runs
    t.assert_same_training(plain, sharded, 1e-12)
    averages = [v for v in sharded.optimizer.variables if v.path.endswith("average")]
    assert [tuple(v.shape) for v in averages] == [
        tuple(w.shape) for w in sharded.trainable_variables
    ]  # EMA stays whole: Keras updates it on whole variables


def test_mixed_precision_loss_scaling_matches_unsharded():
    keras.mixed_precision.set_dtype_policy("mixed_float16")
    try:
        runs = []
        for shard in (False, True):
            strategy = t.strategy(2, shard)
            keras.utils.set_random_seed(1)
            with strategy.scope():
                model = keras.Sequential(
                    [
                        keras.Input((7,)),
                        keras.layers.Dense(5, activation="tanh"),
                        keras.layers.Dense(3, dtype="float32"),
                    ]
                )
                model.compile(keras.optimizers.Adam(0.01), loss="mse")
            assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
            runs.append(t.fit(model, epochs=1, dtype="float32"))
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    plain, sharded = runs
    t.assert_same_training(plain, sharded, 1e-6)


@pytest.mark.parametrize(
    "optimizer, name",
    [
        (lambda: keras.optimizers.Adafactor(0.01), "Adafactor"),
        (lambda: kr.optimizers.Neumann(0.01), "Neumann"),
        (lambda: _MyAdam(0.01), "_MyAdam"),
        (lambda: _MyLARS(0.1), "_MyLARS"),
    ],
)
def test_an_optimizer_that_is_not_element_wise_is_refused_by_name(optimizer, name):
    model = t.model_in(t.strategy(2, True), optimizer)
    with pytest.raises(ValueError, match=rf"Received: optimizer={name}"):
        t.fit(model, epochs=1)


def test_the_option_is_checked():
    with pytest.raises(TypeError, match="shard_weight_update="):
        kr.AllReduceOptions(shard_weight_update="yes")
    assert kr.AllReduceOptions(shard_weight_update=True).shard_weight_update


def test_apply_without_variables_still_counts_the_models_variables():
    """The piece variables' slot aliases exist only while the update traces."""
    strategy = t.strategy(2, True)
    model = t.model_in(strategy, OPTIMIZERS["adam"])
    t.fit(model, epochs=1)
    optimizer = model.optimizer

    @tf.function
    def step():
        def apply():
            grads = [tf.ones_like(v) for v in model.trainable_variables]
            optimizer.apply(grads)  # no variables: Keras counts its index

        strategy.run(apply)

    before = t.weights(model)
    step()
    step()
    assert t.max_difference(before, t.weights(model)) > 0


def test_compressed_wire_keeps_the_sample_count_exact():
    """bf16 cannot hold 257: the count must travel apart from the gradients."""
    x, y = t.data("float32")
    x, y = np.concatenate([x] * 4)[:514], np.concatenate([y] * 4)[:514]
    runs = []
    for shard in (False, True):
        model = t.model_in(
            t.strategy(2, shard, compression="bf16"),
            OPTIMIZERS["sgd_momentum"],
            dtype="float32",
        )
        model.fit(x, y, batch_size=514, epochs=3, verbose=0, shuffle=False)
        runs.append(model)
    t.assert_same_training(*runs, 1e-7)


def test_counts_travel_alone_when_no_bucket_can_carry_them():
    # float16 weights: no float32/float64 bucket carries the sample count, so it
    # is summed on its own, through the same transport, before the buckets.
    def run(replicas, shard):
        model = t.model_in(
            t.strategy(replicas, shard),
            lambda: keras.optimizers.SGD(0.1),
            dtype="float16",
        )
        return t.weights(t.fit(model, epochs=1, dtype="float16"))

    unsharded, sharded = run(2, False), run(2, True)
    assert t.max_difference(unsharded, sharded) == 0.0
