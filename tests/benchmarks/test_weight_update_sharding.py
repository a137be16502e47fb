"""The pure helpers of benchmarks/weight_update_sharding.py and its worker (fast)."""

from types import SimpleNamespace

import pytest

from benchmarks import _sharding_worker as worker
from benchmarks import weight_update_sharding as bench


def _result(apply_s, sgd_apply_s, step_s, state_bytes):
    return {
        "state_elements": state_bytes // 4,
        "state_bytes": state_bytes,
        "weight_elements": 100,
        "apply_s": apply_s,
        "sgd_apply_s": sgd_apply_s,
        "fit_step_s": step_s,
    }


def test_arm_config_names_the_topology_and_the_steps():
    config = bench.arm_config("mlp-lars", "cpu4", True, quick=False)
    assert config["optimizer"] == "lars" and config["model"] == "mlp"
    assert (config["processes"], config["replicas"], config["shard"]) == (1, 4, True)
    assert config["fit_steps"] > config["steady_after"] + 2
    workers = bench.arm_config("resnet20-adam", "workers", False, quick=True)
    assert (workers["processes"], workers["replicas"]) == (2, 2)
    assert workers["apply_calls"] == bench.QUICK_STEPS["apply_calls"]


def test_summarize_takes_medians_and_sharded_over_unsharded_ratios():
    runs = {
        ("mlp-adam", "workers", False): [
            _result(0.050, 0.020, 0.100, 800),
            _result(0.060, 0.020, 0.120, 800),
            _result(0.070, 0.030, 0.110, 800),
        ],
        ("mlp-adam", "workers", True): [
            _result(0.030, 0.020, 0.100, 400),
            _result(0.040, 0.025, 0.080, 400),
            _result(0.035, 0.020, 0.090, 400),
        ],
    }
    (row,) = bench.summarize(runs)
    assert row["unsharded"]["apply_ms"] == pytest.approx(60.0)
    assert row["unsharded"]["update_ms"] == pytest.approx(40.0)  # per run, then median
    assert row["sharded"]["update_ms"] == pytest.approx(15.0)
    assert row["sharded"]["examples_per_s"] == pytest.approx(256 / 0.09)
    ratios = row["ratios"]
    assert ratios["state_bytes"] == 0.5
    assert ratios["update_ms"] == pytest.approx(15 / 40)
    assert ratios["apply_ms"] == pytest.approx(35 / 60)
    assert ratios["examples_per_s"] == pytest.approx(0.11 / 0.09)


def test_a_skipped_arm_is_reported_not_divided(capsys):
    runs = {
        ("mlp-lars", "cpu2", False): [_result(0.05, 0.02, 0.1, 800)],
        ("mlp-lars", "cpu2", True): [{"skipped": "LARS is not one of ..."}],
        ("mlp-adam", "cpu2", False): [_result(0.05, 0.02, 0.1, 800)],
        ("mlp-adam", "cpu2", True): [_result(0.03, 0.02, 0.1, 400)],
    }
    rows = bench.summarize(runs)
    assert [r["model"] for r in rows] == ["mlp-adam", "mlp-lars"]  # MODELS order
    assert rows[1]["skipped"] == "LARS is not one of ..."
    assert "ratios" not in rows[1]
    bench.report(rows)
    assert "skipped: LARS is not one of" in capsys.readouterr().out


def test_held_by_one_replica_counts_one_device_copy():
    def variable(shape, copies=None, dtype="float32"):
        value = SimpleNamespace(shape=shape)
        if copies:
            value.values = [SimpleNamespace(shape=s) for s in copies]
        return SimpleNamespace(value=value, dtype=SimpleNamespace(name=dtype))

    optimizer = SimpleNamespace(
        variables=[
            variable(()),  # the step counter
            variable((5,), copies=[(5,), (5,)]),  # a piece per device
            variable((3, 4), dtype="float64"),  # a whole slot of one worker
        ]
    )
    assert worker.held_by_one_replica(optimizer) == (1 + 5 + 12, 4 + 20 + 96)


def test_time_interleaved_alternates_the_steps():
    calls = []
    medians = worker.time_interleaved(
        [lambda: calls.append("a"), lambda: calls.append("b")], calls=3, warmup=1
    )
    assert calls == ["a", "b"] * 4
    assert len(medians) == 2 and all(m >= 0 for m in medians)
