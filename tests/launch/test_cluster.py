"""Cluster modes: local, a scheduler's TF_CONFIG (pass-through) and Slurm."""

import json
import socket
import subprocess
import sys

import pytest

from keras_replicator.launch import LaunchOptions, free_ports, launch
from keras_replicator.launch._cluster import choose_mode, plan_cluster
from keras_replicator.launch._ports import port_in_use

PY = sys.executable


def _tf_config(workers, index=0, kind="worker", chief=None):
    cluster = {"worker": workers}
    if chief:
        cluster["chief"] = chief
    return json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})


def _two_loopback_workers(index):
    a, b = free_ports(2)
    return _tf_config([f"127.0.0.1:{a}", f"127.0.0.1:{b}"], index)


def _slurm_env(procid, tasks, port_base):
    return {
        "PATH": "/usr/bin:/bin",
        "SLURM_JOB_ID": "42",
        "SLURM_PROCID": str(procid),
        "SLURM_STEP_NUM_TASKS": str(tasks),
        "SLURM_STEP_NODELIST": "localhost",
        "SLURM_STEP_TASKS_PER_NODE": str(tasks),
    }


def _consecutive_free_ports(count):
    for _ in range(50):
        (start,) = free_ports(1)
        if start + count < 65536 and not any(
            port_in_use(start + k) for k in range(count)
        ):
            return start
    raise RuntimeError("no run of free ports found")


# Choosing the mode ----------------------------------------------------------


@pytest.mark.parametrize(
    "num_workers, environ, expected",
    [
        (2, {}, "local"),
        (None, {"TF_CONFIG": _tf_config(["127.0.0.1:1"])}, "tf-config"),
        (None, _slurm_env(0, 2, 8888), "slurm"),
    ],
)
def test_auto_mode(num_workers, environ, expected):
    options = LaunchOptions(num_workers=num_workers)
    assert choose_mode(options, environ) == expected


def test_auto_mode_without_a_cluster_asks_for_num_workers():
    with pytest.raises(ValueError, match="Received: num_workers=None. Use e.g."):
        choose_mode(LaunchOptions(), {})


def test_num_workers_with_an_inherited_tf_config_is_ambiguous():
    environ = {"TF_CONFIG": _tf_config(["127.0.0.1:1"])}
    with pytest.raises(ValueError, match="TF_CONFIG` is already set"):
        choose_mode(LaunchOptions(num_workers=2), environ)
    assert choose_mode(LaunchOptions(num_workers=2, cluster="local"), environ) == (
        "local"
    )


def test_a_single_task_slurm_step_is_not_a_cluster():
    with pytest.raises(ValueError, match="num_workers"):
        choose_mode(LaunchOptions(), _slurm_env(0, 1, 8888))


# A scheduler's TF_CONFIG ------------------------------------------------------


def test_a_port_in_use_names_the_tf_config_field():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        (other,) = free_ports(1)
        environ = {
            "TF_CONFIG": _tf_config(
                [f"127.0.0.1:{other}", f"127.0.0.1:{port}"], index=1
            )
        }
        with pytest.raises(
            ValueError,
            match=rf"`TF_CONFIG\['cluster'\]\['worker'\]\[1\]` names port {port}, "
            "which is already in use",
        ):
            plan_cluster(LaunchOptions(), environ)


def test_given_local_ports_in_use_name_the_argument():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        (free,) = free_ports(1)
        with pytest.raises(ValueError, match=rf"`ports\[1\]` names port {port}"):
            plan_cluster(LaunchOptions(num_workers=2, ports=(free, port)), {})


def test_a_remote_cluster_needs_allow_remote():
    environ = {"TF_CONFIG": _tf_config(["10.0.0.1:2222", "10.0.0.2:2222"], 0)}
    with pytest.raises(
        ValueError, match=r"`TF_CONFIG\['cluster'\]\['worker'\]\[0\]` is '10.0.0.1"
    ):
        plan_cluster(LaunchOptions(), environ)
    plan = plan_cluster(LaunchOptions(allow_remote=True), environ)
    assert plan.mode == "tf-config" and len(plan.specs) == 1


