"""What `fit` iterates: plain tf.data with one replica per worker (issue 36).

The distributed iterator costs every step (its own threads, a partial-batch cond,
an end-of-data all-reduce across workers); with one replica per worker the replica
is fed the way a plain Keras step is, and the numbers stay one device's.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_replicator as kr
from keras_replicator.keras_integration import _fit_input
from keras_replicator.launch import launch_function

TOLERANCE = 1e-10
SAMPLES = 1001  # the last global batch (233) splits unevenly over 2 workers
BATCH = 256


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(SAMPLES, 5)), rng.normal(size=(SAMPLES, 1))


def _model():
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(4, activation="tanh"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(keras.optimizers.SGD(0.1), "mse", metrics=["mae"])
    return model


def _record_iterators(model, seen):
    """Wraps the compiled train and test functions to record what they are fed."""
    model.make_train_function()
    model.make_test_function()
    train, test = model.train_function, model.test_function

    def record_train(iterator):
        seen.append(type(iterator))
        return train(iterator)

    def record_test(iterator):
        seen.append(type(iterator))
        return test(iterator)

    model.train_function, model.test_function = record_train, record_test


def _fed_plainly(seen) -> bool:
    return all(
        issubclass(kind, tf.data.Iterator)
        and not issubclass(kind, tf.distribute.DistributedIterator)
        for kind in seen
    )


def _fit(strategy, seen=None, epochs=2):
    x, y = _data()
    if strategy is None:
        model = _model()
    else:
        with strategy.scope():
            model = _model()
    if seen is not None:
        _record_iterators(model, seen)
    history = model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        validation_data=(x[:300], y[:300]),
    )
    return model, history.history


def test_one_replica_iterates_the_dataset_itself():
    seen = []
    _fit(kr.MultiDeviceReplicator(num_replicas=1), seen, epochs=1)
    assert seen and _fed_plainly(seen), seen


def test_two_replicas_keep_the_distributed_iterator():
    seen = []
    _fit(kr.MultiDeviceReplicator(num_replicas=2), seen, epochs=1)
    assert seen and not any(_fed_plainly([kind]) for kind in seen), seen


def _options(policy):
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    return options


@pytest.fixture
def record_files(tmp_path):
    paths = []
    for index, count in enumerate((3, 1)):
        path = str(tmp_path / f"part-{index}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for value in range(count):
                writer.write(str(value).encode())
        paths.append(path)
    return paths


def test_which_pipelines_give_every_worker_the_same_batch_count(record_files):
    policy = tf.data.experimental.AutoShardPolicy
    data = tf.data.Dataset.range(10).batch(4)
    files = tf.data.TFRecordDataset(record_files).batch(2)
    # Sharding by data: one (maybe empty) batch per global batch on every worker.
    assert _fit_input.same_batch_count_on_every_worker(data)
    assert _fit_input.same_batch_count_on_every_worker(data.repeat())
    assert _fit_input.same_batch_count_on_every_worker(
        data.with_options(_options(policy.DATA))
    )
    # A file reader: `AUTO` shards by files, whose batch counts may differ...
    files = files.apply(tf.data.experimental.assert_cardinality(2))
    assert not _fit_input.same_batch_count_on_every_worker(files)
    # ... also when the reader sits inside an `interleave` function.
    nested = tf.data.Dataset.from_tensor_slices(record_files).interleave(
        tf.data.TFRecordDataset
    )
    nested = nested.batch(2).apply(tf.data.experimental.assert_cardinality(2))
    assert not _fit_input.same_batch_count_on_every_worker(nested)
    assert _fit_input.same_batch_count_on_every_worker(
        files.with_options(_options(policy.DATA))
    )
    # `OFF`: the pipeline shards itself, maybe unevenly; FILE and HINT likewise.
    for each in (policy.OFF, policy.FILE, policy.HINT):
        assert not _fit_input.same_batch_count_on_every_worker(
            data.with_options(_options(each))
        )
    # A dataset Keras built from arrays reads no files: its graph is not read.
    assert _fit_input.same_batch_count_on_every_worker(files, may_read_files=False)
    # An unknown length may differ between workers (an unseeded filter).
    assert not _fit_input.same_batch_count_on_every_worker(data.filter(lambda b: True))


def _fit_on_a_worker(initial, record_files):
    """Per worker: fit + validation on arrays (plain feed), then on files (TF's)."""
    import keras

    import keras_replicator as kr

    keras.backend.set_floatx("float64")
    strategy = kr.MultiWorkerReplicator(collective_timeout=30)
    seen = []
    with strategy.scope():
        model = _model()
    model.set_weights(initial)
    _record_iterators(model, seen)
    x, y = _data()
    history = model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=2,
        shuffle=False,
        verbose=0,
        validation_data=(x[:300], y[:300]),
    )
    parse = lambda r: (  # noqa: E731
        tf.strings.to_number(r, tf.float64)[None],
        tf.zeros([1], tf.float64),
    )
    files = tf.data.TFRecordDataset(record_files).map(parse).batch(2)
    return {
        "weights": model.get_weights(),
        "history": history.history,
        "plain": _fed_plainly(seen) and bool(seen),
        "files_distributed": _files_fit_is_distributed(strategy, files),
    }


def _files_fit_is_distributed(strategy, files):
    seen = []
    with strategy.scope():
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.1), "mse")
    _record_iterators(model, seen)
    model.fit(files, epochs=1, verbose=0)
    return bool(seen) and not any(_fed_plainly([kind]) for kind in seen)


@pytest.mark.slow(
    reason="covered in the default run by: "
    "test_one_replica_iterates_the_dataset_itself, "
    "test_which_pipelines_give_every_worker_the_same_batch_count; "
    "tests/testing/test_conformance.py::test_multi_worker_strategy_passes "
    "(2 workers of one replica each, fed plainly)"
)
@pytest.mark.multi_worker
@pytest.mark.timeout(300)
def test_two_workers_fed_plainly_match_one_device(float64, record_files):
    initial = _model().get_weights()
    chief, other = launch_function(
        _fit_on_a_worker, 2, args=(initial, record_files), echo=False, timeout=240
    )
    one, history = _fit(None)
    assert chief["plain"] and other["plain"]
    for a, b in zip(chief["weights"], one.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=TOLERANCE)
    for a, b in zip(chief["weights"], other["weights"]):
        np.testing.assert_array_equal(a, b)
    for name, values in history.items():
        np.testing.assert_allclose(chief["history"][name], values, rtol=1e-9)
        assert chief["history"][name] == other["history"][name]
    # Files sharded by file may end at different steps: TF's iterator stays.
    assert chief["files_distributed"] and other["files_distributed"]


def test_a_length_keras_knows_counts_as_known():
    # Keras' array datasets have an unknown `cardinality()`; their adapter knows.
    unknown = tf.data.Dataset.range(10).batch(4).filter(lambda b: True)
    assert _fit_input.same_batch_count_on_every_worker(unknown, num_batches=3)
