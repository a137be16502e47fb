"""How `_compat` replaces an upstream function, and how it notices upstream changes.

Every patch keeps the function it replaced as `__kr_original__`, so the source digest
of the upstream code can still be taken after installation (`unpatched`), a digest
mismatch names what changed (`changed_digests`), and a test can tell that a listed
patch is really in place (`is_replaced`, checked against `_compat`'s inventory).

Digests are recorded for the newest supported Keras in each module's `DIGESTS`;
an older supported Keras whose source differs (and whose behaviour was verified
with the conformance suite) has its own entries in `_older_digests`, keyed by the
Keras version.
"""

from __future__ import annotations

import hashlib
import inspect
import threading

install_lock = threading.Lock()

#: `(owner, name)` of every attribute `replace` has patched in this process.
replaced: list[tuple[object, str]] = []


def replace(owner, name, make_replacement):
    original = getattr(owner, name)
    replacement = make_replacement(original)
    replacement.__kr_original__ = original
    replacement.__name__ = getattr(original, "__name__", name)
    replacement.__doc__ = getattr(original, "__doc__", None)
    setattr(owner, name, replacement)
    replaced.append((owner, name))


def replace_property_getter(owner, name, make_getter):
    """`replace` for a property: its getter is replaced, the property kept."""
    original = getattr(owner, name)
    getter = make_getter(original.fget)
    getter.__kr_original__ = original.fget
    setattr(owner, name, property(getter, doc=original.__doc__))
    replaced.append((owner, name))


def is_replaced(owner, name) -> bool:
    """Whether `owner.name` is currently one of our replacements."""
    value = inspect.getattr_static(owner, name, None)
    if isinstance(value, property):
        value = value.fget
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    return hasattr(value, "__kr_original__")


def unpatched(function):
    return getattr(function, "__kr_original__", function)


def digest(function) -> str:
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]


def expected_digest(expected: dict[str, str], name: str) -> str:
    """The digest recorded for `name` under the running Keras version."""
    import keras

    from keras_replicator._compat._older_digests import OLDER_DIGESTS

    return OLDER_DIGESTS.get(keras.__version__, {}).get(name, expected[name])


def changed_digests(expected: dict[str, str], objects: dict) -> dict[str, str]:
    """{name: what changed} for each object whose source digest is not `expected`."""
    changed = {}
    for name, function in objects.items():
        found = digest(function)
        wanted = expected_digest(expected, name)
        if wanted != found:
            changed[name] = f"source digest {wanted} != {found}"
    return changed
