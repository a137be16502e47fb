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

**Which TensorFlow.** TensorFlow ships as several distributions that install the
same `tensorflow` package: `tensorflow` (CPU and CUDA), `tensorflow-cpu`,
`tensorflow-tpu`, `tensorflow-macos`, `tf-nightly`... pip sees different names,
so a hard `tensorflow` requirement would install the CPU build over a TPU VM's
`tensorflow-tpu`. TensorFlow is therefore an extra of ours, one per platform
(`pyproject.toml`: `[tensorflow]`, `[and-cuda]`, `[tpu]`), and the gate checks
the version of the build that runs (`tf.__version__`), whichever distribution
installed it; `tensorflow_distributions` names that distribution (from the
installed metadata: the ones whose top-level package is `tensorflow`), and two of
them at once (one build's files over the other's) get a warning.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import os
import re
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
#: Our extras that install a TensorFlow build (`pyproject.toml`), by platform.
TENSORFLOW_EXTRAS = {
    "tensorflow": "tensorflow",  # CPU, and GPUs with a system CUDA
    "and-cuda": "tensorflow[and-cuda]",  # GPUs, CUDA from pip
    "tpu": "tensorflow-tpu",  # Cloud TPU VMs
}
INSTALL_HINT = (
    '`pip install "keras-replicator[tpu]"` on a Cloud TPU VM, '
    '`pip install "keras-replicator[and-cuda]"` with NVIDIA GPUs, '
    '`pip install "keras-replicator[tensorflow]"` otherwise'
)


class UnsupportedVersionError(RuntimeError):
    """The running Keras or TensorFlow is outside the supported range."""


class TensorFlowMissingError(ModuleNotFoundError):
    """No distribution installs the `tensorflow` package."""


def tensorflow_distributions(distributions=None) -> dict[str, str]:
    """`{name: version}` of the installed distributions that provide `tensorflow`.

    A distribution provides it when `tensorflow` is one of its top-level packages
    (its `top_level.txt`, else the first part of its files' paths).

    Args:
        distributions: `importlib.metadata.Distribution`s to look at. Defaults
            to `None`: every installed one.

    Returns:
        The names normalised as pip writes them (tensorflow-tpu's metadata says
        `tensorflow_tpu`), e.g. `{"tensorflow-tpu": "2.20.0"}`; empty when no
        TensorFlow is installed.
    """
    if distributions is None:
        distributions = importlib.metadata.distributions()
    found = {}
    for distribution in distributions:
        if "tensorflow" in _top_level_packages(distribution):
            name = re.sub(r"[-_.]+", "-", distribution.metadata["Name"]).lower()
            found[name] = distribution.version
    return dict(sorted(found.items()))


def _top_level_packages(distribution) -> set[str]:
    declared = distribution.read_text("top_level.txt")
    if declared is not None:
        return set(declared.split())
    return {
        path.parts[0]
        for path in distribution.files or ()
        if len(path.parts) > 1 and not path.parts[0].endswith((".dist-info", ".data"))
    }


def tensorflow_missing_error() -> TensorFlowMissingError:
    """The error for a Python with no TensorFlow build: which extra to install."""
    return TensorFlowMissingError(
        "keras_replicator needs TensorFlow, which is an extra so that the right "
        "build is installed for the platform (TensorFlow's CPU / GPU and TPU "
        "builds are different distributions of the same `tensorflow` package). "
        f"Received: no `tensorflow` package. Install one: {INSTALL_HINT}.",
        name="tensorflow",
    )


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
    """The versions of the running TensorFlow build (whichever distribution
    installed it) and Keras.

    Raises:
        TensorFlowMissingError: If no TensorFlow build is installed.
    """
    if importlib.util.find_spec("tensorflow") is None:
        raise tensorflow_missing_error()
    import keras
    import tensorflow as tf

    return {"tensorflow": tf.__version__, "keras": keras.__version__}


def check_one_tensorflow(distributions=None) -> dict[str, str]:
    """Warns when several distributions installed `tensorflow` over each other.

    pip installs each into the same directory without noticing the other (e.g.
    `tensorflow` over a TPU VM's `tensorflow-tpu`): the files are then the last
    one's, mixed with any the first had alone, and uninstalling either removes
    the other's files too.

    Args:
        distributions: As for `tensorflow_distributions`.

    Returns:
        The distributions that provide `tensorflow`.
    """
    found = tensorflow_distributions(distributions)
    if len(found) > 1:
        listed = ", ".join(f"{name} {version}" for name, version in found.items())
        names = " ".join(found)
        warnings.warn(
            f"`tensorflow` is installed by {len(found)} distributions ({listed}); "
            "each wrote its files over the other's, so the build that runs may be "
            f"a mix. Uninstall them (`pip uninstall {names}`) and install one "
            f"build: {INSTALL_HINT}.",
            RuntimeWarning,
            stacklevel=4,
        )
    return found


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

    Raises:
        TensorFlowMissingError: If no TensorFlow build is installed.
        UnsupportedVersionError: If a version is outside `SUPPORTED` and
            `KERAS_REPLICATOR_ALLOW_UNSUPPORTED=1` is not set.
    """
    if found is None:
        check_one_tensorflow()
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


def missing_internals_error(
    error: BaseException,
) -> UnsupportedVersionError | TensorFlowMissingError:
    """The error for Keras / TensorFlow internals we patch that cannot be found.

    Raised when `_compat` is imported (by a strategy constructor, or
    `keras-replicator env`): the patch modules import Keras' private modules, which
    a release outside the range may have moved. Unlike `check_versions`, this cannot
    be downgraded to a warning: the patches cannot be installed at all. With no
    TensorFlow build at all, the error says which extra installs one.
    """
    try:
        result = report()
    except TensorFlowMissingError as missing:
        return missing
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
