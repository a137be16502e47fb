"""`kr.spatial.partition` across worker processes equals one device.

Each worker holds one replica, so one image's two height tiles live in two
processes: the halo rows, the batch statistics and the global pooling sums travel
between workers, and the input tiling must survive TensorFlow's per-worker
sharding of the global batch. With 4 workers (2 x 2, spatial x data), workers 0
and 1 share the first half of each batch's images, workers 2 and 3 the second.
(One replica per worker: `MultiWorkerReplicator` uses one CPU device per worker.)

Marked slow: 2 workers take about 33 s, 4 workers about 80 s (on 2 CPU cores).
"""

import json
import sys
import textwrap

import pytest

from keras_replicator.launch import run_workers

pytestmark = [pytest.mark.multi_worker, pytest.mark.slow]

WORKER = textwrap.dedent(
    """
    import json, os
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import keras, numpy as np
    import keras_replicator as kr

    strategy = kr.MultiWorkerReplicator(collective_timeout=60)

    def build():
        keras.utils.set_random_seed(4)
        model = kr.models.small_resnet((16, 16, 1), 3, widths=(4, 8, 8))
        model.compile(
            keras.optimizers.SGD(0.1, momentum=0.5),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        return model

    def max_difference(a, b):
        return max(float(np.abs(u - v).max()) for u, v in zip(a, b))

    rng = np.random.default_rng(5)
    x = rng.normal(size=(5 * 8, 16, 16, 1))
    y = rng.integers(0, 3, size=5 * 8)
    for dtype in ("float64", "float32"):
        keras.backend.set_floatx(dtype)
        keras.config.set_dtype_policy(dtype)
        plain = build()
        spatial = kr.spatial.partition(plain, 2, strategy=strategy)
        history = spatial.fit(x, y, batch_size=8, shuffle=False, verbose=0)
        plain_history = plain.fit(x, y, batch_size=8, shuffle=False, verbose=0)
        print("RESULT " + json.dumps({
            "dtype": dtype,
            "replicas": strategy.num_replicas_in_sync,
            "difference": max_difference(plain.get_weights(), spatial.get_weights()),
            "moved": max_difference(plain.get_weights(), build().get_weights()),
            "loss": history.history["loss"][0],
            "plain_loss": plain_history.history["loss"][0],
        }), flush=True)
    """
)

TOLERANCE = {"float64": 1e-10, "float32": 1e-5}


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "workers",
    [2, 4],
    ids=["1 group of 2 tiles", "2 groups of 2 tiles (spatial x data)"],
)
def test_small_resnet_in_workers_trains_like_one_device(workers):
    result = run_workers(
        [sys.executable, "-c", WORKER], workers, timeout=240, echo=False
    )
    assert not result.timed_out, "the workers did not finish in 240 s"
    for worker in result.workers:
        assert worker.returncode == 0, worker.output
        lines = [x for x in worker.output.splitlines() if x.startswith("RESULT ")]
        reports = [json.loads(line[len("RESULT ") :]) for line in lines]
        assert [r["dtype"] for r in reports] == ["float64", "float32"], worker.output
        for report in reports:
            assert report["replicas"] == workers, report
            assert report["moved"] > 1e-3, report  # training changed the weights
            assert report["difference"] < TOLERANCE[report["dtype"]], report
            assert report["loss"] == pytest.approx(
                report["plain_loss"], rel=TOLERANCE[report["dtype"]]
            )
