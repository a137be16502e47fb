"""How `_compat` replaces an upstream function, and how it notices upstream changes.

Every patch keeps the function it replaced as `__kr_original__`, so the source digest
of the upstream code can still be taken after installation (`unpatched`), and a
digest mismatch names what changed (`changed_digests`).
"""

from __future__ import annotations

import hashlib
import inspect
import threading

install_lock = threading.Lock()


def replace(owner, name, make_replacement):
    original = getattr(owner, name)
    replacement = make_replacement(original)
    replacement.__kr_original__ = original
    replacement.__name__ = getattr(original, "__name__", name)
    replacement.__doc__ = getattr(original, "__doc__", None)
    setattr(owner, name, replacement)


def unpatched(function):
    return getattr(function, "__kr_original__", function)


def digest(function) -> str:
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]


def changed_digests(expected: dict[str, str], objects: dict) -> dict[str, str]:
    """{name: what changed} for each object whose source digest is not `expected`."""
    changed = {}
    for name, function in objects.items():
        found = digest(function)
        if expected[name] != found:
            changed[name] = f"source digest {expected[name]} != {found}"
    return changed
