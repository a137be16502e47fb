"""The workers' output: long lines split into bounded chunks, UTF-8 kept whole."""

import collections
import io

from keras_replicator.launch import _output
from keras_replicator.launch._output import LINE_BYTES, Echo, pump


def _pumped(data: bytes):
    tail = collections.deque()
    pump(io.BufferedReader(io.BytesIO(data)), "[worker 0] ", tail, Echo(False))
    return list(tail)


def test_a_line_without_newline_is_split_into_bounded_chunks(monkeypatch):
    monkeypatch.setattr(_output, "MAX_LINE_BYTES", 3 * LINE_BYTES)
    lines = _pumped(b"x" * (10 * LINE_BYTES + 5))
    assert max(len(line) for line in lines) <= 3 * LINE_BYTES + 1  # + the newline
    assert "".join(lines).replace("\n", "") == "x" * (10 * LINE_BYTES + 5)


def test_a_long_result_line_is_kept_whole():
    # A script's one-line JSON result longer than a read chunk stays one line.
    line = b"RESULT " + b"7" * (5 * LINE_BYTES) + b"\n"
    assert _pumped(line + b"after\n") == [line.decode(), "after\n"]


def test_the_kept_tail_is_bounded_in_bytes(monkeypatch):
    monkeypatch.setattr(_output, "TAIL_BYTES", 10 * LINE_BYTES)
    lines = _pumped((b"y" * (LINE_BYTES - 1) + b"\n") * 50)
    assert sum(len(line) for line in lines) <= 10 * LINE_BYTES
    assert len(lines) == 10


def test_a_character_split_between_chunks_is_decoded_whole():
    text = "a" * (LINE_BYTES - 1) + "é" * 3 + "\n"  # the first é straddles a chunk
    assert "".join(_pumped(text.encode())).replace("\n", "") == text[:-1]


def test_ordinary_lines_are_kept_as_they_are():
    assert _pumped(b"one\ntwo\nno newline at the end") == [
        "one\n",
        "two\n",
        "no newline at the end\n",
    ]


def test_echo_to_a_closed_stdout_stops_once_and_says_so(capsys, monkeypatch):
    class Closed(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("sys.stdout", Closed())
    echo = Echo()
    echo.write("[worker 0] ", "one\n")
    echo.write("[worker 0] ", "two\n")
    assert echo.closed
    assert capsys.readouterr().err.count("stdout was closed") == 1
