"""Weight-update sharding: each replica updates 1/N of the weights (issue 24).

Turned on with `kr.AllReduceOptions(shard_weight_update=True)`; nothing here is
public, and the user's optimizer stays the model's optimizer, of its own class:
Keras is patched only where it makes a slot (`_compat/optimizer.py`), the update
runs in the gradient all-reduce's place, and the slots save themselves whole.
Not a wrapping optimizer (as `LossScaleOptimizer` wraps): `compile` offers no
hook to put one in before users call `model.optimizer.build` or checkpoint
`model.optimizer`, and a wrapper's `tf.train.Checkpoint` object graph is not
the unsharded optimizer's, so sharded checkpoints would stop loading anywhere.
One concept per module:

- `_layout`: which piece of each variable a replica owns, and the `[N, C]`
  bucket matrix whose rows carry the pieces.
- `_exchange`: reduce-scatter and all-gather of those rows over the strategy's
  `communication/_transport` (the socket ring's own phases, or an all-reduce
  and a slice).
- `_slots`: the optimizer's one-piece slots and piece variables.
- `_update`: the sharded update (all-reduce and per-variable update in one);
  it asks `communication/` for the reduction rule, the bucket plan and the
  transport, nothing else.
- `_support`: which optimizers shard exactly (element-wise ones), and when
  sharding applies.
- `_saving`: `PieceSlot`, the slot variable that reads whole (gathered) and is
  assigned whole (cut into pieces), so every saved format holds whole state.
"""
