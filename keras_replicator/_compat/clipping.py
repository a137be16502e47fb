"""Keras' `BaseOptimizer._clip_gradients`: where clipping waits for the reduction.

Keras clips each replica's gradient before the all-reduce
(`BaseOptimizer._backend_apply_gradients` calls `_clip_gradients`, then
`_backend_update_step`, which reduces), so a multi-replica step clips a gradient
no device would compute (keras-team/keras has no issue; stock tf.distribute is
about 1.4x off one device, our sample-weighted gradients were 10x).
No public hook runs between the reduction and the update, so this patch makes
the replica-side clipping a no-op where `hooks.defers_clipping(optimizer)` says
so; the library clips the reduced gradient instead
(`communication/_clipping.py`). Elsewhere Keras' own clipping runs unchanged.
"""

from __future__ import annotations

from keras.src.optimizers import base_optimizer as _base_optimizer

from keras_replicator._compat._patching import changed_digests, replace, unpatched

# Source digests of the internals we replace, for keras==3.15.1.
DIGESTS = {
    "BaseOptimizer._clip_gradients": "152b956e23c91ad9",
}


def _upstream_objects():
    return {
        "BaseOptimizer._clip_gradients": unpatched(
            _base_optimizer.BaseOptimizer._clip_gradients
        ),
    }


def check_upstream() -> dict[str, str]:
    """{name: what changed} for the clipping internal replaced here."""
    return changed_digests(DIGESTS, _upstream_objects())


def install(hooks) -> None:
    """Routes Keras' replica-side clipping through `hooks.defers_clipping`."""

    def deferring(original):
        def _clip_gradients(self, grads):
            if hooks.defers_clipping(self):
                return grads
            return original(self, grads)

        return _clip_gradients

    replace(_base_optimizer.BaseOptimizer, "_clip_gradients", deferring)
