"""Existing tf.distribute and Keras code gives one device's numbers under ours.

Every case of the client registry (`tests/clients/*.py`), run as written under
`kr.MultiDeviceReplicator(num_replicas=2)` in this process, or under
`kr.MultiWorkerReplicator` in 2 worker processes on 127.0.0.1 (marked `slow`), must
equal one device at the same global batch (or the values Keras' own test asserts)
within the case's tolerance: 1e-5 for float32 weights after a few steps unless the
case states otherwise. The stock strategies are measured by `make clients` (table in
docs/guide.md), not asserted here.
"""

import pytest

from keras_replicator.launch import launch_function
from tests.clients import table
from tests.clients._registry import Case, compare, load_cases, run_case

CASES = load_cases()
# Differences from the reference that are reported and not fixed yet: strict, so
# the fix shows up as an XPASS to remove from here.
KNOWN_DIFFERENCES: dict[str, str] = {}
# Local cases left to `make test-slow`: what each checks is also checked in the
# default run by the case(s) named in its reason.
_SAME_GUIDE = "covered in the default run by: the other clients of the same guide"
SLOW_LOCAL: dict[str, str] = {
    "tf_custom_training_iterators": _SAME_GUIDE,
    "tf_keras_fit_with_callbacks": _SAME_GUIDE,
    "tf_save_and_load_saved_model": _SAME_GUIDE,
    "kerasio_train_step_lower_level": _SAME_GUIDE,
    "kerasio_train_step_sample_weight": _SAME_GUIDE,
    "tf_input_distributed_datasets": _SAME_GUIDE,
    "kerasio_gan_without_call": "covered in the default run by: "
    "tests/keras_integration/test_reduction_rule.py::"
    "test_model_without_call_trains_as_on_one_device (a GAN Model subclass with "
    "train_step, two optimizers and no call, on 2 replicas as on one device)",
}


def _marks(name):
    marks = []
    if name in KNOWN_DIFFERENCES:
        marks.append(pytest.mark.xfail(reason=KNOWN_DIFFERENCES[name], strict=True))
    if name in SLOW_LOCAL:
        marks.append(pytest.mark.slow(reason=SLOW_LOCAL[name]))
    return marks


LOCAL = [
    pytest.param(name, marks=_marks(name))
    for name, case in CASES.items()
    if case.workers == 1
]
# A renamed case must not silently come back into the default run.
_UNKNOWN = set(SLOW_LOCAL) - {param.values[0] for param in LOCAL}
if _UNKNOWN:
    raise ValueError(f"SLOW_LOCAL names no local case: {sorted(_UNKNOWN)}")
MULTI_WORKER = [name for name, case in CASES.items() if case.workers > 1]


def _reference(case, workdir):
    if case.expected is not None:
        return case.expected
    return run_case(case.name, "one_device", str(workdir))


@pytest.mark.parametrize("name", LOCAL)
def test_ours_on_two_replicas_matches_the_reference(name, tmp_path):
    case = CASES[name]
    reference = _reference(case, tmp_path / "one_device")
    (tmp_path / "ours").mkdir()
    ours = run_case(name, "ours", str(tmp_path / "ours"))
    compare(case, reference, ours)


@pytest.mark.slow
@pytest.mark.multi_worker
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", MULTI_WORKER)
def test_ours_on_two_workers_matches_one_device(name, tmp_path):
    case = CASES[name]
    (tmp_path / "one_device").mkdir()
    reference = _reference(case, tmp_path / "one_device")
    (tmp_path / "ours").mkdir()
    chief, other = launch_function(
        run_case,
        case.workers,
        args=(name, "ours", str(tmp_path / "ours")),
        timeout=case.timeout,
        echo=False,
    )
    compare(case, reference, chief)
    # The other worker holds the same model (chief-only results aside).
    compare(case, {k: v for k, v in chief.items() if k in other}, other)


def test_the_table_names_the_reason_of_each_failure():
    case = Case("c", lambda strategy, workdir: {}, "the tutorial", tolerance=1e-5)
    reference = table.Outcome(results={"weights": [0.1, 0.2]})
    rows = [
        {
            "case": "c",
            "origin": "the tutorial",
            "reference": case.reference,
            "tolerance": case.tolerance,
            "stock": table.cell(case, reference, table.Outcome(error="Crash | x"))[0],
            "ours": table.cell(
                case, reference, table.Outcome(results={"weights": [0.1, 0.200001]})
            )[0],
            "ours_error": 1e-6,
        }
    ]
    off, _ = table.cell(case, reference, table.Outcome(results={"weights": [0.1, 0.7]}))
    assert off == "FAIL: off by 0.5 in `weights` (tolerance 1e-05)"
    assert table.format_table(rows).splitlines()[-1] == (
        "| `c` | the tutorial | one device | FAIL: Crash / x | pass (1e-06 ≤ 1e-05) |"
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_table_runs_each_mode_in_fresh_processes(capsys):
    assert table.main(["--cases", "keras_sgd_single_step"]) == 0
    printed = capsys.readouterr().out
    assert "| `keras_sgd_single_step` |" in printed
