"""Source digests on older supported Keras releases, where they differ.

Each module's `DIGESTS` records the newest supported Keras. An older release in
the supported range (`_versions.SUPPORTED`) whose source of a replaced function
differs gets an entry here, keyed by its exact version, once the difference was
read and the conformance suite passed on that release (`make compat-range`):
`changed_digests` then expects these digests instead. A Keras release not listed
is compared against the newest digests.
"""

from __future__ import annotations

#: {keras version: {internal: digest}} for entries that differ from `DIGESTS`.
OLDER_DIGESTS: dict[str, dict[str, str]] = {
    # Keras 3.14.1 (with TensorFlow 2.20.0, the oldest verified pair): `shutil.rmtree`
    # without `ignore_errors` after a remote save, and `export`'s docstring.
    "3.14.1": {
        "saving_lib.save_weights_only": "287c76192a486226",
        "Model.export": "e72dcb1c919648ad",
    },
}
