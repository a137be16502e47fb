"""The TF-Replicator form (`input_fn` + `step_fn`) under parameter-server training.

`distribute_input(input_fn)` gives one input pipeline per worker;
`run_steps(step_fn, iterator, num_steps)` schedules `num_steps` calls of
`step_fn(batch)` as one function on whichever worker is free, and returns at once
with a `RemoteValue`. Steps are asynchronous: `strategy.coordinator.join()` waits
for all of them. Collectives from `keras_replicator.replica` have no peers here
(each worker is one replica on its own); Keras optimizers apply each step's
gradients to the variables on the parameter servers.
"""

from __future__ import annotations

import inspect

import tensorflow as tf

from keras_replicator._replicator_state import replicator_state
from keras_replicator.parameter_server import _faults


def distribute_input(strategy, input_fn):
    """A per-worker dataset from `input_fn(input_context)` (or `input_fn()`)."""
    if not callable(input_fn):
        raise TypeError(
            "`input_fn` must be a callable taking a `tf.distribute.InputContext` "
            f"and returning a `tf.data.Dataset`. Received: input_fn={input_fn!r}."
        )
    if inspect.signature(input_fn).parameters:

        def per_worker_fn():
            return strategy.distribute_datasets_from_function(input_fn)

    else:
        per_worker_fn = input_fn
    return _faults.call(strategy.coordinator.create_per_worker_dataset, per_worker_fn)


def run_steps(strategy, step_fn, inputs, *, num_steps=1):
    """Schedules `num_steps` of `step_fn` on a free worker; returns a RemoteValue."""
    if not callable(step_fn):
        raise TypeError(f"`step_fn` must be callable. Received: step_fn={step_fn!r}.")
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(
            "`num_steps` must be a positive integer. "
            f"Received: num_steps={num_steps!r}."
        )
    cache = replicator_state(strategy).step_functions
    key = (step_fn, num_steps)
    if key not in cache:

        @tf.function
        def steps(iterator):
            outputs = None
            for _ in range(num_steps):
                outputs = strategy.run(step_fn, args=(next(iterator),))
            return outputs

        cache[key] = steps
    return _faults.call(strategy.coordinator.schedule, cache[key], args=(inputs,))
