import doctest

import pytest

from keras_replicator.pipeline import (
    _batchnorm,
    _checkpoint,
    _microbatch,
    _partition,
    _schedule,
    balance,
    gpipe,
)


@pytest.mark.parametrize(
    "module",
    [_batchnorm, _checkpoint, _microbatch, _partition, _schedule, balance, gpipe],
    ids=lambda m: m.__name__.rsplit(".", 1)[-1],
)
def test_examples_run(module):
    result = doctest.testmod(module, raise_on_error=False)
    assert result.failed == 0
