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
        "_track_variable",
        "keras.optimizers.Optimizer (shadowed during one add_variable)",
        "_compat/optimizer.py add_variable_prepared",
        "a deferred checkpoint restore must wait until the slot is set up",
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
