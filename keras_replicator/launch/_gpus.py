"""Which GPUs each local worker sees: one `CUDA_VISIBLE_DEVICES` per worker.

Without it, N workers started on one machine with G GPUs each see all G: every
process builds a replica per GPU (N * G replicas where G were meant) and maps
nearly all the memory of every GPU, so the second one runs out of memory. The
launcher therefore pins them, as `torchrun` users do by hand:

- **The visible GPUs** are those the workers would see: `CUDA_VISIBLE_DEVICES`
  from `env=` or this process's environment when set (its entries kept as
  written, indices or `GPU-...` / `MIG-...` UUIDs; empty or `-1` means none, and
  as in CUDA the list ends at the first negative entry), else the indices
  `nvidia-smi` lists (asked once per launch, at most `NVIDIA_SMI_SECONDS`), else
  none: on a machine without GPUs nothing is set, as before. Indices from
  `nvidia-smi` are in PCI bus order, so the workers also get
  `CUDA_DEVICE_ORDER=PCI_BUS_ID` (unless it is set) and "0,1" means the GPUs
  `nvidia-smi` calls 0 and 1.
- **The split** (`gpus_per_worker=None`): G GPUs among N workers, G // N
  consecutive ones each when N divides G. When it does not (3 GPUs, 2 workers)
  the launch is refused, naming both numbers and `gpus_per_worker`: the
  workers of a synchronous job need the same number of GPUs (replicas), and an
  idle GPU should be a choice, not a surprise. With fewer GPUs than workers
  (a debug run of 2 workers on a 1-GPU machine) worker i shares GPU i % G, with
  `TF_FORCE_GPU_ALLOW_GROWTH=true` (unless set) so no process maps the whole
  GPU; a note says so. An elastic launch (`discover`) never refuses a size: it
  gives each worker G // n GPUs, or shares them when G < n.
- **An explicit `gpus_per_worker=K`** gives worker i GPUs [i*K, (i+1)*K); K * N
  must not exceed G. `0` hides every GPU (`CUDA_VISIBLE_DEVICES=""`: a CPU run on
  a GPU machine); `"all"` sets nothing (every worker sees every GPU, the old
  behaviour).
- **Other tasks** get no GPU (`CUDA_VISIBLE_DEVICES=""`) when workers are
  pinned: the chief and the parameter servers of a `--ps` job (the chief only
  coordinates, variables live on the servers' CPUs) and the tf.data service
  tasks: the GPUs are for the workers.

Only local workers are pinned: under Slurm, TensorFlow's `SlurmClusterResolver`
keeps assigning each task its GPUs (`_slurm.py`), and a scheduler's `TF_CONFIG`
task (a Kubernetes pod) keeps the GPUs its scheduler gave it. So
`gpus_per_worker` needs `num_workers` (`_options.py`).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from keras_replicator._environment import SHARED_GPUS
from keras_replicator.launch._bounded_run import run_bounded
from keras_replicator.launch._runner import WorkerSpec

VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
ORDER_ENV = "CUDA_DEVICE_ORDER"
GROWTH_ENV = "TF_FORCE_GPU_ALLOW_GROWTH"
ALL = "all"
NVIDIA_SMI_SECONDS = 10.0
_NVIDIA_SMI = ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"]


@dataclasses.dataclass(frozen=True)
class VisibleGpus:
    """The GPUs local workers could use, and where that list came from.

    Example:
    >>> gpus = visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-a1,GPU-b2"})
    >>> gpus.ids, gpus.source
    (('GPU-a1', 'GPU-b2'), 'CUDA_VISIBLE_DEVICES')
    """

    ids: tuple[str, ...]
    source: str  # "CUDA_VISIBLE_DEVICES", "env['CUDA_VISIBLE_DEVICES']", ...

    def describe(self) -> str:
        return f"{self.source}: {','.join(self.ids) or 'none'}"


@dataclasses.dataclass(frozen=True)
class GpuAssignment:
    """What each task of a local group gets in its environment.

    `workers` holds one environment per worker; `others` is the environment
    of the tasks that get no GPU (chief and ps of a `--ps` job, tf.data service
    tasks). `summary` is the dry-run's line, `note` a remark for the user
    (shared or idle GPUs), or empty.
    """

    workers: tuple[dict[str, str], ...]
    others: dict[str, str]
    summary: str = ""
    note: str = ""


def parse_visible_devices(value: str) -> tuple[str, ...]:
    """The entries of a `CUDA_VISIBLE_DEVICES` value, as CUDA reads them.

    Example:
    >>> parse_visible_devices("0, 1"), parse_visible_devices("-1")
    (('0', '1'), ())
    >>> parse_visible_devices("2,-1,3"), parse_visible_devices("")
    (('2',), ())
    """
    ids = []
    for entry in value.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break  # CUDA ignores the rest of the list
        ids.append(entry)
    return tuple(ids)


def visible_gpus(
    environ: Mapping[str, str], env: Mapping[str, str] | None = None
) -> VisibleGpus:
    """The GPUs the workers would see (see the module docstring for the order)."""
    if env and VISIBLE_ENV in env:
        return VisibleGpus(
            parse_visible_devices(env[VISIBLE_ENV]), f"env['{VISIBLE_ENV}']"
        )
    if VISIBLE_ENV in environ:
        return VisibleGpus(parse_visible_devices(environ[VISIBLE_ENV]), VISIBLE_ENV)
    path = environ.get("PATH")
    program = shutil.which(_NVIDIA_SMI[0], path=path)
    if program is None:
        return VisibleGpus((), "no nvidia-smi on PATH")
    try:
        code, out, _ = run_bounded([program, *_NVIDIA_SMI[1:]], NVIDIA_SMI_SECONDS)
    except (OSError, subprocess.SubprocessError) as error:
        return VisibleGpus((), f"nvidia-smi failed ({type(error).__name__})")
    if code != 0:
        return VisibleGpus((), f"nvidia-smi failed (exit code {code})")
    ids = tuple(
        line.strip() for line in out.splitlines() if re.fullmatch(r"\s*\d+\s*", line)
    )
    return VisibleGpus(ids, "nvidia-smi")


def assign_gpus(
    gpus: VisibleGpus,
    num_workers: int,
    gpus_per_worker: int | str | None,
    *,
    elastic: bool = False,
    environ: Mapping[str, str] | None = None,
) -> GpuAssignment:
    """Each worker's `CUDA_VISIBLE_DEVICES` (and friends) for `num_workers`.

    Args:
        gpus: The visible GPUs (`visible_gpus`).
        num_workers: The local workers to pin (`worker` tasks of a `--ps` job).
        gpus_per_worker: `None` (split evenly), a count, or `"all"`.
        elastic: Never refuse a split (floor, or share when too few GPUs).
        environ: The workers' inherited environment: a variable set there is
            not overridden (`CUDA_DEVICE_ORDER`, `TF_FORCE_GPU_ALLOW_GROWTH`).

    Raises:
        ValueError: When the GPUs cannot be split as asked; names both numbers
            and `gpus_per_worker`.

    Example:
    >>> gpus = VisibleGpus(("0", "1", "2", "3"), "CUDA_VISIBLE_DEVICES")
    >>> [w["CUDA_VISIBLE_DEVICES"] for w in assign_gpus(gpus, 2, None).workers]
    ['0,1', '2,3']
    """
    count = len(gpus.ids)
    environ = environ or {}
    if gpus_per_worker == ALL or (gpus_per_worker is None and not count):
        return GpuAssignment(({},) * num_workers, {})
    hidden = {VISIBLE_ENV: ""}
    if gpus_per_worker == 0:
        summary = f'GPUs: none for any task (gpus_per_worker=0: {VISIBLE_ENV}="")'
        return GpuAssignment((hidden,) * num_workers, hidden, summary)
    extra = {}
    if gpus.source == "nvidia-smi" and ORDER_ENV not in environ:
        extra[ORDER_ENV] = "PCI_BUS_ID"  # nvidia-smi's indices are in bus order
    note = ""
    if gpus_per_worker is None and count < num_workers:
        slices = [gpus.ids[i % count] for i in range(num_workers)]
        if GROWTH_ENV not in environ:
            extra[GROWTH_ENV] = "true"
        extra[SHARED_GPUS] = "1"  # no NCCL: two ranks on one GPU
        note = (
            f"{num_workers} workers share {count} GPU(s) ({gpus.describe()}), "
            f"worker i on GPU i % {count}, memory growing on demand "
            f"({GROWTH_ENV}=true): fine for a trial run, slow for training. Start "
            f"at most {count} worker(s) (`-n {count}`) to give each a GPU of its own."
        )
        each = f"{num_workers} workers share them, 1"
    else:
        per = _per_worker(gpus, num_workers, gpus_per_worker, elastic)
        each = str(per)
        slices = [
            ",".join(gpus.ids[i * per : (i + 1) * per]) for i in range(num_workers)
        ]
        idle = gpus.ids[per * num_workers :]
        if idle:
            note = (
                f"GPU(s) {','.join(idle)} stay idle: {num_workers} workers x {per} "
                f"GPU(s) of the {count} visible ({gpus.describe()})."
            )
    workers = tuple({VISIBLE_ENV: one, **extra} for one in slices)
    summary = (
        f"GPUs: {count} visible ({gpus.describe()}); {each} per worker; every "
        "other task: none "
        f'({VISIBLE_ENV}="")'
    )
    return GpuAssignment(workers, hidden, summary, note)


def _per_worker(gpus, num_workers, gpus_per_worker, elastic) -> int:
    count = len(gpus.ids)
    if gpus_per_worker is None:
        if count % num_workers and not elastic:
            fewer = count // num_workers
            raise ValueError(
                f"`gpus_per_worker` is unset, so the {count} visible GPUs "
                f"({gpus.describe()}) are split evenly, but {num_workers} "
                "workers cannot split them evenly: the workers of a synchronous "
                "job need the same number of GPUs (replicas). Received: "
                f"num_workers={num_workers}, gpus_per_worker=None. Pass "
                f"gpus_per_worker={fewer} (`--gpus-per-worker {fewer}`, GPU(s) "
                f"{','.join(gpus.ids[fewer * num_workers :])} stay idle), use "
                f"`-n {count}` (one GPU each), or set {VISIBLE_ENV} to the GPUs "
                "to use."
            )
        return count // num_workers
    if gpus_per_worker * num_workers > count:
        fits = count // num_workers
        if fits:
            remedy = f"Use gpus_per_worker={fits} (`--gpus-per-worker {fits}`)"
        elif count:
            remedy = f"Use at most {count} workers with `--gpus-per-worker 1`"
        else:
            remedy = f"Set {VISIBLE_ENV} to the GPUs to use, leave it unset"
        raise ValueError(
            f"`gpus_per_worker` asks for {gpus_per_worker} GPU(s) for each of "
            f"{num_workers} workers ({gpus_per_worker * num_workers} in all), but "
            f"{count} are visible ({gpus.describe()}). Received: "
            f"gpus_per_worker={gpus_per_worker}, num_workers={num_workers}. "
            f"{remedy}, or gpus_per_worker=0 to run them on the CPU."
        )
    return gpus_per_worker


def pin_specs(
    specs: Sequence[WorkerSpec],
    services: Sequence[WorkerSpec],
    gpus: VisibleGpus,
    gpus_per_worker: int | str | None,
    *,
    parameter_servers: bool,
    elastic: bool,
    environ: Mapping[str, str],
) -> tuple[tuple[WorkerSpec, ...], tuple[WorkerSpec, ...], GpuAssignment]:
    """The specs with their GPU environment, and the assignment made.

    The workers (the `worker` tasks of a parameter-server job) get the GPUs;
    the chief, the parameter servers and the service tasks get `others`.
    """
    pinned = [
        position
        for position, spec in enumerate(specs)
        if not parameter_servers or (spec.label or "").startswith("worker")
    ]
    assignment = assign_gpus(
        gpus, len(pinned), gpus_per_worker, elastic=elastic, environ=environ
    )
    gpu_env = [assignment.others] * len(specs)
    for position, env in zip(pinned, assignment.workers):
        gpu_env[position] = env
    return (
        tuple(
            dataclasses.replace(spec, env={**spec.env, **env})
            for spec, env in zip(specs, gpu_env)
        ),
        tuple(
            dataclasses.replace(spec, env={**spec.env, **assignment.others})
            for spec in services
        ),
        assignment,
    )


def shown(env: Mapping[str, str]) -> str:
    """The dry-run's ` CUDA_VISIBLE_DEVICES='0,1'` for a task, or nothing."""
    if VISIBLE_ENV not in env:
        return ""
    return f" {VISIBLE_ENV}={env[VISIBLE_ENV]!r}"
