"""What a worker reads under PS training, from what `fit` / `evaluate` received.

Training input becomes one pipeline per worker (`ClusterCoordinator.
create_per_worker_dataset`), repeated so that no worker runs dry mid-epoch: an
epoch is `steps_per_epoch` steps in total over all workers, as in `tf_keras`.
Each worker shuffles on its own (unseeded), so the workers see different orders.

A `tf.data.Dataset` made on the chief is handed to the coordinator *as a
dataset*, not captured by a function: the coordinator serializes its graph and
rebuilds it on every worker. A function that closes over the dataset would
capture its variant tensor, which lives on the chief and cannot be sent to a
worker ("Unable to parse tensor proto"). The graph must be self-contained:
`from_generator` / `py_function` datasets call Python on the chief, so they
need a dataset function instead.

Evaluation and prediction input is batched on the chief and each batch is sent
to a free worker as an argument: every example is used exactly once and
predictions come back in order, which a per-worker pipeline cannot promise.
NumPy arrays are embedded in the per-worker pipeline's graph, which suits data
sets up to about 100 MB; use a dataset function for anything larger.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable

import numpy as np
import tensorflow as tf
from keras import tree

DEFAULT_BATCH_SIZE = 32


@dataclasses.dataclass(frozen=True)
class TrainingInput:
    """What each worker reads, the epoch length and one batch to build from.

    `per_worker` is what `create_per_worker_dataset` takes: a dataset function,
    or a `tf.data.Dataset` the coordinator serializes and rebuilds per worker.
    """

    per_worker: Callable | tf.data.Dataset
    steps_per_epoch: int
    sample_batch: object


def _takes_context(function) -> bool:
    try:
        return len(inspect.signature(function).parameters) > 0
    except (TypeError, ValueError):
        return True


def training_input(
    strategy, x, y, sample_weight, batch_size, steps_per_epoch
) -> TrainingInput:
    """Turns `fit`'s data arguments into a `TrainingInput` (see the module doc)."""
    if callable(x) and not isinstance(x, tf.data.Dataset):
        _no_targets("a dataset function", y, sample_weight)
        dataset_fn = x
        if _takes_context(dataset_fn):
            local = dataset_fn(tf.distribute.InputContext())

            def per_worker_fn():
                return strategy.distribute_datasets_from_function(dataset_fn)

        else:
            local = dataset_fn()
            per_worker_fn = dataset_fn
        _check_dataset(local, "the dataset function's result")
        steps = _steps(steps_per_epoch, None, "a dataset function")
        return TrainingInput(per_worker_fn, steps, _first(local))
    if isinstance(x, tf.data.Dataset):
        _no_targets("a `tf.data.Dataset`", y, sample_weight)
        known = int(x.cardinality())
        steps = _steps(steps_per_epoch, known if known > 0 else None, "this dataset")
        return TrainingInput(x.repeat(), steps, _first(x))
    data = _arrays(x, y, sample_weight)
    batch_size = batch_size or DEFAULT_BATCH_SIZE
    count = len(tree.flatten(data)[0])
    steps = _steps(steps_per_epoch, math.ceil(count / batch_size), "arrays")

    def per_worker_fn():
        dataset = tf.data.Dataset.from_tensor_slices(data)
        return dataset.shuffle(count).repeat().batch(batch_size)

    sample = tree.map_structure(lambda a: a[:batch_size], data)
    return TrainingInput(per_worker_fn, steps, sample)


def chief_batches(x, y, sample_weight, batch_size, steps):
    """Yields the batches of finite data, in order, for evaluate / predict."""
    if isinstance(x, tf.data.Dataset):
        _no_targets("a `tf.data.Dataset`", y, sample_weight)
        dataset = x.take(steps) if steps is not None else x
        yield from dataset
        return
    data = _arrays(x, y, sample_weight)
    batch_size = batch_size or DEFAULT_BATCH_SIZE
    count = len(tree.flatten(data)[0])
    for number, start in enumerate(range(0, count, batch_size)):
        if steps is not None and number >= steps:
            return
        window = slice(start, start + batch_size)
        yield tree.map_structure(lambda a, window=window: a[window], data)


def _arrays(x, y, sample_weight):
    if x is None:
        raise ValueError(
            "`x` must be given: arrays, a `tf.data.Dataset` or a dataset "
            "function. Received: x=None."
        )
    x, y, sample_weight = (
        None if part is None else tree.map_structure(np.asarray, part)
        for part in (x, y, sample_weight)
    )
    if sample_weight is not None:
        return (x, y, sample_weight)
    return x if y is None else (x, y)


def _no_targets(what, y, sample_weight):
    if y is not None or sample_weight is not None:
        raise ValueError(
            f"`y` and `sample_weight` must be None when `x` is {what}: it yields "
            "them itself. Received: "
            f"y={type(y).__name__}, sample_weight={type(sample_weight).__name__}. "
            "Put targets and weights in the dataset's elements."
        )


def _check_dataset(dataset, what):
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(
            f"{what} must be a `tf.data.Dataset`. Received: {type(dataset).__name__}."
        )


def _steps(steps_per_epoch, known, what):
    if steps_per_epoch is not None:
        if isinstance(steps_per_epoch, bool) or not isinstance(steps_per_epoch, int):
            raise TypeError(
                "`steps_per_epoch` must be an integer. "
                f"Received: steps_per_epoch={steps_per_epoch!r}."
            )
        if steps_per_epoch < 1:
            raise ValueError(
                "`steps_per_epoch` must be positive. "
                f"Received: steps_per_epoch={steps_per_epoch}."
            )
        return steps_per_epoch
    if known is None:
        raise ValueError(
            "`steps_per_epoch` is required for parameter-server training with "
            f"{what}: every worker repeats its input, so an epoch is a number of "
            "steps over all workers. Received: steps_per_epoch=None. Pass e.g. "
            "`steps_per_epoch=len(x_train) // batch_size`."
        )
    return known


def _first(dataset):
    for batch in dataset.take(1):
        return batch
    raise ValueError("The training dataset is empty; it must yield at least a batch.")
