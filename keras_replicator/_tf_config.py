"""TF_CONFIG: parsed and validated once, for the launcher and the strategies alike.

TensorFlow's own parsing fails late and vaguely on a malformed TF_CONFIG (a KeyError
deep in the cluster resolver, or a hang while waiting for a worker that does not
exist). Checking it up front turns each mistake into one sentence that says which
field is wrong and what to write instead.

The launcher (which must not import TensorFlow) and the strategies read the same
variable, so they share this one validator: two would drift apart, and a TF_CONFIG
the launcher accepts would then fail differently, later, in the worker. Hence this
module imports nothing but the standard library.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

TASK_TYPES = ("chief", "worker", "ps", "evaluator")
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
    except json.JSONDecodeError as error:
        raise ValueError(
            f"`TF_CONFIG` must be JSON ({error}). Received: TF_CONFIG={raw!r}. "
            f"Expected e.g. {_EXAMPLE}."
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
    shown = f"TF_CONFIG={json.dumps(config)}"
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
    for task_type, addresses in cluster.items():
        if task_type not in TASK_TYPES:
            raise ValueError(
                f"`TF_CONFIG['cluster']` has an unknown task type {task_type!r}; "
                f"expected one of {list(TASK_TYPES)}. Received: {shown}."
            )
        if not isinstance(addresses, list) or not addresses:
            raise ValueError(
                f"`TF_CONFIG['cluster']['{task_type}']` must be a non-empty list of "
                f'"host:port" strings. Received: {shown}.'
            )
        for position, address in enumerate(addresses):
            if not _is_host_port(address):
                raise ValueError(
                    f"`TF_CONFIG['cluster']['{task_type}'][{position}]` must be a "
                    f'"host:port" string. Received: address={address!r} in {shown}.'
                )
    task = config.get("task")
    if not isinstance(task, dict):
        raise ValueError(
            "`TF_CONFIG['task']` is missing: each process must say which task it is, "
            f'e.g. {{"type": "worker", "index": 0}}. Received: {shown}.'
        )
    task_type = task.get("type")
    if task_type not in cluster:
        raise ValueError(
            f"`TF_CONFIG['task']['type']` must be one of the cluster's task types "
            f"{list(cluster)}. Received: type={task_type!r} in {shown}."
        )
    index, count = task.get("index"), len(cluster[task_type])
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
        raise ValueError(
            f"`TF_CONFIG['task']['index']` must be an integer in [0, {count}) "
            f"because `TF_CONFIG['cluster']['{task_type}']` lists {count} "
            f"address(es). Received: index={index!r} in {shown}."
        )


def _is_host_port(address: Any) -> bool:
    if not isinstance(address, str) or ":" not in address:
        return False
    host, _, port = address.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


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
