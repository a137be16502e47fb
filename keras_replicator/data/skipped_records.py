"""`SkippedRecords`: how many bad records `image_pipeline(on_error="skip")` dropped.

tf.data's `ignore_errors` drops an element whose map raised and logs a warning,
but counts nothing, and a decode error cannot be caught inside the graph. So the
count is a difference: one host variable counts the records entering the check,
another those leaving `ignore_errors`; both are incremented by small sequential
graph-only maps around it (no Python per record). `count` is exact once the
pipeline has passed over the data (with the default `cache=True`, after the first
epoch: later epochs read the cache, which holds only good records, and count
nothing); while records are in flight between the two maps it may be ahead by up
to the parallel check's buffer. Host variables cannot travel to tf.data service
workers, so it is refused there (their logs name each skipped record).
"""

from __future__ import annotations

import tensorflow as tf


class SkippedRecords:
    """Counts the records an `image_pipeline(on_error="skip")` dropped.

    Pass one as `skipped=` and read `count` (or `checked`, the records checked)
    after a pass over the data.

    Example:
    >>> from keras_replicator.data import SkippedRecords
    >>> skipped = SkippedRecords()
    >>> skipped.count, skipped.checked
    (0, 0)
    """

    def __init__(self):
        with tf.init_scope(), tf.device("/cpu:0"):
            self._checked = tf.Variable(0, dtype=tf.int64, trainable=False)
            self._kept = tf.Variable(0, dtype=tf.int64, trainable=False)

    @property
    def count(self) -> int:
        """Records dropped so far."""
        return int(self._checked.numpy() - self._kept.numpy())

    @property
    def checked(self) -> int:
        """Records checked so far (kept + dropped)."""
        return int(self._checked.numpy())

    def count_checked(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """`dataset`, counting each element that passes into the check."""
        return dataset.map(lambda *element: _counted(self._checked, element))

    def count_kept(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """`dataset`, counting each element that survived the check."""
        return dataset.map(lambda *element: _counted(self._kept, element))

    def __repr__(self) -> str:
        return f"SkippedRecords(count={self.count}, checked={self.checked})"


def _counted(variable, element):
    with tf.control_dependencies([variable.assign_add(1)]):
        return tuple(tf.identity(part) for part in element)
