"""The pure helpers of benchmarks/step_overhead.py and its arm (fast, no training)."""

import os

import pytest

from benchmarks import _step_overhead_arm as arm
from benchmarks import _step_overhead_report as report
from benchmarks import step_overhead as bench


def _round(step, first):
    return {"step": step, "first_step": first}


def _samples(model="small_mlp"):
    # Two rounds; ms: plain 20, ours 1 device 20.8 (1.04x), ours 2 workers 25
    # against 2 plain processes 20 (0.80x: missed), stock 2 workers 40.
    rounds = {
        "plain": [(0.020, 1.0), (0.020, 1.2)],
        "stock 1 device": [(0.023, 2.0), (0.023, 2.0)],
        "ours 1 device": [(0.0208, 2.0), (0.0208, 2.0)],
        "ours 2 workers": [(0.025, 2.2), (0.026, 2.4)],
        "stock 2 workers": [(0.040, 3.0), (0.040, 3.0)],
        "2 plain processes": [(0.020, 0.9), (0.020, 0.9)],
    }
    return {model: {a: [_round(*r) for r in rs] for a, rs in rounds.items()}}


def test_each_row_is_a_ratio_to_its_same_run_ceiling():
    model = bench.summarize(_samples())["small_mlp"]
    rows = model["arms"]
    assert model["global_batch"] == 128
    assert rows["ours 1 device"]["ceiling"] == "plain"
    assert rows["ours 1 device"]["ratio_to_ceiling"] == pytest.approx(1.04)
    assert rows["ours 2 workers"]["ceiling"] == "2 plain processes"
    assert rows["ours 2 workers"]["ratio_to_ceiling"] == pytest.approx(0.020 / 0.0255)
    assert rows["ours 2 workers"]["ratio_to_ceiling_per_round"] == pytest.approx(
        [0.8, 0.020 / 0.026]
    )
    assert rows["2 plain processes"]["ratio_to_ceiling"] == pytest.approx(1.0)
    assert rows["ours 2 workers"]["examples_per_s"] == pytest.approx(128 / 0.0255)
    assert rows["ours 2 workers"]["first_step_vs_ours_1_device"] == pytest.approx(1.15)
    assert rows["plain"]["per_round"]["first_step_s"] == [1.0, 1.2]


def test_targets_say_met_or_missed():
    found = bench.summarize(_samples())["small_mlp"]["targets"]
    assert found["ours_1_device_step_vs_plain"]["met"] is True
    assert found["ours_2_workers_speed_vs_2_plain_processes"]["met"] is False
    assert found["ours_2_workers_speed_vs_2_plain_processes"]["limit"] == 0.90
    assert found["first_step_2_workers_vs_ours_1_device"]["met"] is True
    resnet = bench.summarize(_samples("resnet20"))["resnet20"]["targets"]
    assert resnet["ours_2_workers_speed_vs_2_plain_processes"]["limit"] == 0.95


def test_target_line_and_issue_23_line():
    model = bench.summarize(_samples())["small_mlp"]
    line = report.target_line("small_mlp", model)
    assert line == (
        "small_mlp targets: ours 1 device = 1.040x plain step (<= 1.05: met); "
        "ours 2 workers = 0.784x of 2 plain processes (>= 0.9: MISSED); "
        "first step 2 workers / ours 1 device = 1.15 (<= 1.2: met)"
    )
    old = report.continuity_line("small_mlp", model)
    assert "ours 2 workers = 0.784x one process, 1.57x stock 2 workers" in old


def test_the_table_shows_each_ratio_over_the_rounds(capsys):
    # Issue 36: a miss smaller than the rounds' spread is a miss within the noise.
    model = bench.summarize(_samples())["small_mlp"]
    arms = model["arms"]
    assert report.round_range("ours 2 workers", arms["ours 2 workers"]) == (
        "0.769-0.800"
    )
    assert report.round_range("2 plain processes", arms["2 plain processes"]) == ""
    report.report(bench.summarize(_samples()))
    lines = capsys.readouterr().out.splitlines()
    ours = next(line for line in lines if line.startswith("ours 2 workers"))
    assert ours.endswith("0.769-0.800")
    assert next(line for line in lines if line.startswith("plain ")).endswith("   ")


def test_a_subset_of_arms_gets_the_ceilings(capsys):
    assert bench.with_ceilings(["ours 2 workers"]) == [
        "plain",
        "ours 2 workers",
        "2 plain processes",
    ]
    assert "adding the ceilings" in capsys.readouterr().err
    samples = _samples()
    for name in ("stock 1 device", "ours 1 device", "stock 2 workers"):
        del samples["small_mlp"][name]
    model = bench.summarize(samples)["small_mlp"]
    assert model["targets"]["ours_1_device_step_vs_plain"]["met"] is None
    assert "ours 1 device = n/a" in report.target_line("small_mlp", model)
    report.report(bench.summarize(samples))  # blank cells, no error


