"""What each worker of `test_multi_worker_checkpoints.py` runs (`launch_function`).

Every worker builds `test_checkpoints`' Megatron MLP (float64, SGD with
momentum) on one 2x2 ["batch", "model"] mesh of 2 workers x 2 logical CPUs, and
trains it under Keras' `BackupAndRestore` and under ours, each with its own
backup directory. The first launch stops both `fit`s after epoch 2 of 4 by
raising on every worker (a crash: `on_train_end` never runs, so the backup
stays); the second launch starts the same `fit`s again from the same
directories, then saves the model on every worker to one path. Each worker
returns what it saw, and the names of the files it wrote to scratch.
"""

BACKUPS = ("keras", "keras_replicator")


def checkpoints_on_two_workers(phase: str, root: str) -> dict:
    """Runs `phase` ("interrupt" or "resume") of the test in this worker."""
    import os
    import tempfile
    import warnings

    import keras

    import keras_replicator as kr
    from keras_replicator._files import worker_files
    from tests.layouts import test_checkpoints as mlp

    keras.backend.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    kr.devices(4)  # Joins the workers: before any other TF call.
    scratch = _count_scratch_writes(worker_files)
    backup_types = {
        "keras": keras.callbacks.BackupAndRestore,
        # Default `preemption_signals`: on a mesh over workers, a warning.
        "keras_replicator": kr.callbacks.BackupAndRestore,
    }
    result = {"scratch": scratch, "runs": {}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name in BACKUPS:
            model = mlp.on_mesh()
            callbacks = [backup_types[name](os.path.join(root, name))]
            run = {}
            if phase == "interrupt":
                callbacks.append(mlp.InterruptAfter(2))
                try:
                    mlp.fit(model, 4, callbacks)
                except mlp.Interrupted as error:
                    run["interrupted"] = str(error)
            else:
                if name == "keras":
                    checkpoint = os.path.join(root, "checkpoint", "last.weights.h5")
                    callbacks.append(
                        keras.callbacks.ModelCheckpoint(
                            checkpoint, save_weights_only=True
                        )
                    )
                history = mlp.fit(model, 4, callbacks)
                run["epochs"] = history.epoch
                run["state"] = mlp.state(model)
            result["runs"][name] = run
    strategy = model.distribute_strategy
    result["chief"] = kr.is_chief(strategy)
    result["worker_index"] = strategy.worker_index
    result["warnings"] = [
        str(w.message) for w in caught if issubclass(w.category, UserWarning)
    ]
    if phase == "resume":
        # Saving reads every weight whole (a gather over the workers): every
        # worker saves, all to the same path.
        model.save(os.path.join(root, "saved", "model.keras"))
        result["predictions"] = mlp.predict(model)
    # This worker's own scratch only: the other worker may still be writing
    # into its own (the chief's listing once saw worker 1's mid-save).
    own = f"kr-worker{strategy.worker_index}-scratch-"
    result["scratch_left"] = [
        name for name in os.listdir(tempfile.gettempdir()) if name.startswith(own)
    ]
    return result


def _count_scratch_writes(worker_files) -> list:
    """Records the name of every file this worker writes to scratch."""
    import os

    names = []
    write_to_scratch = worker_files.write_to_scratch

    def counting(path, write, index):
        names.append(os.path.basename(path))
        return write_to_scratch(path, write, index)

    worker_files.write_to_scratch = counting
    return names
