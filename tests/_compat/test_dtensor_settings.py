"""The DTensor setting `ModelParallelReplicator` needs still works and is still needed.

`_compat/layouts.py` turns off DTensor's combine-all-reduces optimization, which
reorders a merged all-reduce past a read of the variable it feeds. This runs the
standalone repro of docs/upstream.md#dtensor-combined-all-reduce-order in fresh
processes (DTensor must not share a process with `tf.distribute`'s collectives),
with the optimization on and off: off must read the written value; on must
still show the bug, so an upstream fix (or a renamed setting) fails here and the
setting can be revisited.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from keras_replicator import _compat

UPSTREAM_MD = pathlib.Path(__file__).parents[2] / "docs" / "upstream.md"
SETTING = "DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION"


def _repro() -> str:
    text = UPSTREAM_MD.read_text()
    section = text.split("## dtensor-combined-all-reduce-order", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def _run(value: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", _repro(), value],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def test_the_setting_is_the_one_applied():
    assert _compat.DTENSOR_SETTINGS == {SETTING: "0"}


@pytest.mark.timeout(300)
def test_off_reads_the_written_value_and_on_still_does_not():
    assert _run("0").startswith("[4.0, 8.0]")
    assert _run("1").startswith("[0.0, 8.0]"), (
        "DTensor's combined all-reduces are read in order now: "
        "`_compat.DTENSOR_SETTINGS` may no longer be needed."
    )


def test_applying_warns_about_a_conflicting_value(monkeypatch):
    monkeypatch.setenv(SETTING, "1")
    with pytest.warns(UserWarning, match=f"`{SETTING}=1` is set"):
        _compat.apply_dtensor_settings()
    assert os.environ[SETTING] == "0"
