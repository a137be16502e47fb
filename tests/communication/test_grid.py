"""`_grid`: the one 2-D layout both hierarchical all-reduces place replicas by."""

import pytest

from keras_replicator.communication import _grid
from keras_replicator.communication.ring import _hierarchical


def test_grid_positions():
    assert _grid.grid(8, 4, 6) == _grid.Grid(rows=2, row_size=4, row=1, column=2)
    with pytest.raises(ValueError, match=r"Received: group_size=3\. Use one of"):
        _grid.grid(4, 3, 0)


@pytest.mark.parametrize("length", [0, 1, 7, 8, 9])
@pytest.mark.parametrize("row_size", [1, 2, 3, 4])
def test_chunks_cover_the_buffer_with_less_than_a_row_of_padding(length, row_size):
    chunk = _grid.chunk_size(length, row_size)
    assert length <= chunk * row_size < length + row_size


def test_the_rings_rows_are_the_grids_rows():
    # Ring positions ordered by machine (2 machines x 2 workers): the ring's rows
    # are `_grid`'s, so both 2-D all-reduces place a worker the same way.
    rows = _hierarchical.grid([0, 2, 1, 3], [[1, 0], [2, 0], [1, 0], [2, 0]])
    for position in range(4):
        place = _grid.grid(4, len(rows[0]), position)
        assert rows[place.row][place.column] == position
