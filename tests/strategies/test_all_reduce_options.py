"""`kr.AllReduceOptions`: validation and how strategies take it."""

import dataclasses

import pytest
import tensorflow as tf

import keras_replicator as kr
from keras_replicator.strategies import _communication


def test_defaults_and_frozen():
    options = kr.AllReduceOptions()
    assert options.resolved_bucket_mb() == 16.0
    assert options.compression is None and options.hierarchy is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.compression = "fp16"


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"bucket_mb": -1}, "bucket_mb"),
        ({"bucket_mb": "4"}, "bucket_mb"),
        ({"bucket_mb": float("inf")}, "bucket_mb"),
        ({"compression": "int8"}, "compression"),
        ({"hierarchy": "3d"}, "hierarchy"),
        ({"hierarchy": "2d", "group_size": 0}, "group_size"),
        ({"hierarchy": "2d", "group_size": 2.0}, "group_size"),
    ],
)
def test_bad_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"`{field}` must be"):
        kr.AllReduceOptions(**kwargs)


def test_strategies_take_and_expose_the_options():
    options = kr.AllReduceOptions(compression="bf16")
    strategy = kr.MultiDeviceReplicator(num_replicas=2, all_reduce=options)
    assert _communication.options_of(strategy) is options
    assert (
        _communication.options_of(kr.MultiDeviceReplicator(num_replicas=2))
        == kr.AllReduceOptions()
    )
    stock = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert _communication.options_of(stock) == kr.AllReduceOptions()


def test_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match="`all_reduce` must be"):
        kr.MultiDeviceReplicator(num_replicas=2, all_reduce={"compression": "fp16"})
