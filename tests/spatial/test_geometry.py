"""The halo arithmetic against a brute-force count of the rows each output reads."""

import pytest

from keras_replicator.spatial import _geometry


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("stride", [1, 2, 3])
@pytest.mark.parametrize("padding", ["same", "valid"])
@pytest.mark.parametrize("parts", [2, 4])
def test_each_tile_reads_exactly_its_outputs_rows(size, stride, padding, parts):
    window = _geometry.Window(size, stride, padding)
    for height in range(parts, 48, parts):
        rows = height // parts
        try:
            plan = _geometry.halo(window, rows, parts, "layer")
        except ValueError:
            continue
        out = window.output_length(height)
        pad_top, _ = window.pads(height)
        for p in range(parts):
            first_output = p * plan.output_rows
            # Global input row of the first row the tile's window op reads.
            first_input = p * rows - plan.top + plan.offsets[p]
            assert first_input == first_output * stride - pad_top
            assert plan.output_rows * parts == out
            assert (plan.length - size) // stride + 1 == plan.output_rows
            assert 0 <= plan.offsets[p] <= plan.top + plan.bottom + rows - plan.length
