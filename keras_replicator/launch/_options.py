"""`LaunchOptions`: every option of `keras-replicator launch`, checked up front.

The CLI flags, `launch()` and `launch_function()` share these options, so one
frozen dataclass validates them all before any process starts: a typo in
`--max-restarts` should fail in a millisecond, not after the first worker crashed.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence

from keras_replicator._tf_config import address_problem, format_address

CLUSTER_MODES = ("auto", "local", "tf-config", "slurm")
DEFAULT_SLURM_PORT_BASE = 8888  # TensorFlow's SlurmClusterResolver default.

REMOTE_WARNING = (
    "TensorFlow's gRPC servers have no authentication or encryption: any machine "
    "that can reach the workers' ports can send them work. Run only on a trusted "
    "network, or firewall the ports."
)


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    """How to start and supervise a group of workers (see `launch()` for each field).

    Example:
    >>> from keras_replicator.launch import LaunchOptions
    >>> LaunchOptions(num_workers=2, max_restarts=1).max_restarts
    1
    """

    num_workers: int | None = None
    num_ps: int = 0
    cluster: str = "auto"
    max_restarts: int = 0
    timeout: float | None = None
    host: str = "127.0.0.1"
    allow_remote: bool = False
    ports: Sequence[int] | None = None  # stored as a tuple
    port_base: int = DEFAULT_SLURM_PORT_BASE
    grace_seconds: float = 5.0
    resize_grace_seconds: float = 60.0
    echo: bool = True
    dry_run: bool = False
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    data_service_workers: int = 0
    min_workers: int | None = None
    discover: str | Callable[[], Iterable[str]] | None = None
    discover_seconds: float = 5.0
    gpus_per_worker: int | str | None = None

    def __post_init__(self):
        if self.num_workers is not None:
            _check_int("num_workers", self.num_workers, minimum=1, hint="Use 2")
        _check_int("num_ps", self.num_ps, minimum=0, hint="Use 1")
        if self.num_ps and self.num_workers is None:
            raise ValueError(
                "`num_ps` starts a local parameter-server job and needs "
                f"`num_workers`. Received: num_ps={self.num_ps}, num_workers=None. "
                "Use e.g. `keras-replicator launch -n 2 --ps 1 -- python train.py`."
            )
        if self.cluster not in CLUSTER_MODES:
            raise ValueError(
                f"`cluster` must be one of {list(CLUSTER_MODES)}. "
                f"Received: cluster={self.cluster!r}. Use 'auto' to pick from the "
                "environment (TF_CONFIG, then Slurm, then local workers)."
            )
        if self.cluster == "local" and self.num_workers is None:
            raise ValueError(
                "`num_workers` is required with `cluster='local'`. "
                "Received: num_workers=None. Use e.g. num_workers=2 (`-n 2`)."
            )
        if self.cluster in ("tf-config", "slurm") and self.num_workers is not None:
            raise ValueError(
                f"`num_workers` only applies to local workers; with "
                f"`cluster={self.cluster!r}` the scheduler decides how many there "
                f"are. Received: num_workers={self.num_workers}. Drop `-n`."
            )
        _check_int("max_restarts", self.max_restarts, minimum=0, hint="Use 0")
        _check_seconds("timeout", self.timeout, allow_none=True)
        _check_seconds("grace_seconds", self.grace_seconds, allow_none=False)
        _check_seconds(
            "resize_grace_seconds", self.resize_grace_seconds, allow_none=False
        )
        if not isinstance(self.host, str) or not self.host:
            raise TypeError(
                "`host` must be a host name or IP address string. "
                f"Received: host={self.host!r}. Use '127.0.0.1'."
            )
        if self.host.startswith("[") and self.host.endswith("]"):
            object.__setattr__(self, "host", self.host[1:-1])  # "[::1]" -> "::1"
        problem = address_problem(format_address(self.host, 1))
        if problem:
            raise ValueError(
                f"`host` must be a host name, an IPv4 or an IPv6 address: {problem}. "
                f"Received: host={self.host!r}. Use e.g. '127.0.0.1' or '::1'."
            )
        if not self.allow_remote and not is_loopback(self.host):
            raise ValueError(
                "`host` must be a loopback address unless `allow_remote=True` "
                f"(`--allow-remote`). Received: host={self.host!r}. " + REMOTE_WARNING
            )
        if self.ports is not None:
            object.__setattr__(self, "ports", tuple(self.ports))
            for position, port in enumerate(self.ports):
                _check_port(f"ports[{position}]", port)
            tasks = (self.num_workers or 0) + (self.num_ps + 1 if self.num_ps else 0)
            if self.num_workers is not None and len(self.ports) != tasks:
                what = (
                    f"task ({tasks}: the chief, the workers, then the parameter "
                    "servers)"
                    if self.num_ps
                    else f"worker ({tasks})"
                )
                raise ValueError(
                    f"`ports` must list one port per {what}. "
                    f"Received: ports={list(self.ports)}. Give {tasks} "
                    "ports or leave `ports` unset to use free ones."
                )
            if len(set(self.ports)) != len(self.ports):
                raise ValueError(
                    "`ports` must be distinct: each worker needs its own. "
                    f"Received: ports={list(self.ports)}."
                )
        _check_port("port_base", self.port_base)
        self._check_data_service()
        self._check_elastic()
        self._check_gpus()

    def _check_gpus(self):
        value = self.gpus_per_worker
        if value is None:
            return
        if value != "all":
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(
                    "`gpus_per_worker` must be a number of GPUs, 0 (none) or "
                    f"'all'. Received: gpus_per_worker={value!r}. Use e.g. 2, or "
                    "leave it unset to split the visible GPUs evenly."
                )
            _check_int("gpus_per_worker", value, minimum=0, hint="Use 1")
        if self.num_workers is None or self.cluster in ("tf-config", "slurm"):
            raise ValueError(
                "`gpus_per_worker` splits this machine's GPUs among local workers "
                f"and needs `num_workers`. Received: gpus_per_worker={value!r}, "
                f"num_workers={self.num_workers}, cluster={self.cluster!r}. Under "
                "Slurm each task gets its GPUs from Slurm and TensorFlow's "
                "SlurmClusterResolver (ask `srun` for them, e.g. "
                "`--gpus-per-task`); a scheduler's TF_CONFIG task keeps the GPUs "
                "its scheduler gave it. Drop `--gpus-per-worker`."
            )

    def _check_elastic(self):
        _check_seconds("discover_seconds", self.discover_seconds, allow_none=False)
        if self.min_workers is not None:
            _check_int("min_workers", self.min_workers, minimum=1, hint="Use 1")
        if self.discover is None and self.min_workers is None:
            return
        if self.discover is not None and not (
            callable(self.discover)
            or (isinstance(self.discover, str) and self.discover.strip())
        ):
            raise TypeError(
                "`discover` must be a shell command printing one worker slot per "
                "line, or a callable returning the slots. Received: discover="
                f"{self.discover!r}. Use e.g. 'cat /etc/slots' or "
                '"nvidia-smi --query-gpu=index --format=csv,noheader".'
            )
        if self.num_ps:
            raise ValueError(
                "`min_workers` / `discover` resize a group of peers; a "
                "parameter-server job already goes on without a lost worker (the "
                "coordinator gives its steps to the others) and restarts it alone "
                f"with `max_restarts`. Received: num_ps={self.num_ps}, "
                f"min_workers={self.min_workers}, discover={self.discover!r}. "
                "Drop `min_workers` and `discover`."
            )
        if self.num_workers is None or self.cluster in ("tf-config", "slurm"):
            raise ValueError(
                "`min_workers` / `discover` start and resize local workers and "
                f"need `num_workers` (the most). Received: num_workers="
                f"{self.num_workers}, cluster={self.cluster!r}. Under a scheduler, "
                "let it restart the job on the machines it has: BackupAndRestore "
                "resumes on any number of workers."
            )
        if self.min_workers is not None and self.min_workers > self.num_workers:
            raise ValueError(
                "`min_workers` must be at most `num_workers` (the most workers). "
                f"Received: min_workers={self.min_workers}, num_workers="
                f"{self.num_workers}."
            )
        if self.discover is None:
            raise ValueError(
                "`min_workers` needs `discover`: the launcher cannot tell on its "
                "own whether a lost worker's slot can come back. Received: "
                f"min_workers={self.min_workers}, discover=None. Give a command "
                "printing one line per slot that can run a worker now (e.g. "
                "`--discover 'cat slots.txt'`)."
            )
        if self.ports is not None:
            raise ValueError(
                "`ports` cannot be given for an elastic launch: each size gets "
                f"fresh ports. Received: ports={list(self.ports)}, discover="
                f"{self.discover!r}. Leave `ports` unset."
            )

    @property
    def fewest_workers(self) -> int:
        """`min_workers`, or `num_workers` when not set (or 1 without either)."""
        return self.min_workers or self.num_workers or 1

    def _check_data_service(self):
        _check_int(
            "data_service_workers", self.data_service_workers, minimum=0, hint="Use 2"
        )
        if not self.data_service_workers:
            return
        count = f"Received: data_service_workers={self.data_service_workers}"
        if self.num_workers is None or self.cluster in ("tf-config", "slurm"):
            raise ValueError(
                "`data_service_workers` starts a tf.data service beside local "
                f"workers and needs `num_workers`. {count}, num_workers="
                f"{self.num_workers}, cluster={self.cluster!r}. On a cluster, run "
                "the service's dispatcher and workers as tasks of their own and "
                "pass their address as `data_service=`."
            )
        if self.num_ps:
            raise ValueError(
                "`data_service_workers` is not supported with parameter servers "
                f"yet. {count}, num_ps={self.num_ps}. Drop one of them."
            )
        if not is_loopback(self.host):
            raise ValueError(
                "`data_service_workers` starts the tf.data service on loopback "
                f"only (its servers have no authentication). {count}, host="
                f"{self.host!r}. Use host='127.0.0.1'."
            )


def is_loopback(host: str) -> bool:
    """Whether `host` (bracketed or not, for IPv6) names this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _check_int(name, value, *, minimum, hint):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"`{name}` must be an integer. Received: {name}={value!r}. "
            f"{hint}, for example."
        )
    if value < minimum:
        raise ValueError(
            f"`{name}` must be at least {minimum}. Received: {name}={value}. "
            f"{hint}, for example."
        )


