"""Every touch of TensorFlow / Keras internals, in one package, split by target.

Each patch names the upstream issue it works around. `check_upstream()` compares the
internals we replace or read against the pinned versions, and `tests/test_compat.py`
fails loudly when they change, so a Keras or TensorFlow upgrade cannot silently
route around our fixes.

This package is a leaf: it imports nothing from keras_replicator outside itself.
The Keras patches are installed once (`install(hooks)`, called by
`keras_integration._hooks.install()` from every Replicator strategy's constructor);
they ask `hooks` what to do, and only change behaviour when the model's strategy is a
Replicator strategy: stock strategies keep stock Keras behaviour, which is what lets
the conformance suite compare the two side by side.

Every patch is listed in one inventory (`PATCHES` and `STAMPS`, from `_inventory`;
rendered in docs/compat.md): target, patching module, installer, guard (a source
digest, or a weaker structural check), upstream issue and reason. Every group of
patches goes in through one install-once mechanism (`_installer.install_once`),
which first checks the running Keras and TensorFlow against the supported range
(`_versions.SUPPORTED`; `KERAS_REPLICATOR_ALLOW_UNSUPPORTED=1` downgrades the error
to a warning that lists what `check_upstream()` found changed).

Modules, by what they patch or read:

- `trainer`: Keras' TF trainer (step functions, symbolic build, epoch state).
- `optimizer`: loss scaling, the gradient all-reduce, the optimizer's lazy build;
  under weight-update sharding, one-piece slots, the sharded update and saving.
- `clipping`: Keras' replica-side gradient clipping, deferred to the reduced
  gradient under our strategies.
- `average_loss`: TensorFlow's custom-loop loss helpers (`tf.nn.compute_average_loss`,
  `scale_regularization_loss`) inside our steps.
- `loss_scale`: `LossScaleOptimizer`'s finiteness verdict, agreed across replicas
  (an overflow in one replica skips the step on all).
- `accumulation`: `gradient_accumulation_steps` (Keras' update/accumulate branch
  moved to the cross-replica context; local accumulators, one all-reduce per update).
- `lamb`: Keras' `Lamb` step cut at its norms, for weight-update sharding.
- `data`: a distributed dataset's length across workers.
- `saving`: Keras' own saving, ModelCheckpoint, BackupAndRestore, TensorBoard on
  several workers.
- `parameter_server`: fit / evaluate / predict on `ParameterServerStrategy`.
- `strategy`: tf.distribute internals (collective keys, multi-worker mode, the
  ordering token of its NCCL collectives).
- `layers`: the batch-norm `_moments` hook.

And the machinery: `_inventory` (the table), `_installer` (install once, after the
gate), `_versions` (the supported range and the gate), `_patching` (`replace`,
digests), `_older_digests` (digests of older supported Keras releases).
"""

from __future__ import annotations

# The version check needs nothing but the versions: it comes first, so a Keras
# whose private modules moved gets the supported-range message, not an ImportError
# from one of the patch modules below.
from keras_replicator._compat import _versions

try:
    from keras_replicator._compat import (
        _installer,
        accumulation,
        average_loss,
        clipping,
        data,
        lamb,
        layers,
        layouts,
        loss_scale,
        optimizer,
        parameter_server,
        saving,
        strategy,
        trainer,
    )
    from keras_replicator._compat._inventory import PATCHES, STAMPS
    from keras_replicator._compat.layers import register_batch_norm_moments_hook
    from keras_replicator._compat.layouts import (
        DTENSOR_SETTINGS,
        apply_dtensor_settings,
        keras_variable_path,
    )
    from keras_replicator._compat.optimizer import optimizer_variable_index
    from keras_replicator._compat.parameter_server import (
        closure_queue_state,
        install_parameter_server,
        stop_coordinator,
        symbolic_build,
    )
    from keras_replicator._compat.saving import WORKER_FILES_DIGESTS
    from keras_replicator._compat.strategy import (
        collective_ordering_token,
        in_multi_worker_mode,
        is_replicator,
        is_replicator_current,
        next_collective_key_base,
        stock_mirrored_strategy,
    )
    from keras_replicator._compat.trainer import (
        in_keras_symbolic_build,
        initial_epoch_of,
        loss_tracker,
        replica_mean_loss,
        set_initial_epoch,
    )
except (ImportError, AttributeError) as error:  # internals missing or moved
    raise _versions.missing_internals_error(error) from error

# Source digests of the Keras internals we replace, for keras==3.15.1 (the Keras
# saving functions behind `_patch_worker_files` are in `WORKER_FILES_DIGESTS`).
UPSTREAM_DIGESTS = {
    **trainer.DIGESTS,
    **optimizer.DIGESTS,
    **lamb.DIGESTS,
    **loss_scale.DIGESTS,
    **accumulation.DIGESTS,
    **clipping.DIGESTS,
    **average_loss.DIGESTS,
    **saving.CHECKPOINT_DIGESTS,
    **data.DIGESTS,
}

_PATCHED = (
    trainer,
    optimizer,
    clipping,
    average_loss,
    loss_scale,
    accumulation,
    data,
    saving,
)
_CHECKED = (
    trainer,
    optimizer,
    lamb,
    loss_scale,
    accumulation,
    clipping,
    average_loss,
    data,
    saving,
    parameter_server,
    strategy,
    layers,
    layouts,
)


def install(hooks) -> None:
    """Routes Keras' internals to `hooks`, once per process.

    This package stays a leaf: it knows which internals to replace, never what our
    replacements do. `hooks` (`keras_integration/_hooks.KerasHooks`) answers for
    the library; `keras_integration._hooks.install()` is the caller.

    Raises:
        UnsupportedVersionError: The running Keras or TensorFlow is outside
            `SUPPORTED_VERSIONS` (and `KERAS_REPLICATOR_ALLOW_UNSUPPORTED` is not
            `1`).
    """

    def install_all():
        for module in _PATCHED:
            module.install(hooks)

    _installer.install_once(_installer.KERAS, install_all)


SUPPORTED_VERSIONS = _versions.SUPPORTED
UnsupportedVersionError = _versions.UnsupportedVersionError
check_versions = _versions.check_versions


def check_upstream() -> dict[str, str]:
    """Returns {name: what changed} for every upstream internal we rely on."""
    changed = {}
    for module in _CHECKED:
        changed.update(module.check_upstream())
    return changed


__all__ = [
    "DTENSOR_SETTINGS",
    "PATCHES",
    "STAMPS",
    "SUPPORTED_VERSIONS",
    "UPSTREAM_DIGESTS",
    "UnsupportedVersionError",
    "WORKER_FILES_DIGESTS",
    "apply_dtensor_settings",
    "check_upstream",
    "check_versions",
    "closure_queue_state",
    "collective_ordering_token",
    "in_keras_symbolic_build",
    "in_multi_worker_mode",
    "initial_epoch_of",
    "install",
    "install_parameter_server",
    "is_replicator",
    "is_replicator_current",
    "keras_variable_path",
    "loss_tracker",
    "next_collective_key_base",
    "stock_mirrored_strategy",
    "optimizer_variable_index",
    "register_batch_norm_moments_hook",
    "replica_mean_loss",
    "set_initial_epoch",
    "stop_coordinator",
    "symbolic_build",
]
