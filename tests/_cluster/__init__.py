"""Simulated hosts on one Linux machine, for multi-worker tests (needs root)."""

from tests._cluster._availability import unavailable_reason
from tests._cluster._teardown import remove_stale_clusters
from tests._cluster.simulated import SimulatedCluster

__all__ = ["SimulatedCluster", "remove_stale_clusters", "unavailable_reason"]
