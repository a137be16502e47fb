"""What the strategies decide from TF_CONFIG: a cluster or not, parameter servers.

Parsing and validation live in `keras_replicator._tf_config`, shared with the
launcher (which imports no TensorFlow), so both report a malformed TF_CONFIG with
the same error.
"""

from __future__ import annotations

from typing import Any

from keras_replicator._tf_config import num_tasks


def describes_cluster(config: dict[str, Any] | None) -> bool:
    """Whether a validated TF_CONFIG describes more than one task."""
    return num_tasks(config) > 1


def has_parameter_servers(config: dict[str, Any] | None) -> bool:
    """Whether a validated TF_CONFIG describes a parameter-server cluster."""
    return num_tasks(config, "ps") > 0


def check_parameter_server_cluster(config: dict[str, Any] | None) -> None:
    """Raises unless TF_CONFIG lists a chief, at least one worker and one ps."""
    missing = [
        kind for kind in ("chief", "worker", "ps") if not num_tasks(config, kind)
    ]
    if missing:
        received = "TF_CONFIG unset" if config is None else f"TF_CONFIG={config}"
        raise ValueError(
            "Parameter-server training needs `TF_CONFIG['cluster']` to list "
            f"'chief', 'worker' and 'ps' tasks; {missing} missing. Received: "
            f"{received}. Start the job with `keras-replicator launch -n 2 --ps 1 "
            "-- python train.py`, or pass a `cluster_resolver`."
        )
