"""Whether processes a test started are gone (killed and reaped by someone)."""

import time


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for a reaper does not)."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            state = file.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def gone(*pids: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while any(alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
