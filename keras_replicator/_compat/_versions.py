"""The Keras / TensorFlow versions keras_replicator supports, checked at install.

Our patches replace Keras internals (see `_inventory`), so a Keras release outside
the tested range can route around a fix without any error: the numbers would then
silently stop being one device's. The range below is the one place that says what
was tested (`pyproject.toml` declares the same specifiers, and a test keeps the two
equal); `check_versions()` runs once per process, from the installer, before the
first patch goes in (a Replicator strategy's constructor, `kr.wrap_optimizer`, or
an optimizer that needs a `fit` hook).

Outside the range the install fails with `UnsupportedVersionError`. Setting
`KERAS_REPLICATOR_ALLOW_UNSUPPORTED=1` downgrades that to a warning, but only after
`_compat.check_upstream()` has compared every internal we rely on against the
recorded digests: the warning lists what changed, so whoever runs an untested
pair knows which fixes to re-verify.
"""

from __future__ import annotations

import dataclasses
import os
import warnings

from packaging.specifiers import SpecifierSet
from packaging.version import Version

#: The supported versions, as pip specifiers (also in `pyproject.toml`). The lower
#: bounds are the oldest pair the conformance suite passed on (`make compat-range`),
#: the upper bounds exclude the next minor releases, which nobody has verified.
SUPPORTED = {
    "tensorflow": ">=2.20.0,<2.22",
    "keras": ">=3.14.1,<3.16",
}
#: The pairs `make compat-range` verifies (oldest, newest), as exact pins.
VERIFIED_PAIRS = {
    "oldest": {"tensorflow": "2.20.0", "keras": "3.14.1"},
    "newest": {"tensorflow": "2.21.0", "keras": "3.15.1"},
}
ALLOW_UNSUPPORTED = "KERAS_REPLICATOR_ALLOW_UNSUPPORTED"


class UnsupportedVersionError(RuntimeError):
    """The running Keras or TensorFlow is outside the supported range."""


@dataclasses.dataclass(frozen=True)
class VersionReport:
    """The running versions, and which of them are outside `SUPPORTED`."""

    found: dict[str, str]
    unsupported: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.unsupported

    def describe(self) -> str:
        found = ", ".join(f"{name} {version}" for name, version in self.found.items())
        wanted = ", ".join(f"{name}{spec}" for name, spec in SUPPORTED.items())
        return f"found {found}; supported: {wanted}"


def running_versions() -> dict[str, str]:
    import keras
    import tensorflow as tf

    return {"tensorflow": tf.__version__, "keras": keras.__version__}


def report(found: dict[str, str] | None = None) -> VersionReport:
    """Compares `found` (default: the running versions) with `SUPPORTED`."""
    found = running_versions() if found is None else found
    unsupported = tuple(
        name
        for name, spec in SUPPORTED.items()
        if not SpecifierSet(spec).contains(Version(found[name]), prereleases=True)
    )
    return VersionReport(found=found, unsupported=unsupported)


def check_versions(check_upstream, environ=None, found=None) -> VersionReport:
    """Raises `UnsupportedVersionError` unless the running pair is supported.

    Args:
        check_upstream: `_compat.check_upstream`, run (only) when the pair is
            unsupported and `KERAS_REPLICATOR_ALLOW_UNSUPPORTED=1` is set.
        environ: Where to read the variable. Defaults to `os.environ`.
        found: The versions to check. Defaults to the running ones.

    Returns:
        The report (`ok` is False when the error was downgraded to a warning).
    """
    result = report(found)
    if result.ok:
        return result
    environ = os.environ if environ is None else environ
    pins = " ".join(
        f"{name}=={version}" for name, version in VERIFIED_PAIRS["newest"].items()
    )
    message = (
        "keras_replicator patches Keras and TensorFlow internals and was verified "
        f"only on a range of versions: {result.describe()}. Install a supported "
        f'pair (e.g. `pip install "{pins}"`), or set {ALLOW_UNSUPPORTED}=1 to run '
        "anyway after a check of every internal it relies on."
    )
    if environ.get(ALLOW_UNSUPPORTED) != "1":
        raise UnsupportedVersionError(message)
    changed = check_upstream()
    detail = (
        "; ".join(f"{name}: {what}" for name, what in sorted(changed.items()))
        if changed
        else "no internal we rely on changed"
    )
    warnings.warn(
        f"{message} {ALLOW_UNSUPPORTED}=1 is set, so keras_replicator runs anyway. "
        f"Upstream check: {detail}. Re-verify with `keras-replicator test`.",
        RuntimeWarning,
        stacklevel=4,
    )
    return result


def missing_internals_error(error: BaseException) -> UnsupportedVersionError:
    """The error for Keras / TensorFlow internals we patch that cannot be found.

    Raised when `_compat` is imported (by a strategy constructor, or
    `keras-replicator env`): the patch modules import Keras' private modules, which
    a release outside the range may have moved. Unlike `check_versions`, this cannot
    be downgraded to a warning: the patches cannot be installed at all.
    """
    result = report()
    if result.ok:
        cause = (
            f"although the versions are supported ({result.describe()}): the "
            "installation looks damaged; reinstall keras and tensorflow"
        )
    else:
        pins = " ".join(
            f"{name}=={version}" for name, version in VERIFIED_PAIRS["newest"].items()
        )
        cause = (
            f"this Keras / TensorFlow pair is not supported ({result.describe()}); "
            f'install a supported pair, e.g. `pip install "{pins}"`'
        )
    return UnsupportedVersionError(
        "keras_replicator could not find the Keras / TensorFlow internals it "
        f"patches ({type(error).__name__}: {error}), {cause}."
    )
