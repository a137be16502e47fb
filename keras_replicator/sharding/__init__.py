"""Weight-update sharding: each replica updates 1/N of the weights (issue 24).

Turned on with `kr.AllReduceOptions(shard_weight_update=True)`; nothing here is
public. One concept per module:

- `_layout`: which piece of each variable a replica owns, and the `[N, C]`
  bucket matrix whose rows carry the pieces.
- `_exchange`: reduce-scatter and all-gather of those rows over the strategy's
  `communication/_transport` (the socket ring's own phases, or an all-reduce
  and a slice).
- `_slots`: the optimizer's one-piece slots and piece variables.
- `_update`: the sharded `_backend_update_step`; it asks `communication/` for
  the reduction rule, the bucket plan and the transport, nothing else.
- `_support`: which optimizers shard exactly (element-wise ones), and when
  sharding applies.
- `_saving`: optimizer state gathered into whole variables for checkpoints.
"""
