"""What `layouts/` reads of Keras' private variable naming, and the DTensor
setting it needs (issue 52); no patch.

Keras 3's TensorFlow backend has no layout support (`distribution_lib.
distribute_value` is a TODO; keras-team/keras#18473 is open), so
`ModelParallelReplicator` places each variable from a `tf.variable_creator_scope`
(public), which sees the `tf.Variable`'s name but not the Keras variable's path
that `LayoutMap` keys match. Keras builds that path from its name-scope stack
(`current_path()`, no public accessor) while the Keras variable's `__init__`
makes the `tf.Variable`; the creator reads it the same way.

DTensor merges the independent all-reduces of a step into one
(`DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION`, an environment variable its
C++ passes read when they expand a function; on by default, undocumented) and
moves that merged all-reduce past reads of the variables it feeds: a metric read
after its update in the same step returns the previous step's value, without
an error (Keras' per-batch logs, a custom `train_step`'s returned metrics,
`BatchNormalization(synchronized=True)`'s statistics, a loss-scale update).
Standalone repro: docs/upstream.md#dtensor-combined-all-reduce-order. The
setting turns the merge off; `tests/layouts/test_step.py` runs the repro both
ways, so it fails loudly when the name stops working or upstream fixes the order.
"""

from __future__ import annotations

import inspect
import os
import warnings

from keras.src.backend.common import name_scope as _name_scope
from keras.src.backend.common import variables as _common_variables


def keras_variable_path(name: str) -> str:
    """The path Keras gives a variable named `name` made in the current scope."""
    parent = _name_scope.current_path()
    return f"{parent}/{name}" if parent else name


# Read by DTensor's expansion each time it compiles a function.
DTENSOR_SETTINGS = {"DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION": "0"}


def apply_dtensor_settings() -> None:
    """Sets `DTENSOR_SETTINGS` in this process's environment (see above)."""
    for name, value in DTENSOR_SETTINGS.items():
        previous = os.environ.get(name)
        if previous is not None and previous != value:
            warnings.warn(
                f"`{name}={previous}` is set, but keras_replicator sets it to "
                f"{value!r}: DTensor's merged all-reduces are read out of order "
                "(docs/upstream.md#dtensor-combined-all-reduce-order), which makes "
                "metrics lag a step without an error.",
                stacklevel=3,
            )
        os.environ[name] = value


def check_upstream() -> dict[str, str]:
    """{name: what changed} in the Keras naming `keras_variable_path` mirrors."""
    changed = {}
    if not callable(getattr(_name_scope, "current_path", None)):
        changed["name_scope.current_path"] = "missing"
        return changed
    source = inspect.getsource(_common_variables.Variable.__init__)
    for line in (
        "parent_path = current_path()",
        'self._path = f"{parent_path}/{name}"',
        "self._initialize_with_initializer(initializer)",
    ):
        if line not in source:
            changed["KerasVariable.__init__: path"] = f"no longer has {line!r}"
    return changed
