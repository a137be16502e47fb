"""Layouts: Keras `LayoutMap`s on TensorFlow's DTensor engine (issue 52).

`kr.ModelParallelReplicator(layout_map)` (`strategies/model_parallel.py`) trains a
model whose variables are split over a device mesh as a Keras or keras-hub
`LayoutMap` says. TensorFlow's own engine does the work: DTensor's meshes and
layouts, its SPMD expansion of every op of the step, and the collectives that
expansion inserts (all-gathers where a sharded weight meets a sharded batch,
reductions after a row-split matmul, the cross-"batch" gradient sum). Written
here only what TensorFlow and Keras lack, one concept per module:

- `_mesh`: a `keras.distribution.DeviceMesh` as a DTensor mesh. Keras' own
  TensorFlow converter (`keras.src.backend.tensorflow.distribution_lib`) is
  marked "DO NOT USE" and its `distribute_value` is a TODO.
- `_clients`: several worker processes as one mesh. DTensor's multi-client
  mode finds its cluster only in its own `DTENSOR_*` variables; this reads the
  `TF_CONFIG` that launchers set and starts the client from `kr.devices(n)`.
- `_plan`: which DTensor layout each Keras variable gets: the `LayoutMap`'s
  (Keras' own `re.fullmatch` lookup), else the layout of the weight an optimizer
  slot belongs to, else replicated; axes the mesh lacks and keys that matched
  no variable are errors, never silent replication.
- `_variables`: the `tf.Variable` a Keras variable holds on the mesh: a DTensor
  `DVariable` that reads whole in eager code (`numpy()`, saving) and is
  assigned from whole values (loading), so every saved file holds whole
  weights and loads into any layout.
- `_step`: what a Keras step on the mesh needs beyond DTensor's expansion:
  predictions split over the batch axis only before losses and metrics, and
  gradients laid out as their variables before the optimizer (two silent
  errors of the expansion, measured there).
- `_known_errors`: model shapes DTensor trains wrong without an error and that
  cannot be kept out from outside the layer (a row-split kernel right after a
  `Concatenate`): found in a functional graph, and warned about.
- `_batches`: the dataset's batches as DTensors split over the batch axis. A
  `dtensor.DTensorDataset` cannot stand in: it needs every batch full (Keras'
  last batch is not) and its iterator takes Keras' `tf.while_loop` path, whose
  `OptionalFromValue` op DTensor cannot expand ("does not implement layout
  propagation").
"""