def test_pass_through_keeps_the_schedulers_tf_config_and_ranks_the_chief_first():
    a, b, c = free_ports(3)
    raw = _tf_config([f"127.0.0.1:{b}", f"127.0.0.1:{c}"], 1, chief=[f"127.0.0.1:{a}"])
    plan = plan_cluster(LaunchOptions(), {"TF_CONFIG": raw})
    (spec,) = plan.specs
    assert spec.tf_config == raw  # byte for byte
    assert spec.label == "worker 1" and spec.prefix == "[worker 1] "
    assert spec.env["KERAS_REPLICATOR_WORKER_INDEX"] == "2"
    assert spec.env["KERAS_REPLICATOR_NUM_WORKERS"] == "3"
    assert len(plan.all_configs) == 3
    assert "<- this process" in plan.describe(["python", "train.py"]).splitlines()[-2]


def test_pass_through_runs_the_one_task_with_its_tf_config(monkeypatch, capfd):
    config = json.loads(_two_loopback_workers(1))
    raw = json.dumps({**config, "rpc_layer": "grpc", "environment": "cloud"})
    monkeypatch.setenv("TF_CONFIG", raw)
    code = "import os; print(os.environ['TF_CONFIG'])"
    result = launch([PY, "-c", code], timeout=60)
    assert result.ok and len(result.workers) == 1
    assert result.workers[0].output.strip() == raw
    assert "[worker 1] {" in capfd.readouterr().out


# Slurm (TF's SlurmClusterResolver in a child; fake Slurm variables on localhost) --


def test_slurm_mode_resolves_this_tasks_tf_config():
    base = _consecutive_free_ports(2)
    plan = plan_cluster(
        LaunchOptions(port_base=base), _slurm_env(1, 2, base) | {"PYTHONPATH": ""}
    )
    (spec,) = plan.specs
    config = json.loads(spec.tf_config)
    assert config == {
        "cluster": {"worker": [f"localhost:{base}", f"localhost:{base + 1}"]},
        "task": {"type": "worker", "index": 1},
    }
    assert plan.mode == "slurm" and spec.env["KERAS_REPLICATOR_WORKER_INDEX"] == "1"


def test_slurm_mode_outside_srun_explains_how_to_run():
    with pytest.raises(ValueError, match="srun"):
        plan_cluster(LaunchOptions(cluster="slurm"), {"PATH": "/usr/bin:/bin"})


@pytest.mark.slow(
    reason="covered in the default run by: "
    "test_slurm_mode_resolves_this_tasks_tf_config"
)
def test_two_slurm_tasks_launch_one_worker_each():
    base = _consecutive_free_ports(2)
    code = "import os, json; print(json.loads(os.environ['TF_CONFIG'])['task'])"
    launchers = [
        subprocess.Popen(
            [PY, "-m", "keras_replicator.cli", "launch", "--port-base", str(base)]
            + ["--", PY, "-c", code],
            env=_slurm_env(procid, 2, base),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for procid in range(2)
    ]
    outputs = [p.communicate(timeout=240) for p in launchers]
    for procid, (process, (out, err)) in enumerate(zip(launchers, outputs)):
        assert process.returncode == 0, err
        assert f"[worker {procid}] {{'type': 'worker', 'index': {procid}}}" in out


def test_a_local_ps_job_on_ipv6_brackets_every_address():
    plan = plan_cluster(LaunchOptions(num_workers=2, num_ps=1, host="::1"), {})
    cluster = plan.all_configs[0]["cluster"]
    addresses = [a for kind in ("chief", "worker", "ps") for a in cluster[kind]]
    assert len(addresses) == 4 and all(a.startswith("[::1]:") for a in addresses)


def test_a_scheduler_cluster_on_ipv6_loopback_is_local():
    a, b = free_ports(2, "::1")
    environ = {"TF_CONFIG": _tf_config([f"[::1]:{a}", f"[::1]:{b}"], index=1)}
    plan = plan_cluster(LaunchOptions(), environ)
    assert plan.specs[0].address == ("TF_CONFIG['cluster']['worker'][1]", f"[::1]:{b}")
