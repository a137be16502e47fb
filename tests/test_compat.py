"""Fails loudly when a Keras / TensorFlow internal that `_compat` relies on changes."""

import pytest

from keras_replicator import _compat


def test_upstream_internals_are_unchanged():
    changed = _compat.check_upstream()
    assert not changed, (
        "Upstream internals that keras_replicator patches or reads have changed; "
        f"re-read them and update keras_replicator/_compat.py: {changed}"
    )


def test_patches_only_apply_to_replicator_strategies():
    import tensorflow as tf
    from keras.src.losses import loss as loss_module

    _compat.install()
    value = tf.constant(8.0)
    stock = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with stock.scope():
        assert float(loss_module.scale_loss_for_distribution(value)) == 4.0


def test_install_is_idempotent():
    from keras.src.backend.tensorflow import trainer

    _compat.install()
    first = trainer.TensorFlowTrainer.make_train_function
    _compat.install()
    assert trainer.TensorFlowTrainer.make_train_function is first


@pytest.mark.parametrize("name", sorted(_compat.UPSTREAM_DIGESTS))
def test_every_digest_is_recorded(name):
    assert len(_compat.UPSTREAM_DIGESTS[name]) == 16
