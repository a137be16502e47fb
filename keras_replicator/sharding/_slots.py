"""An optimizer's state under weight-update sharding: one piece per replica.

When a sharding strategy builds an optimizer, each slot Keras would make "like"
a model variable (`add_variable_from_reference`: momenta, velocities,
accumulators) is made as a 1-D variable of one piece (`_layout.piece_length`)
instead, a `_saving.PieceSlot` (it reads and writes whole, so Keras saves and
loads it unchanged). It is still an optimizer variable, in the same place of
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

import keras
import tensorflow as tf

from keras_replicator import _compat
from keras_replicator.sharding import _layout, _saving

#: Slots of these names stay whole: Keras updates them on whole variables.
WHOLE_SLOT_NAMES = ("average", "gradient_accumulator")


@dataclasses.dataclass
class _State:
    pieces: dict = dataclasses.field(default_factory=dict)  # var key -> tf.Variable


_STATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _state(optimizer) -> _State:
    state = _STATES.get(optimizer)
    if state is None:
        state = _STATES[optimizer] = _State()
    return state


def add_piece_slot(optimizer, reference, name, initializer, strategy):
    """Creates the one-piece slot Keras asked for "like" `reference`.

    Made as Keras' `add_variable` makes a slot (in the optimizer's name scope,
    then tracked), with the name Keras' `add_variable_from_reference` gives it,
    as a `_saving.PieceSlot`. Its checkpointing is set up before Keras tracks
    it: TensorFlow restores a deferred `tf.train.Checkpoint` value into an
    optimizer variable the moment it is tracked.

    Returns:
        The `_saving.PieceSlot`, now one of `optimizer.variables`.
    """
    num_replicas = strategy.num_replicas_in_sync
    shape = tuple(reference.shape)
    length = _layout.piece_length(math.prod(shape), num_replicas)
    prefix = getattr(reference, "path", None) or str(reference.name)
    slot_name = f"{prefix.replace('/', '_').replace(':', '_')}_{name or 'var'}"
    raw = reference.value if hasattr(reference, "value") else reference
    with strategy.scope(), strategy.extended.colocate_vars_with(raw):
        with keras.name_scope(optimizer.name, caller=optimizer):
            slot = _saving.PieceSlot(
                shape,
                strategy,
                initializer=keras.initializers.get(initializer),
                shape=(length,),
                dtype=reference.dtype,
                aggregation="none",
                name=slot_name,
            )
    _saving.make_checkpointable(slot)
    _compat.optimizer.track_variable(optimizer, slot)
    return slot


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
