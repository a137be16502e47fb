"""Running the system tools that build namespaces: bounded, and loud on failure.

The harness drives iproute2 (`ip`, `tc`) and util-linux (`nsenter`, `unshare`,
`mount`, `umount`) rather than calling `setns(2)` and `mount(2)` itself: their
command lines are what a contributor types to inspect a cluster by hand, and an
error names the command that failed with the tool's own message.
"""

from __future__ import annotations

import subprocess

TOOLS = ("ip", "tc", "nsenter", "unshare", "mount", "umount")
TOOL_TIMEOUT_SECONDS = 10.0


def run_tool(*args: str, timeout: float = TOOL_TIMEOUT_SECONDS) -> str:
    """Runs one tool command and returns its standard output.

    Args:
        *args: The command line, e.g. `"ip", "netns", "add", "kr1c0h0"`.
        timeout: Seconds the command may take. Defaults to `10.0`.

    Returns:
        The command's standard output.

    Raises:
        RuntimeError: The command failed, could not start or took too long; the
            message holds the command line and the tool's standard error.

    Example:
    >>> run_tool("ip", "-V").startswith("ip utility")
    True
    """
    command = " ".join(args)
    try:
        result = subprocess.run(
            args, capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise RuntimeError(f"`{command}` did not run: {error}") from error
    if result.returncode != 0:
        raise RuntimeError(
            f"`{command}` failed with exit code {result.returncode}: "
            f"{result.stderr.strip() or result.stdout.strip()}"
        )
    return result.stdout
