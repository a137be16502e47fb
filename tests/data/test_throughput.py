"""`measure_pipeline` times delivered batches, without a model (fast)."""

import time

import pytest
import tensorflow as tf

from keras_replicator.data import measure_pipeline


def test_rate_follows_a_known_per_batch_delay():
    def slow(i):
        time.sleep(0.01)
        return i

    dataset = tf.data.Dataset.range(100).map(
        lambda i: tf.py_function(slow, [i], tf.int64)
    )
    dataset = dataset.batch(1).map(lambda b: tf.reshape(b, [1]))
    result = measure_pipeline(dataset, num_batches=20, warmup=2)
    assert 40 < result.batches_per_second < 101  # one batch per >= 10 ms
    assert result.examples_per_second == pytest.approx(result.batches_per_second)


def test_counts_examples_from_the_leading_dimension():
    dataset = tf.data.Dataset.range(1000).batch(8)
    result = measure_pipeline(dataset, num_batches=10, warmup=1)
    assert result.examples_per_second == pytest.approx(8 * result.batches_per_second)


def test_a_short_dataset_is_a_clear_error():
    with pytest.raises(ValueError, match="ended after 5 batches"):
        measure_pipeline(tf.data.Dataset.range(5), num_batches=10, warmup=1)
    with pytest.raises(ValueError, match="num_batches"):
        measure_pipeline(tf.data.Dataset.range(5), num_batches=0)
