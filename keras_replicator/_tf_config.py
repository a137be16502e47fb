"""TF_CONFIG: parsed and validated once, for the launcher and the strategies alike.

TensorFlow's own parsing fails late and vaguely on a malformed TF_CONFIG (a KeyError
deep in the cluster resolver, or a hang while waiting for a worker that does not
exist). Checking it up front turns each mistake into one sentence that says which
field is wrong and what to write instead.

The launcher (which must not import TensorFlow) and the strategies read the same
variable, so they share this one validator: two would drift apart, and a TF_CONFIG
the launcher accepts would then fail differently, later, in the worker. Hence this
module imports nothing but the standard library.

Addresses are held to what gRPC and TensorFlow parse the same way: a host name or
IPv4 address of ASCII letters, digits, `.`, `-` and `_`, or an IPv6 address in
brackets (`[::1]:2222`: unbracketed, `::1:2222` is ambiguous and the workers
hang), then `:` and an ASCII decimal port in [1, 65535] (Python's `int()` also
reads Arabic-Indic digits, which gRPC does not). Two tasks may not share an
address, and since TensorFlow's server binds its port on every interface, two
loopback spellings (`localhost`, `127.0.0.1`, `[::1]`) with one port are the same
address. Hostile input (nesting deep enough for a RecursionError, integers too
long for `int()`, cycles in a dict passed directly) becomes a `ValueError` naming
`TF_CONFIG`, never a bare Python error.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections.abc import Mapping
from typing import Any

TASK_TYPES = ("chief", "worker", "ps", "evaluator")
_HOST = re.compile(r"[A-Za-z0-9._-]+")
_PORT = re.compile(r"[0-9]{1,5}")
_SHOWN_CHARS = 600  # a hostile TF_CONFIG can be megabytes long
_EXAMPLE = (
    '{"cluster": {"worker": ["127.0.0.1:12345", "127.0.0.1:12346"]}, '
    '"task": {"type": "worker", "index": 0}}'
)


def read_tf_config(environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """Parses and validates `TF_CONFIG` from `environ`.

    Args:
        environ: Where to read `TF_CONFIG`. Defaults to `None`: `os.environ`.

    Returns:
        The validated TF_CONFIG dict, or `None` when `TF_CONFIG` is unset or blank.

    Raises:
        ValueError: naming the first malformed field (see `validate_tf_config`).

    Example:
    >>> config = read_tf_config({"TF_CONFIG": '{"cluster": {"worker": '
    ...     '["127.0.0.1:2222", "127.0.0.1:2223"]}, '
    ...     '"task": {"type": "worker", "index": 1}}'})
    >>> config["task"], num_tasks(config)
    ({'type': 'worker', 'index': 1}, 2)
    >>> read_tf_config({}) is None
    True
    """
    environ = os.environ if environ is None else environ
    raw = environ.get("TF_CONFIG", "").strip()
    return parse_tf_config(raw) if raw else None


def parse_tf_config(raw: str) -> dict[str, Any]:
    """Parses a TF_CONFIG JSON string and validates it; returns the whole dict.

    Keys this module does not check ("rpc_layer", "environment") are kept.

    Example:
    >>> parse_tf_config("{not json")
    Traceback (most recent call last):
    ...
    ValueError: `TF_CONFIG` must be JSON (Expecting property name enclosed in \
double quotes: line 1 column 2 (char 1)). Received: TF_CONFIG='{not json'. \
Expected e.g. {"cluster": {"worker": ["127.0.0.1:12345", "127.0.0.1:12346"]}, \
"task": {"type": "worker", "index": 0}}.
    """
    try:
        config = json.loads(raw)
    except RecursionError:
        raise ValueError(
            "`TF_CONFIG` is nested too deeply to be a cluster description. "
            f"Received: TF_CONFIG={_clip(repr(raw))}. Expected e.g. {_EXAMPLE}."
        ) from None
    except ValueError as error:  # JSONDecodeError, or an int too long for int()
        raise ValueError(
            f"`TF_CONFIG` must be JSON ({_clip(str(error))}). "
            f"Received: TF_CONFIG={_clip(repr(raw))}. Expected e.g. {_EXAMPLE}."
        ) from None
    validate_tf_config(config)
    return config


def validate_tf_config(config: Any) -> None:
    """Raises ValueError naming the first malformed field of a TF_CONFIG dict.

    Example:
    >>> validate_tf_config({"cluster": {"worker": ["127.0.0.1:2222"]},
    ...                     "task": {"type": "worker", "index": 1}})
    Traceback (most recent call last):
    ...
    ValueError: `TF_CONFIG['task']['index']` must be an integer in [0, 1) because \
