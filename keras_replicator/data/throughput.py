"""`measure_pipeline`: how many batches per second an input pipeline delivers.

Whether a pipeline can keep replicas busy is a comparison of two rates: what it
delivers alone, and what training consumes. This measures the first with no model
attached: it pulls batches as fast as they come (`warmup` batches first, so
autotuning, file opening and the first cache fill are not counted; for a cached
training pipeline use `warmup` of at least one epoch to time the cached steady
state). Hand-written because tf.data's own statistics are not public API; the
`tf.data` benchmark utilities time the same way.
"""

from __future__ import annotations

import dataclasses
import time

import tensorflow as tf

from keras_replicator._arguments import check_int


@dataclasses.dataclass(frozen=True)
class PipelineThroughput:
    """Delivered rate of an input pipeline.

    Attributes:
        batches_per_second: Batches delivered per second after warm-up.
        examples_per_second: Examples (leading dimension of the first tensor)
            per second.
        num_batches: Batches timed.
        seconds: Wall time of the timed batches.
    """

    batches_per_second: float
    examples_per_second: float
    num_batches: int
    seconds: float


def measure_pipeline(
    dataset, *, num_batches: int = 100, warmup: int = 10
) -> PipelineThroughput:
    """Times `num_batches` batches of `dataset` after `warmup` untimed ones.

    Args:
        dataset: A `tf.data.Dataset` (or a distributed dataset, or any iterable)
            of batches; it must hold at least `warmup + num_batches` batches.
        num_batches: Batches to time. Defaults to `100`.
        warmup: Batches to pull first, untimed. Defaults to `10`.

    Returns:
        A `PipelineThroughput`.

    Example:
    >>> import tensorflow as tf
    >>> from keras_replicator.data import measure_pipeline
    >>> data = tf.data.Dataset.range(1000).batch(10)
    >>> result = measure_pipeline(data, num_batches=50, warmup=5)
    >>> result.num_batches, result.batches_per_second > 0
    (50, True)
    """
    check_int("num_batches", num_batches)
    check_int("warmup", warmup, minimum=0)
    iterator = iter(dataset)
    for i in range(warmup):
        if next(iterator, None) is None:
            raise _too_short(i, warmup, num_batches)
    examples = 0
    start = time.perf_counter()
    for i in range(num_batches):
        batch = next(iterator, None)
        if batch is None:
            raise _too_short(warmup + i, warmup, num_batches)
        examples += _batch_examples(batch)
    seconds = time.perf_counter() - start
    return PipelineThroughput(
        batches_per_second=num_batches / seconds,
        examples_per_second=examples / seconds,
        num_batches=num_batches,
        seconds=seconds,
    )


def _batch_examples(batch) -> int:
    first = tf.nest.flatten(batch)[0]
    values = getattr(first, "values", None)  # a distributed value: one per replica
    parts = values if isinstance(values, tuple) else (first,)
    return sum(int(part.shape[0]) if part.shape.rank else 1 for part in parts)


def _too_short(seen, warmup, num_batches):
    return ValueError(
        f"`dataset` ended after {seen} batches; it must hold `warmup + num_batches` "
        f"= {warmup + num_batches}. Received: warmup={warmup}, "
        f"num_batches={num_batches}. Repeat it (`dataset.repeat()`) or ask for fewer."
    )
