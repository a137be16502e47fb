import json
import sys

import pytest

from keras_replicator.launch import free_ports, run_workers, tf_configs

PY = sys.executable


def test_tf_configs_use_loopback_and_distinct_ports():
    configs = tf_configs(3)
    addresses = configs[0]["cluster"]["worker"]
    assert len(set(addresses)) == 3
    assert all(a.startswith("127.0.0.1:") for a in addresses)
    assert [c["task"]["index"] for c in configs] == [0, 1, 2]


@pytest.mark.parametrize("bad, error", [(0, ValueError), ("2", TypeError)])
def test_bad_worker_count(bad, error):
    with pytest.raises(error, match="num_workers"):
        tf_configs(bad)


def test_each_worker_gets_its_tf_config_and_output_is_kept():
    code = (
        "import os, json; config = json.loads(os.environ['TF_CONFIG']); "
        "print(config['task']['index'])"
    )
    result = run_workers([PY, "-c", code], 2, timeout=60, echo=False)
    assert result.ok
    assert [w.output.strip() for w in result.workers] == ["0", "1"]


def test_output_is_prefixed_with_the_worker_index(capfd):
    run_workers([PY, "-c", "print('hello')"], 2, timeout=60)
    out = capfd.readouterr().out
    assert "[worker 0] hello" in out and "[worker 1] hello" in out


def test_first_failure_stops_the_others_and_is_reported():
    code = (
        "import os, sys, time\n"
        "if os.environ['KERAS_REPLICATOR_WORKER_INDEX'] == '1':\n"
        "    raise SystemExit('worker one broke')\n"
        "time.sleep(60)\n"
    )
    result = run_workers([PY, "-c", code], 2, timeout=50, echo=False, grace_seconds=1)
    assert not result.ok and not result.timed_out
    assert result.seconds < 30
    assert result.first_failure.index == 1
    assert "worker one broke" in result.describe_failure()
    assert result.workers[0].returncode != 0  # stopped, not left running


def test_timeout_stops_everything():
    result = run_workers(
        [PY, "-c", "import time; time.sleep(60)"],
        2,
        timeout=1,
        echo=False,
        grace_seconds=1,
    )
    assert result.timed_out and not result.ok
    assert result.seconds < 20
    assert "timed out" in result.describe_failure()


def test_free_ports_are_distinct():
    ports = free_ports(4)
    assert len(set(ports)) == 4


def test_tf_config_is_valid_json_for_tensorflow():
    config = tf_configs(2)[1]
    assert json.loads(json.dumps(config))["task"] == {"type": "worker", "index": 1}


def test_the_worker_that_failed_first_is_blamed_not_the_lowest_index():
    code = (
        "import os, sys, time\n"
        "index = os.environ['KERAS_REPLICATOR_WORKER_INDEX']\n"
        "if index == '2':\n"
        "    raise ValueError('worker two broke')\n"
        "time.sleep(60)\n"
    )
    result = run_workers([PY, "-c", code], 3, timeout=50, echo=False, grace_seconds=1)
    failure = result.first_failure
    assert failure.index == 2 and not failure.stopped
    assert failure.traceback.startswith("Traceback (most recent call last):")
    assert failure.traceback.endswith("ValueError: worker two broke")
    assert [w.stopped for w in result.workers] == [True, True, False]
    assert result.headline().startswith("worker 2 exited with code 1")
    assert "the launcher stopped worker(s) [0, 1]" in result.headline()
    assert result.describe_failure().index(
        "worker two broke"
    ) < result.describe_failure().index("--- worker 0")


def test_a_worker_that_quit_early_with_code_0_is_named():
    code = (
        "import os, time\n"
        "if os.environ['KERAS_REPLICATOR_WORKER_INDEX'] == '1':\n"
        "    raise SystemExit(0)\n"
        "time.sleep(1.0)\n"
        "raise SystemExit('peer gone')\n"
    )
    result = run_workers([PY, "-c", code], 2, timeout=50, echo=False)
    assert result.first_failure.index == 0
    assert "worker(s) 1 (at" in result.headline()
    assert "had exited with code 0" in result.headline()


def test_a_worker_killed_by_a_signal_is_reported_with_the_signal_name():
    code = (
        "import os, signal, time\n"
        "if os.environ['KERAS_REPLICATOR_WORKER_INDEX'] == '0':\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "time.sleep(60)\n"
    )
    result = run_workers([PY, "-c", code], 2, timeout=50, echo=False, grace_seconds=1)
    assert result.first_failure.index == 0
    assert "exited with code -9 (SIGKILL)" in result.headline()


def test_exit_times_are_recorded():
    result = run_workers([PY, "-c", "pass"], 2, timeout=60, echo=False)
    assert all(0 < w.seconds <= result.seconds for w in result.workers)
    assert not any(w.stopped for w in result.workers)
    assert result.headline() == "all 2 workers succeeded"


def test_tracebacks_are_empty_without_one():
    result = run_workers([PY, "-c", "print('fine')"], 1, echo=False)
    assert result.workers[0].traceback == ""


def test_a_collective_timeout_points_at_the_peers_still_running():
    code = (
        "import os, time\n"
        "if os.environ['KERAS_REPLICATOR_WORKER_INDEX'] == '0':\n"
        "    raise SystemExit('DeadlineExceededError: Collective ops timed out')\n"
        "time.sleep(60)\n"
    )
    result = run_workers([PY, "-c", code], 2, timeout=50, echo=False, grace_seconds=1)
    assert "while worker(s) [1] were still running" in result.headline()
