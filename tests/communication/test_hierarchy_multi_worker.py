"""Hierarchical all-reduce between real worker processes on 127.0.0.1.

`MultiWorkerMirroredStrategy` gives a CPU worker one device (TensorFlow counts
only GPUs as local accelerators), so rows of the grid are modelled with
`group_size`: 2 workers in one row exercise the row collectives (scatter,
gather, broadcast) across processes; 4 workers as a 2 x 2 grid run every
sub-group of both schemes across processes, with the group and instance keys
each process derives on its own.
"""

import numpy as np
import pytest

from tests.communication._options_training import one_device, train_on_workers

pytestmark = [
    pytest.mark.multi_worker,
    pytest.mark.slow(
        reason="covered in the default run by: test_hierarchy.py, in process"
    ),
]


def _check(options, num_workers):
    initial, expected = one_device(256)
    weights = train_on_workers(options, num_workers, initial, 256, timeout=300)
    for e, g in zip(expected, weights[0]):
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12)


@pytest.mark.timeout(360)
def test_two_workers_in_one_row_train_to_the_one_device_weights():
    _check({"hierarchy": "2d", "group_size": 2, "bucket_mb": 0.0005}, 2)


@pytest.mark.slow
@pytest.mark.timeout(480)
@pytest.mark.parametrize("hierarchy", ["local_then_global", "2d"])
def test_four_workers_as_a_2x2_grid_train_to_the_one_device_weights(hierarchy):
    _check({"hierarchy": hierarchy, "group_size": 2}, 4)
