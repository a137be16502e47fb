"""A shared-memory segment with no name: a sealed memfd, mapped without a descriptor.

Why (issue 34): the ring's segments were files of `/dev/shm`, so a process of the
same user could open one by name, and a `SIGKILL` could leave one behind. A
`memfd_create` file has no name anywhere; its memory goes with the last process
that maps it. `Segment.create` reserves the memory (`posix_fallocate`: a machine
short of memory fails here, not with a SIGBUS mid-step) and seals the size, so the
neighbour that maps it cannot be made to read past its end; `Segment.adopt`
checks a received descriptor for exactly that (a regular file, sealed against
shrinking, of an even size that holds the step: only memfds and tmpfs files take
seals) and maps it read-only, so a worker never writes into its neighbour's
memory. Descriptors are closed as soon as they are mapped (and handed over), and
the mapping holds none (`_Mapping`), so none is left to open through
`/proc/<pid>/fd`. How segments travel: `_handover`.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import socket
import stat
import sys

import numpy as np


class Refused(ValueError):
    """A descriptor, or a connection, that is not the neighbour's segment."""


def supported() -> bool:
    """Whether this platform has memfds, descriptor passing and abstract sockets.

    Example:
    >>> isinstance(supported(), bool)
    True
    """
    return (
        sys.platform.startswith("linux")
        and hasattr(os, "memfd_create")
        and hasattr(socket, "AF_UNIX")
        and hasattr(socket, "SO_PEERCRED")
        and hasattr(fcntl, "F_ADD_SEALS")
    )


class Segment:
    """A mapped memfd: two slots of `slot_bytes` (a step writes one, reads the other).

    `descriptor` is open only between `create` and `send` (then closed).
    """

    def __init__(self, mapped: np.ndarray, slot_bytes: int, descriptor=None):
        self.bytes, self.slot_bytes, self.descriptor = mapped, slot_bytes, descriptor

    @classmethod
    def create(cls, slot_bytes: int) -> Segment:
        """A new segment, its memory reserved and mapped up front, sealed in size."""
        flags = os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING
        descriptor = os.memfd_create("krring", flags)
        try:
            # Reserved before any byte is written: no SIGBUS when memory is short.
            os.posix_fallocate(descriptor, 0, 2 * slot_bytes)
            seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
            fcntl.fcntl(descriptor, fcntl.F_ADD_SEALS, seals)
            mapped = np.asarray(_Mapping(descriptor, 2 * slot_bytes, writable=True))
        except BaseException:
            os.close(descriptor)
            raise
        return cls(mapped, slot_bytes, descriptor)

    @classmethod
    def adopt(cls, descriptor: int, step_bytes: int) -> Segment:
        """Maps a received descriptor read-only, if it is a segment for `step_bytes`.

        Closes `descriptor` in any case. Raises `Refused` naming what is wrong.
        """
        try:
            status = os.fstat(descriptor)
            size = status.st_size
            if not stat.S_ISREG(status.st_mode) or size % 2 or size < 2 * step_bytes:
                raise Refused(
                    f"a descriptor of {size} bytes (mode {status.st_mode:o}) is not a "
                    f"segment for steps of {step_bytes} bytes"
                )
            try:
                seals = fcntl.fcntl(descriptor, fcntl.F_GET_SEALS)
            except OSError:
                seals = 0  # not a memfd or tmpfs file: it takes no seals
            if not seals & fcntl.F_SEAL_SHRINK:
                raise Refused("a descriptor that is not sealed against shrinking")
            mapped = np.asarray(_Mapping(descriptor, size, writable=False))
        finally:
            os.close(descriptor)
        return cls(mapped, size // 2)

    def view(self, step: int, dtype, elements: int, offset: int = 0) -> np.ndarray:
        start = (step % 2) * self.slot_bytes + offset
        return self.bytes[start : start + elements * np.dtype(dtype).itemsize].view(
            dtype
        )

    def release(self) -> None:
        """Closes the descriptor (the mapping stays)."""
        if self.descriptor is not None:
            os.close(self.descriptor)
            self.descriptor = None

    def close(self) -> None:
        """Unmaps it once no array views it any more (`_Mapping`)."""
        self.release()
        self.bytes = None


class _Mapping:
    """`length` bytes of a descriptor mapped shared, as numpy's array interface.

    Not `mmap.mmap`: before Python 3.13 it keeps a duplicate of the descriptor
    open for the mapping's life, which another process could open through
    `/proc/<pid>/fd`. The arrays made from it keep it alive; the last one to go
    unmaps it (so no view can outlive the memory).
    """

    def __init__(self, descriptor: int, length: int, writable: bool):
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        address = _libc.mmap(None, length, prot, _MAP_FLAGS, descriptor, 0)
        if address in (None, _MAP_FAILED):
            error = ctypes.get_errno()
            raise OSError(error, os.strerror(error))
        self._address, self._length = address, length
        self.__array_interface__ = {
            "data": (address, not writable),
            "shape": (length,),
            "typestr": "|u1",
            "version": 3,
        }

    def __del__(self):
        try:
            _libc.munmap(ctypes.c_void_p(self._address), ctypes.c_size_t(self._length))
        except Exception:  # noqa: BLE001 - interpreter shutdown: the OS unmaps it
            pass


def _c_library():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # no faults later
_MAP_FAILED = ctypes.c_void_p(-1).value
_libc = _c_library() if supported() else None
