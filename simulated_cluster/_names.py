"""Names of what a simulated cluster creates, and whose run made them.

Everything a run creates carries the run's prefix `kr<pid>c<serial>`: the owner's
process id (so a later run can tell a leftover of a dead process from a live
cluster) and a serial number (so one process can hold several clusters):

* `/var/run/netns/kr<pid>c<serial>h<i>`: host `i`'s network namespace;
* `/var/run/netns/kr<pid>c<serial>br`: the bridge's network namespace;
* `/run/keras_replicator_cluster/kr<pid>c<serial>/h<i>.mnt`: host `i`'s mount
  namespace, kept by a bind mount in the run's directory (itself a private bind
  mount, as the kernel refuses to keep a mount namespace on a shared mount).

Only names that match the whole pattern are ever removed, so another tool's
namespaces that happen to start with "kr" are left alone.
"""

from __future__ import annotations

import itertools
import os
import pathlib
import re

NETNS_DIR = pathlib.Path("/var/run/netns")
RUNTIME_ROOT = pathlib.Path("/run/keras_replicator_cluster")

_PREFIX = r"kr(?P<owner>\d+)c\d+"
_RUN_DIRECTORY = re.compile(_PREFIX)
_NETNS = re.compile(rf"(?P<prefix>{_PREFIX})(?:h\d+|br)")
_serials = itertools.count()


def new_prefix() -> str:
    """Returns a prefix that no namespace or run directory on this machine has."""
    taken = prefixes_on_machine()
    while True:
        prefix = f"kr{os.getpid()}c{next(_serials)}"
        if prefix not in taken:
            return prefix


def host_netns(prefix: str, host: int) -> str:
    """The name of host `host`'s network namespace (for `ip -n`).

    Example:
    >>> host_netns("kr4242c0", 1)
    'kr4242c0h1'
    """
    return f"{prefix}h{host}"


def bridge_netns(prefix: str) -> str:
    """The name of the network namespace that holds the bridge."""
    return f"{prefix}br"


def run_directory(prefix: str) -> pathlib.Path:
    """The directory that keeps the run's mount namespaces."""
    return RUNTIME_ROOT / prefix


def mount_namespace_file(prefix: str, host: int) -> pathlib.Path:
    """The file that keeps host `host`'s mount namespace (for `nsenter --mount`)."""
    return run_directory(prefix) / f"h{host}.mnt"


def netns_of_run(prefix: str) -> list[str]:
    """The network namespaces on this machine that belong to run `prefix`."""
    return sorted(
        name
        for name in _listdir(NETNS_DIR)
        if (match := _NETNS.fullmatch(name)) and match["prefix"] == prefix
    )


def prefixes_on_machine() -> dict[str, int]:
    """Every run prefix found on this machine, mapped to its owner's pid."""
    found = {}
    for name in _listdir(NETNS_DIR):
        if match := _NETNS.fullmatch(name):
            found[match["prefix"]] = int(match["owner"])
    for name in _listdir(RUNTIME_ROOT):
        if match := _RUN_DIRECTORY.fullmatch(name):
            found[name] = int(match["owner"])
    return found


def _listdir(directory: pathlib.Path) -> list[str]:
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []
