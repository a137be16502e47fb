import subprocess
import sys

import keras_replicator as kr


def test_public_names_exist():
    for name in kr.__all__:
        assert getattr(kr, name) is not None, name


def test_strategies_subclass_the_stock_ones():
    import tensorflow as tf

    assert issubclass(kr.MultiDeviceReplicator, tf.distribute.MirroredStrategy)
    assert issubclass(
        kr.MultiWorkerReplicator, tf.distribute.MultiWorkerMirroredStrategy
    )
    assert issubclass(kr.TPUReplicator, tf.distribute.TPUStrategy)


def test_launch_does_not_import_tensorflow():
    code = (
        "import sys, keras_replicator.launch, keras_replicator.testing;"
        "print('tensorflow' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


def test_a_keras_file_naming_our_classes_loads_after_import_keras_replicator(
    tmp_path,
):
    # Keras imports the module of a saved class only for "keras*" packages, so a
    # file naming `keras_replicator>LARS` failed to load unless the user had
    # touched `kr.optimizers` first.
    path = str(tmp_path / "model.keras")
    save = (
        "import keras, keras_replicator as kr\n"
        "layers = [keras.Input((4,)), kr.layers.SyncBatchNormalization()]\n"
        "model = keras.Sequential([*layers, keras.layers.Dense(2)])\n"
        "model.compile(optimizer=kr.optimizers.LARS(0.1), loss='mse')\n"
        "model.fit(keras.ops.ones((8, 4)), keras.ops.ones((8, 2)), verbose=0)\n"
        f"model.save({path!r})\n"
    )
    load = (
        "import keras, keras_replicator\n"
        f"model = keras.models.load_model({path!r})\n"
        "print(type(model.optimizer).__name__, type(model.layers[0]).__name__)\n"
    )
    for code in (save, load):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=240
        )
        assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["LARS", "SyncBatchNormalization"]


def test_import_keras_replicator_alone_imports_no_tensorflow():
    code = "import sys, keras_replicator; print('tensorflow' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
