"""`keras_replicator/_environment.py` owns every `KERAS_REPLICATOR_*` name.

A name written out in a second module drifts from the first (issue 50), so the
only string literal holding one is in `_environment.py`; docstrings elsewhere may
still mention a name, for their readers.
"""

import ast
import pathlib

from keras_replicator import _environment

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "keras_replicator"
PREFIX = "KERAS_REPLICATOR_"
OWNER = PACKAGE / "_environment.py"
# `_compat` is a leaf (tests/test_compat.py): it keeps its own copy of one name,
# checked below to equal the owner's.
MIRRORS = {PACKAGE / "_compat" / "_versions.py": {_environment.ALLOW_UNSUPPORTED}}


def _docstrings(tree):
    """The string nodes that are docstrings (module, class, function)."""
    for node in ast.walk(tree):
        if isinstance(
            node,
            (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef),
        ):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
            ):
                yield body[0].value


def _names_in_code(path):
    """`KERAS_REPLICATOR_` strings in `path`'s code, docstrings aside."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node) for node in _docstrings(tree)}
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and PREFIX in node.value
        and id(node) not in docstrings
    }


def test_no_other_module_spells_an_environment_name():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == OWNER:
            continue
        found = _names_in_code(path) - MIRRORS.get(path, set())
        if found:
            offenders[str(path.relative_to(PACKAGE.parent))] = sorted(found)
    assert offenders == {}, (
        f"{PREFIX}* names spelled outside keras_replicator/_environment.py: "
        f"{offenders}. Add the name there (who sets it, who reads it) and import it."
    )


def test_the_mirror_agrees_with_the_owner():
    from keras_replicator._compat import _versions

    assert _versions.ALLOW_UNSUPPORTED == _environment.ALLOW_UNSUPPORTED


def test_every_name_is_listed_once_with_its_prefix():
    constants = {
        name: value
        for name, value in vars(_environment).items()
        if name.isupper() and isinstance(value, str)
    }
    assert sorted(constants.values()) == sorted(_environment.NAMES)
    assert len(set(_environment.NAMES)) == len(_environment.NAMES)
    assert all(value == PREFIX + name for name, value in constants.items())


def test_the_finder_sees_code_but_not_docstrings(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        '"""Reads `KERAS_REPLICATOR_A`."""\n'
        "def f(raw):\n"
        '    """Mentions KERAS_REPLICATOR_B."""\n'
        '    return f"KERAS_REPLICATOR_C={raw}", "KERAS_REPLICATOR_D"\n'
    )
    assert _names_in_code(module) == {"KERAS_REPLICATOR_C=", "KERAS_REPLICATOR_D"}
