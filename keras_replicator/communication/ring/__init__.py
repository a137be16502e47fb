"""The socket ring: our TCP all-reduce between CPU workers (`transport="socket"`).

The default transport between CPU workers of a `MultiWorkerReplicator`. One
concept per module:

- `_socket_ring`: `SocketRing`, the ring's collectives (all-reduce in two phases,
  reduce-scatter, all-gather) on two connections per worker.
- `_setup`: the pieces of opening: ports, the table every worker shares (one
  all-reduce of the strategy), the machine key and the ring's order,
  connecting, and giving up together.
- `_handshake`: who gets in: the job's secret, proven by every connection; the
  listener serving every connection at once.
- `_frames`: the bytes on the wire: per-call headers, deadlines, one ring step.
- `_arrays`: the calls' arrays: checked inputs and `out=` buffers, count slots.
- `_opening`: `SocketRing.connect`'s work: the flat ring, ordered by machine,
  then its rows and columns where the machines form a grid.
- `_shared_memory`: payloads through shared memory between workers of one
  machine (the sockets carry notes); `_memfd` the anonymous segments,
  `_handover` passing them to the neighbour as descriptors; `_passes` the add,
  division and copy of a received chunk in one read.
- `_hierarchical`: the all-reduce in rows (one machine) and columns (across
  machines), on the ring's own transport.

Nothing is re-exported here: the package is internal.
"""
