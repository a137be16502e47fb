"""Conformance checks for strategies that lay weights out over a device mesh.

Run by default on factories registered with `layouts=True` (e.g.
`model-parallel-2x2`, `fully-sharded-2`), on top of every check in
`CHECK_NAMES`; any strategy with a `bytes_per_device(variables)` method can be
checked by name.
"""

from __future__ import annotations

import numpy as np

from keras_replicator.testing import _workloads as w
from keras_replicator.testing._harness import CheckFailure, compare_to_one_device

BATCH = 64


def layouts_split_weights(strategy):
    """Some weight is split (a device stores less than the whole model) and the
    split model trains like one device."""
    if not callable(getattr(strategy, "bytes_per_device", None)):
        raise CheckFailure(
            f"{type(strategy).__name__} has no `bytes_per_device(variables)`: it "
            "lays out no weights"
        )
    with strategy.scope():
        model = w.mlp()
    per_device = strategy.bytes_per_device(model.weights)
    whole = sum(np.asarray(v).nbytes for v in model.weights)
    if max(per_device) >= whole:
        raise CheckFailure(
            f"no weight is split: a device stores {max(per_device)} of the "
            f"{whole} bytes of weights"
        )
    x, y = w.classification_data(1001)

    def workload(model):
        history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
        out = {"weights": model.get_weights()}
        out.update({k: np.asarray(v) for k, v in history.history.items()})
        return out

    worst, errors = compare_to_one_device(strategy, w.mlp, workload)
    errors["largest_device_share"] = max(per_device) / whole
    return worst, errors


CHECKS = {
    "layouts_split_weights": (
        layouts_split_weights,
        "weights split over the mesh, training like one device",
    ),
}
