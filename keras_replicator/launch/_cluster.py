"""Where the workers are: local processes, a scheduler's TF_CONFIG, or Slurm.

Three cluster modes, one script:

- `local`: the launcher starts N workers on this machine with free loopback ports
  and writes each one's `TF_CONFIG`.
- `tf-config`: a scheduler (a Kubernetes TFJob, a hand-written job) already set
  `TF_CONFIG` for this process; the launcher runs the one worker it describes and
  passes `TF_CONFIG` through unchanged.
- `slurm`: `srun` started one launcher per task; each asks TensorFlow's
  `SlurmClusterResolver` (in a short-lived child process, so the launcher itself
  never imports TensorFlow) for the cluster and runs its worker with the
  resulting `TF_CONFIG`.

`auto` picks `tf-config` when `TF_CONFIG` is set, else `slurm` inside a Slurm job
step with several tasks, else `local`. `TF_CONFIG` is validated by
`keras_replicator._tf_config`, the same check the strategies make in the worker;
what only the launcher can see (a port in use, an address off this machine) is
checked here. Both kinds of error name the `TF_CONFIG` field.

With `data_service_workers=N` (local mode), the plan also holds a tf.data service
dispatcher and N service workers (`keras_replicator/data/_service_main.py`), on
free ports chosen like the workers' and on `127.0.0.1` only, and every worker
gets the dispatcher's address as `KERAS_REPLICATOR_DATA_SERVICE`.

Local workers are pinned to their GPUs (`CUDA_VISIBLE_DEVICES` per worker, see
`_gpus.py`); the GPUs are looked up once per launch and the plan keeps them, so a
restarted or resized group is split again for its own size.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Mapping

from keras_replicator import _environment
from keras_replicator._tf_config import (
    format_address,
    num_tasks,
    parse_tf_config,
    validate_tf_config,
)
from keras_replicator.launch._gpus import (
    ALL,
    VisibleGpus,
    pin_specs,
    shown,
    visible_gpus,
)
from keras_replicator.launch._options import REMOTE_WARNING, LaunchOptions, is_loopback
from keras_replicator.launch._ports import free_ports, port_in_use
from keras_replicator.launch._runner import WorkerSpec, tf_configs

_TRAINING_TASKS = ("chief", "worker")
DATA_SERVICE_ENV = _environment.DATA_SERVICE
_LOOPBACK = "127.0.0.1"
_SLURM_VARIABLES = (
    "SLURM_PROCID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_NODELIST",
    "SLURM_STEP_TASKS_PER_NODE",
)


@dataclasses.dataclass(frozen=True)
class ClusterPlan:
    """The workers one launcher starts, and every worker's TF_CONFIG for display."""

    mode: str
    specs: tuple[WorkerSpec, ...]
    all_configs: tuple[dict, ...]
    this_task: int | None = None  # position in `all_configs` run here (cluster modes)
    services: tuple[WorkerSpec, ...] = ()  # tf.data service tasks, started first
    gpus: VisibleGpus | None = None  # local mode: the GPUs found, kept for restarts
    gpu_summary: str = ""
    gpu_note: str = ""

    def describe(self, command) -> str:
        """The dry-run text: the command and one TF_CONFIG line per worker."""
        lines = [
            f"mode: {self.mode}",
            "command: " + " ".join(command),
        ]
        if self.gpu_summary:
            lines.append(self.gpu_summary)
        if self.gpu_note:
            lines.append(f"note: {self.gpu_note}")
        local = len(self.specs) == len(self.all_configs)
        for position, config in enumerate(self.all_configs):
            task = config["task"]
            mark = "  <- this process" if position == self.this_task else ""
            env = self.specs[position].env if local else {}
            lines.append(
                f"[{task['type']} {task['index']}] "
                f"TF_CONFIG={json.dumps(config, sort_keys=True)}{shown(env)}{mark}"
            )
        for spec in self.services:
            command_line = " ".join(spec.command or ())
            lines.append(f"{spec.prefix.strip()} {command_line}{shown(spec.env)}")
        if self.services:
            address = self.specs[0].env.get(DATA_SERVICE_ENV)
            lines.append(f"every worker: {DATA_SERVICE_ENV}={address}")
        lines.append(
            "note: TensorFlow's gRPC servers listen on all interfaces "
            "(0.0.0.0:<port>) whatever host TF_CONFIG names; firewall the ports "
            "on a shared network."
        )
        return "\n".join(lines)


def choose_mode(options: LaunchOptions, environ: Mapping[str, str]) -> str:
    """The cluster mode `options.cluster` means in this environment."""
    if options.cluster != "auto":
        return options.cluster
    tf_config_set = bool(environ.get("TF_CONFIG", "").strip())
    if options.num_workers is not None:
        if tf_config_set:
            raise ValueError(
                "`num_workers` starts a local cluster, but `TF_CONFIG` is already "
                f"set (a scheduler's cluster?). Received: num_workers="
                f"{options.num_workers}, TF_CONFIG={environ['TF_CONFIG']!r}. Drop "
                "`-n` to run the task TF_CONFIG describes, pass `--cluster local` "
                "to ignore it, or unset TF_CONFIG."
            )
        return "local"
    if tf_config_set:
        return "tf-config"
    if _slurm_step_tasks(environ) > 1:
        return "slurm"
    raise ValueError(
        "`num_workers` is required outside a cluster (no TF_CONFIG, no Slurm job "
        "step with several tasks). Received: num_workers=None. Use e.g. "
        "`keras-replicator launch -n 2 -- python train.py`."
    )


