"""The one-device comparison runs with TensorFloat-32 off (Ampere and newer GPUs)."""

import keras
import tensorflow as tf

from keras_replicator.testing._harness import compare_to_one_device


def test_both_sides_run_with_tf32_off_and_it_is_restored():
    seen = []

    def build():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(loss="mse")
        return model

    def workload(model):
        seen.append(tf.config.experimental.tensor_float_32_execution_enabled())
        return {"weights": model.get_weights()}

    before = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(True)
    try:
        compare_to_one_device(tf.distribute.get_strategy(), build, workload)
        assert tf.config.experimental.tensor_float_32_execution_enabled()
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(before)
    assert seen == [False, False]
