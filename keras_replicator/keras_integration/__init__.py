"""What makes Keras 3 `fit` / `evaluate` / `predict` correct on our strategies.

`_hooks.install()` (called by every Replicator's constructor) hands `KerasHooks` to
`_compat`, which reroutes Keras' internals to them. One concept per module:

- `_hooks`: `KerasHooks`, every question `_compat`'s patches ask, and `install()`.
- `_steps`: the train / test / predict functions; `_loop` the compiled multi-step
  loop (`steps_per_execution > 1`).
- `_sample_count`: each replica's declared sample count (read where Keras hands
  back, passed to the reduction rule, `communication/_reduction`); `_accumulation`
  the rule over a gradient-accumulation cycle; `_wrap_optimizer`
  (`kr.wrap_optimizer`).
- `_global_metrics`: exact global metric logs; `_sample_counter` (throughput).
- `_fit_input`: what Keras' epoch iterator iterates (plain tf.data with one
  replica per worker, else TF's distributed dataset).
- `_validation`: early errors for misuse (model outside the scope, small batches).

Who writes a file on several workers, and the atomic writes themselves, are
`keras_replicator/_files/` (below this package and `callbacks/`): `_hooks` routes
Keras' own saving, `ModelCheckpoint`, `BackupAndRestore` and TensorBoard there.

Nothing is re-exported here: the package is internal, and keeping this file free of
imports means importing one of its modules never pulls in `_hooks`.
"""
