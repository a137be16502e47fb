"""`kr.AllReduceOptions`: validation and how strategies take it."""

import dataclasses

import pytest
import tensorflow as tf

import keras_replicator as kr
from keras_replicator.communication import _strategy_transport


def test_defaults_and_frozen():
    options = kr.AllReduceOptions()
    assert options.resolved_bucket_mb() == 16.0
    assert options.compression is None and options.hierarchy is None
    assert options.transport is None  # the strategy picks
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
        ({"transport": "gloo"}, "transport"),
    ],
)
def test_bad_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"`{field}` must be"):
        kr.AllReduceOptions(**kwargs)


def test_strategies_take_and_expose_the_options():
    options = kr.AllReduceOptions(compression="bf16")
    strategy = kr.MultiDeviceReplicator(num_replicas=2, all_reduce=options)
    # One machine: the transport None resolves to the collectives.
    resolved = dataclasses.replace(options, transport="collective")
    assert strategy.all_reduce_options == resolved
    assert _strategy_transport.options_of(strategy) == resolved
    assert kr.MultiDeviceReplicator(
        num_replicas=2
    ).all_reduce_options == kr.AllReduceOptions(transport="collective")
    stock = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert _strategy_transport.options_of(stock) == kr.AllReduceOptions()


def test_the_socket_ring_on_one_machine_is_a_clear_error():
    with pytest.raises(ValueError, match="`transport='socket'` connects worker"):
        kr.MultiDeviceReplicator(
            num_replicas=2, all_reduce=kr.AllReduceOptions(transport="socket")
        )


def test_one_worker_has_no_ring():
    strategy = kr.MultiWorkerReplicator()  # no TF_CONFIG: one worker
    assert strategy.all_reduce_options.transport == "collective"


def test_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match="`all_reduce` must be"):
        kr.MultiDeviceReplicator(num_replicas=2, all_reduce={"compression": "fp16"})
