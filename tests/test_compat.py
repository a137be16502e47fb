"""Fails loudly when a Keras / TensorFlow internal that `_compat` relies on changes."""

import pytest

from keras_replicator import _compat
from keras_replicator.strategies._keras_integration import install


def test_upstream_internals_are_unchanged():
    changed = _compat.check_upstream()
    assert not changed, (
        "Upstream internals that keras_replicator patches or reads have changed; "
        f"re-read them and update keras_replicator/_compat.py: {changed}"
    )


def test_patches_only_apply_to_replicator_strategies():
    import tensorflow as tf
    from keras.src.losses import loss as loss_module

    install()
    value = tf.constant(8.0)
    stock = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with stock.scope():
        assert float(loss_module.scale_loss_for_distribution(value)) == 4.0


def test_install_is_idempotent():
    from keras.src.backend.tensorflow import trainer

    install()
    first = trainer.TensorFlowTrainer.make_train_function
    install()
    assert trainer.TensorFlowTrainer.make_train_function is first


@pytest.mark.parametrize("name", sorted(_compat.UPSTREAM_DIGESTS))
def test_every_digest_is_recorded(name):
    assert len(_compat.UPSTREAM_DIGESTS[name]) == 16


def test_compat_is_a_leaf():
    # `_compat` only touches internals; importing our modules from it would close
    # an import cycle (issue 11).
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(_compat))
    imported = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in getattr(node, "names", [])
    ]
    assert not [m for m in imported if m and m.startswith("keras_replicator")]
