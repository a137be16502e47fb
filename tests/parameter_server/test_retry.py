"""Forward passes of `evaluate` / `predict` rerun after a transient gRPC error.

CI once failed in `fit`'s validation: fetching a forward pass's outputs from a
worker raised `INTERNAL: ... Unable to parse request` (gRPC status 13), the
coordinator cancelled the other closures, and `join()` raised. These tests
replay that with a coordinator that runs closures in this process and fails the
ones it is told to, exactly as the real one reports it: the failed closure's
value holds the error, the closures still in flight are cancelled, `join()`
raises the first error once.
"""

import numpy as np
import pytest
import tensorflow as tf

from keras_replicator.parameter_server import _retry, _training

PARSE_ERROR = (
    "2 root error(s) found. (0) INTERNAL: {{function_node __wrapped__Identity_"
    "device_/job:chief/replica:0/task:0/device:CPU:0}} Unable to parse request. "
    "Additional GRPC error information from remote target /job:worker/replica:0/"
    "task:1 while calling /tensorflow.eager.EagerService/RunComponentFunction: "
    ':{"grpc_status":13,"grpc_message":"Unable to parse request"}'
)


def parse_error():
    return tf.errors.InternalError(None, None, PARSE_ERROR)


class Value:
    def __init__(self, value=None, error=None):
        self.value, self.error = value, error

    def fetch(self):
        if self.error is not None:
            raise self.error
        return self.value.numpy()


class FlakyCoordinator:
    """Runs each closure here; closure number k fails if `k in fail`."""

    def __init__(
        self, fail, error=lambda: tf.errors.InternalError(None, None, PARSE_ERROR)
    ):
        self.fail, self.make_error = set(fail), error
        self.calls, self.error = 0, None

    def schedule(self, function, args):
        number, self.calls = self.calls, self.calls + 1
        if number in self.fail:
            self.error = self.error or self.make_error()
            return Value(error=self.error)
        if self.error is not None:  # The rest of the round is cancelled.
            return Value(error=tf.errors.CancelledError(None, None, "cancelled"))
        return Value(function(*args))

    def join(self):
        error, self.error = self.error, None
        if error is not None:
            raise error


class Strategy:
    def __init__(self, coordinator):
        self.coordinator = coordinator


class Doubler:
    """A model stand-in: `predict` only calls it."""

    def __init__(self, coordinator):
        self.distribute_strategy = Strategy(coordinator)

    def __call__(self, inputs, training=False):
        return inputs * 2.0


X = np.arange(30, dtype="float32").reshape(10, 3)  # 3 batches of 4, 4, 2


def test_predict_reruns_the_failed_and_cancelled_batches_in_order(capsys):
    coordinator = FlakyCoordinator(fail={1})
    predicted = _training.predict(Doubler(coordinator), X, batch_size=4)
    np.testing.assert_array_equal(predicted, X * 2.0)
    # Round 1: batch 0 ran, batch 1 failed, batch 2 was cancelled; round 2 reran
    # batches 1 and 2 (closures 3 and 4), nothing else.
    assert coordinator.calls == 5
    err = capsys.readouterr().err
    assert "2 forward pass(es) of predict failed with a transient gRPC error" in err
    assert "retry 1 of 3" in err and "InternalError" in err


def test_an_error_of_the_model_is_raised_at_once():
    coordinator = FlakyCoordinator(
        fail={1},
        error=lambda: tf.errors.InvalidArgumentError(None, None, "Incompatible shapes"),
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match="Incompatible shapes"):
        _training.predict(Doubler(coordinator), X, batch_size=4)
    assert coordinator.calls == 3


def test_retries_are_bounded():
    coordinator = FlakyCoordinator(fail=set(range(100)))
    with pytest.raises(tf.errors.InternalError, match="Unable to parse request"):
        _training.predict(Doubler(coordinator), X, batch_size=4)
    assert coordinator.calls == 3 * (_retry.MAX_RETRIES + 1)


@pytest.mark.parametrize(
    "error, transient",
    [
        (tf.errors.InternalError(None, None, PARSE_ERROR), True),
        (tf.errors.UnavailableError(None, None, "Socket closed grpc_status:14"), True),
        (tf.errors.InternalError(None, None, "a kernel failed"), False),
        (tf.errors.InvalidArgumentError(None, None, PARSE_ERROR), False),
        (tf.errors.CancelledError(None, None, "cancelled"), False),
    ],
)
def test_only_grpc_failures_are_transient(error, transient):
    assert _retry.is_transient(error) is transient
