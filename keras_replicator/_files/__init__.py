"""Files written by several workers: who writes, and publishing in one step.

Below `callbacks/` and `keras_integration/`, which both save through it (Keras'
own saving, `ModelCheckpoint`, `BackupAndRestore`, TensorBoard logs); it imports
neither. One concept per module:

- `worker_files`: who writes a file when every worker saves (the chief,
  atomically; the others into scratch).
- `atomic_publish`: writing a file or directory into place in one step
  (`write_atomically`: sharded weights index last, directories swapped).
- `trusted_dirs`: which directories a save may use (only those no other user
  can change), walked and used through directory descriptors.
- `links`: which symlinks a save may follow (only the caller's own).
- `leftovers`: staging and holder names, and the leftovers of killed saves.
- `backup_removal`: deleting a finished backup in a crash-safe order.

Nothing is re-exported here: the package is internal.
"""
