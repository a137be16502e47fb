"""Every patch has an upstream issue, or a ready-to-file report in docs/upstream.md.

A patch of a stock Keras or TensorFlow bug is upstream material (issue 50): a row of
`_inventory.PATCHES` whose `upstream` says "none filed" must point, through
`REPORTS` below, at a section of docs/upstream.md that holds the report (a repro
and a proposed fix, or a feature request where upstream chose the behaviour). The
mapping lives here, not in the inventory: rows may be removed or get an issue
number; only rows that exist and say "none filed" need a report.
"""

import pathlib
import re

from keras_replicator._compat import _inventory

UPSTREAM_MD = pathlib.Path(__file__).parents[2] / "docs" / "upstream.md"

# (patched_by, the target's last two dotted parts) -> the section's anchor slug.
REPORTS = {
    ("optimizer", "BaseOptimizer.apply"): "lazy-optimizer-build",
    ("optimizer", "LossScaleOptimizer.apply"): "lazy-optimizer-build",
    ("loss_scale", "LossScaleOptimizer.check_finite"): "loss-scale-finite-verdict",
    ("accumulation", "BaseOptimizer._backend_apply_gradients"): (
        "gradient-accumulation-merge-call"
    ),
    ("clipping", "BaseOptimizer._clip_gradients"): "clipping-before-reduction",
    ("optimizer", "loss.scale_loss_for_distribution"): "uneven-replica-batches",
    ("optimizer", "loss.unscale_loss_for_distribution"): "uneven-replica-batches",
    ("optimizer", "TFOptimizer._all_reduce_sum_gradients"): "uneven-replica-batches",
    ("optimizer", "BaseOptimizer.scale_loss"): "uneven-replica-batches",
    ("average_loss", "nn.compute_average_loss"): "average-loss-helpers",
    ("average_loss", "nn.scale_regularization_loss"): "average-loss-helpers",
    ("optimizer", "TFOptimizer.add_variable_from_reference"): (
        "sharded-optimizer-state"
    ),
    ("data", "TFEpochIterator.__init__"): "distributed-iterator-one-replica",
    ("parameter_server", "TensorFlowTrainer.fit"): "parameter-server-fit",
    ("parameter_server", "TensorFlowTrainer.evaluate"): "parameter-server-fit",
    ("parameter_server", "TensorFlowTrainer.predict"): "parameter-server-fit",
    ("parameter_server", "Variable.assign_add"): "keras-variable-atomic-increments",
    ("parameter_server", "Variable.assign_sub"): "keras-variable-atomic-increments",
    ("parameter_server", "Variable._initialize"): "sharded-variable-training",
}

# What every report holds (bold labels in docs/upstream.md).
REQUIRED_PARTS = ("**Affected versions**", "**Proposed", "**Repro**")


def _key(patch):
    return patch.patched_by, ".".join(patch.target.split(".")[-2:])


def _sections():
    """{slug: the section's text} for every `## slug` heading."""
    text = UPSTREAM_MD.read_text()
    parts = re.split(r"^## ([a-z0-9-]+)[ \t]*$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


def _unfiled():
    return [p for p in _inventory.PATCHES if p.upstream.startswith("none filed")]


def test_every_patch_names_an_upstream_issue_or_says_none_filed():
    for patch in _inventory.PATCHES:
        assert "#" in patch.upstream or patch.upstream.startswith("none filed"), (
            f"{patch.target}: `upstream` must name an issue (owner/repo#N) or start "
            f"with 'none filed'. Received: upstream={patch.upstream!r}."
        )


def test_every_unfiled_patch_has_a_report():
    sections = _sections()
    for patch in _unfiled():
        key = _key(patch)
        assert key in REPORTS, (
            f"{patch.target} (patched by _compat/{patch.patched_by}.py) says "
            f"'none filed' but has no upstream report. Write one in "
            f"docs/upstream.md (repro + proposed fix) and map {key!r} to its "
            f"slug in REPORTS, or file the issue and name it in `upstream`."
        )
        assert REPORTS[key] in sections, (
            f"{patch.target} maps to `## {REPORTS[key]}`, which docs/upstream.md "
            f"does not have. Sections: {sorted(sections)}."
        )


def test_every_mapped_report_is_complete():
    sections = _sections()
    for slug in sorted({REPORTS[_key(p)] for p in _unfiled() if _key(p) in REPORTS}):
        body = sections.get(slug, "")
        missing = [part for part in REQUIRED_PARTS if part not in body]
        assert not missing, f"docs/upstream.md `## {slug}` lacks {missing}."


def test_the_report_index_lists_every_section():
    text = UPSTREAM_MD.read_text()
    for slug in _sections():
        assert f"(#{slug})" in text, f"the index of docs/upstream.md lacks #{slug}."
