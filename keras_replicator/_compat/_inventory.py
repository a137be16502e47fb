"""Every Keras / TensorFlow attribute `_compat` replaces, and every upstream object
our code writes a private attribute on: one table, rendered in docs/compat.md.

A patch that silently stops being installed (lost in a refactor) is as bad as an
upstream change that routes around it, so tests/test_compat.py checks both ways:
after install every `PATCHES` target is our replacement, and every replacement
`_patching.replace` made is listed here. `guard` says how an upstream change is
noticed: `digest` (the replaced or mirrored source is pinned by a digest in
`check_upstream()`), `weak` (only a structural check: the attribute exists, or a
line we rely on is still in the caller's source).
"""

from __future__ import annotations

import dataclasses
import importlib

from keras_replicator._compat import _installer
from keras_replicator._compat._stamps import STAMPS

_TF_TRAINER = "keras.src.backend.tensorflow.trainer.TensorFlowTrainer"
_TF_OPTIMIZER = "keras.src.backend.tensorflow.optimizer.TFOptimizer"
_BASE_OPTIMIZER = "keras.src.optimizers.base_optimizer.BaseOptimizer"
_LOSS_SCALE = "keras.src.optimizers.loss_scale_optimizer.LossScaleOptimizer"
_TF_VARIABLE = "keras.src.backend.tensorflow.core.Variable"
_STEPS = "keras-team/keras#20585, #21172; tensorflow/tensorflow#72388"
_CHIEF = "tensorflow/tensorflow#38635, #31070 (Keras has no chief)"
_NONE = "none filed"


@dataclasses.dataclass(frozen=True)
class Patch:
    """One replaced upstream attribute.

    Attributes:
        target: `module.Class.attr` (or `module.function`) that is replaced.
        patched_by: The `_compat` module that replaces it.
        installer: The `_installer` group that installs it.
        guard: `"digest"` or `"weak"` (see the module docstring).
        upstream: The upstream issue it works around, or why there is none.
        reason: What goes wrong without it.
    """

    target: str
    patched_by: str
    installer: str
    guard: str
    upstream: str
    reason: str


def _patches(owner, names, patched_by, installer, guard, upstream, reason):
    return tuple(
        Patch(f"{owner}.{name}", patched_by, installer, guard, upstream, reason)
        for name in names
    )