def plan_cluster(
    options: LaunchOptions,
    environ: Mapping[str, str] | None = None,
    gpus: VisibleGpus | None = None,
) -> ClusterPlan:
    """Decides which workers to start; fresh free ports on each call (local mode).

    `gpus` are the GPUs an earlier plan of this launch found (`plan.gpus`);
    `None` looks them up (`CUDA_VISIBLE_DEVICES`, else `nvidia-smi`).
    """
    environ = os.environ if environ is None else environ
    mode = choose_mode(options, environ)
    if mode == "local":
        if gpus is None:
            gpus = _find_gpus(options, environ)
        plan = (_plan_local_ps if options.num_ps else _plan_local)(options)
        return _pin_gpus(plan, options, environ, gpus)
    if mode == "tf-config":
        raw = environ.get("TF_CONFIG", "").strip()
        if not raw:
            raise ValueError(
                "`TF_CONFIG` must be set with `cluster='tf-config'`. Received: "
                "TF_CONFIG unset. Let the scheduler set it, or use `-n N` for "
                "local workers."
            )
        # Passed on byte for byte: TF also reads keys we do not check
        # ("rpc_layer", "environment").
        return _plan_task(mode, parse_tf_config(raw), raw, options, {})
    config, env = resolve_slurm(options.port_base, environ)
    return _plan_task(mode, config, json.dumps(config), options, env)


def _find_gpus(options: LaunchOptions, environ) -> VisibleGpus:
    if options.gpus_per_worker in (ALL, 0):
        return VisibleGpus((), "not looked up")  # nothing to split
    return visible_gpus(environ, options.env)


def _pin_gpus(plan: ClusterPlan, options, environ, gpus) -> ClusterPlan:
    """`plan` with each task's `CUDA_VISIBLE_DEVICES` (see `_gpus.py`)."""
    specs, services, assignment = pin_specs(
        plan.specs,
        plan.services,
        gpus,
        options.gpus_per_worker,
        parameter_servers=bool(options.num_ps),
        elastic=options.discover is not None,
        environ={**environ, **(options.env or {})},
    )
    return dataclasses.replace(
        plan,
        specs=specs,
        services=services,
        gpus=gpus,
        gpu_summary=assignment.summary,
        gpu_note=assignment.note,
    )


def _plan_local(options: LaunchOptions) -> ClusterPlan:
    num_workers = options.num_workers
    ports = options.ports
    if ports is not None:
        check_ports_free(
            [(f"ports[{i}]", port) for i, port in enumerate(ports)], "ports"
        )
    else:
        ports = free_ports(num_workers, "127.0.0.1")
    configs = tf_configs(num_workers, host=options.host, ports=ports)
    services, service_env = _plan_data_service(options.data_service_workers, ports)
    specs = tuple(
        WorkerSpec(
            index=index,
            tf_config=json.dumps(config),
            env={**_worker_env(index, num_workers), **service_env},
        )
        for index, config in enumerate(configs)
    )
    return ClusterPlan("local", specs, tuple(configs), services=services)


def _plan_data_service(num_workers: int, taken) -> tuple[tuple, dict]:
    """A dispatcher and `num_workers` tf.data service workers on loopback ports."""
    if not num_workers:
        return (), {}
    ports: list[int] = []
    while len(ports) < num_workers + 1:  # distinct from the workers' ports
        ports = [p for p in free_ports(num_workers + 1, _LOOPBACK) if p not in taken]
    dispatcher, workers = ports[0], ports[1 : num_workers + 1]
    main = [sys.executable, "-m", "keras_replicator.data._service_main"]
    services = [
        WorkerSpec(
            index=0,
            tf_config=None,
            label="data dispatcher",
            command=(*main, "dispatcher", "--port", str(dispatcher)),
        )
    ]
    services += [
        WorkerSpec(
            index=index,
            tf_config=None,
            label=f"data worker {index}",
            command=(
                *main,
                "worker",
                "--port",
                str(port),
                "--dispatcher-port",
                str(dispatcher),
            ),
        )
        for index, port in enumerate(workers)
    ]
    return tuple(services), {DATA_SERVICE_ENV: f"grpc://{_LOOPBACK}:{dispatcher}"}


