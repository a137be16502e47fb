"""The one install-once mechanism every group of patches goes through.

Patches go in by group, each group once per process, under one lock, and only
after the version gate (`_versions.check_versions`) has passed:

- `KERAS`: the Keras routing (`_compat.install(hooks)`), from every Replicator
  strategy's constructor and `kr.wrap_optimizer`;
- `PARAMETER_SERVER`: Keras on `ParameterServerStrategy`.

The first caller of a group wins (its hooks stay); a failed gate installs
nothing, so the next strategy constructor raises again.
"""

from __future__ import annotations

from collections.abc import Callable

from keras_replicator._compat import _versions
from keras_replicator._compat._patching import install_lock

KERAS = "keras"
PARAMETER_SERVER = "parameter_server"
GROUPS = (KERAS, PARAMETER_SERVER)

_installed: set[str] = set()
_gate_passed = False


def install_once(group: str, install: Callable[[], None]) -> bool:
    """Runs `install()` for `group` unless it ran already; True if it ran now."""
    if group not in GROUPS:
        raise ValueError(f"`group` must be one of {GROUPS}. Received: group={group!r}.")
    with install_lock:
        if group in _installed:
            return False
        _check_versions_once()
        install()
        _installed.add(group)
        return True


def installed(group: str) -> bool:
    """Whether `group`'s patches are in place in this process."""
    return group in _installed


def installed_groups() -> tuple[str, ...]:
    return tuple(group for group in GROUPS if group in _installed)


def _check_versions_once() -> None:
    global _gate_passed
    if _gate_passed:
        return
    from keras_replicator._compat import check_upstream

    _versions.check_versions(check_upstream)
    _gate_passed = True
