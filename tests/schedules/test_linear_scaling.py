import numpy as np
import pytest

import keras_replicator as kr
from keras_replicator.schedules import scaled_learning_rate


@pytest.mark.parametrize(
    ("base", "global_batch", "base_batch", "expected"),
    [
        (0.1, 256, 256, 0.1),
        (0.1, 8192, 256, 3.2),  # Goyal et al.: 0.1 per 256 images, batch 8k
        (0.05, 512, 32, 0.8),
        (0.1, 128, 256, 0.05),  # smaller batches scale down
    ],
)
def test_linear_rule(base, global_batch, base_batch, expected):
    got = scaled_learning_rate(base, global_batch, base_batch)
    assert isinstance(got, float)
    assert got == pytest.approx(expected, rel=1e-12)


def test_per_replica_batch_uses_the_strategys_replica_count():
    strategy = kr.MultiDeviceReplicator(num_replicas=4)
    explicit = scaled_learning_rate(0.1, per_replica_batch_size=128, strategy=strategy)
    with strategy.scope():
        scoped = scaled_learning_rate(0.1, per_replica_batch_size=128)
    assert explicit == scoped == pytest.approx(0.2)


def test_numpy_integers_are_accepted():
    assert scaled_learning_rate(0.1, np.int64(512)) == pytest.approx(0.2)


def test_per_replica_batch_outside_a_scope_is_a_clear_error():
    with pytest.raises(RuntimeError, match="no strategy scope is active"):
        scaled_learning_rate(0.1, per_replica_batch_size=64)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        ((0.1,), {}, ValueError, "exactly one of"),
        ((0.1, 512), {"per_replica_batch_size": 64}, ValueError, "exactly one of"),
        ((0.1, 0), {}, ValueError, "Received: global_batch_size=0"),
        ((0.1, 512.0), {}, TypeError, "Received: global_batch_size=512.0"),
        ((-0.1, 512), {}, ValueError, "Received: base_learning_rate=-0.1"),
        ((0.1, 512, 0), {}, ValueError, "Received: base_batch_size=0"),
        ((0.1, 512), {"strategy": object()}, ValueError, "only used with"),
    ],
)
def test_bad_arguments(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        scaled_learning_rate(*args, **kwargs)
