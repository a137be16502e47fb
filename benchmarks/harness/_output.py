"""What a benchmark leaves behind: the raw JSON and the PNG.

The JSON holds the settings and every round's numbers, so a table or plot can be
redrawn and checked later; the PNG draws the same run's ratios. Plots are drawn
off-screen (matplotlib's Agg backend), so a benchmark runs on a machine without a
display.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any


def write_json(path: str | pathlib.Path, record: Any, indent: int = 1) -> None:
    """Writes `record` to `path` as indented JSON."""
    pathlib.Path(path).write_text(json.dumps(record, indent=indent))


@contextlib.contextmanager
def figure(
    path: str | pathlib.Path,
    *,
    size: tuple[float, float],
    panels: int = 1,
    dpi: int = 100,
    title: str | None = None,
    **subplots: Any,
) -> Iterator[tuple[Any, list]]:
    """A figure of `panels` side by side, saved to `path` when the block ends.

    Args:
        path: The PNG to write (its folder is made if missing).
        size: The figure's (width, height) in inches.
        panels: How many axes side by side. Defaults to 1.
        dpi: Dots per inch of the PNG. Defaults to 100.
        title: The figure's title above every panel. Defaults to `None`.
        **subplots: More arguments for `matplotlib.pyplot.subplots`, such as
            `layout="constrained"` (then no `tight_layout`).

    Yields:
        The figure and the list of its axes.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawing, axes = plt.subplots(1, panels, figsize=size, squeeze=False, **subplots)
    yield drawing, list(axes[0])
    if title is not None:
        drawing.suptitle(title)
    if "layout" not in subplots:
        drawing.tight_layout()
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    drawing.savefig(path, dpi=dpi)
    plt.close(drawing)


def print_table(header: str, lines: Iterable[str], note: str | None = None) -> None:
    """Prints a fixed-width table: `header`, a rule as wide, the lines, a note."""
    print(header)
    print("-" * len(header))
    for line in lines:
        print(line)
    if note is not None:
        print(note)


def plot_panels(
    path: str | pathlib.Path,
    entries: Mapping[str, Any],
    draw: Callable[[Any, str, Any], None],
    *,
    panel_size: tuple[float, float],
    dpi: int = 100,
) -> None:
    """One panel per entry, side by side: `draw(axis, key, value)` fills each.

    Prints `wrote <path>` once the PNG is saved.
    """
    width, height = panel_size
    size = (width * len(entries), height)
    with figure(path, size=size, panels=len(entries), dpi=dpi) as (_, axes):
        for axis, (key, value) in zip(axes, entries.items()):
            draw(axis, key, value)
    print(f"wrote {path}")
