"""The pure helpers of benchmarks/layouts.py and its parts (fast, no training);
one smoke run of the whole benchmark, slow."""

import json
from types import SimpleNamespace

import pytest

from benchmarks import _layouts_report as report
from benchmarks import _layouts_worker as worker
from benchmarks import layouts as bench

MB = 1_000_000
WHOLE = {"weights": 20 * MB, "slots": 40 * MB, "gradients": 20 * MB}


def _layout_result(step_s, weights, slots, grads, from_tape=None):
    per_device = {
        "weights": weights,
        "weights_traced": weights,
        "slots": slots,
        "slots_traced": slots,
        "from_tape": from_tape or grads,
        "to_optimizer": grads,
        "from_tape_specs": {"dense/kernel": ["unsharded", "batch"]},
        "to_optimizer_specs": {"dense/kernel": ["batch", "unsharded"]},
    }
    return {
        "step_s": step_s,
        "parameters": 5,
        "whole": WHOLE,
        "per_device": per_device,
        "weight_specs": {"dense/kernel": ["batch", "unsharded"]},
    }


def _runs(sharded_steps=(0.12, 0.13)):
    # ms: one device 50, data-parallel 100 / 100, fully sharded 120 / 130.
    half = [10 * MB, 10 * MB]
    return {
        worker.ONE_DEVICE: [{"step_s": 0.05, "whole": WHOLE, "parameters": 5}] * 2,
        worker.DATA_PARALLEL: [{"step_s": 0.1, "whole": WHOLE, "parameters": 5}] * 2,
        worker.FULLY_SHARDED: [
            _layout_result(s, half, [20 * MB, 20 * MB], half) for s in sharded_steps
        ],
    }


def _memory():
    def one(arm, devices, held, peak):
        return [{"arm": arm, "devices": devices, "held": held, "peak": peak}]

    return {
        worker.ONE_DEVICE: one(worker.ONE_DEVICE, 1, 80 * MB, 140 * MB),
        worker.DATA_PARALLEL: one(worker.DATA_PARALLEL, 2, 150 * MB, 260 * MB),
        worker.FULLY_SHARDED: one(worker.FULLY_SHARDED, 2, 130 * MB, 208 * MB),
    }


def test_bytes_held_are_the_largest_devices_or_whole():
    whole = report.held_bytes({"whole": WHOLE})
    assert whole["total"] == 80 * MB
    sharded = report.held_bytes(
        _layout_result(0.1, [10, 12], [20, 22], [5, 6], from_tape=[50, 50])
    )
    assert sharded == {"weights": 12, "slots": 22, "gradients": 6, "total": 40}


def test_summary_ratios_are_to_the_same_runs_arms_and_say_the_targets():
    summary = report.summarize(_runs(), _memory())
    arms = summary["arms"]
    sharded = arms[worker.FULLY_SHARDED]
    assert sharded["step_ms"]["median"] == pytest.approx(125.0)
    assert sharded["step_vs_data_parallel"] == pytest.approx(1.25)
    assert sharded["step_vs_data_parallel_per_round"] == pytest.approx([1.2, 1.3])
    assert sharded["step_vs_one_device"] == pytest.approx(2.5)
    assert sharded["bytes_vs_data_parallel"]["total"] == pytest.approx(0.5)
    allocated = sharded["allocator_per_device"]
    assert allocated["peak"] == 104 * MB  # the process's 208 MB over 2 devices
    assert allocated["peak_vs_data_parallel"] == pytest.approx(0.8)
    assert arms[worker.ONE_DEVICE]["allocator_per_device"]["held"] == 80 * MB
    targets = summary["targets"]
    assert targets["step"]["met"] is True
    assert targets["step"]["per_round_range"] == pytest.approx([1.2, 1.3])
    assert targets["memory"]["met"] is True
    assert targets["allocator_peak"] == {"value": 0.8, "limit": 0.6, "met": False}
    slow = report.summarize(_runs((0.14, 0.15)))
    assert slow["targets"]["step"]["met"] is False
    assert slow["targets"]["allocator_peak"]["met"] is None


def test_a_missing_baseline_is_an_error_not_a_number():
    runs = _runs()
    del runs[worker.DATA_PARALLEL]
    with pytest.raises(ValueError, match="same run"):
        report.summarize(runs)


def test_report_prints_the_tables_the_verdicts_and_a_disagreeing_read(capsys):
    runs = _runs()
    runs[worker.FULLY_SHARDED][-1]["per_device"]["weights_traced"] = [1, 1]
    report.report(report.summarize(runs, _memory()))
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| fully sharded"))
    assert row.split(" | ")[1:4] == ["125.0 (120.0-130.0)", "1.25x", "2.50x"]
    assert row.endswith("| 40.0 | 0.50x |")
    assert "| fully sharded 2 | 65.0 | 0.87x | 104.0 | 0.80x |" in out
    assert "WARNING fully sharded 2: `bytes_per_device` gives" in out
    assert "relaid out before Adam: dense/kernel" in out
    assert "<= 0.6x data-parallel: 0.50x, met" in out
    assert "allocator peak per device: 0.80x data-parallel, ABOVE 0.6x" in out
    assert "1.25x (rounds 1.20-1.30), met" in out


def test_plot_writes_both_panels(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "layouts.png"
    report.plot(report.summarize(_runs(), _memory()), str(path))
    assert path.stat().st_size > 10_000


def test_whole_bytes_and_the_arms():
    def variable(shape, dtype):
        return SimpleNamespace(shape=shape, dtype=dtype)

    variables = [variable((3, 4), "float32"), variable((), "int64")]
    assert worker.whole_bytes(variables) == 3 * 4 * 4 + 8
    assert worker.ARMS[:2] == (worker.ONE_DEVICE, worker.DATA_PARALLEL)
    with pytest.raises(ValueError, match="Unknown arm"):
        worker.strategy_for("two devices", None, None, None)


def test_steps_must_leave_a_steady_state():
    with pytest.raises(SystemExit):
        bench.main(["--steps", "6", "--steady-after", "4"])


@pytest.mark.slow(
    reason="covered in the default run by: the helpers above, and "
    "tests/strategies/test_model_parallel.py::"
    "test_fully_sharded_equals_one_device_and_keeps_about_half_per_device"
)
def test_quick_run_writes_the_table_json_and_png(tmp_path, capsys):
    # About a minute and a half on 2 cores: 8 fresh processes.
    pytest.importorskip("matplotlib")
    paths = {"json": tmp_path / "layouts.json", "png": tmp_path / "layouts.png"}
    bench.main(["--quick", "--json", str(paths["json"]), "--png", str(paths["png"])])
    saved = json.loads(paths["json"].read_text())
    assert set(saved["runs"]) == set(worker.ARMS) == set(saved["memory"])
    sharded = saved["summary"]["arms"][worker.FULLY_SHARDED]
    assert sharded["bytes_vs_data_parallel"]["total"] <= 0.6
    assert sharded["weight_specs"]["mlp/hidden_2/kernel"] == ["batch", "unsharded"]
    assert paths["png"].stat().st_size > 10_000
    assert "target: fully sharded step" in capsys.readouterr().out