def _thread(name, group, seconds):
    return {"name": name, "group": group, "seconds": seconds}


def test_cpu_per_step_counts_new_and_exited_threads():
    before = {
        "threads": {
            "1": _thread("python", "python main", 1.0),
            "2": _thread("tf_data_x", "tf_data", 0.5),
        },
        "total": 2.0,
    }
    after = {
        "threads": {
            "1": _thread("python", "python main", 1.4),
            "3": _thread("tf_Compute", "tf_Compute", 0.3),
        },
        "total": 3.0,
    }
    groups = arm.cpu_per_step(before, after, steps=2)
    assert groups["python main"] == pytest.approx(0.2)
    assert groups["tf_Compute"] == pytest.approx(0.15)
    assert groups["exited threads"] == pytest.approx(0.15)
    assert groups["total"] == pytest.approx(0.5)
    assert arm.cpu_per_step(before, after, 2, by="name")["python"] == pytest.approx(0.2)


def test_ring_seconds_splits_the_first_step_from_the_steady_ones():
    # Batches end at 1.0, 2.0, 3.0, 4.0 s; steady steps are those after batch 1.
    ends = [1.0, 2.0, 3.0, 4.0]
    calls = [(0.5, 0.9), (0.95, 1.0), (1.5, 1.6), (2.5, 2.6), (3.5, 3.8)]
    seconds = arm.ring_seconds(calls, ends, steady_after=1)
    assert seconds["ring_first_step"] == pytest.approx(0.45)
    assert seconds["ring_per_step"] == pytest.approx((0.1 + 0.3) / 2)
    diagnose = bench._diagnose_medians(
        [
            {"call": 1.0, "loop": 0.0, "cpu_per_step": {"total": 1.0}, **seconds},
            {"call": 1.0, "loop": 0.0, "cpu_per_step": {"total": 1.0}, **seconds},
        ]
    )
    assert diagnose["ring_first_step_s"] == pytest.approx(0.45)
    assert diagnose["per_round"][0]["ring_per_step"] == pytest.approx(0.2)


def test_thread_names_and_proc_stat_parsing():
    assert arm.thread_group("python", is_main=True) == "python main"
    assert arm.thread_group("tf_Compute", is_main=False) == "tf_Compute"
    assert arm.thread_group("tf_data_private", is_main=False) == "tf_data"
    assert arm.thread_group("grpc_global_tim", is_main=False) == "grpc"
    assert arm.thread_group("python", is_main=False) == "unnamed"
    assert arm.thread_group("collective_ops", is_main=False) == "collectives"
    assert arm.thread_group("event_engine", is_main=False) == "grpc"
    assert arm.thread_group("lifeguard", is_main=False) == "other"
    stat = "42 (a (b) c) S " + " ".join(str(i) for i in range(4, 53))
    assert arm._ticks(stat) == 14 + 15
    now = arm.thread_cpu_seconds()
    assert str(os.getpid()) in now["threads"]
    assert now["total"] >= now["threads"][str(os.getpid())]["seconds"]


def test_small_mlp_is_the_issue_36_model():
    import keras

    model = arm.build_model(keras, "small_mlp")
    assert model.count_params() == 7_912_458  # ~7.9M, ~32 MB of float32 gradients
    assert [layer.units for layer in model.layers] == [2048, 2048, 1024, 10]
    assert arm.GLOBAL_BATCH["small_mlp"] == 128 and arm.STEPS["small_mlp"] == 60


def test_plot_writes_one_panel_per_model(tmp_path):
    pytest.importorskip("matplotlib")
    summary = {**bench.summarize(_samples()), **bench.summarize(_samples("mlp"))}
    report.plot(summary, str(tmp_path / "so.png"))
    assert (tmp_path / "so.png").stat().st_size > 0


def test_the_lockstep_pair_starts_each_batch_together():
    import threading
    import time

    from keras_replicator.launch import free_ports

    address = f"127.0.0.1:{free_ports(1)[0]}"
    begun = {0: [], 1: []}
    late = 0.3  # process 1 reaches each batch this much later

    def process(index):
        barrier = arm.lockstep_barrier(address, index)
        for batch in range(2):
            if index == 1:
                time.sleep(late)
            barrier.on_train_batch_begin(batch)
            begun[index].append(time.perf_counter())

    threads = [threading.Thread(target=process, args=(i,)) for i in (0, 1)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    # Process 0 waited for 1 at each batch: it began no earlier than 1 arrived.
    assert begun[0][0] - start >= late
    assert begun[0][1] - start >= 2 * late
    for a, b in zip(begun[0], begun[1]):
        assert abs(a - b) < late / 2
