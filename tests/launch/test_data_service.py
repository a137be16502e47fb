"""`launch(..., data_service_workers=N)`: a tf.data service beside the workers."""

import collections
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from keras_replicator.launch import LaunchOptions, launch
from keras_replicator.launch._cluster import DATA_SERVICE_ENV, plan_cluster
from keras_replicator.launch._runner import WorkerSpec, run_group

PY = sys.executable
SLEEP = "import time; time.sleep(60)"


def test_the_plan_puts_a_dispatcher_and_workers_on_free_loopback_ports():
    plan = plan_cluster(
        LaunchOptions(num_workers=2, cluster="local", data_service_workers=2), {}
    )
    labels = [spec.label for spec in plan.services]
    assert labels == ["data dispatcher", "data worker 0", "data worker 1"]
    service_ports = [
        int(s.command[s.command.index("--port") + 1]) for s in plan.services
    ]
    worker_ports = [
        int(json.loads(s.tf_config)["cluster"]["worker"][s.index].rpartition(":")[2])
        for s in plan.specs
    ]
    assert len(set(service_ports + worker_ports)) == 5
    dispatcher = service_ports[0]
    for worker in plan.services[1:]:
        assert worker.command[-2:] == ("--dispatcher-port", str(dispatcher))
    for spec in plan.specs:
        assert spec.env[DATA_SERVICE_ENV] == f"grpc://127.0.0.1:{dispatcher}"
    assert not plan_cluster(LaunchOptions(num_workers=2, cluster="local"), {}).services


def test_dry_run_shows_the_service_tasks(capsys):
    launch([PY, "train.py"], 2, data_service_workers=1, dry_run=True, cluster="local")
    out = capsys.readouterr().out
    assert "[data dispatcher] " in out and "[data worker 0] " in out
    assert f"every worker: {DATA_SERVICE_ENV}=grpc://127.0.0.1:" in out


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_workers": 2, "data_service_workers": -1}, "data_service_workers=-1"),
        ({"num_workers": 2, "data_service_workers": 1, "num_ps": 1}, "num_ps=1"),
        ({"data_service_workers": 1, "cluster": "tf-config"}, "needs `num_workers`"),
        (
            {
                "num_workers": 2,
                "data_service_workers": 1,
                "host": "10.1.2.3",
                "allow_remote": True,
            },
            "loopback only",
        ),
    ],
)
def test_bad_data_service_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LaunchOptions(**kwargs)


def _service(label, code):
    return WorkerSpec(0, None, label=label, command=(PY, "-c", code))


def test_services_are_stopped_when_the_workers_are_done():
    result = run_group(
        [PY, "-c", "print('trained')"],
        [WorkerSpec(0, None), WorkerSpec(1, None)],
        services=[_service("data dispatcher", SLEEP)],
        timeout=60,
        grace_seconds=2,
        echo=False,
    )
    assert result.ok, result.describe_failure()
    (dispatcher,) = result.services
    assert dispatcher.stopped and dispatcher.name == "data dispatcher"
    assert [w.output.strip() for w in result.workers] == ["trained", "trained"]
    assert result.seconds < 30


def test_a_service_that_exits_early_fails_the_run_and_is_named():
    result = run_group(
        [PY, "-c", SLEEP],
        [WorkerSpec(0, None)],
        services=[
            _service("data dispatcher", SLEEP),
            _service("data worker 0", "raise SystemExit('no dispatcher')"),
        ],
        timeout=60,
        grace_seconds=2,
        echo=False,
    )
    assert not result.ok and not result.timed_out
    assert result.first_failure.name == "data worker 0"
    assert "data worker 0 exited with code 1" in result.headline()
    assert result.workers[0].stopped and result.seconds < 30


TRAIN_FROM_SERVICE = textwrap.dedent(
    """
    import os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import keras, numpy as np
    import keras_replicator as kr
    from keras_replicator.data import image_pipeline, service_address

    pattern, n = sys.argv[1], int(sys.argv[2])
    address = service_address()
    print("SERVICE", address)
    strategy = kr.MultiWorkerReplicator(collective_timeout=120)

    def train_fn(context):
        return image_pipeline(pattern, training=True, image_size=16, seed=0,
            cache=False, batch_size=context.get_per_replica_batch_size(16),
            input_context=context, data_service=address)

    with strategy.scope():
        model = keras.Sequential([keras.Input((16, 16, 3)),
            keras.layers.Flatten(), keras.layers.Dense(n)])
        model.compile(keras.optimizers.SGD(0.1),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(strategy.distribute_datasets_from_function(train_fn),
        steps_per_epoch=3, verbose=0)
    print("LOSS", history.history["loss"][0])
    # One evaluation epoch, shared by both training workers (one service job).
    evaluation = image_pipeline(pattern, training=False, image_size=16, seed=0,
        cache=False, batch_size=4, data_service=address, job_name="evaluation")
    labels = [int(v) for _, y in evaluation for v in y.numpy()]
    print("LABELS", " ".join(map(str, labels)))
    """
)


@pytest.mark.slow(
    reason="covered in the default run by: "
    "data/test_service.py (the service, in process)"
)
@pytest.mark.multi_worker
@pytest.mark.timeout(420)
def test_launched_workers_train_from_the_service_and_share_each_epoch(tmp_path):
    from keras_replicator.data import digit_images, write_image_tfrecords

    n = 32
    images, _ = digit_images(n, 24)
    write_image_tfrecords(images, np.arange(n), str(tmp_path), 4)
    result = launch(
        [PY, "-c", TRAIN_FROM_SERVICE, str(tmp_path / "*.tfrecord"), str(n)],
        2,
        data_service_workers=2,
        timeout=360,
        grace_seconds=5,
        echo=False,
    )
    assert result.ok, result.describe_failure()
    labels = []
    for worker in result.workers:
        lines = dict(
            line.split(" ", 1)
            for line in worker.output.splitlines()
            if line.split(" ", 1)[0] in ("SERVICE", "LOSS", "LABELS")
        )
        assert lines["SERVICE"].startswith("grpc://127.0.0.1:")
        assert np.isfinite(float(lines["LOSS"]))
        labels += [int(v) for v in lines.get("LABELS", "").split()]
    # Every example exactly once in the evaluation epoch, over both workers.
    assert collections.Counter(labels) == collections.Counter(range(n))
    assert [s.name for s in result.services] == [
        "data dispatcher",
        "data worker 0",
        "data worker 1",
    ]
    # Stopped by the launcher once training was done, and exited cleanly.
    assert all(s.stopped and s.returncode == 0 for s in result.services)


def test_the_cli_flag_starts_the_service_and_rejects_bad_counts():
    command = [PY, "-m", "keras_replicator.cli", "launch", "-n", "2"]
    dry = subprocess.run(
        [*command, "--data-service-workers", "2", "--dry-run", "--", PY, "t.py"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert dry.returncode == 0, dry.stderr
    assert "[data worker 1] " in dry.stdout and DATA_SERVICE_ENV in dry.stdout
    bad = subprocess.run(
        [*command, "--data-service-workers", "-2", "--", PY, "t.py"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "data_service_workers=-2" in bad.stderr


def _service_address():
    import os

    return os.environ.get("KERAS_REPLICATOR_DATA_SERVICE")


@pytest.mark.multi_worker
@pytest.mark.timeout(180)
def test_launch_function_passes_the_service_address():
    from keras_replicator.launch import launch_function

    addresses = launch_function(
        _service_address, 2, data_service_workers=1, timeout=150, echo=False
    )
    assert addresses[0] == addresses[1]
    assert addresses[0].startswith("grpc://127.0.0.1:")
