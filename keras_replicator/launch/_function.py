"""`launch_function()`: run a Python function as N workers, from a notebook too.

The workers are fresh processes (`python -m keras_replicator.launch._function_worker`),
never forks: TensorFlow is usually already running in a notebook's kernel, and a
forked copy of its runtime threads deadlocks. So the function has to reach the
workers as something they can load:

- a function defined in an importable module travels by reference
  (`module:qualname`), and the workers get this process's `sys.path`;
- a function defined in a notebook cell or a script (`__main__`, which the workers
  cannot import) travels as its source code, taken with `inspect.getsource`. It
  must then be self-contained: imports inside the function, no closures. What it
  needs from outside goes in through `args` / `kwargs`.

Arguments and return values travel with `pickle` through a private temporary
directory; each worker's return value comes back in index order.
"""

from __future__ import annotations

import inspect
import json
import os
import pickle
import sys
import tempfile
import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from keras_replicator.launch._launcher import launch_with_options
from keras_replicator.launch._options import LaunchOptions
from keras_replicator.launch._results import LaunchResult

PAYLOAD_FILE = "payload.json"
ARGUMENTS_FILE = "arguments.pkl"
SOURCE_FILE = "function_source.py"


class LaunchError(RuntimeError):
    """A worker group failed; `.result` holds every worker's exit code and output."""

    def __init__(self, message: str, result: LaunchResult):
        super().__init__(message)
        self.result = result


def launch_function(
    function: Callable[..., Any],
    num_workers: int,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    max_restarts: int = 0,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    echo: bool = True,
    grace_seconds: float = 5.0,
    data_service_workers: int = 0,
    gpus_per_worker: int | str | None = None,
) -> list[Any]:
    """Calls `function(*args, **kwargs)` in `num_workers` worker processes.

    The notebook-friendly form of `keras-replicator launch` (like Accelerate's
    `notebook_launcher`): each worker has its own `TF_CONFIG`, so
    `kr.MultiWorkerReplicator()` inside the function joins the others. Workers'
    output is echoed as `[worker i] ...` and the first failure stops the rest.

    Args:
        function: A named function. One from a notebook cell must be
            self-contained (imports inside it, no closures).
        num_workers: How many worker processes to start on this machine.
        args: Positional arguments for `function` (picklable). Defaults to `()`.
        kwargs: Keyword arguments for `function` (picklable). Defaults to `None`.
        max_restarts: Restarts of the whole group after a failure. Defaults to `0`.
        timeout: Seconds for all runs together. Defaults to `None` (no limit).
        env: Extra environment variables for the workers. Defaults to `None`.
        echo: Print the workers' output. Defaults to `True`.
        grace_seconds: Seconds between SIGTERM and SIGKILL when stopping workers.
            Defaults to `5.0`.
        data_service_workers: Start a tf.data service dispatcher and this many
            service workers beside the workers (see `launch()`); the function
            finds the address with `kr.data.service_address()`. Defaults to `0`.
        gpus_per_worker: GPUs each worker sees through its own
            `CUDA_VISIBLE_DEVICES` (see `launch()`). Defaults to `None`: the
            visible GPUs split evenly among the workers.

    Returns:
        Each worker's return value, in worker order (`[0]` is the chief's). They
        must be picklable: return `history.history`, not the `History`.

    Raises:
        TypeError: If `function` cannot be sent to the workers.
        LaunchError: If the workers failed; the message names the worker that
            failed first and shows its traceback.

    Example:
    >>> from keras_replicator.launch import launch_function
    >>> def rank():
    ...     import os
    ...     return int(os.environ["KERAS_REPLICATOR_WORKER_INDEX"])
    >>> launch_function(rank, 2, echo=False)
    [0, 1]
    """
    options = LaunchOptions(
        num_workers=num_workers,
        cluster="local",
        max_restarts=max_restarts,
        timeout=timeout,
        grace_seconds=grace_seconds,
        echo=echo,
        env=env,
        data_service_workers=data_service_workers,
        gpus_per_worker=gpus_per_worker,
    )
    payload = function_payload(function)
    with tempfile.TemporaryDirectory(prefix="kr-launch-function-") as workdir:
        _write_inputs(workdir, payload, args, kwargs)
        worker_env = dict(env or {})
        worker_env["PYTHONPATH"] = os.pathsep.join(
            [p for p in sys.path if p] + [os.environ.get("PYTHONPATH", "")]
        ).rstrip(os.pathsep)
        command = [
            sys.executable,
            "-m",
            "keras_replicator.launch._function_worker",
            workdir,
        ]
        result = launch_with_options(
            command,
            LaunchOptions(**{**_fields(options), "env": worker_env}),
        )
        if not result.ok:
            failure = result.first_failure
            detail = failure.traceback if failure is not None else ""
            raise LaunchError(
                f"{result.headline()}.\n{detail or result.describe_failure()}",
                result,
            )
        return [_read_result(workdir, w.index) for w in result.workers]


def function_payload(function: Callable[..., Any]) -> dict[str, str]:
    """How the workers will find `function`: by reference or by its source."""
    if not inspect.isfunction(function):
        raise TypeError(
            "`function` must be a function defined with `def`. "
            f"Received: function={function!r}. Wrap the call in a `def`."
        )
    name = function.__name__
    if name == "<lambda>":
        raise TypeError(
            "`function` must be a named function, not a lambda: the workers "
            "rebuild it from its name. Received: a lambda. Define it with `def`."
        )
    if _importable(function):
        return {
            "kind": "reference",
            "module": function.__module__,
            "qualname": function.__qualname__,
        }
    if function.__code__.co_freevars:
        raise TypeError(
            f"`function` must not use variables of an enclosing function; "
            f"`{name}` uses {list(function.__code__.co_freevars)}. Pass them "
            "through `args` / `kwargs` instead."
        )
    try:
        source = textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError) as error:
        raise TypeError(
            f"`function` ({name}) was defined interactively and its source is "
            f"not available ({error}). Define it in a notebook cell or a module."
        ) from None
    return {"kind": "source", "name": name, "source": source}


def _importable(function) -> bool:
    """Whether importing its module and name gives back this very function."""
    module = sys.modules.get(function.__module__)
    if function.__module__ == "__main__" or module is None:
        return False
    target: object = module
    for part in function.__qualname__.split("."):
        target = getattr(target, part, None)
    return target is function


def _write_inputs(workdir, payload, args, kwargs):
    try:
        arguments = pickle.dumps((tuple(args), dict(kwargs or {})))
    except Exception as error:  # noqa: BLE001 - any pickling failure
        raise TypeError(
            "`args` and `kwargs` must be picklable to reach the workers. "
            f"Received an unpicklable value ({type(error).__name__}: {error}). "
            "Pass file paths or plain data instead."
        ) from None
    with open(os.path.join(workdir, ARGUMENTS_FILE), "wb") as file:
        file.write(arguments)
    if payload["kind"] == "source":
        with open(os.path.join(workdir, SOURCE_FILE), "w") as file:
            file.write(payload.pop("source"))
    with open(os.path.join(workdir, PAYLOAD_FILE), "w") as file:
        json.dump(payload, file)


def result_path(workdir: str, index: int) -> str:
    return os.path.join(workdir, f"result-{index}.pkl")


def _read_result(workdir, index):
    with open(result_path(workdir, index), "rb") as file:
        return pickle.load(file)


def _fields(options: LaunchOptions) -> dict:
    return {name: getattr(options, name) for name in LaunchOptions.__dataclass_fields__}
