"""Weight-update sharding patches Keras only where a slot is made (issue 50).

The update runs in the gradient all-reduce's place and each sharded slot, a
`PieceSlot`, reads and is assigned whole, so the compiled model's optimizer is
the user's own object, of its own class, and Keras' `save_own_variables`,
`load_own_variables` and `_backend_update_step` stay stock.
"""

import keras
import numpy as np
import pytest
from keras.src.backend.tensorflow import optimizer as tf_optimizer
from keras.src.optimizers import base_optimizer

from keras_replicator import _compat
from keras_replicator._compat import _inventory, _patching
from keras_replicator.sharding import _saving
from tests.sharding import _training as t

_STOCK = [
    (base_optimizer.BaseOptimizer, "save_own_variables"),
    (base_optimizer.BaseOptimizer, "load_own_variables"),
    (tf_optimizer.TFOptimizer, "_backend_update_step"),
]


def test_the_sharded_optimizer_is_the_users_with_piece_slots():
    created = []

    def adam():  # the user's optimizer, made in the strategy's scope
        created.append(keras.optimizers.Adam(0.01))
        return created[0]

    model = t.fit(t.model_in(t.strategy(2, True), adam), epochs=1)
    optimizer = created[0]
    assert model.optimizer is optimizer
    assert type(model.optimizer) is keras.optimizers.Adam
    slots = [v for v in optimizer.variables if isinstance(v, _saving.PieceSlot)]
    assert len(slots) == 2 * len(model.trainable_variables)  # momenta, velocities
    for owner, name in _STOCK:
        assert not _patching.is_replaced(owner, name), f"{owner.__name__}.{name}"
    listed = {_inventory.resolve(p.target) for p in _inventory.PATCHES}
    assert not listed & set(_STOCK)


def test_an_unsharded_optimizer_has_no_piece_slots():
    model = t.fit(t.model_in(t.strategy(2, False), lambda: keras.optimizers.Adam()))
    assert not any(isinstance(v, _saving.PieceSlot) for v in model.optimizer.variables)


def test_a_piece_slot_reads_and_is_assigned_whole():
    strategy = t.strategy(2, True)
    with strategy.scope():
        slot = _saving.PieceSlot((3,), strategy, initializer="zeros", shape=(2,))
    slot.assign(np.array([1.0, 2.0, 3.0], "float32"))
    assert [c.numpy().tolist() for c in slot.value.values] == [[1.0, 2.0], [3.0, 0.0]]
    assert slot.numpy().tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match=r"Received: shape \(2,\)"):
        slot.assign(np.zeros([2], "float32"))


def _update_step_without_all_reduce(self, grads, trainable_variables, learning_rate):
    for grad, variable in zip(grads, trainable_variables):
        self.update_step(grad, variable, learning_rate)


def _save_without_numpy(self, store):
    for i, variable in enumerate(self.variables):
        store[str(i)] = np.asarray(variable)


def _load_without_assign(self, store):
    for i, variable in enumerate(self.variables):
        variable._direct_assign(store[str(i)])


@pytest.mark.parametrize(
    "owner, name, replacement, reported",
    [
        (
            tf_optimizer.TFOptimizer,
            "_backend_update_step",
            _update_step_without_all_reduce,
            "TFOptimizer._backend_update_step: all-reduce",
        ),
        (
            base_optimizer.BaseOptimizer,
            "save_own_variables",
            _save_without_numpy,
            "BaseOptimizer.save_own_variables: numpy",
        ),
        (
            base_optimizer.BaseOptimizer,
            "load_own_variables",
            _load_without_assign,
            "BaseOptimizer.load_own_variables: assign",
        ),
    ],
)
def test_the_route_checks_can_fail(monkeypatch, owner, name, replacement, reported):
    # The sharded update and the whole saved state rely on these lines of Keras:
    # a Keras without them must fail `check_upstream`, not shard silently wrong.
    monkeypatch.setattr(owner, name, replacement)
    assert reported in _compat.optimizer.check_upstream()
