"""The socket transport and compression between real worker processes (127.0.0.1)."""

import numpy as np
import pytest

from tests.communication._options_training import one_device, train_on_workers

pytestmark = pytest.mark.multi_worker


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "options, transport, rtol",
    [
        pytest.param(
            {"bucket_mb": 0.0005},
            "socket",
            1e-10,
            marks=pytest.mark.slow(
                reason="covered in the default run by: test_all_reduce.py::"
                "test_lossless_options_train_to_the_one_device_weights; the ring "
                "on 2 workers: test_worker_logs.py::"
                "test_two_workers_average_logs_over_the_ring_like_one_device and "
                "tests/testing/test_conformance.py::test_multi_worker_strategy_passes"
            ),
        ),
        pytest.param(  # the default's code path, made required: slow run only
            {"transport": "socket", "bucket_mb": 0.0005},
            "socket",
            1e-10,
            marks=pytest.mark.slow,
        ),
        pytest.param(
            {"compression": "bf16", "transport": "collective"},
            "collective",
            0,
            marks=pytest.mark.slow(
                reason="covered in the default run by: the same test "
                "[default-is-the-ring]"
            ),
        ),
        pytest.param(  # rows from the machines: one here, so the flat ring
            {"hierarchy": "local_then_global", "bucket_mb": 0.0005},
            "socket",
            1e-10,
            marks=pytest.mark.slow,
        ),
    ],
    ids=["default-is-the-ring", "socket-exact", "bf16-collective", "hierarchy-ring"],
)
def test_two_workers_train_to_the_one_device_weights(options, transport, rtol):
    initial, expected = one_device(300)
    weights = train_on_workers(
        options, 2, initial, 300, timeout=200, transport=transport
    )
    for e, g in zip(expected, weights[0]):
        if rtol:
            np.testing.assert_allclose(g, e, rtol=rtol, atol=1e-12)
        else:  # bf16 wire: within 2% of the largest weight
            np.testing.assert_allclose(g, e, atol=2e-2 * np.max(np.abs(e)))


@pytest.mark.timeout(240)
def test_the_default_falls_back_to_the_collectives_on_every_worker_together():
    """Worker 1 cannot listen: both workers agree to use the collectives."""
    initial, expected = one_device(300)
    weights = train_on_workers(
        {}, 2, initial, 300, timeout=200, transport="collective", cannot_listen=[1]
    )
    for e, g in zip(expected, weights[0]):
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12)


@pytest.mark.slow(
    reason="covered in the default run by: conformance multi-worker-2 run_eagerly"
)
@pytest.mark.timeout(240)
def test_eager_fit_trains_on_two_workers_like_one_device():
    # `fit(run_eagerly=True)` failed on the ring: eagerly, `tf.numpy_function`
    # returns one output as a tensor, not a list ("Tensor's shape () is not
    # compatible with supplied shape (1,)").
    initial, expected = one_device(300)
    weights = train_on_workers(
        {}, 2, initial, 300, timeout=200, transport="socket", run_eagerly=True
    )
    for e, g in zip(expected, weights[0]):
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12)
