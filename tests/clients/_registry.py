"""The client cases, the three modes they run in, and how results are compared.

A case is a function `case(strategy, workdir) -> dict` of arrays (final weights,
per-step losses, metrics, predictions). One registry drives both the pytest suite
and the table script, as optax's shared test suites do. Nothing here imports
TensorFlow at import time: the table script's parent process stays TF-free.

Modes:
- `one_device`: TensorFlow's default strategy in one process -- the reference.
- `stock`: `tf.distribute.MirroredStrategy` on 2 logical CPUs, or, for the
  multi-worker tutorials, `tf.distribute.MultiWorkerMirroredStrategy` in 2 worker
  processes on 127.0.0.1.
- `ours`: `kr.MultiDeviceReplicator(num_replicas=2)`, or `kr.MultiWorkerReplicator()`
  in 2 worker processes.

Cases that reproduce Keras' own tests compare with the expected values those tests
assert (`Case.expected`) instead of a one-device run.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Callable

MODES = ("one_device", "stock", "ours")
REPLICAS = 2
SEED = 1234
# float32 weights after a few steps of Adam/SGD: every case so far agrees to < 2e-6.
TOLERANCE = 1e-5

# The modules holding the cases, in table order.
CASE_MODULES = (
    "tf_keras",
    "tf_custom_training",
    "tf_input",
    "tf_save_and_load",
    "kerasio_distributed_training",
    "kerasio_custom_train_step",
    "keras_optimizer_distribute",
    "kerashub_kerastuner",
    "tf_multi_worker_keras",
    "tf_multi_worker_ctl",
)


@dataclasses.dataclass(frozen=True)
class Case:
    """One idiom of existing code.

    Attributes:
        name: The function's name, used as the row of the table.
        function: `function(strategy, workdir) -> dict` of results.
        origin: Where the idiom comes from (tutorial, guide or test).
        workers: 1 (local replicas) or 2 (the multi-worker tutorials).
        tolerance: Largest difference from the reference (absolute up to
            magnitude 1, relative above).
        expected: Values asserted by the upstream test, used instead of a
            one-device run; `None` to compare with one device.
        timeout: Seconds allowed for one mode in fresh processes.
    """

    name: str
    function: Callable
    origin: str
    workers: int = 1
    tolerance: float = TOLERANCE
    expected: dict | None = None
    timeout: float = 240.0

    @property
    def reference(self) -> str:
        return "one device" if self.expected is None else "Keras' expected values"


CASES: dict[str, Case] = {}


def client_case(origin: str, **options):
    """Registers the decorated `function(strategy, workdir)` as a case."""

    def register(function):
        CASES[function.__name__] = Case(function.__name__, function, origin, **options)
        return function

    return register


def load_cases() -> dict[str, Case]:
    """Imports every case module (once) and returns the registry."""
    for module in CASE_MODULES:
        importlib.import_module(f"{__package__}.{module}")
    return CASES


def make_strategy(mode: str, workers: int):
    """The strategy of `mode`, built in this (worker) process."""
    import tensorflow as tf

    import keras_replicator as kr

    if mode == "one_device":
        return tf.distribute.get_strategy()
    if mode == "stock":
        if workers > 1:
            return tf.distribute.MultiWorkerMirroredStrategy()
        return tf.distribute.MirroredStrategy(
            [f"/cpu:{index}" for index in range(REPLICAS)]
        )
    if mode == "ours":
        if workers > 1:
            return kr.MultiWorkerReplicator()
        return kr.MultiDeviceReplicator(num_replicas=REPLICAS)
    raise ValueError(f"`mode` must be one of {MODES}. Received: mode={mode!r}.")


def run_case(name: str, mode: str, workdir: str) -> dict:
    """Runs case `name` under `mode`'s strategy; returns its results as numpy."""
    import keras
    import numpy as np

    case = load_cases()[name]
    os.makedirs(workdir, exist_ok=True)
    strategy = make_strategy(mode, case.workers)
    keras.utils.set_random_seed(SEED)
    results = case.function(strategy, workdir)
    return keras.tree.map_structure(np.asarray, results)


class Mismatch(AssertionError):
    """Results differ from the reference; the message says where and by how much."""


def compare(case: Case, reference: dict, candidate: dict) -> float:
    """Largest difference over every result; raises `Mismatch` if too big.

    The difference is absolute for values up to 1 in magnitude and relative above
    (a summed loss of 1e4 carries float32 rounding of 1e-3).
    """
    import numpy as np

    errors = {}
    for key, expected in reference.items():
        if key not in candidate:
            raise Mismatch(f"`{key}` missing from the results")
        want = _leaves(expected)
        got = _leaves(candidate[key])
        if len(want) != len(got):
            raise Mismatch(f"`{key}` has {len(got)} values, expected {len(want)}")
        worst = 0.0
        for a, b in zip(want, got):
            a, b = np.asarray(a), np.asarray(b)
            if a.shape != b.shape:
                raise Mismatch(f"`{key}` has shape {b.shape}, expected {a.shape}")
            if a.dtype.kind in "fc" or b.dtype.kind in "fc":
                a, b = a.astype("float64"), b.astype("float64")
                difference = np.abs(a - b) / np.maximum(1.0, np.abs(a))
                worst = max(worst, float(np.max(difference, initial=0.0)))
            elif not np.array_equal(a, b):
                raise Mismatch(f"`{key}` differs: {b.tolist()} != {a.tolist()}")
        errors[key] = worst
    largest = max(errors.values(), default=0.0)
    if not largest <= case.tolerance:
        key = max(errors, key=errors.get)
        raise Mismatch(
            f"off by {largest:.3g} in `{key}` (tolerance {case.tolerance:g})"
        )
    return largest


def _leaves(value) -> list:
    """The arrays in `value`; a nested list of numbers is one array."""
    import numpy as np

    if isinstance(value, dict):
        return [leaf for key in sorted(value) for leaf in _leaves(value[key])]
    if isinstance(value, (list, tuple)):
        try:
            array = np.asarray(value)
        except ValueError:  # ragged, e.g. a model's weights
            array = None
        if array is not None and array.dtype != object:
            return [array]
        return [leaf for item in value for leaf in _leaves(item)]
    return [np.asarray(value)]
