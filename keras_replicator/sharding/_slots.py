"""An optimizer's state under weight-update sharding: one piece per replica.

When a sharding strategy builds an optimizer, each slot Keras would make "like"
a model variable (`add_variable_from_reference`: momenta, velocities,
accumulators) is made as a 1-D variable of one piece (`_layout.piece_length`)
instead. It is still an ordinary optimizer variable, in the same place of
`optimizer.variables`, with the same name; under a mirrored strategy each
device's copy holds its own replica's piece (the variables have no aggregation,
so a replica's assignment stays on its device). Keras' own state made like a
model variable but used on whole variables stays whole: EMA averages and
gradient accumulators.

`update_step` also needs a variable to update: each model variable gets a
1-D "piece variable" (`piece_variables`), loaded from this replica's piece of the
weights before the update and read after it. Its key maps to the model
variable's slot index, so `update_step` finds the right slots. Piece variables
are not optimizer state (nothing is lost between steps), so they are not
tracked, saved or counted.

The registry is module-level (a `WeakKeyDictionary` keyed by optimizer): an
attribute on the optimizer would be tracked by Keras and by `tf.train.Checkpoint`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import weakref

import tensorflow as tf

from keras_replicator import _compat
from keras_replicator.sharding import _layout

#: Slots of these names stay whole: Keras updates them on whole variables.
WHOLE_SLOT_NAMES = ("average", "gradient_accumulator")


@dataclasses.dataclass
class ShardedSlot:
    """A slot holding one piece per replica of a variable of `shape`."""

    variable: object  # the Keras optimizer variable (1-D, one piece)
    shape: tuple
    num_replicas: int

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclasses.dataclass
class _State:
    slots: list = dataclasses.field(default_factory=list)
    pieces: dict = dataclasses.field(default_factory=dict)  # var key -> tf.Variable


_STATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _state(optimizer) -> _State:
    state = _STATES.get(optimizer)
    if state is None:
        state = _STATES[optimizer] = _State()
    return state


def sharded_slots(optimizer) -> list[ShardedSlot]:
    """The optimizer's sharded slots, in creation order (empty if none)."""
    state = _STATES.get(optimizer)
    return list(state.slots) if state is not None else []


def add_piece_slot(optimizer, reference, name, initializer, strategy, prepare):
    """Creates the one-piece slot Keras asked for "like" `reference`.

    `prepare(sharded_slot)` runs before Keras tracks the variable (a deferred
    checkpoint restore fires then, see `_compat.optimizer.add_variable_prepared`).

    Returns:
        Its `ShardedSlot` (the Keras variable is its `variable`).
    """
    num_replicas = strategy.num_replicas_in_sync
    shape = tuple(reference.shape)
    length = _layout.piece_length(math.prod(shape), num_replicas)
    prefix = getattr(reference, "path", None) or str(reference.name)
    slot_name = f"{prefix.replace('/', '_').replace(':', '_')}_{name or 'var'}"
    raw = reference.value if hasattr(reference, "value") else reference
    with strategy.scope(), strategy.extended.colocate_vars_with(raw):
        found = []

        def record(variable):
            found.append(ShardedSlot(variable, shape, num_replicas))
            _state(optimizer).slots.append(found[0])
            prepare(found[0])

        _compat.optimizer.add_variable_prepared(
            optimizer,
            record,
            shape=(length,),
            initializer=initializer,
            dtype=reference.dtype,
            name=slot_name,
        )
    return found[0]


def piece_variables(optimizer, variables, strategy) -> list:
    """This optimizer's piece variable of each model variable (made once).

    Call in a replica context: missing ones are created in one `merge_call`,
    eagerly and in the strategy's scope, like slots.
    """
    state = _state(optimizer)
    keys = [_compat.optimizer.variable_key(optimizer, v) for v in variables]
    missing = [(k, v) for k, v in zip(keys, variables) if k not in state.pieces]
    if missing:

        def create(distribution):
            with tf.init_scope(), distribution.scope():
                for key, variable in missing:
                    if key in state.pieces:
                        continue
                    length = _layout.piece_length(
                        math.prod(variable.shape), distribution.num_replicas_in_sync
                    )
                    state.pieces[key] = tf.Variable(
                        tf.zeros([length], variable.dtype),
                        trainable=False,
                        name="weight_update_piece",
                        aggregation=tf.VariableAggregation.NONE,
                    )

        tf.distribute.get_replica_context().merge_call(create)
    return [state.pieces[k] for k in keys]


@contextlib.contextmanager
def aliased(optimizer, pieces, variables):
    """Within: `update_step(grad, piece, lr)` finds `variable`'s slots.

    The aliases exist only while the update is traced: Keras takes the size of
    its index as the optimizer's variable count (`apply(grads)`).
    """
    for piece, variable in zip(pieces, variables):
        _compat.optimizer.alias_variable(optimizer, piece, variable)
    try:
        yield
    finally:
        for piece in pieces:
            _compat.optimizer.remove_alias(optimizer, piece)
