"""Exact values of every `keras_replicator.replica` collective.

4 replicas on logical CPUs (replica i contributes values built from i) and 2 worker
processes on 127.0.0.1; groups of 2 and non-zero broadcast sources included.
"""

import json
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import keras_replicator as kr
from keras_replicator import replica
from keras_replicator.launch import run_workers

# name -> (function of the float replica index i, expected per replica for n=4)
CASES = {
    "replica_id": (lambda i: tf.cast(replica.replica_id(), tf.float32), [0, 1, 2, 3]),
    "num_replicas": (lambda i: tf.constant(float(replica.num_replicas())), [4] * 4),
    "sum": (lambda i: replica.all_reduce(i + 1), [10] * 4),
    "mean_op": (
        lambda i: replica.all_reduce(i + 1, tf.distribute.ReduceOp.MEAN),
        [2.5] * 4,
    ),
    "max": (lambda i: replica.all_reduce(i, "max"), [3] * 4),
    "min_g2": (lambda i: replica.all_reduce(i, "min", group_size=2), [0, 0, 2, 2]),
    "mean_g2": (
        lambda i: replica.all_reduce(i + 1, "mean", group_size=2),
        [1.5, 1.5, 3.5, 3.5],
    ),
    "sum_g1": (lambda i: replica.all_reduce(i, group_size=1), [0, 1, 2, 3]),
    "gather": (lambda i: replica.all_gather(tf.reshape(i, [1])), [[0, 1, 2, 3]] * 4),
    "gather_axis1": (
        lambda i: replica.all_gather(tf.reshape(i, [1, 1]), axis=1),
        [[[0, 1, 2, 3]]] * 4,
    ),
    "gather_g2": (
        lambda i: replica.all_gather(tf.reshape(i, [1]), group_size=2),
        [[0, 1], [0, 1], [2, 3], [2, 3]],
    ),
    "broadcast_0": (lambda i: replica.broadcast(i), [0] * 4),
    "broadcast_2": (lambda i: replica.broadcast(i, source=2), [2] * 4),
    "broadcast_g2_1": (
        lambda i: replica.broadcast(i, source=1, group_size=2),
        [1, 1, 3, 3],
    ),
    "reduce_scatter": (
        lambda i: replica.reduce_scatter(tf.range(4.0) + i),
        [[6], [10], [14], [18]],
    ),
    "reduce_scatter_g2": (
        lambda i: replica.reduce_scatter(tf.range(4.0) + i, "max", group_size=2),
        [[1, 2], [3, 4], [3, 4], [5, 6]],
    ),
    "all_to_all": (
        lambda i: replica.all_to_all(tf.range(4.0) + 10 * i),
        [[0, 10, 20, 30], [1, 11, 21, 31], [2, 12, 22, 32], [3, 13, 23, 33]],
    ),
    "all_to_all_g2": (
        lambda i: replica.all_to_all(tf.range(2.0) + 10 * i, group_size=2),
        [[0, 10], [1, 11], [20, 30], [21, 31]],
    ),
    "all_gather_bfloat16_g2": (  # travels as float32 (no bfloat16 gather kernel)
        lambda i: tf.cast(
            replica.all_gather(tf.cast([i + 0.5], tf.bfloat16), group_size=2),
            tf.float32,
        ),
        [[0.5, 1.5], [0.5, 1.5], [2.5, 3.5], [2.5, 3.5]],
    ),
    "permute": (lambda i: replica.permute(i), [3, 0, 1, 2]),
    "permute_shift2": (lambda i: replica.permute(i, shift=2), [2, 3, 0, 1]),
    "permute_g2": (lambda i: replica.permute(i, group_size=2), [1, 0, 3, 2]),
}


@pytest.fixture(scope="module")
def strategy():
    return kr.MultiDeviceReplicator(num_replicas=4)


def _per_replica(strategy, function):
    @tf.function
    def step():
        def replica_fn():
            return function(tf.cast(replica.replica_id(), tf.float32))

        return strategy.experimental_local_results(strategy.run(replica_fn))

    return [np.asarray(v).tolist() for v in step()]


@pytest.mark.parametrize("name", sorted(CASES))
def test_collective_values_on_4_replicas(strategy, name):
    function, expected = CASES[name]
    assert _per_replica(strategy, function) == expected


def test_collectives_are_differentiable(strategy):
    @tf.function
    def step():
        def replica_fn():
            i = tf.cast(replica.replica_id(), tf.float32)
            x = i + 1
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = replica.all_reduce(x * x, "sum", group_size=2)
            return tape.gradient(y, x)

        return strategy.experimental_local_results(strategy.run(replica_fn))

    # Each replica's y sums x_j^2 over its group of 2, so x_i reaches 2 replicas'
    # outputs: the total derivative is 2 * 2 * x_i.
    grads = [float(g) for g in step()]
    assert grads == [4.0, 8.0, 12.0, 16.0]


def test_one_replica_outside_any_strategy():
    assert replica.num_replicas() == 1
    assert float(replica.broadcast(tf.constant(5.0))) == 5.0
    assert replica.all_gather(tf.constant([1.0])).numpy().tolist() == [1.0]


