"""How to build TensorFlow's `SlurmClusterResolver` for this Slurm task's GPUs.

Standard library only: `keras_replicator.launch` calls it in a child process and
`kr.auto()` in the training process; neither needs TensorFlow for this decision.

TensorFlow's `SlurmClusterResolver` (default `auto_set_gpu=True`) assumes every
task sees every GPU of its node: it counts the GPUs in `CUDA_VISIBLE_DEVICES` (or
with `nvidia-smi`), splits them evenly between the node's tasks and rewrites
`CUDA_VISIBLE_DEVICES` to task `k`'s share. When `srun` has already bound GPUs to
each task (`--gpus-per-task`, `--gpu-bind`), that breaks: a task that sees one
GPU among two tasks gets zero GPUs per task (`range() arg 3 must not be zero`),
and a task Slurm gave "2,3" is moved to "1", another task's GPU.

The rule (conservative: Slurm's own variables must show the binding): Slurm bound
GPUs to this task when `CUDA_VISIBLE_DEVICES` names GPUs and either

1. `SLURM_GPU_BIND` (set by `srun --gpu-bind`) asks for a binding other than
   `none`, or
2. this task sees fewer GPUs than the step has on this node: `SLURM_STEP_GPUS`
   (the step's GPU ids on this node), else `SLURM_GPUS_ON_NODE` (their count).

`SLURM_JOB_GPUS` (the whole job's GPUs, which a step may not all use) and
`SLURM_GPUS_PER_TASK` (a request; whether Slurm binds on it depends on its
version) are not evidence on their own. Then the resolver derives only the
cluster and `CUDA_VISIBLE_DEVICES` stays as Slurm set it. Otherwise (every task
sees the node's GPUs) TensorFlow's own assignment is kept.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping

_NO_GPUS = ("", "NoDevFiles", "-1")


def _count_ids(raw: str) -> int:
    """The number of GPU ids in a Slurm list such as "0,1" or "0-3,6"."""
    count = 0
    for part in raw.split(","):
        low, dash, high = part.strip().partition("-")
        if dash and low.isdigit() and high.isdigit():
            count += int(high) - int(low) + 1
        elif part.strip():
            count += 1
    return count


def _step_gpus_on_node(environ: Mapping[str, str]) -> int | None:
    """How many GPUs this step has on this node, or `None` when Slurm is silent."""
    step_gpus = environ.get("SLURM_STEP_GPUS", "").strip()
    if step_gpus not in _NO_GPUS:
        return _count_ids(step_gpus)
    on_node = environ.get("SLURM_GPUS_ON_NODE", "").strip().rpartition(":")[2]
    return int(on_node) if on_node.isdigit() else None


def _binding_requested(environ: Mapping[str, str]) -> bool:
    """Whether `SLURM_GPU_BIND` asks for a binding (not `none`, not only verbose)."""
    tokens = {t.strip().lower() for t in environ.get("SLURM_GPU_BIND", "").split(",")}
    tokens.discard("")
    tokens.discard("verbose")
    return bool(tokens) and "none" not in tokens


def slurm_bound_gpus(environ: Mapping[str, str] | None = None) -> list[str] | None:
    """The GPUs Slurm bound to this task, or `None` if it did not bind any.

    Args:
        environ: The environment to read. Defaults to `None`: `os.environ`.

    Returns:
        The entries of `CUDA_VISIBLE_DEVICES` when Slurm's variables show that
        `srun` bound GPUs to this task (see the module docstring for the rule),
        else `None` (no GPUs, or a node-wide view TensorFlow may split).
    """
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible in _NO_GPUS:
        return None
    gpus = [gpu.strip() for gpu in visible.split(",") if gpu.strip()]
    step_gpus = _step_gpus_on_node(environ)
    shows_binding = _binding_requested(environ) or (
        step_gpus is not None and len(gpus) < step_gpus
    )
    return gpus if shows_binding else None


def _step_tasks(environ: Mapping[str, str]) -> int:
    raw = environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS") or "1"
    return int(raw) if raw.isdigit() else 1


def resolver_arguments(environ: Mapping[str, str] | None = None) -> dict:
    """Keyword arguments for `SlurmClusterResolver` on this task.

    Args:
        environ: The environment to read. Defaults to `None`: `os.environ`.

    Returns:
        `{}` when TensorFlow's own GPU assignment applies (a node-wide view of
        NVIDIA GPUs). When Slurm bound GPUs to this task, or the node has no
        NVIDIA GPUs (the stock resolver runs `nvidia-smi` and then divides by
        zero), arguments that make the resolver derive only the cluster and
        leave `CUDA_VISIBLE_DEVICES` alone: one slot per task of the step
        (`gpus_per_node` is at least the tasks on any node), each of
        `gpus_per_task` GPUs (the bound GPUs; one when there are none), and
        `auto_set_gpu=False`.
    """
    environ = os.environ if environ is None else environ
    bound = slurm_bound_gpus(environ)
    if bound is None and (
        environ.get("CUDA_VISIBLE_DEVICES")
        or shutil.which("nvidia-smi", path=environ.get("PATH"))
    ):
        return {}
    per_task = len(bound) if bound else 1
    return {
        "gpus_per_node": _step_tasks(environ) * per_task,
        "gpus_per_task": per_task,
        "auto_set_gpu": False,
    }