`TF_CONFIG['cluster']['worker']` lists 1 address(es). Received: index=1 in \
TF_CONFIG={"cluster": {"worker": ["127.0.0.1:2222"]}, "task": {"type": "worker", \
"index": 1}}.
    """
    shown = f"TF_CONFIG={_show(config)}"
    if not isinstance(config, dict):
        raise ValueError(
            f"`TF_CONFIG` must be a JSON object. Received: {shown}. Expected e.g. "
            f"{_EXAMPLE}."
        )
    cluster = config.get("cluster")
    if not isinstance(cluster, dict) or not cluster:
        raise ValueError(
            "`TF_CONFIG['cluster']` must map task types to lists of \"host:port\" "
            f'addresses, e.g. {{"worker": ["127.0.0.1:12345"]}}. Received: {shown}.'
        )
    seen: dict[tuple[str, int], str] = {}
    for task_type, addresses in cluster.items():
        if task_type not in TASK_TYPES:
            raise ValueError(
                "`TF_CONFIG['cluster']` has an unknown task type "
                f"{_clip(repr(task_type))}; "
                f"expected one of {list(TASK_TYPES)}. Received: {shown}."
            )
        if not isinstance(addresses, list) or not addresses:
            raise ValueError(
                f"`TF_CONFIG['cluster']['{task_type}']` must be a non-empty list of "
                f'"host:port" strings. Received: {shown}.'
            )
        for position, address in enumerate(addresses):
            field = f"TF_CONFIG['cluster']['{task_type}'][{position}]"
            problem = address_problem(address)
            if problem:
                raise ValueError(
                    f'`{field}` must be a "host:port" string: {problem}. '
                    f"Received: address={_clip(repr(address))} in {shown}."
                )
            key = _address_key(address)
            if key in seen:
                raise ValueError(
                    f"`{field}` repeats the address of `{seen[key]}`: every task "
                    "needs its own host:port (TensorFlow's server binds the port "
                    "on all interfaces, so loopback names with one port collide). "
                    f"Received: address={address!r} in {shown}. Give each task "
                    "its own port."
                )
            seen[key] = field
    task = config.get("task")
    if not isinstance(task, dict):
        raise ValueError(
            "`TF_CONFIG['task']` is missing: each process must say which task it is, "
            f'e.g. {{"type": "worker", "index": 0}}. Received: {shown}.'
        )
    task_type = task.get("type")
    if not isinstance(task_type, str) or task_type not in cluster:
        raise ValueError(
            f"`TF_CONFIG['task']['type']` must be one of the cluster's task types "
            f"{list(cluster)}. Received: type={_clip(repr(task_type))} in {shown}."
        )
    index, count = task.get("index"), len(cluster[task_type])
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
        raise ValueError(
            f"`TF_CONFIG['task']['index']` must be an integer in [0, {count}) "
            f"because `TF_CONFIG['cluster']['{task_type}']` lists {count} "
            f"address(es). Received: index={_clip(repr(index))} in {shown}."
        )


def address_problem(address: Any) -> str | None:
    """What is wrong with a TF_CONFIG address, or `None` if gRPC reads it as meant.

    Example:
    >>> address_problem("[::1]:2222") is None
    True
    >>> address_problem("::1:2222")
    'an IPv6 host must be in brackets, e.g. "[::1]:2222"'
    """
    if not isinstance(address, str):
        return f"got a {type(address).__name__}"
    host, colon, port = address.rpartition(":")
    if not colon or not host:
        return 'expected e.g. "127.0.0.1:2222"'
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return f"{_clip(host)} is not an IPv6 address in brackets"
    elif ":" in host:
        return 'an IPv6 host must be in brackets, e.g. "[::1]:2222"'
    elif not _HOST.fullmatch(host):
        return (
            f"the host {_clip(repr(host))} may only hold ASCII letters, digits, "
            "'.', '-' and '_' (no spaces, newlines or other characters)"
        )
    if not _PORT.fullmatch(port) or not 0 < int(port) < 65536:
        return (
            f"the port {_clip(repr(port))} must be ASCII decimal digits in [1, 65535]"
        )
    return None


def format_address(host: str, port: int) -> str:
    """`host:port` as TF_CONFIG and gRPC expect it: IPv6 hosts in brackets.

    Example:
    >>> format_address("::1", 2222), format_address("127.0.0.1", 2222)
    ('[::1]:2222', '127.0.0.1:2222')
    """
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def _address_key(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    host = host.strip("[]").lower()
    try:
        if ipaddress.ip_address(host).is_loopback:
            host = "localhost"
        else:
            host = ipaddress.ip_address(host).compressed
    except ValueError:
        pass
    return host, int(port)


def _clip(text: str) -> str:
    if len(text) <= _SHOWN_CHARS:
        return text
    return (
        f"{text[: _SHOWN_CHARS // 2]}...({len(text)} characters)..."
        + text[-_SHOWN_CHARS // 4 :]
    )


def _show(config: Any) -> str:
    """The config for an error message: JSON, shortened, and safe on any input."""
    try:
        text = json.dumps(config)
    except (RecursionError, ValueError, TypeError):
        try:
            text = repr(config)
        except RecursionError:
            text = f"<a {type(config).__name__} nested too deeply to show>"
    return _clip(text)


def num_tasks(config: Mapping[str, Any] | None, task_type: str | None = None) -> int:
    """How many tasks a validated TF_CONFIG lists: of `task_type`, or in all.

    Args:
        config: A validated TF_CONFIG dict, or `None` (no cluster: 0 tasks).
        task_type: One of `TASK_TYPES`. Defaults to `None`: count every task.

    Example:
    >>> config = {"cluster": {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]},
    ...           "task": {"type": "chief", "index": 0}}
    >>> num_tasks(config), num_tasks(config, "ps"), num_tasks(config, "worker")
    (2, 1, 0)
    """
    if not config:
        return 0
    cluster = config["cluster"]
    if task_type is None:
        return sum(len(addresses) for addresses in cluster.values())
    return len(cluster.get(task_type, ()))