def _plan_local_ps(options: LaunchOptions) -> ClusterPlan:
    """A chief, `num_workers` workers and `num_ps` parameter servers, here."""
    counts = {"chief": 1, "worker": options.num_workers, "ps": options.num_ps}
    ports = list(options.ports or free_ports(sum(counts.values()), "127.0.0.1"))
    if options.ports is not None:
        check_ports_free(
            [(f"ports[{i}]", port) for i, port in enumerate(ports)], "ports"
        )
    cluster, start = {}, 0
    for kind, count in counts.items():
        cluster[kind] = [
            format_address(options.host, p) for p in ports[start : start + count]
        ]
        start += count
    configs = [
        {"cluster": cluster, "task": {"type": kind, "index": index}}
        for kind, count in counts.items()
        for index in range(count)
    ]
    validate_tf_config(configs[0])
    specs = tuple(
        WorkerSpec(
            index=config["task"]["index"],
            tf_config=json.dumps(config),
            env={
                _environment.TASK_TYPE: config["task"]["type"],
                _environment.NUM_WORKERS: str(options.num_workers),
            },
            label=(
                "chief"
                if config["task"]["type"] == "chief"
                else f"{config['task']['type']} {config['task']['index']}"
            ),
        )
        for config in configs
    )
    return ClusterPlan("local", specs, tuple(configs))


def _plan_task(mode, config, raw_tf_config, options, extra_env) -> ClusterPlan:
    cluster, task = config["cluster"], config["task"]
    remote = [
        (f"TF_CONFIG['cluster']['{kind}'][{i}]", address)
        for kind, addresses in cluster.items()
        for i, address in enumerate(addresses)
        if not is_loopback(address.rpartition(":")[0])
    ]
    if remote and not options.allow_remote:
        field, address = remote[0]
        raise ValueError(
            f"`{field}` is {address!r}, reachable from other machines; the "
            "launcher only runs such clusters with `allow_remote=True` "
            f"(`--allow-remote`). {REMOTE_WARNING}"
        )
    own = cluster[task["type"]][task["index"]]
    check_ports_free(
        [(f"TF_CONFIG['cluster']['{task['type']}'][{task['index']}]", own)],
        "TF_CONFIG",
    )
    training = [
        (kind, i) for kind in _TRAINING_TASKS for i in range(num_tasks(config, kind))
    ]
    key = (task["type"], task["index"])
    rank = training.index(key) if key in training else None
    env = dict(extra_env)
    if rank is not None:
        env.update(_worker_env(rank, len(training)))
    spec = WorkerSpec(
        index=task["index"] if rank is None else rank,
        tf_config=raw_tf_config,
        env=env,
        label=f"{task['type']} {task['index']}",
    )
    kinds = [k for k in _TRAINING_TASKS if k in cluster]
    kinds += [k for k in cluster if k not in _TRAINING_TASKS]
    all_configs = tuple(
        {"cluster": cluster, "task": {"type": kind, "index": i}}
        for kind in kinds
        for i in range(num_tasks(config, kind))
    )
    this_task = all_configs.index(
        {"cluster": cluster, "task": {"type": task["type"], "index": task["index"]}}
    )
    return ClusterPlan(mode, (spec,), all_configs, this_task)


def _worker_env(rank: int, count: int) -> dict[str, str]:
    return {
        _environment.WORKER_INDEX: str(rank),
        _environment.NUM_WORKERS: str(count),
    }


def check_ports_free(named_ports, what: str) -> None:
    """Raises naming the first `(field, port or "host:port")` that is in use."""
    for field, port in named_ports:
        number = int(str(port).rpartition(":")[2])
        if port_in_use(number):
            raise ValueError(
                f"`{field}` names port {number}, which is already in use on this "
                f"machine. Received: {field}={port!r}. Stop the process using it "
                f"or choose another port in `{what}`."
            )


def _slurm_step_tasks(environ) -> int:
    raw = environ.get("SLURM_STEP_NUM_TASKS", "")
    if "SLURM_PROCID" not in environ or not raw.isdigit():
        return 0
    return int(raw)


def resolve_slurm(port_base: int, environ: Mapping[str, str]) -> tuple[dict, dict]:
    """This Slurm task's TF_CONFIG and GPU env, from TF's SlurmClusterResolver."""
    missing = [name for name in _SLURM_VARIABLES if name not in environ]
    if missing:
        raise ValueError(
            f"Slurm mode needs the variables `srun` sets; `{missing[0]}` is not "
            "set. Run the launcher under `srun` (one task per worker), e.g. "
            "`srun --ntasks=4 keras-replicator launch -- python train.py`."
        )
    command = [
        sys.executable,
        "-m",
        "keras_replicator.launch._slurm",
        "--port-base",
        str(port_base),
    ]
    child_env = dict(environ)
    child_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    done = subprocess.run(
        command, env=child_env, capture_output=True, text=True, timeout=300
    )
    if done.returncode != 0:
        detail = done.stderr.strip().splitlines()
        raise ValueError(
            "Slurm's environment does not describe a cluster TensorFlow's "
            f"SlurmClusterResolver can use: {detail[-1] if detail else done}. Run "
            "the launcher under `srun` (one task per worker), e.g. "
            "`srun --ntasks=4 keras-replicator launch -- python train.py`."
        )
    resolved = json.loads(done.stdout.strip().splitlines()[-1])
    return parse_tf_config(json.dumps(resolved["tf_config"])), resolved["env"]
