"""Wire formats a platform cannot sum are refused, naming the one to use."""

import pytest

from keras_replicator import _platform
from keras_replicator.communication import _compression


@pytest.mark.parametrize(
    "compression, platform",
    [
        (None, _platform.CPU),
        ("fp16", _platform.CPU),
        ("bf16", _platform.CPU),
        (None, _platform.GPU),
        ("fp16", _platform.GPU),
        (None, _platform.TPU),
        ("bf16", _platform.TPU),
    ],
)
def test_supported_wire_formats_pass(compression, platform):
    _compression.check_wire_format(compression, platform)


@pytest.mark.parametrize(
    "compression, platform, remedy",
    [("bf16", _platform.GPU, "'fp16'"), ("fp16", _platform.TPU, "'bf16'")],
)
def test_unsupported_wire_formats_name_the_replacement(compression, platform, remedy):
    with pytest.raises(ValueError) as error:
        _compression.check_wire_format(compression, platform)
    message = str(error.value)
    assert f"Received: compression={compression!r} on {platform}" in message
    assert f"Use compression={remedy}" in message
