"""The strategy conformance suite: named strategy factories x checks.

Run it from the command line with `keras-replicator test`, or from Python with
`run_conformance`. Register your own strategy with `register_factory`.
"""

from keras_replicator.testing._factories import (
    FACTORIES,
    StrategyFactory,
    register_factory,
)
from keras_replicator.testing._suite import (
    CHECK_NAMES,
    LAYOUT_CHECK_NAMES,
    Row,
    format_table,
    run_conformance,
)

__all__ = [
    "CHECK_NAMES",
    "LAYOUT_CHECK_NAMES",
    "FACTORIES",
    "Row",
    "StrategyFactory",
    "format_table",
    "register_factory",
    "run_conformance",
]
