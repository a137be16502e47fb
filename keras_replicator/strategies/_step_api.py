"""The TF-Replicator two-function API: `input_fn` + `step_fn`, on every strategy.

A researcher writes `input_fn(input_context) -> tf.data.Dataset` (batched per
replica, sharded by worker) and `step_fn(batch)` as for one replica, calling
`keras_replicator.replica` collectives where replicas must talk. The strategy runs
`step_fn` on every replica in a compiled loop; each replica declares its sample
count, so Keras optimizers average gradients exactly as one device would at the
global batch (see `communication/_reduction`).

The methods are named `distribute_input` and `run_steps` so they do not clash with
`tf.distribute.Strategy.run`, which keeps its stock meaning.
"""

from __future__ import annotations

import tensorflow as tf
from keras import tree

from keras_replicator._replicator_state import replicator_state
from keras_replicator.keras_integration import _loop, _sample_count

_REDUCTIONS = (None, "mean", "sum", "concat", "first")


def distribute_input(strategy, input_fn):
    """`input_fn(input_context)` → a distributed dataset (one pipeline per worker)."""
    if not callable(input_fn):
        raise TypeError(
            "`input_fn` must be a callable taking a `tf.distribute.InputContext` "
            f"and returning a `tf.data.Dataset`. Received: input_fn={input_fn!r}."
        )
    return strategy.distribute_datasets_from_function(input_fn)


def run_steps(strategy, step_fn, inputs, *, num_steps=1, reduce=None):
    """Runs `step_fn(batch)` on every replica for `num_steps` batches of `inputs`."""
    if not callable(step_fn):
        raise TypeError(f"`step_fn` must be callable. Received: step_fn={step_fn!r}.")
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(
            "`num_steps` must be a positive integer. "
            f"Received: num_steps={num_steps!r}."
        )
    if reduce not in _REDUCTIONS:
        raise ValueError(
            f"`reduce` must be one of {list(_REDUCTIONS)}. Received: reduce={reduce!r}."
        )
    if isinstance(inputs, tf.distribute.DistributedDataset):
        raise TypeError(
            "`inputs` must be an iterator, so that successive calls continue where "
            "the last one stopped. Received: a distributed dataset. Pass "
            "`iter(strategy.distribute_input(input_fn))`."
        )
    cache = replicator_state(strategy).step_functions
    key = (step_fn, num_steps, reduce)
    if key not in cache:
        cache[key] = _compile(strategy, step_fn, num_steps, reduce)
    return cache[key](inputs)


def _compile(strategy, step_fn, num_steps, reduce):
    def replica_step(batch):
        with _sample_count.counting_samples(_sample_count.batch_size_of(batch)):
            return step_fn(batch)

    @tf.autograph.experimental.do_not_convert
    def one_step(batch):
        outputs = strategy.run(replica_step, args=(batch,))
        if reduce is None:
            return outputs
        return tree.map_structure(lambda v: _reduce(strategy, v, reduce), outputs)

    @tf.function
    def steps(iterator):
        return _loop.run_loop(one_step, iterator, num_steps)

    return steps


def _reduce(strategy, value, reduce):
    if reduce == "first":
        return strategy.experimental_local_results(value)[0]
    if reduce == "concat":
        return strategy.gather(value, axis=0)
    op = tf.distribute.ReduceOp.MEAN if reduce == "mean" else tf.distribute.ReduceOp.SUM
    return strategy.reduce(op, value, axis=None)
