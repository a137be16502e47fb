import keras
import numpy as np
import pytest

from keras_replicator.pipeline import balance_by_size, balance_by_time
from keras_replicator.pipeline.balance import partition_costs


@pytest.mark.parametrize(
    "costs,stages,expected",
    [
        ([1, 1, 1, 1], 2, [2, 2]),
        ([5, 1, 1, 1, 1, 1], 2, [1, 5]),
        ([1, 2, 3], 3, [1, 1, 1]),
    ],
)
def test_partition_minimizes_the_largest_stage(costs, stages, expected):
    assert partition_costs(costs, stages) == expected


def test_balance_by_size_counts_parameters():
    model = keras.Sequential(
        [keras.Input((10,)), keras.layers.Dense(100), keras.layers.Dense(50)]
        + [keras.layers.Dense(50) for _ in range(2)]
    )
    assert balance_by_size(model, 2) == [2, 2]
    assert sum(balance_by_size(model, 3)) == 4


def test_balance_by_time_returns_a_valid_balance():
    model = keras.Sequential([keras.layers.Dense(64) for _ in range(4)])
    balance = balance_by_time(model, 2, np.ones((8, 16), "float32"), repeats=1)
    assert sum(balance) == 4 and len(balance) == 2


def test_errors():
    model = keras.Sequential([keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="`num_stages` must be at most"):
        partition_costs([1.0], 2)
    with pytest.raises(ValueError, match="must be built"):
        balance_by_size(model, 1)
