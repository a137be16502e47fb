import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_replicator as kr
from keras_replicator.models import small_resnet as module_function


def test_shapes_and_depth():
    model = kr.models.small_resnet((16, 16, 1), 10, blocks_per_stage=2)
    assert model.output_shape == (None, 10)
    convolutions = [
        layer
        for layer in model.layers
        if isinstance(layer, keras.layers.Conv2D) and layer.kernel_size == (3, 3)
    ]
    assert len(convolutions) == 6 * 2 + 1  # 6n + 2 layers: 3x3 convs + the dense
    norms = [
        layer
        for layer in model.layers
        if isinstance(layer, kr.layers.SyncBatchNormalization)
    ]
    assert norms and all(layer.group_size is None for layer in norms)


def test_replicas_match_one_device_for_a_step():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 8, 8, 1)).astype("float32")
    y = rng.integers(0, 4, 32)

    def build():
        model = kr.models.small_resnet((8, 8, 1), 4, widths=(4, 8, 8))
        model.compile(
            keras.optimizers.SGD(0.1),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        return model

    keras.utils.set_random_seed(0)
    initial = build().get_weights()
    results = []
    for strategy in (
        kr.MultiDeviceReplicator(num_replicas=2),
        tf.distribute.get_strategy(),
    ):
        with strategy.scope():
            model = build()
        model.set_weights(initial)
        model.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False)
        results.append(model.get_weights())
    for ours, single in zip(*results):
        np.testing.assert_allclose(ours, single, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_classes": 1}, "num_classes=1"),
        ({"blocks_per_stage": 0}, "blocks_per_stage=0"),
        ({"widths": (16, -1)}, "widths"),
    ],
)
def test_bad_arguments(kwargs, match):
    arguments = {"input_shape": (8, 8, 1), "num_classes": 10, **kwargs}
    with pytest.raises(ValueError, match=match):
        kr.models.small_resnet(**arguments)


def test_the_function_not_the_module_is_the_public_name():
    # The module and the function share a name; `kr.models.small_resnet` must be
    # the function (its examples run in tests/test_docstring_examples.py).
    import sys

    import keras_replicator.models.small_resnet as _  # noqa: F401

    assert "keras_replicator.models.small_resnet" in sys.modules
    assert module_function is kr.models.small_resnet
