"""`launch()`: run a command as a worker group, restarting the group after failures.

Restarts are a layer on top of the one-run supervisor (`run_group`): after a
failure the whole group is stopped and started again with fresh ports, because a
synchronous job cannot continue with a replaced member (its collectives and the
coordination service are bound to the old processes). Training then resumes from
the last `keras_replicator.callbacks.BackupAndRestore` backup. Each worker sees
`KERAS_REPLICATOR_RESTART_COUNT` (0 on the first run), like torchrun's
`TORCHELASTIC_RESTART_COUNT`.

Whether a stopped group is done, restarted or resized is the `RestartPolicy`'s
decision (`_policy.py`: failures and preemptions count in `max_restarts`, a lost
port is retried on fresh ports up to `PORT_RETRIES` times without counting, an
elastic resize does not count unless cut short); `_supervise` carries it out.
A worker tells the launcher it stopped for a preemption through the file
`KERAS_REPLICATOR_PREEMPTED_FILE` names; with `discover` (and `min_workers`) the
launch is elastic (`_elastic.py`).

Restarts are only offered in `local` mode: in `tf-config` / `slurm` mode this
launcher runs one task of a group that spans machines, so restarting it alone
cannot restart the group; there the scheduler restarts (TFJob `restartPolicy`,
`sbatch --requeue`) and `BackupAndRestore` resumes the same way.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from keras_replicator._environment import PREEMPTED_FILE, RESTART_COUNT, SLOT
from keras_replicator.launch._cluster import ClusterPlan, plan_cluster
from keras_replicator.launch._elastic import Discovery, resize_wanted, workers_for
from keras_replicator.launch._group_outcome import CUT_SHORT, restart_note
from keras_replicator.launch._options import (
    REMOTE_WARNING,
    LaunchOptions,
    check_command,
)
from keras_replicator.launch._output import note
from keras_replicator.launch._policy import (
    PORT_RETRIES,
    Action,
    Counters,
    Reason,
    RestartPolicy,
)
from keras_replicator.launch._ps_runner import run_ps_group
from keras_replicator.launch._results import LaunchResult
from keras_replicator.launch._runner import run_group


def launch(
    command: Sequence[str],
    num_workers: int | None = None,
    *,
    num_ps: int = 0,
    cluster: str = "auto",
    max_restarts: int = 0,
    timeout: float | None = None,
    host: str = "127.0.0.1",
    allow_remote: bool = False,
    ports: Sequence[int] | None = None,
    port_base: int = 8888,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    echo: bool = True,
    grace_seconds: float = 5.0,
    resize_grace_seconds: float = 60.0,
    dry_run: bool = False,
    data_service_workers: int = 0,
    min_workers: int | None = None,
    discover: str | Callable[[], Iterable[str]] | None = None,
    discover_seconds: float = 5.0,
    gpus_per_worker: int | str | None = None,
) -> LaunchResult:
    """Runs `command` as the workers of one cluster (`keras-replicator launch`).

    Every option is also a flag of `keras-replicator launch` (`max_restarts` is
    `--max-restarts`). Workers get a `TF_CONFIG`, `KERAS_REPLICATOR_WORKER_INDEX`,
    `KERAS_REPLICATOR_NUM_WORKERS` and `KERAS_REPLICATOR_RESTART_COUNT`; their
    output is echoed as `[worker i] ...`; the first worker to fail stops the others.

    Args:
        command: The program and its arguments, e.g. `["python", "train.py"]`.
        num_workers: Worker processes to start on this machine. Defaults to
            `None`: required unless a scheduler describes the cluster (`TF_CONFIG`
            or a Slurm job step).
        num_ps: Parameter servers to start (`--ps`). With `num_ps > 0` the job
            is a parameter-server job: a chief, `num_workers` workers and
            `num_ps` parameter servers; the chief's exit code is the job's, the
            others are stopped (and exit 0) when it exits, and a worker that dies
            is restarted alone (up to `max_restarts` times) to rejoin. Defaults
            to `0`.
        cluster: `"auto"`, `"local"`, `"tf-config"` (run the one task a
            scheduler's `TF_CONFIG` describes) or `"slurm"` (one task of an
            `srun` step, via TF's `SlurmClusterResolver`). Defaults to `"auto"`:
            `TF_CONFIG` if set, else Slurm, else local.
        max_restarts: How many times to restart the whole group after a failure
            or a preemption (local mode only). Defaults to `0`.
        timeout: Seconds for all runs together before everything is stopped.
            Defaults to `None` (no limit).
        host: Address the local workers advertise to each other. Defaults to
            `"127.0.0.1"`; anything else needs `allow_remote=True`.
        allow_remote: Allow worker addresses other machines can reach (a
            non-loopback `host`, or a scheduler's cluster). Warns: TF's gRPC has
            no authentication. Defaults to `False`.
        ports: One port per local worker. Defaults to `None` (free ports, new
            ones for each restart).
        port_base: First port of each node in Slurm mode. Defaults to `8888`
            (TensorFlow's default).
        env: Extra environment variables for the workers. Defaults to `None`.
        cwd: Working directory of the workers. Defaults to `None` (this one's).
        echo: Print the workers' output and the launcher's notes. Defaults to
            `True`.
        grace_seconds: Seconds between SIGTERM and SIGKILL when stopping workers.
            Defaults to `5.0`.
        resize_grace_seconds: The same when an elastic launch resizes: time for
            the backup at the agreed step. Past it, the resize counts as a
            restart (the backup may not have completed). Defaults to `60.0`.
        dry_run: Print each worker's `TF_CONFIG` and start nothing. Defaults to
            `False`.
        data_service_workers: Also start a tf.data service dispatcher and this
            many service workers (`--data-service-workers`), each a process of
            its own on `127.0.0.1` with a free port, output echoed as
            `[data dispatcher]` / `[data worker i]`, stopped (SIGTERM, then
            SIGKILL) once the workers are done, and restarted with them. Every
            worker gets the dispatcher's address as
            `KERAS_REPLICATOR_DATA_SERVICE`, for
            `kr.data.image_pipeline(..., data_service=kr.data.service_address())`.
            A service task that exits early fails the run. Local mode only, no
            parameter servers. Defaults to `0`.
        min_workers: The fewest workers an elastic launch goes on with
            (`--min-workers`); `num_workers` is the most. Needs `discover`.
            After a failure the group starts again (counted in `max_restarts`)
            on the slots `discover` lists now, down to `min_workers`, and
            resumes from the last `BackupAndRestore` backup. Defaults to `None`
            (`num_workers`). See docs/preemption.md.
        discover: Where the slots come from (`--discover`): a shell command
            that prints one line per worker that can run now, or a callable
            returning the lines. Asked every `discover_seconds`; when the
            number of slots changes while the group runs, the workers are
            stopped with SIGTERM (a backup at an agreed step, exit 0) and
            started again on the new number (not counted as a restart, unless
            one ran past `resize_grace_seconds`). Each worker gets its line as
            `KERAS_REPLICATOR_SLOT`; an answer over 1 MiB or with a slot that
            is not up to 4096 printable characters is a failed question (the
            slots stay as last known). Defaults to `None` (a fixed group).
        discover_seconds: Seconds between two questions to `discover`.
            Defaults to `5.0`.
        gpus_per_worker: GPUs each local worker sees through its own
            `CUDA_VISIBLE_DEVICES` (`--gpus-per-worker`; `0`: none, `"all"`:
            every worker sees every GPU). Needs `num_workers`. Defaults to
            `None`: the visible GPUs (`CUDA_VISIBLE_DEVICES`, else
            `nvidia-smi`) split evenly, nothing set without GPUs (see
            docs/launch.md, "GPUs").

    Returns:
        The `LaunchResult` of the last run: `.ok`, `.preempted` (all workers
        exited 0 after a preemption backup: not done), `.restarts`, `.resizes`,
        `.previous` (the earlier runs), and per worker `.returncode`,
        `.output`, `.traceback`.

    Raises:
        ValueError: For invalid options or an unusable cluster description; the
            message names the argument or `TF_CONFIG` field.

    Example:
    >>> import sys
    >>> from keras_replicator.launch import launch
    >>> code = "import os; print(os.environ['KERAS_REPLICATOR_WORKER_INDEX'])"
    >>> result = launch([sys.executable, "-c", code], 2, echo=False)
    >>> result.ok, [w.output.strip() for w in result.workers]
    (True, ['0', '1'])
    """
    options = LaunchOptions(
        num_workers=num_workers,
        num_ps=num_ps,
        cluster=cluster,
        max_restarts=max_restarts,
        timeout=timeout,
        host=host,
        allow_remote=allow_remote,
        ports=ports,
        port_base=port_base,
        grace_seconds=grace_seconds,
        resize_grace_seconds=resize_grace_seconds,
        echo=echo,
        dry_run=dry_run,
        env=env,
        cwd=cwd,
        data_service_workers=data_service_workers,
        min_workers=min_workers,
        discover=discover,
        discover_seconds=discover_seconds,
        gpus_per_worker=gpus_per_worker,
    )
    return launch_with_options(command, options)


def launch_with_options(command: Sequence[str], options: LaunchOptions) -> LaunchResult:
    """`launch()` with its options already gathered (the CLI's entry point)."""
    command = check_command(command)
    plan = plan_cluster(options)
    if options.max_restarts and plan.mode != "local":
        raise ValueError(
            f"`max_restarts` restarts the whole local group, but this launcher "
            f"runs one task of a {plan.mode!r} cluster that spans machines. "
            f"Received: max_restarts={options.max_restarts}. Use the scheduler's "
            "restarts (TFJob restartPolicy: OnFailure, `sbatch --requeue`); "
            "BackupAndRestore resumes the same way."
        )
    if options.allow_remote and options.echo:
        warnings.warn(REMOTE_WARNING, UserWarning, stacklevel=3)
    if plan.gpu_note and options.echo and not options.dry_run:
        _note(plan.gpu_note)
    if options.dry_run:
        print(plan.describe(command))
        return LaunchResult(workers=(), timed_out=False, seconds=0.0)

    started = time.monotonic()
    deadline = None if options.timeout is None else started + options.timeout
    discovery = None
    if options.discover is not None:
        discovery = Discovery(options.discover, options.discover_seconds, options.echo)
    with tempfile.TemporaryDirectory(prefix="kr-launch-") as marks:
        try:
            return _supervise(command, options, plan, discovery, deadline, marks)
        finally:
            if discovery is not None:
                discovery.close()


def _supervise(command, options, plan, discovery, deadline, marks) -> LaunchResult:
    """Runs the group, again after failures, preemptions and resizes.

    Each stopped group's result goes to the `RestartPolicy`; this loop only
    carries out its decision (`_policy.py` says which rule gives which).
    """
    started = time.monotonic()
    ports_are_ours = plan.mode == "local" and options.ports is None
    policy = RestartPolicy(
        options.max_restarts,
        port_retries=PORT_RETRIES if ports_are_ours else 0,
        deadline=deadline,
    )
    counters = Counters()
    earlier: list[LaunchResult] = []
    size, slots = options.num_workers, ()
    if discovery is not None:
        slots = discovery.wait_for(options.fewest_workers, deadline)
        if slots is None:
            return _no_slots(options, started)
        size = workers_for(slots, options.num_workers)
        plan = _plan(options, size, plan)
        discovery.start()
    while True:
        if earlier and policy.deadline_passed():
            # The deadline passed while the last group stopped: start no other.
            result = LaunchResult(workers=(), timed_out=True, seconds=0.0)
            break
        result = _run_once(
            command,
            options,
            plan,
            discovery,
            slots,
            size,
            marks,
            run=len(earlier),
            restarts=counters.restarts,
            timeout=policy.seconds_left(),
        )
        decision = policy.decide(result, counters)
        if decision.action is Action.DONE:
            if decision.reason is Reason.CUT_SHORT and options.echo:
                _note(
                    f"{CUT_SHORT}, and none is left (max_restarts={counters.restarts})."
                )
            break
        earlier.append(result)
        if decision.reason is Reason.LOST_PORT:
            counters = counters.after(decision)
            if options.echo:
                _note(f"{result.headline()}. Starting again on fresh ports.")
            plan = _plan(options, size, plan)
            continue
        before = size
        if discovery is not None:
            waiting = time.monotonic()
            fresh = discovery.wait_for(options.fewest_workers, deadline)
            if fresh is None:
                result = _no_slots(options, waiting)
                break
            slots = fresh
            size = workers_for(slots, options.num_workers)
        counters = counters.after(decision)
        if options.echo:
            _note(_restart_note(result, before, size, decision, counters, options))
        plan = _plan(options, size, plan)  # fresh ports: the old ones may linger
    return dataclasses.replace(
        result,
        restarts=counters.restarts,
        previous=tuple(earlier),
        resizes=counters.resizes,
    )


def _run_once(
    command, options, plan, discovery, slots, size, marks, *, run, restarts, timeout
) -> LaunchResult:
    """One run of the group: its workers' environment, then the group's runner.

    `slots` are the ones discovery listed (empty without it), the first `size` run.
    """
    specs = [
        dataclasses.replace(
            spec,
            env={
                **spec.env,
                RESTART_COUNT: str(restarts),
                PREEMPTED_FILE: os.path.join(marks, f"{run}-{spec.index}"),
                **({SLOT: slots[spec.index]} if slots else {}),
            },
        )
        for spec in plan.specs
    ]
    runner_options: dict[str, Any] = dict(
        timeout=timeout,
        env=options.env,
        cwd=options.cwd,
        echo=options.echo,
        grace_seconds=options.grace_seconds,
    )
    if options.num_ps:
        return run_ps_group(
            command, specs, max_rejoins=options.max_restarts, **runner_options
        )
    return run_group(
        command,
        specs,
        services=plan.services,
        stop_when=_resize_wanted(discovery, slots[:size], options),
        stop_when_grace=options.resize_grace_seconds,
        **runner_options,
    )


def _restart_note(result, before, size, decision, counters, options) -> str:
    """The note before the next group (counters already counting it)."""
    if decision.action is Action.RESIZE:
        why = "the slots changed"
    else:
        why = f"restart {counters.restarts} of {options.max_restarts}"
    cut = decision.reason is Reason.CUT_SHORT
    return restart_note(result, before, size, why, decision.resized, cut)


def _plan(options: LaunchOptions, size: int | None, before: ClusterPlan) -> ClusterPlan:
    """The cluster for `size` workers (an elastic launch's size), fresh ports.

    The GPUs found for the first plan are split again for `size` workers.
    """
    return plan_cluster(
        dataclasses.replace(options, num_workers=size), gpus=before.gpus
    )


def _resize_wanted(discovery, running: tuple, options: LaunchOptions):
    """`run_group`'s `stop_when`: whether the slots now call for another group."""
    if discovery is None:
        return None
    most, fewest = options.num_workers or 1, options.fewest_workers
    return lambda: resize_wanted(running, discovery.latest, most, fewest)


def _no_slots(options: LaunchOptions, waiting_since: float) -> LaunchResult:
    """The result of a wait for slots that reached the deadline (no workers)."""
    if options.echo:
        _note(
            f"timed out waiting for {options.fewest_workers} slot(s) from "
            "discover; nothing more was started."
        )
    return LaunchResult(
        workers=(), timed_out=True, seconds=time.monotonic() - waiting_since
    )


def _note(message: str) -> None:
    note(message)
