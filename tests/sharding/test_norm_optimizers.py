"""LARS and Lamb sharded: per-variable norms summed over the pieces (issue 24).

Their trust ratios need whole-variable norms; sharded, each replica's sums of
squares are all-reduced. Compared with the unsharded run (float64, 20 steps,
uneven last batch) and, for the halves mirrored from Keras' Lamb, with Keras'
own `update_step`.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_replicator as kr
from keras_replicator import _compat
from tests.sharding import _training as t

OPTIMIZERS = {
    "lars": lambda: kr.optimizers.LARS(0.5, momentum=0.9, weight_decay=1e-3, eeta=0.01),
    "lars_nesterov": lambda: kr.optimizers.LARS(
        0.5, momentum=0.9, nesterov=True, eeta=0.01
    ),
    "lars_no_momentum_kernels_excluded": lambda: kr.optimizers.LARS(
        0.5, momentum=0.0, exclude_from_layer_adaptation=["kernel$"]
    ),
    "lamb": lambda: keras.optimizers.Lamb(0.01, weight_decay=0.01),
    "adam_global_clipnorm": lambda: keras.optimizers.Adam(0.01, global_clipnorm=0.1),
}


@pytest.mark.parametrize(
    "name, replicas",
    [
        ("lars", 2),
        pytest.param(
            "lamb",
            2,
            marks=pytest.mark.slow(
                reason="covered in the default run by: the same test [lars-2]"
            ),
        ),
        pytest.param("lars", 4, marks=pytest.mark.slow),
        pytest.param("lamb", 4, marks=pytest.mark.slow),
    ],
)
def test_norm_optimizers_sharded_equal_unsharded(name, replicas):
    runs = [
        t.fit(t.model_in(t.strategy(replicas, shard), OPTIMIZERS[name]))
        for shard in (False, True)
    ]
    t.assert_same_training(*runs, 1e-12)


@pytest.mark.parametrize(
    "name",
    ["lars_nesterov", "lars_no_momentum_kernels_excluded", "adam_global_clipnorm"],
)
@pytest.mark.slow
def test_variants_sharded_equal_unsharded(name):
    runs = [
        t.fit(t.model_in(t.strategy(2, shard), OPTIMIZERS[name]))
        for shard in (False, True)
    ]
    t.assert_same_training(*runs, 1e-12)


@pytest.mark.slow
def test_lars_trust_ratios_are_those_of_the_whole_variables():
    runs = [
        t.fit(t.model_in(t.strategy(4, shard), OPTIMIZERS["lars"]), epochs=1)
        for shard in (False, True)
    ]
    plain, sharded = (
        [v.numpy() for v in r.optimizer.trust_ratios.values()] for r in runs
    )
    np.testing.assert_allclose(sharded, plain, rtol=1e-6)
    assert np.any(np.abs(np.asarray(sharded) - 1.0) > 1e-3)  # LARS is at work


def test_lamb_halves_equal_keras_lamb_on_one_variable():
    """The mirrored halves, run on a whole variable, are Keras' own step."""
    rng = np.random.default_rng(3)
    start = rng.normal(size=(4, 3))
    gradients = [rng.normal(size=(4, 3)) for _ in range(3)]
    results = []
    for mirrored in (False, True):
        variable = keras.Variable(start, dtype="float64")
        optimizer = keras.optimizers.Lamb(0.05)
        optimizer.build([variable])
        for g in gradients:
            g = tf.constant(g)
            if mirrored:
                squares, update = _compat.lamb.partial_squares(optimizer, g, variable)
                _compat.lamb.finish(optimizer, g, variable, 0.05, squares, update)
            else:
                optimizer.update_step(g, variable, 0.05)
            optimizer.iterations.assign_add(1)
        results.append(variable.numpy())
    np.testing.assert_allclose(results[1], results[0], rtol=1e-14, atol=1e-15)


class _ElementWiseOptIn(keras.optimizers.SGD):
    """A user's optimizer opting in with the two halves (docs' recipe)."""

    def sharded_partial_squares(self, gradient, variable):
        return keras.ops.zeros([0], variable.dtype), None

    def sharded_finish(self, gradient, variable, learning_rate, squares, state):
        self.update_step(gradient, variable, learning_rate)


def _opt_in():
    return _ElementWiseOptIn(0.1, 0.9, name="opt_in")


def test_an_optimizer_opting_in_with_the_two_halves_shards():
    runs = [t.fit(t.model_in(t.strategy(2, shard), _opt_in)) for shard in (False, True)]
    t.assert_same_training(*runs, 1e-12)
    assert len(runs[1].optimizer.variables[2].value.values[0].numpy()) == 18  # 35/2
