"""What `layouts/` reads of Keras' private variable naming (issue 52); no patch.

Keras 3's TensorFlow backend has no layout support (`distribution_lib.
distribute_value` is a TODO; keras-team/keras#18473 is open), so
`ModelParallelReplicator` places each variable from a `tf.variable_creator_scope`
(public), which sees the `tf.Variable`'s name but not the Keras variable's path
that `LayoutMap` keys match. Keras builds that path from its name-scope stack
(`current_path()`, no public accessor) while the Keras variable's `__init__`
makes the `tf.Variable`; the creator reads it the same way.
"""

from __future__ import annotations

import inspect

from keras.src.backend.common import name_scope as _name_scope
from keras.src.backend.common import variables as _common_variables


def keras_variable_path(name: str) -> str:
    """The path Keras gives a variable named `name` made in the current scope."""
    parent = _name_scope.current_path()
    return f"{parent}/{name}" if parent else name


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
