"""The one 2-D design both hierarchical all-reduces follow: the grid and its phases.

The replicas form a grid, row-major. A *row* is ``row_size`` consecutive
replicas on the fast links: the devices of one worker for TensorFlow's
collectives (or ``group_size`` replicas), the workers of one machine for the
socket ring (its positions are ordered by machine). A *column* holds the replicas
at the same position of every row: one per row, over the slow network. Replica
``g`` sits in row ``g // row_size`` and column ``g % row_size`` (`grid`).

Ying et al.'s 2-D all-reduce runs in three phases over that grid, whatever moves
the bytes:

1. reduce-scatter along the row: position ``c`` keeps chunk ``c`` of the row's
   sum (a buffer is cut into ``row_size`` chunks of `chunk_size` values, the
   last padded with zeros);
2. all-reduce of that chunk along column ``c``: each of the ``row_size``
   columns carries ``1 / row_size`` of the buffer over the network;
3. all-gather along the row.

Two transports implement the phases, each with its own primitives:
`_hierarchy` on TensorFlow's sub-group collectives (one graph op a phase; also
Jia et al.'s local-then-global), and `ring/_hierarchical` on the socket ring's
shared-memory rows and socket columns (numpy, a call cut into pieces whose phases
overlap). Both place a replica with `grid` and cut a buffer with `chunk_size`.

Example:
>>> grid(num_replicas=4, row_size=2, replica=3)
Grid(rows=2, row_size=2, row=1, column=1)
>>> chunk_size(7, 2)  # 7 values in rows of 2: chunks of 4, the last padded
4
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Grid:
    """Where a replica sits: ``rows`` x ``row_size`` replicas, its row and column."""

    rows: int
    row_size: int
    row: int
    column: int


def grid(num_replicas: int, row_size: int, replica: int) -> Grid:
    """The grid position of replica `replica`; checks the grid is rectangular.

    Raises:
        ValueError: `row_size` does not divide `num_replicas` (named as the
            user's `group_size`, the only way to ask for such rows).
    """
    if row_size < 1 or num_replicas % row_size:
        divisors = [d for d in range(1, num_replicas + 1) if num_replicas % d == 0]
        raise ValueError(
            f"`group_size` must divide the {num_replicas} replicas into equal rows "
            f"for a hierarchical all-reduce. Received: group_size={row_size}. "
            f"Use one of {divisors}, or None for the replicas of one worker."
        )
    return Grid(
        num_replicas // row_size,
        row_size,
        replica // row_size,
        replica % row_size,
    )


def chunk_size(length: int, row_size: int) -> int:
    """Values in each of a row's chunks of a `length`-value buffer (rounded up)."""
    return -(-length // row_size)
