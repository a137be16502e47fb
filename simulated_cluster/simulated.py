"""Several simulated hosts on this one Linux machine, for multi-worker tests.

Worker processes on one machine share more than the network: loopback, abstract
Unix sockets and `/dev/shm`. The socket ring uses all three to find and map its
neighbours, so workers started side by side on 127.0.0.1 never exercise the path
that workers on separate machines take. A simulated host takes them away:

* its own network namespace: loopback and abstract Unix sockets are the host's
  own, its only other interface is `eth0` with address `198.18.0.<i + 1>/24`, and
  there is no default route (nothing outside the cluster is reachable, not even
  the root namespace's loopback);
* its own mount namespace with a private tmpfs on `/dev/shm`, kept by a bind
  mount so that every process started on the host shares it.

The hosts are joined by a bridge that lives in a namespace of its own, one veth
pair per host, so nothing is added to the root namespace. The addresses come from
198.18.0.0/15, the range RFC 2544 reserves for benchmarking networks, so they
cannot collide with a real network, and exist only inside these namespaces.

`rate` shapes each host's `eth0` with a token bucket (`tc qdisc ... tbf`) on
egress: both directions of every link between two hosts are limited to `rate`.

Processes start through `nsenter --net=... --mount=... --wd=...`. The `--wd` is
needed: entering a mount namespace moves a process to that namespace's root
directory, so without it every worker would start in `/`.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Sequence

from simulated_cluster import _names, _teardown
from simulated_cluster._tools import run_tool

NETWORK = "198.18.0.0/24"
MAX_HOSTS = 254
TBF_LATENCY = "50ms"
_HOST_INTERFACE = "eth0"
_BRIDGE = "br0"
_MIN_BURST_BYTES = 16 * 1024
_RATE = re.compile(r"(?P<number>\d+(?:\.\d+)?)(?P<unit>bit|kbit|mbit|gbit)")
_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
_KILL_WAIT_SECONDS = 5.0


class SimulatedCluster:
    """`hosts` simulated machines joined by one (optionally shaped) network.

    Workers started on the same host share its loopback, abstract Unix sockets
    and `/dev/shm`; workers on different hosts share none of them and talk over
    TCP/UDP to each other's `address(host)`. Everything is removed by `close()`,
    at the end of a `with` block, or at interpreter exit; runs whose process
    died without closing are removed by `remove_stale_clusters()`, which every
    new cluster calls first.

    Needs root, iproute2 and util-linux: check `unavailable_reason()` first.

    Args:
        hosts: The number of hosts, 1 to 254. Defaults to `2`.
        rate: The bandwidth of each host's link, as `tc` writes it (`"1gbit"`,
            `"100mbit"`, `"500kbit"`), or `None` for the veth's full speed.
            Defaults to `None`.
        grace_seconds: Seconds between SIGTERM and SIGKILL when `close()` stops
            the processes. Defaults to `2.0`.

    Raises:
        ValueError: `hosts`, `rate` or `grace_seconds` is out of range.
        TypeError: `hosts` is not an integer.
        RuntimeError: A namespace could not be built (what was built is removed).

    Example:
    >>> import sys
    >>> shm = [sys.executable, "-c", "import os; print(os.listdir('/dev/shm'))"]
    >>> with SimulatedCluster(hosts=2, rate="1gbit") as cluster:
    ...     cluster.address(1)
    ...     cluster.run(0, shm, timeout=30, capture_output=True, text=True).stdout
    '198.18.0.2'
    '[]\\n'
    """

    def __init__(
        self,
        hosts: int = 2,
        rate: str | None = None,
        *,
        grace_seconds: float = 2.0,
    ):
        if not isinstance(hosts, int) or isinstance(hosts, bool):
            raise TypeError(f"`hosts` must be an integer. Received: hosts={hosts!r}.")
        if not 1 <= hosts <= MAX_HOSTS:
            raise ValueError(
                f"`hosts` must be between 1 and {MAX_HOSTS} (one /24 network). "
                f"Received: hosts={hosts}."
            )
        if grace_seconds < 0:
            raise ValueError(
                "`grace_seconds` must be 0 or more. "
                f"Received: grace_seconds={grace_seconds}."
            )
        self._bits_per_second = None if rate is None else _parse_rate(rate)
        self.hosts = hosts
        self.rate = rate
        self.prefix = ""
        self._grace_seconds = grace_seconds
        self._started: list[subprocess.Popen] = []
        self._closed = False
        _teardown.remove_stale_clusters()
        self._nsenter = shutil.which("nsenter") or "nsenter"
        self.prefix = _names.new_prefix()
        atexit.register(self.close)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def address(self, host: int) -> str:
        """Returns host `host`'s IPv4 address, e.g. `"198.18.0.1"` for host 0."""
        self._check_host(host)
        return f"198.18.0.{host + 1}"

    def namespace(self, host: int) -> str:
        """Returns host `host`'s network namespace name, for `ip -n` or `tc -n`."""
        self._check_host(host)
        return _names.host_netns(self.prefix, host)

    def popen(
        self,
        host: int,
        args: Sequence[str | os.PathLike],
        *,
        cwd: str | os.PathLike | None = None,
        **kwargs,
    ) -> subprocess.Popen:
        """Starts `args` on host `host`, like `subprocess.Popen`.

        The process starts in a session of its own, so that `close()` can stop
        it with its children; `close()` stops it if it still runs.

        Args:
            host: The host's index, from 0.
            args: The command line (a sequence, not a shell string).
            cwd: The working directory. Defaults to this process's.
            **kwargs: Passed to `subprocess.Popen` (`env`, `stdout`, `text`...),
                except `start_new_session` and `process_group`.

        Returns:
            The `Popen` of the command (`nsenter` replaces itself with it, so
            its pid is the command's).
        """
        self._check_host(host)
        if self._closed:
            raise RuntimeError(
                f"The simulated cluster {self.prefix} is closed. Start processes "
                "before `close()` or the end of its `with` block."
            )
        for name in ("start_new_session", "process_group"):
            if name in kwargs:
                raise ValueError(
                    "`SimulatedCluster.popen` starts every process in a session "
                    "of its own, so that `close()` can stop its children. "
                    f"Received: {name}={kwargs[name]!r}. Remove the argument."
                )
        workdir = os.path.abspath(os.getcwd() if cwd is None else cwd)
        command = [
            self._nsenter,
            f"--net={_names.NETNS_DIR / self.namespace(host)}",
            f"--mount={_names.mount_namespace_file(self.prefix, host)}",
            f"--wd={workdir}",
            "--",
            *map(os.fspath, args),
        ]
        process = subprocess.Popen(command, start_new_session=True, **kwargs)
        self._started.append(process)
        return process

    def run(
        self,
        host: int,
        args: Sequence[str | os.PathLike],
        *,
        timeout: float,
        input=None,
        capture_output: bool = False,
        check: bool = False,
        **kwargs,
    ) -> subprocess.CompletedProcess:
        """Runs `args` on host `host` and waits for it, like `subprocess.run`.

        On timeout the command's whole process group is killed, not only the
        command, then `subprocess.TimeoutExpired` is raised.

        Args:
            host: The host's index, from 0.
            args: The command line.
            timeout: Seconds to wait for the command.
            input: Bytes (or text with `text=True`) for its standard input.
                Defaults to `None`.
            capture_output: Capture standard output and error. Defaults to
                `False`.
            check: Raise `subprocess.CalledProcessError` on a non-zero exit.
                Defaults to `False`.
            **kwargs: Passed to `popen`.

        Returns:
            The `subprocess.CompletedProcess`, with `args` as given.
        """
        clashes = {
            "stdin": input is not None,
            "stdout": capture_output,
            "stderr": capture_output,
        }
        for name, clash in clashes.items():
            if clash and name in kwargs:
                raise ValueError(
                    f"`{name}` cannot be given with `input` or `capture_output`. "
                    f"Received: {name}={kwargs[name]!r}. Remove one of them."
                )
        if input is not None:
            kwargs["stdin"] = subprocess.PIPE
        if capture_output:
            kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
        process = self.popen(host, args, **kwargs)
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            stdout, stderr = _kill(process)
            raise subprocess.TimeoutExpired(
                list(args), timeout, stdout, stderr
            ) from None
        except BaseException:
            _kill(process)
            raise
        completed = subprocess.CompletedProcess(
            list(args), process.returncode, stdout, stderr
        )
        if check:
            completed.check_returncode()
        return completed

    def close(self) -> None:
        """Stops every process on the hosts and removes the namespaces.

        SIGTERM first, SIGKILL after `grace_seconds`. Safe to call again.

        Raises:
            RuntimeError: Something could not be removed (the message says what).
        """
        self._closed = True
        atexit.unregister(self.close)
        if self.prefix:
            _teardown.remove_run(self.prefix, self._started, self._grace_seconds)

    def __enter__(self) -> SimulatedCluster:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"SimulatedCluster(hosts={self.hosts}, rate={self.rate!r}, "
            f"prefix={self.prefix!r}, closed={self._closed})"
        )

    def _check_host(self, host: int) -> None:
        if not isinstance(host, int) or not 0 <= host < self.hosts:
            raise ValueError(
                f"`host` must be an index in range({self.hosts}). "
                f"Received: host={host!r}."
            )

    def _build(self) -> None:
        directory = _names.run_directory(self.prefix)
        directory.mkdir(parents=True)
        # The kernel keeps a mount namespace on a file only outside shared mounts.
        run_tool("mount", "--bind", os.fspath(directory), os.fspath(directory))
        run_tool("mount", "--make-private", os.fspath(directory))
        bridge = _names.bridge_netns(self.prefix)
        run_tool("ip", "netns", "add", bridge)
        run_tool("ip", "-n", bridge, "link", "add", _BRIDGE, "type", "bridge")
        run_tool("ip", "-n", bridge, "link", "set", _BRIDGE, "up")
        for host in range(self.hosts):
            self._build_host(host, bridge)

    def _build_host(self, host: int, bridge: str) -> None:
        netns = _names.host_netns(self.prefix, host)
        port = f"h{host}"
        run_tool("ip", "netns", "add", netns)
        run_tool("ip", "-n", netns, "link", "set", "lo", "up")
        # Made in the bridge's namespace with its peer in the host's: the pair
        # never appears in the root namespace.
        run_tool(
            "ip", "-n", bridge, "link", "add", port, "type", "veth",
            "peer", "name", _HOST_INTERFACE, "netns", netns,
        )  # fmt: skip
        run_tool("ip", "-n", bridge, "link", "set", port, "master", _BRIDGE, "up")
        run_tool(
            "ip", "-n", netns, "address", "add",
            f"{self.address(host)}/24", "dev", _HOST_INTERFACE,
        )  # fmt: skip
        run_tool("ip", "-n", netns, "link", "set", _HOST_INTERFACE, "up")
        if self._bits_per_second is not None:
            burst = max(self._bits_per_second // 8 // 100, _MIN_BURST_BYTES)
            run_tool(
                "tc", "-n", netns, "qdisc", "add", "dev", _HOST_INTERFACE,
                "root", "tbf", "rate", f"{self._bits_per_second}bit",
                "burst", str(burst), "latency", TBF_LATENCY,
            )  # fmt: skip
        mount_file = _names.mount_namespace_file(self.prefix, host)
        mount_file.touch()
        # The new mount namespace starts as a copy of this one, including the
        # mounts that keep every network namespace alive under /var/run/netns;
        # detached there, they no longer outlive `ip netns delete` until this
        # host's mount namespace goes.
        setup = (
            f"mount -t tmpfs -o mode=1777 {netns}-shm /dev/shm && "
            f"{{ umount --lazy {_names.NETNS_DIR} 2>/dev/null || true; }}"
        )
        run_tool(
            "unshare", f"--mount={mount_file}", "--propagation", "private",
            "--", "sh", "-c", setup,
        )  # fmt: skip


def _parse_rate(rate: str) -> int:
    """Bits per second of a `tc` rate such as `"100mbit"` (10**6, as `tc`)."""
    match = _RATE.fullmatch(rate.strip().lower()) if isinstance(rate, str) else None
    bits = int(float(match["number"]) * _UNITS[match["unit"]]) if match else 0
    if bits <= 0:
        raise ValueError(
            "`rate` must be a positive bandwidth written as `tc` does, such as "
            '"1gbit", "100mbit" or "500kbit", or None for no shaping. '
            f"Received: rate={rate!r}."
        )
    return bits


def _kill(process: subprocess.Popen) -> tuple:
    """Kills `process`'s group and returns what it wrote, waiting a bounded time."""
    if process.returncode is None:  # unreaped: its pid is still its group's id
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        return process.communicate(timeout=_KILL_WAIT_SECONDS)
    except subprocess.TimeoutExpired:  # an escaped child holds the pipes open
        return None, None
