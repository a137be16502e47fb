"""Slurm's per-task GPU binding survives TF's SlurmClusterResolver (issue 48, 4).

Fake Slurm variables on "localhost"; the resolver only formats addresses, so no
host is contacted and no port is bound.
"""

import json
import pathlib
import subprocess
import sys

import pytest

from keras_replicator import _slurm_gpus
from keras_replicator.launch import LaunchOptions, free_ports
from keras_replicator.launch._cluster import plan_cluster
from keras_replicator.launch._ports import port_in_use

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _two_tasks_on_one_node(procid, visible, **slurm):
    env = {
        "PATH": "/usr/bin:/bin",
        "SLURM_JOB_ID": "42",
        "SLURM_NTASKS": "2",
        "SLURM_PROCID": str(procid),
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NODELIST": "localhost",
        "SLURM_STEP_TASKS_PER_NODE": "2",
        "CUDA_VISIBLE_DEVICES": visible,
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    return env | {f"SLURM_{name.upper()}": value for name, value in slurm.items()}


def _resolve(env):
    done = subprocess.run(
        [sys.executable, "-m", "keras_replicator.launch._slurm"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


_CLUSTER = {"worker": ["localhost:8888", "localhost:8889"]}


# The rule, without TensorFlow --------------------------------------------------


@pytest.mark.parametrize(
    "environ, bound",
    [
        ({}, None),
        ({"CUDA_VISIBLE_DEVICES": "1"}, None),  # no Slurm variable shows a binding
        ({"CUDA_VISIBLE_DEVICES": "1", "SLURM_STEP_GPUS": "0,1"}, ["1"]),
        ({"CUDA_VISIBLE_DEVICES": "2,3", "SLURM_STEP_GPUS": "0-3"}, ["2", "3"]),
        ({"CUDA_VISIBLE_DEVICES": "0", "SLURM_GPUS_ON_NODE": "2"}, ["0"]),
        ({"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_STEP_GPUS": "0,1,2,3"}, None),
        ({"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_GPUS_ON_NODE": "2"}, None),
        ({"CUDA_VISIBLE_DEVICES": "2,3", "SLURM_GPU_BIND": "per_task:2"}, ["2", "3"]),
        ({"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_GPU_BIND": "verbose,none"}, None),
        ({"CUDA_VISIBLE_DEVICES": "NoDevFiles", "SLURM_STEP_GPUS": "0,1"}, None),
    ],
)
def test_slurm_shows_a_per_task_binding(environ, bound):
    assert _slurm_gpus.slurm_bound_gpus(environ) == bound


def test_resolver_arguments_follow_the_binding(tmp_path):
    bound = _two_tasks_on_one_node(1, "2,3", step_gpus="0,1,2,3")
    assert _slurm_gpus.resolver_arguments(bound) == {
        "gpus_per_node": 4,
        "gpus_per_task": 2,
        "auto_set_gpu": False,
    }
    node_wide = _two_tasks_on_one_node(1, "0,1,2,3", step_gpus="0,1,2,3")
    assert _slurm_gpus.resolver_arguments(node_wide) == {}
    no_gpus = {"SLURM_STEP_NUM_TASKS": "3", "PATH": str(tmp_path)}
    assert _slurm_gpus.resolver_arguments(no_gpus) == {
        "gpus_per_node": 3,
        "gpus_per_task": 1,
        "auto_set_gpu": False,
    }


# TF's resolver in the launcher's child -----------------------------------------


def test_one_bound_gpu_per_task_with_two_tasks_per_node_resolves():
    # Before: the resolver counted 1 GPU per node -> 0 per task -> ValueError.
    for procid in range(2):
        env = _two_tasks_on_one_node(procid, str(procid), step_gpus="0,1")
        resolved = _resolve(env)
        assert resolved["tf_config"] == {
            "cluster": _CLUSTER,
            "task": {"type": "worker", "index": procid},
        }
        assert resolved["env"] == {"CUDA_VISIBLE_DEVICES": str(procid)}


@pytest.mark.slow(
    reason="covered in the default run by: test_slurm_shows_a_per_task_binding "
    "(the rule, SLURM_GPU_BIND cases) and "
    "test_one_bound_gpu_per_task_with_two_tasks_per_node_resolves (TF's resolver)"
)
def test_gpu_bind_keeps_slurms_gpu_even_without_step_gpus():
    env = _two_tasks_on_one_node(1, "1", gpu_bind="map_gpu:0,1")
    assert _resolve(env)["env"] == {"CUDA_VISIBLE_DEVICES": "1"}


@pytest.mark.slow(
    reason="covered in the default run by: test_resolver_arguments_follow_the_binding "
    "(a node-wide view adds no argument) and "
    "test_one_bound_gpu_per_task_with_two_tasks_per_node_resolves (TF's resolver)"
)
def test_a_node_wide_view_keeps_tensorflows_assignment():
    env = _two_tasks_on_one_node(1, "0,1,2,3", step_gpus="0,1,2,3")
    resolved = _resolve(env)
    assert resolved["tf_config"]["cluster"] == _CLUSTER
    assert resolved["env"] == {"CUDA_VISIBLE_DEVICES": "2,3"}


def _consecutive_free_ports(count):
    for _ in range(50):
        (start,) = free_ports(1)
        if start + count < 65536 and not any(
            port_in_use(start + k) for k in range(count)
        ):
            return start
    pytest.skip("no run of consecutive free ports")


@pytest.mark.slow(
    reason="covered in the default run by: test_resolver_arguments_follow_the_binding "
    "(2 bound GPUs a task), test_one_bound_gpu_per_task_with_two_tasks_per_node_"
    "resolves (the child keeps the bound GPU) and tests/launch/test_cluster.py::"
    "test_slurm_mode_resolves_this_tasks_tf_config (plan_cluster's Slurm mode)"
)
def test_the_launched_worker_keeps_the_gpus_slurm_bound_to_its_task():
    # Before: task 1's "2,3" became "1", a GPU of task 0.
    base = _consecutive_free_ports(2)
    env = _two_tasks_on_one_node(1, "2,3", step_gpus="0,1,2,3")
    plan = plan_cluster(LaunchOptions(port_base=base), env | {"PYTHONPATH": ""})
    (spec,) = plan.specs
    assert json.loads(spec.tf_config)["task"] == {"type": "worker", "index": 1}
    assert spec.env["CUDA_VISIBLE_DEVICES"] == "2,3"
