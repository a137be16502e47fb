"""mypy (in `make lint`) checks exactly the modules that define the public API.

mypy.ini lists them; this test recomputes the list from the public packages'
`__all__`, so a public name moved to a new module cannot leave mypy's view.
"""

import configparser
import importlib
import inspect
import pathlib
import sys

import keras_replicator

_ROOT = pathlib.Path(keras_replicator.__file__).parent.parent


def _public_modules() -> set[str]:
    packages = ["keras_replicator"] + [
        f"keras_replicator.{name}" for name in keras_replicator._SUBMODULES
    ]
    modules = set()
    for package in packages:
        module = importlib.import_module(package)
        modules.add(module.__name__)
        for name in module.__all__:
            value = getattr(module, name)
            defined_in = (
                value.__name__
                if inspect.ismodule(value)
                else getattr(value, "__module__", None)
            )
            if defined_in and defined_in.startswith("keras_replicator"):
                modules.add(defined_in)
    return modules


def test_mypy_checks_the_modules_defining_the_public_api():
    config = configparser.ConfigParser()
    config.read(_ROOT / "mypy.ini")
    listed = {f.strip() for f in config["mypy"]["files"].split(",") if f.strip()}
    expected = {
        str(pathlib.Path(sys.modules[name].__file__).relative_to(_ROOT))
        for name in _public_modules()
    }
    assert listed == expected, (
        f"Add to mypy.ini's `files`: {sorted(expected - listed)}; "
        f"remove: {sorted(listed - expected)}."
    )
