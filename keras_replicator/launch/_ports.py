"""Free TCP ports on the loopback interface."""

from __future__ import annotations

import contextlib
import socket


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Returns `count` distinct ports that were free on `host` a moment ago."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(
                socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            )
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
        return ports


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False