def test_cross_replica_context_is_a_clear_error(strategy):
    with strategy.scope():
        with pytest.raises(RuntimeError, match="must be called inside a replica"):
            replica.all_reduce(tf.constant(1.0))


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: replica.all_reduce(1.0, group_size=3), ValueError, "group_size=3"),
        (lambda: replica.all_reduce(1.0, op="prod"), ValueError, "op='prod'"),
        (lambda: replica.broadcast(1.0, source=4), ValueError, "source=4"),
        (lambda: replica.permute(1.0, shift=0.5), TypeError, "shift=0.5"),
        (lambda: replica.all_gather(tf.constant(1.0)), ValueError, "scalar"),
        (
            lambda: replica.reduce_scatter(tf.zeros([3])),
            ValueError,
            "4 equal slices",
        ),
    ],
)
def test_bad_arguments_name_themselves(strategy, call, error, match):
    with pytest.raises(error, match=match):
        strategy.run(tf.function(call))


WORKER_SCRIPT = textwrap.dedent(
    """
    import json, os
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf
    import keras_replicator as kr
    from keras_replicator import replica
    strategy = kr.MultiWorkerReplicator(collective_timeout=60)
    cases = {
        "sum": lambda i: replica.all_reduce(i + 1),
        "max": lambda i: replica.all_reduce(i, "max"),
        "gather": lambda i: replica.all_gather(tf.reshape(i, [1])),
        "broadcast_1": lambda i: replica.broadcast(i + 5, source=1),
        "reduce_scatter": lambda i: replica.reduce_scatter(tf.range(2.0) + i),
        "all_to_all": lambda i: replica.all_to_all(tf.range(2.0) + 10 * i),
        "permute": lambda i: replica.permute(i),
        "sum_g1": lambda i: replica.all_reduce(i, group_size=1),
    }
    out = {}
    for name, function in cases.items():
        @tf.function
        def step():
            def replica_fn():
                return function(tf.cast(replica.replica_id(), tf.float32))
            return strategy.experimental_local_results(strategy.run(replica_fn))[0]
        out[name] = step().numpy().tolist()
    print("RESULT " + json.dumps(out))
    """
)


@pytest.mark.slow(
    reason="covered in the default run by: "
    "test_collective_values_on_4_replicas (the same collectives); "
    "tests/testing/test_conformance.py::test_multi_worker_strategy_passes"
)
@pytest.mark.multi_worker
@pytest.mark.timeout(300)
def test_collective_values_on_2_workers():
    result = run_workers([sys.executable, "-c", WORKER_SCRIPT], 2, timeout=240)
    assert result.ok, result.describe_failure()
    expected = [
        {
            "sum": 3,
            "max": 1,
            "gather": [0, 1],
            "broadcast_1": 6,
            "reduce_scatter": [1],
            "all_to_all": [0, 10],
            "permute": 1,
            "sum_g1": 0,
        },
        {
            "sum": 3,
            "max": 1,
            "gather": [0, 1],
            "broadcast_1": 6,
            "reduce_scatter": [3],
            "all_to_all": [1, 11],
            "permute": 0,
            "sum_g1": 1,
        },
    ]
    for worker, want in zip(result.workers, expected):
        line = next(x for x in worker.output.splitlines() if x.startswith("RESULT "))
        assert json.loads(line[len("RESULT ") :]) == want


def test_replica_dependent_branch_is_a_clear_error(strategy):
    @tf.function
    def step():
        def replica_fn():
            return tf.cond(
                replica.replica_id() == 0,
                lambda: replica.all_reduce(tf.constant(1.0)),
                lambda: tf.constant(0.0),
            )

        return strategy.run(replica_fn)

    with pytest.raises(RuntimeError, match="must be called by every replica"):
        step()


MISMATCH_SCRIPT = textwrap.dedent(
    """
    import os, time
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf
    import keras_replicator as kr
    from keras_replicator import replica
    strategy = kr.MultiWorkerReplicator(collective_timeout=5)
    worker = int(os.environ["KERAS_REPLICATOR_WORKER_INDEX"])

    @tf.function
    def step():
        def replica_fn():
            if worker == 0:  # worker 1 skips the collective
                return replica.all_reduce(tf.constant(1.0))
            return tf.constant(0.0)
        return strategy.experimental_local_results(strategy.run(replica_fn))[0]

    start = time.time()
    try:
        step()
        print("NO ERROR")
    except tf.errors.DeadlineExceededError as error:
        print("TIMED OUT", round(time.time() - start))
    if worker == 1:
        time.sleep(15)  # stay alive: the failure must come from the timeout
    """
)


@pytest.mark.slow(
    reason="covered in the default run by: strategies/test_multi_worker.py::"
    "test_a_dead_peer_is_an_error_not_a_hang"
)
@pytest.mark.multi_worker
@pytest.mark.timeout(300)
def test_a_skipped_collective_times_out_instead_of_hanging():
    result = run_workers([sys.executable, "-c", MISMATCH_SCRIPT], 2, timeout=240)
    waiting = result.workers[0].output
    line = next(x for x in waiting.splitlines() if x.startswith(("TIMED OUT", "NO")))
    assert line.startswith("TIMED OUT"), waiting[-3000:]
    assert int(line.split()[-1]) < 15


def test_module_docstring_example_is_code_only():
    # It runs outside any strategy (one replica) in tests/test_docstring_examples.py.
    example = replica.__doc__.split("Example:")[1]
    assert all(
        line.startswith((">>>", "...", "(")) for line in example.split("\n")[1:-1]
    )
