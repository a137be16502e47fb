"""Which elements of each variable a replica owns, and the buffer that carries them.

Each variable of `n` elements is padded to `N * L` with `L = ceil(n / N)` and cut
into `N` consecutive pieces; replica `r` owns piece `r` of *every* variable. A
bucket of variables travels as one `[N, C]` matrix whose row `r` is piece `r` of
each member, side by side (`C = sum(L)` plus any exact scalars). A reduce-scatter
of the flattened matrix that leaves chunk `r` on replica `r` therefore hands each
replica exactly its pieces, summed; an all-gather of the rows rebuilds the matrix.

Per-variable pieces (rather than one contiguous cut of the bucket) keep every
optimizer slot the shape of one variable's piece, so a slot belongs to one
variable as it does unsharded, the saved state can be gathered variable by
variable, and an optimizer that needs a per-variable quantity can find its piece.
The cost is at most `N - 1` padding elements per variable.
"""

from __future__ import annotations

import math

import tensorflow as tf


def piece_length(num_elements: int, num_replicas: int) -> int:
    """Elements of one replica's piece of a variable (the last may be padding).

    Example:
    >>> piece_length(10, 4)
    3
    """
    return max(1, math.ceil(num_elements / num_replicas))


class Layout:
    """The piece layout of one bucket of same-dtype tensors over `num_replicas`.

    Args:
        shapes: The members' static shapes, in bucket order.
        num_replicas: The number of replicas sharing the update.
        extra_columns: Scalars appended to every row (sample counts that every
            replica needs summed, not sliced). Defaults to 0.

    Example:
    >>> import tensorflow as tf
    >>> layout = Layout([(3,), (2, 2)], num_replicas=2)
    >>> layout.lengths, layout.row_length
    ([2, 2], 4)
    >>> matrix = layout.pack([tf.constant([1., 2, 3]), tf.ones((2, 2))])
    >>> matrix.numpy().tolist()
    [[1.0, 2.0, 1.0, 1.0], [3.0, 0.0, 1.0, 1.0]]
    >>> [t.shape.as_list() for t in layout.unpack(matrix)]
    [[3], [2, 2]]
    """

    def __init__(self, shapes, num_replicas: int, extra_columns: int = 0):
        self.shapes = [tuple(tf.TensorShape(s).as_list()) for s in shapes]
        self.num_replicas = num_replicas
        self.sizes = [math.prod(s) for s in self.shapes]
        self.lengths = [piece_length(n, num_replicas) for n in self.sizes]
        self.extra_columns = extra_columns
        self.row_length = sum(self.lengths) + extra_columns

    def with_extra_columns(self, count: int) -> Layout:
        """The same layout with `count` scalars appended to every row."""
        return Layout(self.shapes, self.num_replicas, count)

    def rows_of(self, tensor, index: int) -> tf.Tensor:
        """Member `index` as `[N, L]`: padded with zeros, one piece per row."""
        flat = tf.reshape(tensor, [-1])
        padding = self.num_replicas * self.lengths[index] - self.sizes[index]
        if padding:
            flat = tf.concat([flat, tf.zeros([padding], flat.dtype)], axis=0)
        return tf.reshape(flat, [self.num_replicas, self.lengths[index]])

    def pack(self, tensors, extra=()) -> tf.Tensor:
        """The `[N, C]` matrix of `tensors`; `extra` scalars repeated in every row."""
        columns = [self.rows_of(t, i) for i, t in enumerate(tensors)]
        if extra:
            row = tf.stack([tf.cast(e, columns[0].dtype) for e in extra])
            columns.append(tf.tile(row[None, :], [self.num_replicas, 1]))
        if len(columns) == 1:
            return columns[0]
        return tf.concat(columns, axis=1)

    def split_row(self, row):
        """A replica's row as `(pieces, extra)`: one 1-D piece per member."""
        parts = tf.split(row, self.lengths + [self.extra_columns], axis=-1)
        return parts[:-1], parts[-1]

    def piece_of(self, tensor, index: int, replica) -> tf.Tensor:
        """Replica `replica`'s piece (1-D, length `L`) of member `index`."""
        return tf.gather(self.rows_of(tensor, index), replica)

    def unpack(self, matrix) -> list[tf.Tensor]:
        """The members rebuilt from an `[N, C - extra]` (or `[N, C]`) matrix."""
        columns = tf.split(matrix[:, : sum(self.lengths)], self.lengths, axis=1)
        return [
            tf.reshape(tf.reshape(c, [-1])[:size], shape)
            for c, size, shape in zip(columns, self.sizes, self.shapes)
        ]
