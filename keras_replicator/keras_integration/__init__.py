"""What makes Keras 3 `fit` / `evaluate` / `predict` correct on our strategies.

`_hooks.install()` (called by every Replicator's constructor) hands `KerasHooks` to
`_compat`, which reroutes Keras' internals to them. One concept per module:

- `_hooks`: `KerasHooks`, every question `_compat`'s patches ask, and `install()`.
- `_steps`: the train / test / predict functions; `_loop` the compiled multi-step
  loop (`steps_per_execution > 1`).
- `_gradients`: the gradient reduction rule (sample-weighted mean vs stock sum);
  `_sample_count` each replica's declared sample count; `_wrap_optimizer`
  (`kr.wrap_optimizer`).
- `_global_metrics`: exact global metric logs; `_sample_counter` (throughput).
- `_validation`: early errors for misuse (model outside the scope, small batches).
- `_worker_files`: who writes a file on several workers (the chief, atomically).
- `_atomic_publish`: writing a file or directory into place in one step
  (symlinks, directory swap, leftovers of killed saves).

Nothing is re-exported here: the package is internal, and keeping this file free of
imports means importing one of its modules (as `callbacks/` does) never pulls in
`_hooks`, which reaches up to `callbacks.BackupAndRestore` when Keras' own
BackupAndRestore runs on several workers.
"""
