"""Whether this machine can make simulated hosts, and if not, why.

Being root is not enough: a container's root may lack `CAP_NET_ADMIN` or
`CAP_SYS_ADMIN`, a kernel may lack veth, bridges or the tbf qdisc. So after the
cheap checks (Linux, root, the tools on `PATH`) the probe builds a small
cluster, two shaped hosts, and removes it: whatever step fails is the reason.
"""

from __future__ import annotations

import os
import shutil
import sys

from simulated_cluster._tools import TOOLS
from simulated_cluster.simulated import SimulatedCluster


def unavailable_reason() -> str | None:
    """Returns why simulated hosts cannot be made here, or `None` if they can.

    Takes a fraction of a second (it builds and removes a cluster), so call it
    once per test module, e.g. in a module-scoped fixture.

    Returns:
        `None`, or a sentence for `pytest.skip`: what is missing and what to do.

    Example:
    >>> reason = unavailable_reason()
    >>> reason is None or isinstance(reason, str)
    True
    """
    if not sys.platform.startswith("linux"):
        return (
            "Simulated hosts need Linux network and mount namespaces. "
            f"Received: sys.platform={sys.platform!r}."
        )
    if os.geteuid() != 0:
        return (
            "Simulated hosts need root (they create namespaces, veth pairs and "
            f"mounts). Received: uid={os.geteuid()}. Run these tests as root."
        )
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return (
            "Simulated hosts need iproute2 (ip, tc) and util-linux (nsenter, "
            f"unshare, mount, umount). Missing: {', '.join(missing)}. Install "
            "the packages `iproute2` and `util-linux` (and `mount`)."
        )
    try:
        SimulatedCluster(hosts=2, rate="1gbit").close()
    except RuntimeError as error:
        return f"A simulated cluster could not be built here: {error}"
    return None
