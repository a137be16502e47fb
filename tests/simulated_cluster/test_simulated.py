"""Simulated hosts are isolated, joined, shaped, and leave nothing behind.

Pure networking, no TensorFlow: the workers are small Python programs. The tests
that build clusters skip with `unavailable_reason()` where that is not possible
(not root, tools or kernel features missing).
"""

import doctest
import os
import pathlib
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from simulated_cluster import (
    SimulatedCluster,
    _availability,
    _names,
    _processes,
    _teardown,
    _tools,
    remove_stale_clusters,
    simulated,
    unavailable_reason,
)

pytestmark = pytest.mark.timeout(20)

REPOSITORY = pathlib.Path(__file__).resolve().parents[2]
WAIT_SECONDS = 10.0

ECHO_SERVER = """
    import socket, sys
    server = socket.create_server((sys.argv[1], 0))
    print(server.getsockname()[1], flush=True)
    connection, (peer, _) = server.accept()
    connection.sendall(peer.encode() + b" says " + connection.recv(100))
"""
TCP_CLIENT = """
    import socket, sys
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5) as s:
        s.sendall(b"hello")
        print(s.recv(100).decode())
"""
ABSTRACT_SERVER = """
    import socket, sys
    server = socket.socket(socket.AF_UNIX)
    server.bind("\\0" + sys.argv[1])
    server.listen()
    print("ready", flush=True)
    while True:
        server.accept()[0].sendall(b"same host")
"""
ABSTRACT_CLIENT = """
    import socket, sys
    client = socket.socket(socket.AF_UNIX)
    try:
        client.connect("\\0" + sys.argv[1])
        print(client.recv(100).decode())
    except ConnectionRefusedError:
        print("refused")
"""
SINK_SERVER = """
    import socket, sys
    server = socket.create_server((sys.argv[1], 0))
    print(server.getsockname()[1], flush=True)
    connection, _ = server.accept()
    while connection.recv(1 << 20):
        pass
    connection.sendall(b"done")
"""
TIMED_SENDER = """
    import socket, sys, time
    payload = bytes(12 * 10**6)
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10) as s:
        started = time.perf_counter()
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        assert s.recv(4) == b"done"
        print(time.perf_counter() - started)
"""
IGNORES_SIGTERM = """
    import signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ready", flush=True)
    time.sleep(60)
"""
# Builds a cluster, starts a process on it, and waits for stdin to close.
OWNER = """
    import sys
    from simulated_cluster import SimulatedCluster
    cluster = SimulatedCluster(hosts=2)
    sleeper = cluster.popen(0, ["sleep", "60"])
    print(cluster.prefix, sleeper.pid, flush=True)
    sys.stdin.read()
"""


@pytest.fixture(scope="module")
def reason():
    return unavailable_reason()


@pytest.fixture
def available(reason):
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture
def cluster(available):
    with SimulatedCluster(hosts=2) as cluster:
        yield cluster


def test_hosts_reach_each_other_over_tcp_at_their_addresses(cluster):
    assert [cluster.address(0), cluster.address(1)] == ["198.18.0.1", "198.18.0.2"]
    server = cluster.popen(
        1, _python(ECHO_SERVER, cluster.address(1)), stdout=subprocess.PIPE, text=True
    )
    port = _first_line(server)
    client = cluster.run(
        0,
        _python(TCP_CLIENT, cluster.address(1), port),
        timeout=WAIT_SECONDS,
        capture_output=True,
        text=True,
        check=True,
    )
    assert client.stdout.strip() == "198.18.0.1 says hello"
    with pytest.raises(ValueError, match=r"range\(2\). Received: host=2"):
        cluster.address(2)


