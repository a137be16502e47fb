"""The asynchronous runtime behind `kr.ParameterServerReplicator`.

The strategy class itself lives in `strategies/parameter_server.py`; this package is
what it runs. One concept per module:

- `_keras`: routes Keras 3 `fit` / `evaluate` / `predict` of PS models (through
  `_compat.install_parameter_server`), makes Keras variable increments atomic and
  refuses sharded Keras variables.
- `_training`: that `fit` / `evaluate` / `predict` loop on a `ClusterCoordinator`.
- `_data`: inputs (arrays, datasets, dataset functions) as per-worker datasets.
- `_faults`: lost steps, parameter-server errors and hung tasks.
- `_retry`: forward passes of `evaluate` / `predict` rerun after a transient gRPC
  error.
- `_serving`: what `worker` and `ps` tasks run (serve until the job ends).
- `_steps`: `distribute_input` / `run_steps` for the TF-Replicator form.
- `_marker`: recognising the strategy without importing it.

See `docs/async.md`.
"""
