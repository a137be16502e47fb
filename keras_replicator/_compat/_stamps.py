"""Every private attribute our code writes on a TensorFlow / Keras object.

The second half of `_compat`'s inventory (`_inventory` has the replaced
attributes); rendered with it in docs/compat.md. `_kr_*` names are found by a
scan of the package (tests/test_compat.py); each must be listed here.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Stamp:
    """A private attribute our code writes on a TensorFlow / Keras object."""

    attribute: str
    on: str
    set_by: str
    reason: str


#: Private attributes written on TensorFlow / Keras objects (our own subclasses'
#: attributes excluded). `_kr_*` names are found by a scan of the package
#: (tests/test_compat.py); each must be listed here with its reason.
STAMPS: tuple[Stamp, ...] = (
    Stamp(
        "_serialize_to_tensors, _restore_from_tensors",
        "tf.Variable (a weight-update-sharding slot piece)",
        "_compat/optimizer.py override_checkpointing",
        "TF's per-object checkpoint protocol: a piece saves as the whole slot",
    ),
    Stamp(
        "_save_model",
        "keras.callbacks.ModelCheckpoint (each instance fit is given)",
        "_compat/saving.py _patch_stock_callbacks",
        "the chief writes, atomically (with BackupAndRestore's and TensorBoard's "
        "public events, routed per instance: their classes stay Keras' own)",
    ),
    Stamp(
        "_num_batches, reset",
        "keras' TFEpochIterator (each one our multi-worker strategies' fit builds "
        "over a dataset they distributed)",
        "_compat/data.py _forget_length",
        "unequal worker shards would stop workers after different step counts",
    ),
    Stamp(
        "_enumerate_iterator",
        "keras' TFEpochIterator (each one our strategies' fit builds)",
        "_compat/data.py _resuming",
        "resume mid-epoch after a backup (keras-team/keras#15711, closed "
        "unmerged: fit resumes epochs, not steps); Keras' class stays its own",
    ),
    Stamp(
        "_initial_epoch",
        "keras.Model",
        "_compat/trainer.py set_initial_epoch",
        "Keras' own resume attribute, written as its BackupAndRestore does",
    ),
    Stamp(
        "_replicator_state",
        "our strategies (subclasses of tf.distribute strategies)",
        "_replicator_state.register",
        "the library's one typed state object, held by the strategy so it dies with it",
    ),
    Stamp(
        "_collective_key_base",
        "tf.distribute.MirroredStrategy (stock, for tests)",
        "_compat/strategy.py stock_mirrored_strategy",
        "TF's knob for distinct collective keys per strategy in one process",
    ),
)
