"""Simulated hosts on one Linux machine, for multi-worker tests and benchmarks.

Test and benchmark infrastructure, not part of the `keras_replicator` package (it
needs root: network and mount namespaces, `tc`). `tests/` and `benchmarks/` both
import it from the repository's root; `simulated.py` says what a host is.
"""

from simulated_cluster._availability import unavailable_reason
from simulated_cluster._teardown import remove_stale_clusters
from simulated_cluster.simulated import SimulatedCluster

__all__ = ["SimulatedCluster", "remove_stale_clusters", "unavailable_reason"]
