"""Fails loudly when a Keras / TensorFlow internal that `_compat` relies on changes."""

import pathlib

import pytest

from keras_replicator import _compat
from keras_replicator.keras_integration._hooks import install


def test_upstream_internals_are_unchanged():
    changed = _compat.check_upstream()
    assert not changed, (
        "Upstream internals that keras_replicator patches or reads have changed; "
        f"re-read them and update keras_replicator/_compat/: {changed}"
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
    # `_compat` only touches internals; importing our other modules from it would
    # close an import cycle (issue 11). Its modules may import each other.
    import ast
    import pathlib

    package = pathlib.Path(_compat.__file__).parent
    modules = sorted(package.glob("*.py"))
    assert len(modules) > 5, modules
    for path in modules:
        tree = ast.parse(path.read_text())
        imported = [
            node.module if isinstance(node, ast.ImportFrom) else alias.name
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in getattr(node, "names", [])
        ]
        ours = [m for m in imported if m and m.startswith("keras_replicator")]
        assert all(m.startswith("keras_replicator._compat") for m in ours), (
            path.name,
            ours,
        )


def test_every_patch_module_checks_its_upstream():
    # A module that patches or reads an internal must also say when it changed.
    from keras_replicator._compat import _CHECKED

    names = {module.__name__.rsplit(".", 1)[1] for module in _CHECKED}
    package = pathlib.Path(_compat.__file__).parent
    modules = {p.stem for p in package.glob("*.py") if not p.stem.startswith("_")}
    assert modules == names


def _applies_per_variable(self, grads, trainable_variables):
    for grad, variable in zip(grads, trainable_variables):
        self.update_step(grad, variable, self.learning_rate)


def _renamed_argument(self, grads, variables, learning_rate):
    return None


@pytest.mark.parametrize(
    "owner,name,replacement,reported",
    [
        (
            "base",
            "_backend_apply_gradients",
            _applies_per_variable,
            "BaseOptimizer._backend_apply_gradients",
        ),
        (
            "tf",
            "_backend_update_step",
            _renamed_argument,
            "Optimizer._backend_update_step",
        ),
    ],
)
def test_the_whole_list_update_hook_check_can_fail(
    monkeypatch, owner, name, replacement, reported
):
    # `optimizers/_whole_list.py` overrides `_backend_update_step`: if Keras stops
    # calling it (or changes its arguments), the override silently stops running.
    from keras.src.backend.tensorflow import optimizer as tf_optimizer
    from keras.src.optimizers import base_optimizer

    classes = {"base": base_optimizer.BaseOptimizer, "tf": tf_optimizer.TFOptimizer}
    monkeypatch.setattr(classes[owner], name, replacement)
    assert reported in _compat.optimizer.check_upstream()


def test_nlcg_takes_the_loss_from_scale_loss_and_patches_nothing():
    # `fit` hands NLCG its loss through the public `optimizer.scale_loss`, which
    # Keras' train step calls inside the tape (the Trainer._compute_loss patch is
    # gone): the loss is recorded, scaled as by any optimizer.
    import tensorflow as tf
    from keras.src.trainers import trainer

    from keras_replicator._compat import _patching
    from keras_replicator.optimizers import NLCG

    optimizer = NLCG(0.1)
    assert float(optimizer.scale_loss(tf.constant(3.0))) == 3.0
    assert float(optimizer._losses.mean(0.0)) == 3.0
    assert not _patching.is_replaced(trainer.Trainer, "_compute_loss")


def test_the_scale_loss_route_check_can_fail(monkeypatch):
    from keras.src.backend.tensorflow import trainer as tf_trainer

    def train_step(self, data):  # a Keras that no longer asks `scale_loss`
        loss = self._compute_loss(y=data[1], y_pred=self(data[0]), training=True)
        self.optimizer.apply_gradients([])
        return loss

    monkeypatch.setattr(tf_trainer.TensorFlowTrainer, "train_step", train_step)
    changed = _compat.trainer.check_upstream()
    assert "TensorFlowTrainer.train_step: scale_loss" in changed


@pytest.mark.parametrize(
    "module, name",
    [
        ("loss_scale_optimizer.LossScaleOptimizer", "check_finite"),
        ("base_optimizer.BaseOptimizer", "_backend_apply_gradients"),
    ],
)
def test_optimizer_decision_patches_are_installed_and_keep_the_original(module, name):
    # Issue 33: the loss-scale verdict agreed across replicas, and gradient
    # accumulation's branch moved to the cross-replica context.
    import importlib

    from keras_replicator._compat import _patching

    install()
    module_name, class_name = module.split(".")
    owner = getattr(
        importlib.import_module(f"keras.src.optimizers.{module_name}"), class_name
    )
    patched = getattr(owner, name)
    original = _patching.unpatched(patched)
    assert original is not patched
    assert original.__qualname__ == f"{class_name}.{name}"


def test_the_loss_scale_check_can_fail(monkeypatch):
    from keras.src.optimizers import loss_scale_optimizer

    def _tf_apply(self, grads, trainable_variables=None):  # decides elsewhere
        self._common_apply(grads, trainable_variables)

    monkeypatch.setattr(loss_scale_optimizer.LossScaleOptimizer, "_tf_apply", _tf_apply)
    changed = _compat.loss_scale.check_upstream()
    assert "LossScaleOptimizer._tf_apply" in changed


def test_neumann_leaves_the_callback_list_alone():
    # `UseTrueWeights` re-displaces Neumann's weights (the CallbackList patches
    # are gone): creating the optimizer patches nothing.
    import keras

    from keras_replicator._compat import _patching
    from keras_replicator.optimizers import Neumann

    Neumann(0.1)
    for name in ("on_train_begin", "on_train_batch_begin"):
        assert not _patching.is_replaced(keras.callbacks.CallbackList, name)


def _install_every_group():
    # What a process that uses everything has installed: a Replicator strategy
    # (the Keras routing) and PS training.
    import keras_replicator as kr
    from keras_replicator.parameter_server import _keras as ps_keras

    kr.MultiDeviceReplicator(num_replicas=2)
    ps_keras.install()


def test_every_listed_patch_is_installed():
    # The TensorBoard `on_train_end` patch was listed (its digest too) but lost
    # its `replace(...)` line in a refactor: nothing noticed until this test.
    from keras_replicator._compat import _inventory, _patching

    _install_every_group()
    missing = [
        p.target
        for p in _compat.PATCHES
        if not _patching.is_replaced(*_inventory.resolve(p.target))
    ]
    assert not missing, f"Listed in the inventory but not installed: {missing}"


def test_every_installed_patch_is_listed():
    from keras_replicator._compat import _inventory, _patching

    _install_every_group()
    listed = {_inventory.resolve(p.target) for p in _compat.PATCHES}
    unlisted = [
        f"{getattr(owner, '__name__', owner)}.{name}"
        for owner, name in _patching.replaced
        if (owner, name) not in listed
    ]
    assert not unlisted, f"Patched but missing from _compat/_inventory.py: {unlisted}"
    assert len(_patching.replaced) == len(set(_patching.replaced)), "patched twice"


def test_every_patch_is_guarded_and_digest_guards_have_a_digest():
    digests = {**_compat.UPSTREAM_DIGESTS, **_compat.WORKER_FILES_DIGESTS}
    for patch in _compat.PATCHES:
        assert patch.guard in ("digest", "weak"), patch
        assert patch.upstream and patch.reason, patch
        if patch.guard == "digest":
            short = ".".join(patch.target.split(".")[-2:])
            assert short in digests, f"{patch.target} says digest, none recorded"


@pytest.mark.parametrize(
    "owner, name",
    [
        ("keras.callbacks.BackupAndRestore", "on_epoch_begin"),
        ("keras.callbacks.TensorBoard", "on_train_end"),
    ],
)
def test_the_once_unguarded_patches_are_digest_checked(monkeypatch, owner, name):
    import keras

    install()
    cls = getattr(keras.callbacks, owner.rsplit(".", 1)[1])

    def changed_upstream(self, *args, **kwargs):  # a Keras that does more here
        return None

    monkeypatch.setattr(cls, name, changed_upstream)
    assert f"{cls.__name__}.{name}" in _compat.check_upstream()


def test_older_digests_are_for_supported_versions_of_known_internals():
    from packaging.specifiers import SpecifierSet

    from keras_replicator._compat._older_digests import OLDER_DIGESTS

    digests = {**_compat.UPSTREAM_DIGESTS, **_compat.WORKER_FILES_DIGESTS}
    for version, entries in OLDER_DIGESTS.items():
        assert SpecifierSet(_compat.SUPPORTED_VERSIONS["keras"]).contains(version)
        for name, value in entries.items():
            assert name in digests and len(value) == 16 and value != digests[name]


def test_digests_are_keyed_by_the_running_keras_version(monkeypatch):
    import keras

    from keras_replicator._compat import _older_digests, _patching

    monkeypatch.setitem(
        _older_digests.OLDER_DIGESTS, "3.0.1", {"Model.export": "0" * 16}
    )
    monkeypatch.setattr(keras, "__version__", "3.0.1")
    assert "Model.export" in _compat.check_upstream()
    assert _patching.expected_digest({"Model.export": "x"}, "Model.export") == "0" * 16


def test_docs_compat_shows_the_inventory():
    from keras_replicator._compat import _inventory

    docs = pathlib.Path(__file__).parents[1] / "docs" / "compat.md"
    assert _inventory.render() in docs.read_text(), (
        "docs/compat.md is out of date: paste `_compat._inventory.render()` into it"
    )


def _kr_stamps_in(package: pathlib.Path) -> set[str]:
    """`_kr_*` attributes our code writes on objects other than `self` / `cls`."""
    import ast

    found = set()
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text())
        constants = {
            target.id: node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            for target in node.targets
            if isinstance(target, ast.Name) and isinstance(node.value.value, str)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "setattr"
                and len(node.args) >= 2
            ):
                obj, name = node.args[0], node.args[1]
                if isinstance(name, ast.Name):
                    name = constants.get(name.id)
                elif isinstance(name, ast.Constant):
                    name = name.value
                if (
                    isinstance(name, str)
                    and name.startswith("_kr_")
                    and getattr(obj, "id", None) not in ("self", "cls")
                ):
                    found.add(name)
            targets = node.targets if isinstance(node, ast.Assign) else []
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and target.attr.startswith("_kr_")
                    and getattr(target.value, "id", None) not in ("self", "cls")
                ):
                    found.add(target.attr)
    return found


def test_kr_attributes_stamped_on_upstream_objects_are_listed():
    import keras_replicator

    package = pathlib.Path(keras_replicator.__file__).parent
    found = _kr_stamps_in(package)
    listed = {
        name.strip()
        for stamp in _compat.STAMPS
        for name in stamp.attribute.split(",")
        if name.strip().startswith("_kr_")
    }
    assert found <= listed, (
        f"`_kr_*` attributes set on TF/Keras objects, not in the inventory's "
        f"STAMPS: {sorted(found - listed)}"
    )
    assert listed <= found, f"STAMPS lists attributes no longer set: {listed - found}"


def test_the_stamp_scan_finds_a_stamp(tmp_path):
    (tmp_path / "m.py").write_text(
        '_NAME = "_kr_flag"\n'
        "def f(optimizer, strategy):\n"
        "    setattr(optimizer, _NAME, True)\n"
        "    strategy._kr_state = 1\n"
        "    self._kr_own = 2\n"
    )
    assert _kr_stamps_in(tmp_path) == {"_kr_flag", "_kr_state"}
