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
