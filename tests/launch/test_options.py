"""Every bad launch option fails up front, naming the argument and the remedy."""

import pytest

from keras_replicator.launch import LaunchOptions
from keras_replicator.launch._options import (
    is_loopback,
    parse_gpus_per_worker,
    parse_ports,
)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"num_workers": 0}, ValueError, "Received: num_workers=0. Use 2"),
        ({"num_workers": "2"}, TypeError, "Received: num_workers='2'"),
        ({"num_workers": True}, TypeError, "num_workers=True"),
        ({"max_restarts": -1}, ValueError, "Received: max_restarts=-1"),
        ({"max_restarts": 1.5}, TypeError, "Received: max_restarts=1.5"),
        ({"timeout": 0}, ValueError, "Received: timeout=0. Use None"),
        ({"timeout": float("inf")}, ValueError, "timeout=inf"),
        ({"timeout": "60"}, TypeError, "Received: timeout='60'"),
        ({"grace_seconds": -1}, ValueError, "Received: grace_seconds=-1"),
        ({"cluster": "k8s"}, ValueError, "Received: cluster='k8s'"),
        ({"cluster": "local"}, ValueError, "`num_workers` is required"),
        (
            {"cluster": "slurm", "num_workers": 2},
            ValueError,
            "only applies to local workers.*Received: num_workers=2",
        ),
        ({"host": ""}, TypeError, "Received: host=''"),
        ({"host": "10.0.0.7"}, ValueError, "Received: host='10.0.0.7'"),
        ({"host": "0.0.0.0"}, ValueError, "allow_remote=True"),
        ({"ports": (5000, 70000)}, ValueError, "`ports\\[1\\]`.*ports\\[1\\]=70000"),
        (
            {"num_workers": 2, "ports": (5000,)},
            ValueError,
            "one port per worker \\(2\\). Received: ports=\\[5000\\]",
        ),
        ({"num_workers": 2, "ports": (5000, 5000)}, ValueError, "distinct"),
        ({"port_base": 0}, ValueError, "Received: port_base=0"),
        ({"host": "my host"}, ValueError, "may only hold ASCII.*host='my host'"),
        ({"host": "node\n1"}, ValueError, "may only hold ASCII"),
        ({"host": "::1::2"}, ValueError, "not an IPv6 address"),
        (
            {"num_workers": 2, "gpus_per_worker": -1},
            ValueError,
            "Received: gpus_per_worker=-1",
        ),
        ({"num_workers": 2, "gpus_per_worker": "two"}, TypeError, "or 'all'"),
        ({"num_workers": 2, "gpus_per_worker": True}, TypeError, "=True"),
        ({"num_workers": 2, "gpus_per_worker": 1.5}, TypeError, "=1.5"),
        ({"gpus_per_worker": 1}, ValueError, "splits this machine's GPUs"),
        (
            {"cluster": "slurm", "gpus_per_worker": 2},
            ValueError,
            "cluster='slurm'. Under Slurm.*--gpus-per-task",
        ),
    ],
)
def test_bad_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        LaunchOptions(**kwargs)


def test_remote_host_needs_the_explicit_flag_and_says_why():
    with pytest.raises(ValueError, match="no authentication"):
        LaunchOptions(num_workers=2, host="192.168.1.5")
    options = LaunchOptions(num_workers=2, host="192.168.1.5", allow_remote=True)
    assert options.host == "192.168.1.5"


@pytest.mark.parametrize("host", ["::1", "[::1]"])
def test_an_ipv6_loopback_host_is_accepted_without_brackets(host):
    assert LaunchOptions(num_workers=2, host=host).host == "::1"


def test_good_options_are_kept():
    options = LaunchOptions(num_workers=2, max_restarts=3, ports=[5000, 5001])
    assert options.ports == (5000, 5001) and options.max_restarts == 3


@pytest.mark.parametrize(
    "host, expected",
    [
        ("127.0.0.1", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("10.0.0.1", False),
    ],
)
def test_is_loopback(host, expected):
    assert is_loopback(host) is expected


def test_parse_ports():
    assert parse_ports("5000,5001") == (5000, 5001)
    assert parse_ports(None) is None
    with pytest.raises(ValueError, match="Received: ports='50a0'"):
        parse_ports("50a0")


def test_parse_gpus_per_worker():
    assert [parse_gpus_per_worker(t) for t in ("2", " 0", "ALL", "-1", "two")] == [
        2,
        0,
        "all",
        -1,
        "two",
    ]
    assert parse_gpus_per_worker(None) is None
