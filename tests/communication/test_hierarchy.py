"""Hierarchical all-reduce: both grid schemes are transparent on 4 logical CPUs.

The 4 replicas of a `MultiDeviceReplicator` form a 2 x 2 grid with
`group_size=2` (rows {0, 1} and {2, 3}, columns {0, 2} and {1, 3}), so every
native sub-group collective of the hierarchy runs; the multi-worker form is in
test_hierarchy_multi_worker.py.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_replicator as kr
from keras_replicator.communication import _hierarchy, _strategy_transport


def _model(steps_per_execution=1):
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(16, activation="tanh"),
            keras.layers.Dense(3),
        ]
    )
    model.compile(
        keras.optimizers.SGD(0.1, momentum=0.9),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=steps_per_execution,
    )
    return model


def _train(strategy, initial, steps_per_execution=1):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(300, 6)), rng.integers(0, 3, 300)
    with strategy.scope():
        model = _model(steps_per_execution)
    model.set_weights(initial)
    # 300 samples at batch 64: an uneven last batch (44 = 4 x 11).
    model.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
    return model.get_weights()


def _one_device_and(options, steps_per_execution=1):
    keras.utils.set_random_seed(0)
    initial = _model().get_weights()
    expected = _train(tf.distribute.get_strategy(), initial)
    strategy = kr.MultiDeviceReplicator(num_replicas=4, all_reduce=options)
    return expected, _train(strategy, initial, steps_per_execution)


# bucket_mb=0.0005: several buckets a step, each its own chain of sub-group ops;
# steps_per_execution=3: the collectives inside Keras' multi-step loop body.
@pytest.mark.parametrize(
    "options, steps_per_execution",
    [
        (kr.AllReduceOptions(hierarchy="local_then_global", group_size=2), 1),
        (kr.AllReduceOptions(hierarchy="2d", group_size=2, bucket_mb=0.0005), 3),
    ],
    ids=["local_then_global-2x2", "2d-2x2-buckets-loop"],
)
def test_hierarchies_train_to_the_one_device_weights_float64(
    float64, options, steps_per_execution
):
    expected, got = _one_device_and(options, steps_per_execution)
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12)


@pytest.mark.slow(
    reason="covered in the default run by: the same hierarchies in float64"
)
@pytest.mark.parametrize(
    "options",
    [
        kr.AllReduceOptions(hierarchy="local_then_global", group_size=2),
        kr.AllReduceOptions(hierarchy="2d", group_size=2),
    ],
    ids=["local_then_global-2x2", "2d-2x2"],
)
def test_hierarchies_train_to_the_one_device_weights_float32(options):
    expected, got = _one_device_and(options)
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_hierarchy_composes_with_fp16_wire():
    options = kr.AllReduceOptions(hierarchy="2d", group_size=2, compression="fp16")
    expected, got = _one_device_and(options)
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, atol=2e-3 * np.max(np.abs(e)))


@pytest.mark.parametrize("hierarchy", ["local_then_global", "2d"])
@pytest.mark.parametrize("group_size", [1, 2, 4])
def test_sum_over_replicas_is_the_sum_on_every_replica(hierarchy, group_size):
    strategy = kr.MultiDeviceReplicator(num_replicas=4)
    keys = _strategy_transport.transport_for(strategy).collective_keys

    @tf.function
    def step():
        def replica_fn():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            # 7 elements: padded to a multiple of the row for the 2-D scatter.
            x = tf.range(7, dtype=tf.float64) * tf.cast(r + 1, tf.float64) ** 2
            return _hierarchy.sum_over_replicas(
                x, hierarchy, group_size, timeout=60, keys=keys
            )

        return strategy.run(replica_fn)

    expected = np.arange(7) * sum((r + 1) ** 2 for r in range(4))
    for value in strategy.experimental_local_results(step()):
        np.testing.assert_array_equal(value.numpy(), expected)


def test_reduce_scatter_over_replicas_leaves_row_r_of_the_sum_on_replica_r():
    # On CPUs the scatter itself is the all-reduce-and-slice fallback (no CPU
    # kernel), so this runs the rest: keys, tokens, the gather of replica ids
    # in rank order and the permutation of rows (the GPU graph is checked in
    # tests/strategies/test_gpu_paths.py).
    strategy = kr.MultiDeviceReplicator(num_replicas=4)
    keys = _strategy_transport.transport_for(strategy).collective_keys

    @tf.function
    def step():
        def replica_fn():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            matrix = tf.reshape(tf.range(12, dtype=tf.float32), [4, 3])
            matrix = matrix * tf.cast(r + 1, tf.float32)
            return _hierarchy.reduce_scatter_over_replicas(
                matrix, timeout=60, keys=keys
            )

        return strategy.run(replica_fn)

    expected = np.arange(12).reshape(4, 3) * sum(r + 1 for r in range(4))
    for r, value in enumerate(strategy.experimental_local_results(step())):
        np.testing.assert_array_equal(value.numpy(), expected[r])


def test_group_size_that_is_not_a_grid_fails_at_the_first_step():
    options = kr.AllReduceOptions(hierarchy="2d", group_size=3)
    strategy = kr.MultiDeviceReplicator(num_replicas=4, all_reduce=options)
    with strategy.scope():
        model = _model()
    with pytest.raises(ValueError, match="`group_size` must divide the 4 replicas"):
        model.fit(np.zeros((8, 6)), np.zeros(8), batch_size=8, verbose=0)


def test_bad_combinations_name_the_field():
    with pytest.raises(ValueError, match="`group_size` only shapes"):
        kr.AllReduceOptions(group_size=2)
    with pytest.raises(ValueError, match="`group_size` needs transport='collective'"):
        kr.AllReduceOptions(hierarchy="2d", group_size=2, transport="socket")
    # Rows found from the machines: the socket ring's rows and columns.
    assert kr.AllReduceOptions(hierarchy="2d", transport="socket").group_size is None


def test_tpu_replicator_rejects_a_hierarchy_before_connecting():
    with pytest.raises(ValueError, match="`hierarchy` must be None on a TPU"):
        kr.TPUReplicator(all_reduce=kr.AllReduceOptions(hierarchy="2d"))
