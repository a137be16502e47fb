"""The keras-io Transformer on 2 real worker processes (127.0.0.1), issue 33.

It died at trace time on workers ("Gradient buckets need static gradient shapes",
a feed-forward kernel's gradient of shape `(None, 8)`). Float64 SGD must give one
device's weights: the embeddings' gradients, made dense, travel the socket ring
with the others. Adam on embeddings is tested in-process
(`test_embedding_gradients.py`: the same code up to the transport).
"""

import json
import sys
import textwrap

import keras
import numpy as np
import pytest

from keras_replicator.launch import run_workers
from tests.keras_integration import _transformer

pytestmark = [
    pytest.mark.multi_worker,
    pytest.mark.slow(
        reason="covered in the default run by: "
        "conformance multi-worker-2 transformer_embeddings"
    ),
]

_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import keras, numpy as np
    import keras_replicator as kr
    from tests.keras_integration import _transformer
    strategy = kr.MultiWorkerReplicator(collective_timeout=60)
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    x, y = _transformer.data(64)
    with strategy.scope():
        model = _transformer.build()
    model.set_weights([np.asarray(w) for w in json.loads(sys.argv[1])])
    model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    print("WEIGHTS " + json.dumps([w.tolist() for w in model.get_weights()]))
    print("TRANSPORT " + strategy.all_reduce_options.transport)
    """
)


@pytest.mark.timeout(240)
def test_transformer_trains_on_two_workers_like_one_device():
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    try:
        x, y = _transformer.data(64)
        keras.utils.set_random_seed(0)
        model = _transformer.build()  # SGD(0.1)
        initial = model.get_weights()
        model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
        expected = model.get_weights()
    finally:
        keras.config.set_floatx("float32")
        keras.config.set_dtype_policy("float32")
    command = [
        sys.executable,
        "-c",
        _SCRIPT,
        json.dumps([w.tolist() for w in initial]),
    ]
    result = run_workers(command, 2, timeout=200, echo=False)
    assert result.ok, "\n".join(w.output[-3000:] for w in result.workers)
    for worker in result.workers:
        assert "TRANSPORT socket\n" in worker.output, worker.output[-2000:]
        line = next(
            ln for ln in worker.output.splitlines() if ln.startswith("WEIGHTS ")
        )
        for e, g in zip(expected, json.loads(line[len("WEIGHTS ") :])):
            np.testing.assert_allclose(np.asarray(g), e, rtol=1e-10, atol=1e-12)
