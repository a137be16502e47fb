"""The gradient path: how replicas' gradients are summed and moved.

Gradients are summed by `_all_reduce.all_reduce_sum` (buckets, compression, the
division) and, under weight-update sharding, by `sharding/`'s reduce-scatter; both,
and the step's logs, move bytes through the strategy's one `_transport.Transport`
(built by its constructor: the socket ring or TensorFlow's collectives). One concept
per module:

- `options`: `AllReduceOptions`, the user's knobs (buckets, compression, hierarchy,
  transport).
- `_all_reduce`: the gradient all-reduce: plans and runs the buckets.
- `_buckets`: tensor fusion, packs in reverse layer order (Jia et al. 2018).
- `_compression`: 16-bit wire formats (float16 / bfloat16).
- `_grid`: the one 2-D design (rows, columns, chunks) both hierarchical sums follow.
- `_hierarchy`: local-then-global and 2-D torus sums (Ying et al. 2018) on
  TensorFlow's sub-group collectives (`ring/_hierarchical`: the same on the ring).
- `_reduction`: the reduction rule: what is summed, and divided by what.
- `_division`: the division by the summed sample count (fused into the ring).
- `_gradient_form`: the form a gradient is reduced in (static shapes, exact
  embedding gradients).
- `_transport`: the `Transport` every byte goes through, one per strategy
  (`transport_for`); `_socket_transport` (the ring) and `_collective_transport`
  (TensorFlow's collectives, `_hierarchy`) implement it.
- `ring/`: the TCP ring transport between CPU workers (`ring/__init__` lists its
  modules: the ring, its setup, handshake, frames and shared memory).
"""

from keras_replicator.communication.options import AllReduceOptions

__all__ = ["AllReduceOptions"]