def _check_seconds(name, value, *, allow_none):
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"`{name}` must be a number of seconds. Received: {name}={value!r}."
        )
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(
            f"`{name}` must be a positive number of seconds. "
            f"Received: {name}={value!r}."
            + (" Use None for no limit." if allow_none else "")
        )


def _check_port(name, port):
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(
            f"`{name}` must be a TCP port number in [1, 65535]. "
            f"Received: {name}={port!r}."
        )


def check_command(command) -> list[str]:
    """`command` as a list of strings, its program checked (found, executable)."""
    if isinstance(command, str) or not command:
        raise ValueError(
            "`command` must be a non-empty list: the program and its arguments. "
            f'Received: command={command!r}. Use e.g. ["python", "train.py"].'
        )
    command = [str(part) for part in command]
    program = command[0]
    if "/" not in program and shutil.which(program) is None:
        raise ValueError(
            f"`command[0]` must be a program on PATH or a path. Received: "
            f"command[0]={program!r}, which was not found. Check the spelling, "
            "or give the full path (e.g. sys.executable for this Python)."
        )
    if "/" in program and not (os.path.isfile(program) and os.access(program, os.X_OK)):
        problem = (
            "does not exist"
            if not os.path.exists(program)
            else ("is not an executable file")
        )
        raise ValueError(
            f"`command[0]` must be an executable program. Received: "
            f"command[0]={program!r}, which {problem}. Check the path, or run a "
            "script through its interpreter (e.g. `python train.py`)."
        )
    return command


def parse_gpus_per_worker(text: str | int | None) -> int | str | None:
    """`"2"` / `"all"` (the CLI form) as `2` / `"all"`; other text is kept.

    Anything else is left for `LaunchOptions` to refuse with its message.

    Example:
    >>> parse_gpus_per_worker("2"), parse_gpus_per_worker("all")
    (2, 'all')
    """
    if not isinstance(text, str):
        return text
    stripped = text.strip()
    if re.fullmatch(r"-?\d+", stripped):
        return int(stripped)
    return stripped.lower() if stripped.lower() == "all" else text


def parse_ports(text: str | Sequence[int] | None) -> tuple[int, ...] | None:
    """`"5000,5001"` (the CLI form) or a sequence of ints, as a tuple of ints."""
    if text is None or not isinstance(text, str):
        return None if text is None else tuple(text)
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(
            "`ports` must be comma-separated port numbers, e.g. '5000,5001'. "
            f"Received: ports={text!r}."
        ) from None
