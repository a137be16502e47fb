import importlib
import json

import pytest

import keras_replicator as kr

auto_module = importlib.import_module("keras_replicator.strategies._auto")


def test_local_devices_when_no_tpu_or_cluster(clean_tf_config, capsys):
    strategy = kr.auto(num_replicas=2)
    assert isinstance(strategy, kr.MultiDeviceReplicator)
    assert strategy.num_replicas_in_sync == 2
    assert "2 local logical CPU device(s)" in strategy.selection_reason
    assert "MultiDeviceReplicator with 2 replica(s)" in capsys.readouterr().err


def test_single_worker_tf_config_is_not_a_cluster(clean_tf_config, monkeypatch):
    config = {
        "cluster": {"worker": ["127.0.0.1:1"]},
        "task": {"type": "worker", "index": 0},
    }
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    strategy = kr.auto(num_replicas=1, verbose=False)
    assert isinstance(strategy, kr.MultiDeviceReplicator)


def test_malformed_tf_config_is_reported_before_anything_starts(
    clean_tf_config, monkeypatch
):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["x"]}}')
    with pytest.raises(ValueError, match=r"TF_CONFIG\['cluster'\]\['worker'\]\[0\]"):
        kr.auto(verbose=False)


def test_env_num_replicas(clean_tf_config, monkeypatch):
    monkeypatch.setenv("KERAS_REPLICATOR_NUM_REPLICAS", "two")
    with pytest.raises(ValueError, match="KERAS_REPLICATOR_NUM_REPLICAS='two'"):
        kr.auto(verbose=False)


def test_tpu_hint_reads_only_the_environment(clean_tf_config, monkeypatch):
    assert auto_module.tpu_environment_hint() is None or "device files" in (
        auto_module.tpu_environment_hint()
    )
    monkeypatch.setenv("COLAB_TPU_ADDR", "10.0.0.2:8470")
    assert auto_module.tpu_environment_hint() == "COLAB_TPU_ADDR is set"


def test_slurm_detection(clean_tf_config, monkeypatch):
    assert not auto_module._slurm_cluster()
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    assert auto_module._slurm_cluster()


def _two_tasks_on_one_node(monkeypatch, procid, visible, step_gpus):
    for name, value in {
        "SLURM_JOB_ID": "7",
        "SLURM_NTASKS": "2",
        "SLURM_PROCID": str(procid),
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NODELIST": "localhost",
        "SLURM_STEP_TASKS_PER_NODE": "2",
        "SLURM_STEP_GPUS": step_gpus,
        "CUDA_VISIBLE_DEVICES": visible,
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SLURM_GPU_BIND", raising=False)
    monkeypatch.delenv("SLURM_GPUS_ON_NODE", raising=False)


@pytest.mark.parametrize("visible, gpus", [("1", 1), ("2,3", 2)])
def test_slurm_resolver_keeps_the_gpus_srun_bound_to_the_task(
    clean_tf_config, monkeypatch, visible, gpus
):
    # Before: "1" of 2 tasks -> 0 GPUs per task (ValueError); "2,3" -> "1".
    _two_tasks_on_one_node(monkeypatch, 1, visible, step_gpus="0,1,2,3")
    resolver = auto_module._slurm_resolver()
    cluster = resolver.cluster_spec().as_dict()
    assert cluster == {"worker": ["localhost:8888", "localhost:8889"]}
    assert resolver.get_task_info() == ("worker", 1)
    assert resolver.num_accelerators() == {"GPU": gpus}
    assert auto_module.os.environ["CUDA_VISIBLE_DEVICES"] == visible


def test_slurm_resolver_splits_a_node_wide_view_as_tensorflow_does(
    clean_tf_config, monkeypatch
):
    _two_tasks_on_one_node(monkeypatch, 1, "0,1,2,3", step_gpus="0,1,2,3")
    resolver = auto_module._slurm_resolver()
    resolver.cluster_spec()
    assert resolver.num_accelerators() == {"GPU": 2}
    assert auto_module.os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_slurm_resolver_on_a_node_without_gpus_reports_none(
    clean_tf_config, monkeypatch
):
    # The resolver's pseudo-GPU per task derives the cluster; before, it also
    # reached the strategy as {"GPU": 1} (replicas on a missing /gpu:0, NCCL).
    _two_tasks_on_one_node(monkeypatch, 1, "", step_gpus="")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setenv("PATH", "/nonexistent")
    resolver = auto_module._slurm_resolver()
    assert resolver.cluster_spec().as_dict() == {
        "worker": ["localhost:8888", "localhost:8889"]
    }
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)
    assert resolver.num_accelerators() == {}
    assert "CUDA_VISIBLE_DEVICES" not in auto_module.os.environ
