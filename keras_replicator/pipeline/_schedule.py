"""The fill-drain schedule of GPipe: which (micro-batch, stage) runs at each clock.

At clock `t` stage `k` works on micro-batch `t - k`, so K stages and M micro-batches
take `M + K - 1` clocks instead of `M * K`: the bubble is `(K - 1) / (M + K - 1)`.
The schedule is only the order in which the graph is built: in a `tf.function` the
ops of task (i, k) depend on task (i, k - 1) (data) and on task (i - 1, k) (the
stage's state), nothing else, so TensorFlow's executor runs the tasks of one clock
at the same time on their devices.
"""

from __future__ import annotations


def clock_cycles(num_microbatches: int, num_stages: int) -> list[list[tuple]]:
    """The tasks `(microbatch, stage)` of each clock cycle, in order.

    Example:
    >>> clock_cycles(2, 2)
    [[(0, 0)], [(1, 0), (0, 1)], [(1, 1)]]
    """
    return [
        [(t - k, k) for k in range(num_stages) if 0 <= t - k < num_microbatches]
        for t in range(num_microbatches + num_stages - 1)
    ]
