"""The gradient path: how replicas' gradients are summed and moved.

Gradients are summed by `_all_reduce.all_reduce_sum` (buckets, compression, the
division) and, under weight-update sharding, by `sharding/`'s reduce-scatter; both
move bytes through `_transport` (the socket ring or TensorFlow's collectives, chosen
by `_transport.transport_for` from the strategy's `AllReduceOptions`). One concept per
module:

- `options`: `AllReduceOptions`, the user's knobs (buckets, compression, hierarchy,
  transport).
- `_all_reduce`: the gradient all-reduce: plans and runs the buckets.
- `_buckets`: tensor fusion, packs in reverse layer order (Jia et al. 2018).
- `_compression`: 16-bit wire formats (float16 / bfloat16).
- `_hierarchy`: local-then-global and 2-D torus sums (Ying et al. 2018).
- `_reduction`: the reduction rule: what is summed, and divided by what.
- `_division`: the division by the summed sample count (fused into the ring).
- `_gradient_form`: the form a gradient is reduced in (static shapes, exact
  embedding gradients).
- `_transport`: the one small interface (`all_reduce`, `reduce_scatter`,
  `all_gather`) over the socket ring or TensorFlow's collectives.
- `ring/`: the TCP ring transport between CPU workers (`ring/__init__` lists its
  modules: the ring, its setup, handshake, frames and shared memory).
"""

from keras_replicator.communication.options import AllReduceOptions

__all__ = ["AllReduceOptions"]
