"""Forward passes of `evaluate` / `predict`, run again after a transient gRPC error.

`evaluate` and `predict` schedule one forward pass per batch. After a pass
finishes, the coordinator's worker thread copies its outputs to the chief
(`RemoteValue.get`: an `Identity` on the chief whose input lives on the worker,
run as a component function on that worker). Rarely (once in CI, in the
validation of `fit`) the worker cannot read that request: `INTERNAL: Unable to
parse request` (gRPC status 13) from `EagerService/RunComponentFunction`. The
request is built and serialized inside TensorFlow's eager runtime from a plain
float32 tensor of logits; we found nothing in what the closure returns or
captures that explains it. The coordinator then fails the closure, cancels
every other one in flight (`CancelledError`), and `join()` raises. TensorFlow
puts closures back only when it thinks a worker was preempted, not for this.

A forward pass only reads the variables, so running it again changes nothing
but time. `run_all` schedules every batch, waits, keeps what finished, and
schedules the failed and cancelled batches again, at most `MAX_RETRIES` times,
with one line on stderr each time. Only gRPC-level failures (`InternalError`,
`UnavailableError`, `AbortedError` carrying a gRPC status) are retried; an
error of the model itself (a wrong shape) is raised at once. Training steps
update the variables and are never retried: a training step that failed after
applying its update would be applied twice.
"""

from __future__ import annotations

import sys

import tensorflow as tf

from keras_replicator.parameter_server import _faults

MAX_RETRIES = 3

_TRANSIENT_TYPES = (
    tf.errors.InternalError,
    tf.errors.UnavailableError,
    tf.errors.AbortedError,
)
_GRPC_MARKERS = ("Unable to parse request", "grpc_status", "GRPC error")


def is_transient(error: BaseException) -> bool:
    """Whether `error` is a gRPC failure worth running a forward pass again for.

    Example:
    >>> import tensorflow as tf
    >>> is_transient(tf.errors.InternalError(None, None, "Unable to parse request"))
    True
    >>> is_transient(tf.errors.InvalidArgumentError(None, None, "Incompatible shapes"))
    False
    """
    text = str(error)
    return isinstance(error, _TRANSIENT_TYPES) and any(
        marker in text for marker in _GRPC_MARKERS
    )


def run_all(strategy, function, arguments: list, what: str) -> list:
    """Runs `function(*args)` for each `args` in `arguments` on free workers.

    Args:
        strategy: The `ParameterServerReplicator` whose coordinator schedules.
        function: A side-effect-free `tf.function` (a forward pass).
        arguments: One tuple of arguments per call.
        what: What the calls are for, for messages (e.g. "evaluate").

    Returns:
        The fetched outputs (NumPy), in the order of `arguments`.

    Example:
    >>> run_all(strategy, forward, [(x[:32],), (x[32:],)], "predict")  # doctest: +SKIP
    """
    coordinator = strategy.coordinator
    outputs = {}
    pending = list(range(len(arguments)))
    for attempt in range(MAX_RETRIES + 1):
        remote, error = {}, None
        try:
            for index in pending:
                remote[index] = _faults.call(
                    coordinator.schedule, function, args=arguments[index]
                )
            _faults.wait(strategy, what)
        except tf.errors.OpError as caught:
            if not is_transient(caught) or attempt == MAX_RETRIES:
                raise
            error = caught
        failed = []
        for index in pending:
            if index not in remote:
                failed.append(index)
                continue
            try:
                outputs[index] = _faults.call(remote[index].fetch)
            except tf.errors.OpError:
                if error is None:
                    raise
                failed.append(index)
        if not failed:
            break
        pending = failed
        first_line = str(error).strip().splitlines()[0][:200]
        print(
            f"keras_replicator: {len(failed)} forward pass(es) of {what} failed "
            f"with a transient gRPC error and are run again (retry {attempt + 1} "
            f"of {MAX_RETRIES}; they only read the weights): "
            f"{type(error).__name__}: {first_line}",
            file=sys.stderr,
            flush=True,
        )
    return [outputs[index] for index in range(len(arguments))]