def test_a_host_has_no_default_route_nor_the_root_namespaces_loopback(cluster):
    probe = """
        import errno, socket, sys
        for address in [("127.0.0.1", int(sys.argv[1])), ("198.51.100.1", 80)]:
            try:
                socket.create_connection(address, timeout=5)
                print("connected")
            except OSError as error:
                print(errno.errorcode[error.errno])
    """
    with socket.create_server(("127.0.0.1", 0)) as root_service:
        port = root_service.getsockname()[1]
        result = cluster.run(
            0, _python(probe, port), timeout=WAIT_SECONDS, capture_output=True
        )
    # Nothing listens on the host's own loopback; 198.51.100.1 has no route.
    assert result.stdout.decode().split() == ["ECONNREFUSED", "ENETUNREACH"]
    routes = {
        family: cluster.run(
            0,
            ["ip", family, "route"],
            timeout=WAIT_SECONDS,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for family in ("-4", "-6")
    }
    assert "default" not in routes["-4"] + routes["-6"]
    assert routes["-4"].startswith("198.18.0.0/24 dev eth0")


def test_abstract_unix_sockets_connect_within_a_host_only(cluster):
    name = f"kr-test-{uuid.uuid4().hex}"
    server = cluster.popen(
        0, _python(ABSTRACT_SERVER, name), stdout=subprocess.PIPE, text=True
    )
    assert _first_line(server) == "ready"

    def connect_from(host):
        return cluster.run(
            host,
            _python(ABSTRACT_CLIENT, name),
            timeout=WAIT_SECONDS,
            capture_output=True,
            text=True,
        ).stdout.strip()

    assert connect_from(0) == "same host"
    assert connect_from(1) == "refused"
    with socket.socket(socket.AF_UNIX) as root_client:
        with pytest.raises(ConnectionRefusedError):
            root_client.connect("\0" + name)


def test_dev_shm_is_shared_on_a_host_and_private_to_it(cluster):
    name = f"kr-test-{uuid.uuid4().hex}"
    write = "import sys; open('/dev/shm/' + sys.argv[1], 'w').write('from host 0')"
    read = """
        import os, sys
        path = "/dev/shm/" + sys.argv[1]
        print(open(path).read() if os.path.exists(path) else "absent")
    """
    cluster.run(0, _python(write, name), timeout=WAIT_SECONDS, check=True)

    def read_from(host):
        return cluster.run(
            host,
            _python(read, name),
            timeout=WAIT_SECONDS,
            capture_output=True,
            text=True,
        ).stdout.strip()

    assert read_from(0) == "from host 0"
    assert read_from(1) == "absent"
    assert not os.path.exists(f"/dev/shm/{name}")


def test_processes_start_in_the_callers_working_directory(cluster, tmp_path):
    pwd = _python("import os; print(os.getcwd())")
    for cwd, expected in [(None, os.getcwd()), (tmp_path, str(tmp_path))]:
        result = cluster.run(
            0, pwd, cwd=cwd, timeout=WAIT_SECONDS, capture_output=True, text=True
        )
        assert result.stdout.strip() == expected


@pytest.mark.parametrize(
    "rate, at_least, at_most", [("100mbit", 0.6, 5.0), (None, 0.0, 0.5)]
)
def test_rate_shapes_the_link_between_hosts(available, rate, at_least, at_most):
    with SimulatedCluster(hosts=2, rate=rate) as cluster:
        qdisc = _tools.run_tool(
            "tc", "-n", cluster.namespace(0), "qdisc", "show", "dev", "eth0"
        )
        assert ("tbf" in qdisc) == (rate is not None), qdisc
        server = cluster.popen(
            1,
            _python(SINK_SERVER, cluster.address(1)),
            stdout=subprocess.PIPE,
            text=True,
        )
        port = _first_line(server)
        sender = cluster.run(
            0,
            _python(TIMED_SENDER, cluster.address(1), port),
            timeout=WAIT_SECONDS,
            capture_output=True,
            text=True,
            check=True,
        )
    seconds = float(sender.stdout)
    # 12 MB at 100 Mbit/s take about 0.96 s; through an unshaped veth, a few ms.
    assert at_least < seconds < at_most, f"12 MB took {seconds:.3f} s at {rate}"


def test_close_stops_every_process_and_removes_every_namespace(available):
    cluster = SimulatedCluster(hosts=2, grace_seconds=0.5)
    stubborn = cluster.popen(
        0, _python(IGNORES_SIGTERM), stdout=subprocess.PIPE, text=True
    )
    # A grandchild in a session of its own: only the namespace finds it.
    escaped = cluster.popen(
        1,
        ["sh", "-c", "setsid sh -c 'echo $$; exec sleep 60' & exec sleep 60"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert _first_line(stubborn) == "ready"
    escaped_pid = int(_first_line(escaped))
    assert os.getsid(escaped_pid) == escaped_pid

    started = time.monotonic()
    cluster.close()

    assert time.monotonic() - started >= 0.4  # the grace before SIGKILL
    assert stubborn.returncode == -signal.SIGKILL
    assert escaped.returncode == -signal.SIGTERM
    assert not _running(escaped_pid)
    assert _leftovers(cluster.prefix) == []
    cluster.close()  # again: nothing left to do
    with pytest.raises(RuntimeError, match="is closed"):
        cluster.popen(0, ["true"])


def test_a_with_block_removes_the_cluster_on_an_exception(available):
    with pytest.raises(KeyError):
        with SimulatedCluster(hosts=1) as cluster:
            sleeper = cluster.popen(0, ["sleep", "60"])
            raise KeyError("in the block")
    assert sleeper.returncode == -signal.SIGTERM
    assert _leftovers(cluster.prefix) == []


def test_a_cluster_left_open_is_removed_at_interpreter_exit(available):
    owner = _start_owner()
    prefix, sleeper = _first_line(owner).split()
    assert _leftovers(prefix) != []
    owner.stdin.close()  # the owner returns without closing its cluster
    assert owner.wait(timeout=WAIT_SECONDS) == 0
    assert _leftovers(prefix) == []
    assert not _running(int(sleeper))


def test_stale_clusters_of_dead_owners_are_removed(available):
    owner = _start_owner()
    prefix, sleeper = _first_line(owner).split()
    owner.kill()  # no atexit
    owner.wait(timeout=WAIT_SECONDS)
    assert _leftovers(prefix) != []
    assert _running(int(sleeper))

    assert prefix in remove_stale_clusters()

    assert _leftovers(prefix) == []
    assert not _running(int(sleeper))
    assert prefix not in remove_stale_clusters()


def test_unavailable_reason_is_none_for_a_privileged_root():
    if os.geteuid() != 0 or not _has_capabilities(net_admin=12, sys_admin=21):
        pytest.skip("Runs as root with CAP_NET_ADMIN and CAP_SYS_ADMIN only.")
    if not all(shutil.which(tool) for tool in _tools.TOOLS):
        pytest.skip(f"Needs the tools {_tools.TOOLS}.")
    assert unavailable_reason() is None


def test_unavailable_reason_names_root_and_the_missing_tools(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "need root" in unavailable_reason()
    assert "uid=1000" in unavailable_reason()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "tc" else tool)
    assert "Missing: tc." in unavailable_reason()


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        ({"hosts": 0}, ValueError, "Received: hosts=0"),
        ({"hosts": 255}, ValueError, "between 1 and 254"),
        ({"hosts": "2"}, TypeError, "Received: hosts='2'"),
        ({"rate": "fast"}, ValueError, "Received: rate='fast'"),
        ({"rate": "0mbit"}, ValueError, "positive bandwidth"),
        ({"grace_seconds": -1}, ValueError, "Received: grace_seconds=-1"),
    ],
)
def test_invalid_arguments_fail_before_anything_is_built(arguments, error, message):
    with pytest.raises(error, match=re.escape(message)):
        SimulatedCluster(**arguments)


@pytest.mark.parametrize(
    "module", [simulated, _availability, _names, _processes, _teardown, _tools]
)
def test_docstring_examples_run(available, module):
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in doctest.DocTestFinder().find(module, module.__name__):
        runner.run(test)
    results = runner.summarize(verbose=False)
    assert results.attempted > 0
    assert results.failed == 0


def _python(code, *args):
    return [sys.executable, "-I", "-c", textwrap.dedent(code), *map(str, args)]


def _first_line(process, timeout=WAIT_SECONDS):
    readable, _, _ = select.select([process.stdout], [], [], timeout)
    assert readable, f"{process.args} printed nothing within {timeout} s"
    return process.stdout.readline().strip()


def _start_owner():
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(OWNER)],
        cwd=REPOSITORY,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _leftovers(prefix):
    """What of run `prefix` is on the machine: namespaces, mounts, directory."""
    netns = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, timeout=WAIT_SECONDS
    ).stdout.split()
    left = [name for name in netns if re.fullmatch(rf"{prefix}(h\d+|br)", name)]
    with open("/proc/self/mountinfo") as mountinfo:
        left += [line for line in mountinfo if re.search(rf"/{prefix}[/ ]", line)]
    if _names.run_directory(prefix).exists():
        left.append(str(_names.run_directory(prefix)))
    return left


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _has_capabilities(**bits):
    with open("/proc/self/status") as status:
        effective = next(line for line in status if line.startswith("CapEff:"))
    mask = int(effective.split()[1], 16)
    return all(mask >> bit & 1 for bit in bits.values())
