"""Entry point of one `launch_function` worker: loads the function, calls it.

`python -m keras_replicator.launch._function_worker WORKDIR` reads the payload
`launch_function` wrote, rebuilds the function (import by reference, or exec of its
source under its own file name so tracebacks show its lines), calls it and pickles
its return value to `WORKDIR/result-<worker index>.pkl` (written to a temporary
name, then renamed, so the parent never reads half a result). Exceptions are left
to propagate: the traceback is printed and the exit code is non-zero.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import sys

from keras_replicator._environment import WORKER_INDEX
from keras_replicator.launch._function import (
    ARGUMENTS_FILE,
    PAYLOAD_FILE,
    SOURCE_FILE,
    result_path,
)


def load_function(workdir: str):
    with open(os.path.join(workdir, PAYLOAD_FILE)) as file:
        payload = json.load(file)
    if payload["kind"] == "reference":
        target = importlib.import_module(payload["module"])
        for part in payload["qualname"].split("."):
            target = getattr(target, part)
        return target
    path = os.path.join(workdir, SOURCE_FILE)
    with open(path) as file:
        code = compile(file.read(), path, "exec")
    namespace = {"__name__": "__kr_launch_function__"}
    exec(code, namespace)  # noqa: S102 - the caller's own function
    return namespace[payload["name"]]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    workdir = argv[0]
    function = load_function(workdir)
    with open(os.path.join(workdir, ARGUMENTS_FILE), "rb") as file:
        args, kwargs = pickle.load(file)
    value = function(*args, **kwargs)
    try:
        data = pickle.dumps(value)
    except Exception as error:  # noqa: BLE001 - any pickling failure
        raise TypeError(
            f"The return value of `{getattr(function, '__name__', function)}` must "
            f"be picklable to reach the launcher. Received: {type(value).__name__} "
            f"({error}). Return plain data, e.g. `history.history`."
        ) from None
    index = os.environ.get(WORKER_INDEX, "0")
    final = result_path(workdir, int(index))
    with open(final + ".tmp", "wb") as file:
        file.write(data)
    os.replace(final + ".tmp", final)
    return 0


if __name__ == "__main__":
    sys.exit(main())
