"""What the all-reduce benchmarks share: the gradient set and the entry script.

Every measurement that starts processes starts `allreduce.py` itself (its hidden
`--worker` / `--fit-worker` flags), so the modules of this benchmark name that
script here rather than their own file.
"""

from __future__ import annotations

import pathlib

MB = 1e6
# The script the worker processes run (this benchmark's entry point).
SCRIPT = str(pathlib.Path(__file__).resolve().with_name("allreduce.py"))


def resnet50_shapes():
    """The trainable weight shapes of `keras.applications.ResNet50(weights=None)`."""
    import keras

    model = keras.applications.ResNet50(weights=None)
    return [tuple(w.shape) for w in model.trainable_weights]
