"""Validation of TF_CONFIG, with errors that name the offending field.

TensorFlow's own parsing fails late and vaguely on a malformed TF_CONFIG (a KeyError
deep in the cluster resolver, or a hang while waiting for a worker that does not
exist). Checking it up front turns each mistake into one sentence that says which
field is wrong and what to write instead.
"""

from __future__ import annotations

import json
import os
from typing import Any

_TASK_TYPES = ("chief", "worker", "ps", "evaluator")


def read_tf_config(environ=None) -> dict[str, Any] | None:
    """Parses and validates `TF_CONFIG` from `environ`; None when unset or empty."""
    environ = os.environ if environ is None else environ
    raw = environ.get("TF_CONFIG", "").strip()
    if not raw:
        return None
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"`TF_CONFIG` must be JSON ({error}). Received: TF_CONFIG={raw!r}. "
            'Expected e.g. {"cluster": {"worker": ["127.0.0.1:12345", '
            '"127.0.0.1:12346"]}, "task": {"type": "worker", "index": 0}}.'
        ) from None
    validate_tf_config(config)
    return config


def validate_tf_config(config: Any) -> None:
    """Raises ValueError naming the first malformed field of a TF_CONFIG dict."""
    received = f"Received: TF_CONFIG={json.dumps(config)!s}"
    if not isinstance(config, dict):
        raise ValueError(f"`TF_CONFIG` must be a JSON object. {received}.")
    cluster = config.get("cluster")
    if not isinstance(cluster, dict) or not cluster:
        raise ValueError(
            "`TF_CONFIG['cluster']` must map task types to address lists, e.g. "
            f'{{"worker": ["127.0.0.1:12345"]}}. {received}.'
        )
    for task_type, addresses in cluster.items():
        if task_type not in _TASK_TYPES:
            raise ValueError(
                f"`TF_CONFIG['cluster']` has an unknown task type {task_type!r}; "
                f"expected one of {list(_TASK_TYPES)}. {received}."
            )
        if not isinstance(addresses, list) or not addresses:
            raise ValueError(
                f"`TF_CONFIG['cluster']['{task_type}']` must be a non-empty list of "
                f'"host:port" strings. {received}.'
            )
        for position, address in enumerate(addresses):
            if not _is_host_port(address):
                raise ValueError(
                    f"`TF_CONFIG['cluster']['{task_type}'][{position}]` must be a "
                    f'"host:port" string. Received: {address!r}. {received}.'
                )
    task = config.get("task")
    if not isinstance(task, dict):
        raise ValueError(
            "`TF_CONFIG['task']` is missing: each process must say which task it is, "
            f'e.g. {{"type": "worker", "index": 0}}. {received}.'
        )
    task_type = task.get("type")
    if task_type not in cluster:
        raise ValueError(
            f"`TF_CONFIG['task']['type']` must be one of the cluster's task types "
            f"{list(cluster)}. Received: type={task_type!r}. {received}."
        )
    index = task.get("index")
    if isinstance(index, bool) or not isinstance(index, int):
        raise ValueError(
            "`TF_CONFIG['task']['index']` must be an integer. "
            f"Received: index={index!r}. {received}."
        )
    count = len(cluster[task_type])
    if not 0 <= index < count:
        raise ValueError(
            f"`TF_CONFIG['task']['index']` must be in [0, {count}) because "
            f"`TF_CONFIG['cluster']['{task_type}']` lists {count} address(es). "
            f"Received: index={index}. {received}."
        )


def _is_host_port(address: Any) -> bool:
    if not isinstance(address, str) or ":" not in address:
        return False
    host, _, port = address.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


def describes_cluster(config: dict[str, Any] | None) -> bool:
    """Whether a validated TF_CONFIG describes more than one task."""
    if not config:
        return False
    return sum(len(addresses) for addresses in config["cluster"].values()) > 1
