"""Each local worker sees its own GPUs: `CUDA_VISIBLE_DEVICES` per worker.

No GPU is needed: a fake `nvidia-smi` first on `PATH` (a shell script printing
GPU indices) or a fake `CUDA_VISIBLE_DEVICES` in the launcher's environment stands
for the machine's GPUs, and real worker processes print what they were given.
"""

import json
import os
import sys
import textwrap

import pytest

from keras_replicator.launch import LaunchOptions, launch, launch_function
from keras_replicator.launch._cluster import plan_cluster
from keras_replicator.launch._gpus import VisibleGpus, assign_gpus, visible_gpus

PY = sys.executable
VISIBLE = "CUDA_VISIBLE_DEVICES"
# Each worker prints the GPU variables it got (None: not set).
SHOW = (
    "import json, os; print(json.dumps({k: os.environ.get(k) for k in "
    "('CUDA_VISIBLE_DEVICES', 'CUDA_DEVICE_ORDER', 'TF_FORCE_GPU_ALLOW_GROWTH', "
    "'KERAS_REPLICATOR_SHARED_GPUS')}))"
)
UUIDS = [f"GPU-{n}1b2c3d4-0000-4000-8000-00000000000{n}" for n in range(4)]


def _fake_nvidia_smi(tmp_path, body):
    """An executable `nvidia-smi` in `tmp_path/bin` running the shell `body`."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    script.chmod(0o755)
    return str(folder)


@pytest.fixture
def four_gpus(tmp_path, monkeypatch):
    """This machine shows 4 GPUs to `nvidia-smi`; no CUDA_VISIBLE_DEVICES is set."""
    folder = _fake_nvidia_smi(
        tmp_path,
        """
        case "$*" in
          *--query-gpu=index*) printf '0\\n1\\n2\\n3\\n' ;;
          *) echo "unexpected arguments: $*" >&2; exit 4 ;;
        esac
        """,
    )
    monkeypatch.setenv("PATH", folder + os.pathsep + os.environ["PATH"])
    monkeypatch.delenv(VISIBLE, raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    monkeypatch.delenv("TF_FORCE_GPU_ALLOW_GROWTH", raising=False)


@pytest.fixture
def no_gpus(tmp_path, monkeypatch):
    """A machine without GPUs: no `nvidia-smi` on PATH, no CUDA_VISIBLE_DEVICES."""
    monkeypatch.setenv("PATH", os.path.dirname(PY))  # no nvidia-smi there
    monkeypatch.delenv(VISIBLE, raising=False)
    monkeypatch.delenv("TF_FORCE_GPU_ALLOW_GROWTH", raising=False)


def _worker_gpus(num_workers=2, **options):
    """What each of `num_workers` real worker processes was given."""
    result = launch([PY, "-c", SHOW], num_workers, echo=False, timeout=60, **options)
    assert result.ok, [w.output for w in result.workers]
    return [json.loads(w.output.strip().splitlines()[-1]) for w in result.workers]


# Real workers, the GPUs from nvidia-smi or CUDA_VISIBLE_DEVICES -----------------


def test_four_gpus_from_nvidia_smi_are_split_between_two_workers(four_gpus):
    gpus = _worker_gpus(gpus_per_worker=None)
    assert [g[VISIBLE] for g in gpus] == ["0,1", "2,3"]
    # nvidia-smi counts in PCI bus order; CUDA must too for "0,1" to mean its 0, 1.
    assert {g["CUDA_DEVICE_ORDER"] for g in gpus} == {"PCI_BUS_ID"}
    assert {g["TF_FORCE_GPU_ALLOW_GROWTH"] for g in gpus} == {None}
    assert {g["KERAS_REPLICATOR_SHARED_GPUS"] for g in gpus} == {None}


def test_uuids_in_cuda_visible_devices_stay_uuids(no_gpus, monkeypatch):
    monkeypatch.setenv(VISIBLE, ",".join(UUIDS))
    gpus = _worker_gpus(gpus_per_worker=None)
    assert [g[VISIBLE] for g in gpus] == [",".join(UUIDS[:2]), ",".join(UUIDS[2:])]
    assert {g["CUDA_DEVICE_ORDER"] for g in gpus} == {None}  # UUIDs need no order


def test_the_launchers_cuda_visible_devices_is_what_gets_split(four_gpus, monkeypatch):
    monkeypatch.setenv(VISIBLE, "5, 7")  # a subset of the machine, e.g. by a job
    assert [g[VISIBLE] for g in _worker_gpus(gpus_per_worker=None)] == ["5", "7"]
    # `env=` is what the workers would inherit: it wins over the launcher's own.
    gpus = _worker_gpus(env={VISIBLE: "1,2,3,4"}, gpus_per_worker=None)
    assert [g[VISIBLE] for g in gpus] == ["1,2", "3,4"]


def test_an_explicit_gpus_per_worker_is_honoured(four_gpus):
    assert [g[VISIBLE] for g in _worker_gpus(gpus_per_worker=1)] == ["0", "1"]
    hidden = _worker_gpus(gpus_per_worker=0)
    assert [g[VISIBLE] for g in hidden] == ["", ""]  # a CPU run on a GPU machine
    unpinned = _worker_gpus(gpus_per_worker="all")
    assert [g[VISIBLE] for g in unpinned] == [None, None]


@pytest.mark.parametrize("visible", [None, "", "-1"])
def test_without_gpus_nothing_is_set(no_gpus, monkeypatch, visible):
    if visible is not None:
        monkeypatch.setenv(VISIBLE, visible)
    gpus = _worker_gpus(gpus_per_worker=None)
    assert [g[VISIBLE] for g in gpus] == [visible, visible]  # inherited as is
    assert {g["CUDA_DEVICE_ORDER"] for g in gpus} == {None}


@pytest.mark.parametrize(
    "body",
    [
        "echo 'NVIDIA-SMI has failed: no driver' >&2; exit 9\n",
        "echo 'No devices were found'\n",
        "sleep 30\n",  # a hung driver: the launcher does not wait for it
    ],
)
def test_a_failing_nvidia_smi_means_no_gpus(tmp_path, monkeypatch, body):
    folder = _fake_nvidia_smi(tmp_path, body)
    monkeypatch.setenv("PATH", folder + os.pathsep + os.environ["PATH"])
    monkeypatch.delenv(VISIBLE, raising=False)
    monkeypatch.setattr("keras_replicator.launch._gpus.NVIDIA_SMI_SECONDS", 1.0)
    assert [g[VISIBLE] for g in _worker_gpus(gpus_per_worker=None)] == [None, None]


def test_fewer_gpus_than_workers_are_shared_with_memory_growth(no_gpus, monkeypatch):
    monkeypatch.setenv(VISIBLE, "3")
    gpus = _worker_gpus(num_workers=2, gpus_per_worker=None)
    assert [g[VISIBLE] for g in gpus] == ["3", "3"]
    assert {g["TF_FORCE_GPU_ALLOW_GROWTH"] for g in gpus} == {"true"}
    # ... and told so: NCCL refuses two ranks on one GPU (they keep RING).
    assert {g["KERAS_REPLICATOR_SHARED_GPUS"] for g in gpus} == {"1"}


def test_launch_function_pins_too(four_gpus):
    def visible():
        import os

        return os.environ["CUDA_VISIBLE_DEVICES"]

    assert launch_function(visible, 2, echo=False, gpus_per_worker=2) == ["0,1", "2,3"]


# Bad values: refused before any process starts -----------------------------------


@pytest.mark.parametrize(
    "num_workers, gpus_per_worker, match",
    [
        (
            2,
            3,
            r"asks for 3 GPU\(s\) for each of 2 workers \(6 in all\), but 4 "
            r"are visible.*Received: gpus_per_worker=3, num_workers=2. Use "
            r"gpus_per_worker=2",
        ),
        (
            3,
            None,
            r"3 workers cannot split them evenly.*Received: num_workers=3, "
            r"gpus_per_worker=None. Pass gpus_per_worker=1 \(`--gpus-per-worker 1`, "
            r"GPU\(s\) 3 stay idle\)",
        ),
        (5, 1, r"Received: gpus_per_worker=1, num_workers=5. Use at most 4 workers"),
    ],
)
def test_an_impossible_split_fails_before_anything_starts(
    four_gpus, tmp_path, num_workers, gpus_per_worker, match
):
    started = tmp_path / "started"
    code = f"open({str(started)!r}, 'a').close()"
    with pytest.raises(ValueError, match=match):
        launch(
            [PY, "-c", code],
            num_workers,
            echo=False,
            timeout=60,
            gpus_per_worker=gpus_per_worker,
        )
    assert not started.exists()


def test_asking_for_gpus_on_a_machine_without_any_is_refused(no_gpus):
    with pytest.raises(ValueError, match=r"but 0 are visible \(no nvidia-smi on PATH"):
        launch([PY, "-c", "pass"], 2, echo=False, timeout=60, gpus_per_worker=1)
    assert [g[VISIBLE] for g in _worker_gpus(gpus_per_worker=0)] == ["", ""]


# The plan: other tasks, restarts and resizes -------------------------------------


def test_a_ps_job_gives_the_gpus_to_its_workers_only():
    environ = {VISIBLE: "0,1,2,3"}
    plan = plan_cluster(LaunchOptions(num_workers=2, num_ps=1), environ)
    given = {spec.label: spec.env[VISIBLE] for spec in plan.specs}
    assert given == {"chief": "", "worker 0": "0,1", "worker 1": "2,3", "ps 0": ""}


def test_the_data_service_tasks_get_no_gpu():
    options = LaunchOptions(num_workers=2, data_service_workers=2)
    plan = plan_cluster(options, {VISIBLE: "0,1"})
    assert [spec.env[VISIBLE] for spec in plan.specs] == ["0", "1"]
    assert [spec.env[VISIBLE] for spec in plan.services] == ["", "", ""]


def test_a_smaller_group_is_split_again_from_the_gpus_found_first(four_gpus, tmp_path):
    # Run 0: two workers, worker 1 loses its slot and fails; run 1 (a restart
    # on the one slot left) has one worker, which gets all four GPUs.
    lost = tmp_path / "lost"
    worker = textwrap.dedent(
        f"""
        import os, sys, time
        {SHOW}
        if os.environ["KERAS_REPLICATOR_NUM_WORKERS"] == "2":
            if os.environ["KERAS_REPLICATOR_WORKER_INDEX"] == "1":
                time.sleep(1)
                open({str(lost)!r}, "w").close()
                sys.exit(9)
            time.sleep(60)
        """
    )
    result = launch(
        [PY, "-c", worker],
        2,
        min_workers=1,
        discover=lambda: ["a"] if lost.exists() else ["a", "b"],
        discover_seconds=30.0,
        max_restarts=1,
        echo=False,
        timeout=120,
        grace_seconds=1.0,
    )
    assert result.ok and result.restarts == 1

    def given(run):
        return [json.loads(w.output.splitlines()[0])[VISIBLE] for w in run.workers]

    assert given(result.previous[0]) == ["0,1", "2,3"]
    assert given(result) == ["0,1,2,3"]


@pytest.mark.parametrize(
    "size, expected",
    [(4, ["0", "1", "2", "3"]), (3, ["0", "1", "2"]), (2, ["0,1", "2,3"])],
)
def test_an_elastic_size_takes_the_even_share_and_leaves_the_rest(size, expected):
    gpus = VisibleGpus(("0", "1", "2", "3"), "nvidia-smi")
    assignment = assign_gpus(gpus, size, None, elastic=True)
    assert [w[VISIBLE] for w in assignment.workers] == expected
    assert ("stay idle" in assignment.note) is (size == 3)


def test_variables_set_by_the_user_are_kept():
    gpus = VisibleGpus(("0",), "nvidia-smi")
    environ = {"CUDA_DEVICE_ORDER": "FASTEST_FIRST", "TF_FORCE_GPU_ALLOW_GROWTH": "0"}
    (worker, _) = assign_gpus(gpus, 2, None, environ=environ).workers
    assert worker == {VISIBLE: "0", "KERAS_REPLICATOR_SHARED_GPUS": "1"}


def test_visible_gpus_reads_cuda_visible_devices_as_cuda_does():
    assert visible_gpus({VISIBLE: "0,2,-1,3"}).ids == ("0", "2")
    assert visible_gpus({VISIBLE: "MIG-a,MIG-b"}).ids == ("MIG-a", "MIG-b")
    assert visible_gpus({VISIBLE: "1"}, {VISIBLE: ""}).ids == ()
