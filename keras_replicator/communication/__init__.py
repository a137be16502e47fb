"""The gradient path: how replicas' gradients are summed and moved.

Every all-reduce of the library ends in `_all_reduce.all_reduce_sum`, configured by
the strategy's `AllReduceOptions`. One concept per module:

- `options`: `AllReduceOptions`, the user's knobs (buckets, compression, hierarchy,
  transport).
- `_all_reduce`: the one entry point; picks the transport and runs the buckets.
- `_buckets`: tensor fusion, packs in reverse layer order (Jia et al. 2018).
- `_compression`: 16-bit wire formats (float16 / bfloat16).
- `_hierarchy`: local-then-global and 2-D torus sums (Ying et al. 2018).
- `_socket_ring`: the TCP ring transport between CPU workers.
"""

from keras_replicator.communication.options import AllReduceOptions

__all__ = ["AllReduceOptions"]
