"""Free TCP ports, and whether a worker's port can be bound.

TensorFlow's gRPC server always listens on `0.0.0.0:<port>` (all interfaces),
whatever host its `TF_CONFIG` names, with `SO_REUSEADDR` and without
`SO_REUSEPORT`. `port_in_use` asks the same question the server will: can this port
be bound on all interfaces, ignoring connections in TIME_WAIT? When it cannot, TF
fails with a bare "Could not start gRPC server"; the launcher says which
`TF_CONFIG` field names the busy port instead.
"""

from __future__ import annotations

import contextlib
import socket


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Returns `count` distinct ports that were free on `host` a moment ago.

    `host` may be an IPv6 address (`"::1"`, bracketed or not).

    Example:
    >>> from keras_replicator.launch import free_ports
    >>> len(set(free_ports(3)))
    3
    """
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(family, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
        return ports


def port_in_use(port: int, host: str = "0.0.0.0") -> bool:
    """Whether a server could not bind `port` on `host` now (as TF's gRPC would)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False
