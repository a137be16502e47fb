import numpy as np
import tensorflow as tf

from keras_replicator.pipeline import _microbatch, _schedule


def test_uneven_split_and_join_round_trip():
    x = tf.reshape(tf.range(14.0), (7, 2))
    pieces = _microbatch.split(x, 3)
    assert [int(p.shape[0]) for p in pieces] == [3, 2, 2]
    np.testing.assert_array_equal(_microbatch.join(pieces), x)


def test_split_with_an_unknown_batch_size():
    @tf.function(input_signature=[tf.TensorSpec([None, 2])])
    def sizes(x):
        return tf.stack([tf.shape(p)[0] for p in _microbatch.split(x, 4)])

    assert sizes(tf.zeros([6, 2])).numpy().tolist() == [2, 2, 1, 1]


def test_fill_drain_takes_m_plus_k_minus_one_clocks():
    clocks = _schedule.clock_cycles(4, 2)
    assert len(clocks) == 5
    assert sorted(t for c in clocks for t in c) == [
        (i, k) for i in range(4) for k in range(2)
    ]
