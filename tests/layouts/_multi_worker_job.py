"""What each worker of the multi-worker layout tests runs (`launch_function`).

Every worker builds the same model on one mesh of 2 workers x 2 logical CPUs,
reads the same data and trains; each returns what it saw, so the test can hold
every worker to one device.
"""


def fit_then_lora_on_two_workers(name: str, save_dir: str) -> dict:
    """`_causal_lm.fit_then_lora` on a 2x2 mesh spanning the 2 workers."""
    import os

    import keras

    import keras_replicator as kr
    from tests.layouts import _causal_lm

    keras.backend.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    devices = kr.devices(4)  # Joins the workers: before any other TF call.
    mesh = keras.distribution.DeviceMesh((2, 2), ["batch", "model"], devices)
    strategy = kr.ModelParallelReplicator(_causal_lm.LAYOUT_MAPS[name][1](mesh))
    model, phases = _causal_lm.fit_then_lora(name, strategy)
    errors = {
        "another count": _error(kr.devices, 2),
        "devices out of order": _error(
            kr.ModelParallelReplicator,
            keras.distribution.LayoutMap(
                keras.distribution.DeviceMesh((4,), ["batch"], devices[::-1])
            ),
        ),
    }
    worker = os.environ["KERAS_REPLICATOR_WORKER_INDEX"]
    # Saving reads every weight whole (a gather over the workers): all save.
    model.save(os.path.join(save_dir, f"worker{worker}.keras"))
    x, _ = _causal_lm.tokens()
    return {
        "devices": devices,
        "local_devices": [str(d) for d in strategy.mesh.local_devices()],
        "split": sum(
            "model" in strategy.layout_of(v).sharding_specs for v in model.weights
        ),
        "phases": phases,
        "errors": errors,
        "predictions": model.predict(x, batch_size=8, verbose=0),
    }


def fully_sharded_on_two_workers(optimizer: str) -> dict:
    """The MLP of `test_model_parallel.py`, fully sharded over 2 x 2 devices."""
    import keras
    import numpy as np

    import keras_replicator as kr
    from tests.strategies import test_model_parallel as mlp

    keras.backend.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    mesh = keras.distribution.DeviceMesh((4,), ["batch"], kr.devices(4))
    strategy = kr.ModelParallelReplicator(
        keras.distribution.LayoutMap(mesh), fully_shard=True
    )
    with strategy.scope():
        model = mlp.build(optimizer)
    x, y = mlp.data()
    history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    state = model.weights + model.optimizer.variables
    whole = sum(np.asarray(v).nbytes for v in state)
    return {
        "weights": model.get_weights(),
        "loss": history.history["loss"],
        "share_per_device": [b / whole for b in strategy.bytes_per_device(state)],
    }


def _error(function, *args) -> str:
    try:
        function(*args)
    except ValueError as error:
        return str(error)
    return "no error"
