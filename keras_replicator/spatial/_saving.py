"""Saving a partitioned model as the model the user wrote.

A `SpatialModel` is an execution plan: its layers exchange halo rows with other
replicas and cannot run on whole images, so a `.keras` file of it would load
nowhere useful (and Keras cannot rebuild it without the strategy). Saving therefore
writes the *unpartitioned* model, with the partitioned model's current weights and
optimizer state: `keras.models.load_model` gives a model that runs on one device,
and `kr.spatial.partition` of the loaded model continues training where it stopped
(the optimizer state is carried over in both directions). Both models list their
weights and optimizer variables in the same order (`partition` clones the layers
one for one), which is what the copies rely on; a mismatch is an error, never a
silent partial copy.
"""

from __future__ import annotations


def compile_like(source, target) -> None:
    """Compiles `target` like `source` unless it already is; builds its optimizer.

    Without it, a partitioned model compiled after `partition` (or recompiled
    with another optimizer) would save the original model's optimizer state,
    or none. `jit_compile` is not compared: the partitioned model never uses
    XLA, and the original keeps its own setting.
    """
    if not source.compiled:
        return
    config = dict(source.get_compile_config())
    wanted = _without_jit(config)
    if not target.compiled or _without_jit(target.get_compile_config()) != wanted:
        config["jit_compile"] = (
            target.get_compile_config().get("jit_compile", "auto")
            if target.compiled
            else "auto"
        )
        target.compile_from_config(config)
    if not target.optimizer.built:
        target.optimizer.build(target.trainable_variables)


def _without_jit(config):
    return {k: v for k, v in config.items() if k != "jit_compile"}


def copy_optimizer_state(source, target) -> None:
    """Gives `target.optimizer` the variable values of `source.optimizer`.

    Does nothing if `source` has no built optimizer or `target` is not compiled.
    `target`'s optimizer is built on its trainable variables first if needed.

    Raises:
        ValueError: if the two optimizers' variables do not correspond.
    """
    if not _has_built_optimizer(source) or getattr(target, "optimizer", None) is None:
        return
    if not target.optimizer.built:
        target.optimizer.build(target.trainable_variables)
    values = [variable.numpy() for variable in source.optimizer.variables]
    variables = target.optimizer.variables
    shapes = [tuple(v.shape) for v in values]
    if shapes != [tuple(v.shape) for v in variables]:
        raise ValueError(
            f"The optimizer state of `{source.name}` ({len(values)} variables) does "
            f"not match the optimizer of `{target.name}` ({len(variables)} "
            f"variables). Received shapes {shapes[:6]}... and "
            f"{[tuple(v.shape) for v in variables][:6]}.... Compile both with the "
            "same optimizer."
        )
    for variable, value in zip(variables, values):
        variable.assign(value)


def _has_built_optimizer(model) -> bool:
    optimizer = getattr(model, "optimizer", None)
    return optimizer is not None and optimizer.built
