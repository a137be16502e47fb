"""The table and plot helpers of benchmarks/pipeline.py, on its saved run (fast)."""

import json
from pathlib import Path

import pytest

from benchmarks import pipeline as bench

PATH = Path(bench.__file__)


def _saved():
    return json.loads((PATH.parent / "pipeline.json").read_text())


def test_limit_rows_are_ratios_of_the_measured_rows():
    saved = _saved()
    median = saved["median"]
    cap = {mode: tuple(value) for mode, value in saved["deepest"].items()}
    table = bench._tables(list(median), median, saved["memory"], cap)
    ceiling = (
        median["2 plain processes at once, 1 thread/op"] / median["plain, 1 thread/op"]
    )
    efficiency = (
        median["small batch: plain, 1 thread/op"] / median["plain, 1 thread/op"]
    )
    estimate = ceiling * efficiency * median["plain, 1 thread/op"]
    estimate /= median["GPipe K=2 M=1"]
    row = next(line for line in table.splitlines() if "M=8 estimate" in line)
    assert row.split("|")[2].strip() == f"{estimate:.2f}x"
    assert f"| {ceiling:.2f}x |" in table
    assert "deepest that trains" in table


def test_replot_redraws_from_the_saved_run(tmp_path, monkeypatch):
    (tmp_path / "pipeline.json").write_text(json.dumps(_saved()))
    monkeypatch.setattr(bench, "HERE", tmp_path)
    bench.replot()
    assert (tmp_path / "pipeline.png").stat().st_size > 10_000


@pytest.mark.parametrize("mode", ["never", "always"])
def test_saved_run_has_a_cap_row_per_mode(mode):
    deepest, tried = _saved()["deepest"][mode]
    assert [depth for depth, ok in tried if ok][-1] == deepest
