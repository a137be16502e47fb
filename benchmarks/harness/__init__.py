"""The one harness every benchmark in `benchmarks/` is built on.

A benchmark compares named configurations (*arms*) against a baseline or a ceiling
measured **in the same run**, so that a slower or busier machine moves both sides
alike. The harness owns the parts of that contract that do not depend on what is
measured:

* `fresh_process` / `fresh_workers`: run an arm in new Python processes (the
  benchmark's own module with `python -m`, or `keras_replicator.launch`'s workers)
  and read back the one `RESULT {json}` line the arm prints with `emit_result`;
* `interleave`: every arm once per round, round after round (optionally rotating
  the order), so drift over the run hits every arm alike;
* `batch_end_stamps`, `steady_interval`: a `fit` call's steady step, the median
  interval between batches after the warm-up;
* `medians`, `median_and_range`, `ratios`, `over_seeds`: the summary over rounds
  (or seeds) and the ratio of each arm to the same run's baseline;
* `markdown_table`, `print_table`, `write_json`, `figure`, `plot_panels`: the
  printed table, the raw JSON and the PNG.
"""

from benchmarks.harness._output import (
    figure,
    plot_panels,
    print_table,
    write_json,
)
from benchmarks.harness._processes import (
    ROOT,
    emit_result,
    fresh_process,
    fresh_workers,
    module_command,
    module_environment,
    read_result,
)
from benchmarks.harness._rounds import interleave, rotate
from benchmarks.harness._statistics import (
    markdown_table,
    median_and_range,
    medians,
    over_seeds,
    ratios,
)
from benchmarks.harness._steady import batch_end_stamps, steady_interval

__all__ = [
    "ROOT",
    "batch_end_stamps",
    "emit_result",
    "figure",
    "fresh_process",
    "fresh_workers",
    "interleave",
    "markdown_table",
    "median_and_range",
    "medians",
    "module_command",
    "module_environment",
    "over_seeds",
    "plot_panels",
    "print_table",
    "ratios",
    "read_result",
    "rotate",
    "steady_interval",
    "write_json",
]
