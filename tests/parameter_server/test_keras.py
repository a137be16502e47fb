"""The Keras patches behind `ParameterServerReplicator`, checked in this process.

Under a `ParameterServerReplicator` a Keras variable's `assign_add` /
`assign_sub` must be the TF variable's own op (one atomic update on the ps),
not Keras' read-then-write; everywhere else Keras' code must run unchanged.
The real cluster is in test_custom_loop.py; here the hook is forced on.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_replicator.parameter_server import _keras


@pytest.fixture
def installed():
    _keras.install()


def _ops_of(variable, method, monkeypatch, atomic):
    monkeypatch.setattr(
        _keras.ParameterServerHooks, "atomic_updates", staticmethod(lambda: atomic)
    )

    @tf.function
    def update():
        getattr(variable, method)(2.0)

    return {op.type for op in update.get_concrete_function().graph.get_operations()}


@pytest.mark.parametrize(
    "method, op, expected",
    [
        ("assign_add", "AssignAddVariableOp", 3.0),
        ("assign_sub", "AssignSubVariableOp", -1.0),
    ],
)
def test_increments_are_one_op_where_the_hook_says_so(
    installed, monkeypatch, method, op, expected
):
    variable = keras.Variable(1.0)
    ops = _ops_of(variable, method, monkeypatch, atomic=True)
    assert op in ops and "AssignVariableOp" not in ops, ops
    monkeypatch.setattr(
        _keras.ParameterServerHooks, "atomic_updates", staticmethod(lambda: True)
    )
    getattr(variable, method)(2)  # An int is cast to the variable's dtype.
    assert float(variable.numpy()) == expected


def test_elsewhere_keras_read_then_write_runs(installed, monkeypatch):
    variable = keras.Variable(1.0)
    ops = _ops_of(variable, "assign_add", monkeypatch, atomic=False)
    assert "AssignVariableOp" in ops and "AssignAddVariableOp" not in ops, ops


def test_the_hook_is_off_outside_a_parameter_server_strategy(installed):
    assert not _keras.ParameterServerHooks.atomic_updates()
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        assert not _keras.ParameterServerHooks.atomic_updates()


def test_a_stateless_scope_still_collects_the_update(installed, monkeypatch):
    monkeypatch.setattr(
        _keras.ParameterServerHooks, "atomic_updates", staticmethod(lambda: True)
    )
    variable = keras.Variable(np.float32(1.0))
    with keras.StatelessScope() as scope:
        variable.assign_add(2.0)
    assert float(variable.numpy()) == 1.0
    assert float(scope.get_current_value(variable)) == 3.0
