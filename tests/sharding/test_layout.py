"""The piece layout: every element lands in exactly one replica's row, and back."""

import numpy as np
import pytest
import tensorflow as tf

from keras_replicator.sharding import _layout


@pytest.mark.parametrize("replicas", [1, 2, 3, 4])
def test_pack_then_unpack_is_the_identity_and_rows_hold_the_pieces(replicas):
    shapes = [(7, 5), (5,), (1,), (2, 3, 2), (), (0,)]
    tensors = [tf.reshape(tf.range(np.prod(s), dtype=tf.float64), s) for s in shapes]
    layout = _layout.Layout(shapes, replicas, extra_columns=1)
    matrix = layout.pack(tensors, extra=[tf.constant(3.0)])
    assert matrix.shape == (replicas, layout.row_length)
    for r in range(replicas):
        pieces, extra = layout.split_row(matrix[r])
        assert extra.numpy().tolist() == [3.0]
        for i, (piece, tensor) in enumerate(zip(pieces, tensors)):
            expected = layout.piece_of(tensor, i, r)
            np.testing.assert_array_equal(piece, expected)
    for back, tensor in zip(layout.unpack(matrix), tensors):
        np.testing.assert_array_equal(back, tensor)
    # Padding: at most replicas - 1 elements per variable (an empty one: 1 row).
    for length, shape in zip(layout.lengths, shapes):
        size = int(np.prod(shape))
        padding = length * replicas - size
        assert 0 <= padding <= (replicas - 1 if size else replicas)
