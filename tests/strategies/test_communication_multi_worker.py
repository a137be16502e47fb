"""The socket transport and compression between real worker processes (127.0.0.1)."""

import numpy as np
import pytest

from tests.strategies._options_training import one_device, train_on_workers

pytestmark = pytest.mark.multi_worker


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "options, rtol",
    [
        ({"transport": "socket", "bucket_mb": 0.0005}, 1e-10),
        ({"compression": "bf16"}, 0),
    ],
    ids=["socket-exact", "bf16-collective"],
)
def test_two_workers_train_to_the_one_device_weights(options, rtol):
    initial, expected = one_device(300)
    weights = train_on_workers(options, 2, initial, 300, timeout=200)
    for e, g in zip(expected, weights[0]):
        if rtol:
            np.testing.assert_allclose(g, e, rtol=rtol, atol=1e-12)
        else:  # bf16 wire: within 2% of the largest weight
            np.testing.assert_allclose(g, e, atol=2e-2 * np.max(np.abs(e)))