_KERAS = _installer.KERAS
PATCHES: tuple[Patch, ...] = (
    *_patches(
        _TF_TRAINER,
        ("make_train_function", "make_test_function", "make_predict_function"),
        "trainer",
        _KERAS,
        "digest",
        _STEPS,
        "stock step functions fail under multi-worker, steps_per_execution > 1 "
        "with jit_compile, and string inputs",
    ),
    *_patches(
        _TF_TRAINER,
        ("_maybe_symbolic_build",),
        "trainer",
        _KERAS,
        "digest",
        "keras-team/keras#20585, #21172",
        "the stock build MEAN-reduces a batch to read its shapes",
    ),
    *_patches(
        "keras.src.losses.loss",
        ("scale_loss_for_distribution", "unscale_loss_for_distribution"),
        "optimizer",
        _KERAS,
        "digest",
        _NONE,
        "Keras divides by the replica count, wrong for uneven batches",
    ),
    *_patches(
        _TF_OPTIMIZER,
        ("_all_reduce_sum_gradients",),
        "optimizer",
        _KERAS,
        "digest",
        _NONE,
        "no hook to weigh replicas by their sample counts or shard the update",
    ),
    *_patches(
        _BASE_OPTIMIZER,
        ("_clip_gradients",),
        "clipping",
        _KERAS,
        "digest",
        _NONE,
        "Keras clips each replica's gradient, not the reduced one",
    ),
    *_patches(
        "tensorflow._api.v2.nn",
        ("compute_average_loss", "scale_regularization_loss"),
        "average_loss",
        _KERAS,
        "digest",
        _NONE + " (TensorFlow's contract: the optimizer sums)",
        "a custom train_step's loss divided by the replicas trains at 1/N in fit",
    ),
    *_patches(
        _BASE_OPTIMIZER,
        ("scale_loss",),
        "optimizer",
        _KERAS,
        "digest",
        _NONE,
        "sample-count weighting must happen inside the tape (sync batch norm)",
    ),
    *_patches(
        _BASE_OPTIMIZER,
        ("apply",),
        "optimizer",
        _KERAS,
        "digest",
        _NONE,
        "a lazy build inside a traced replica function fails",
    ),
    *_patches(
        _LOSS_SCALE,
        ("apply",),
        "optimizer",
        _KERAS,
        "digest",
        _NONE,
        "same lazy build, in LossScaleOptimizer's own apply (issue 22)",
    ),
    *_patches(
        _TF_OPTIMIZER,
        ("add_variable_from_reference",),
        "optimizer",
        _KERAS,
        "digest",
        _NONE + " (Keras shards optimizer state only on JAX)",
        "weight-update sharding: one piece of each slot per replica",
    ),
    *_patches(
        _LOSS_SCALE,
        ("check_finite",),
        "loss_scale",
        _KERAS,
        "digest",
        _NONE + " (_tf_apply's comment states the wrong assumption)",
        "an overflow in one replica's share is missed",
    ),
    *_patches(
        _BASE_OPTIMIZER,
        ("_backend_apply_gradients",),
        "accumulation",
        _KERAS,
        "digest",
        _NONE,
        "gradient_accumulation_steps: merge_call inside a cond branch fails",
    ),
    *_patches(
        "keras.src.backend.tensorflow.trainer.TFEpochIterator",
        ("__init__",),
        "data",
        _KERAS,
        "digest",
        _NONE,
        "one replica per worker pays the distributed iterator's per-step costs",
    ),
    *_patches(
        "keras.src.saving.saving_lib",
        ("save_model", "save_weights_only"),
        "saving",
        _KERAS,
        "digest",
        _CHIEF,
        "every worker writes the user's path (h5 lock errors)",
    ),
    *_patches(
        "keras.src.legacy.saving.legacy_h5_format",
        ("save_model_to_hdf5",),
        "saving",
        _KERAS,
        "digest",
        _CHIEF,
        "every worker writes the user's path (h5 lock errors)",
    ),
    *_patches(
        "keras.src.models.model.Model",
        ("export",),
        "saving",
        _KERAS,
        "digest",
        _CHIEF,
        "every worker exports to the user's path",
    ),
    *_patches(
        "keras.src.callbacks.callback_list.CallbackList",
        ("set_model",),
        "saving",
        _KERAS,
        "digest",
        _CHIEF,
        "stock ModelCheckpoint, BackupAndRestore, TensorBoard write on every worker "
        "(unguarded makedirs, torn in-place backups, N event files): each one "
        "given to fit is routed, per instance",
    ),
    *_patches(
        _TF_TRAINER,
        ("fit", "evaluate", "predict"),
        "parameter_server",
        _installer.PARAMETER_SERVER,
        "weak",
        _NONE + " (tf_keras had ClusterCoordinator support)",
        "Keras 3 cannot train on ParameterServerStrategy",
    ),
    *_patches(
        _TF_VARIABLE,
        ("assign_add", "assign_sub"),
        "parameter_server",
        _installer.PARAMETER_SERVER,
        "weak",
        _NONE,
        "read-then-write increments lose updates on a parameter server",
    ),
    *_patches(
        _TF_VARIABLE,
        ("_initialize",),
        "parameter_server",
        _installer.PARAMETER_SERVER,
        "weak",
        _NONE,
        "a partitioned (ShardedVariable) Keras variable cannot train",
    ),
)


def resolve(target: str):
    """`(owner, name)` for a `module.Class.attr` / `module.function` target."""
    parts = target.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for part in parts[split:-1]:
            owner = getattr(owner, part)
        return owner, parts[-1]
    raise ImportError(f"No module found for {target!r}")


def render() -> str:
    """The inventory as Markdown tables (docs/compat.md holds this text)."""
    lines = [
        "| target | patched by | installed by | guard | upstream | why |",
        "|---|---|---|---|---|---|",
    ]
    for p in PATCHES:
        lines.append(
            f"| `{p.target}` | `_compat/{p.patched_by}.py` | {p.installer} | "
            f"{p.guard} | {p.upstream} | {p.reason} |"
        )
    lines += [
        "",
        "Attributes stamped on upstream objects:",
        "",
        "| attribute | on | set by | why |",
        "|---|---|---|---|",
    ]
    for s in STAMPS:
        lines.append(f"| `{s.attribute}` | {s.on} | `{s.set_by}` | {s.reason} |")
    return "\n".join(lines) + "\n"
