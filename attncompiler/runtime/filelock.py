"""Process-safe file updates: an advisory lock (``fcntl.flock``) and atomic replacement.

:class:`FileLock` serializes read-modify-write cycles of a shared file across processes (and
threads: each acquisition opens its own file description, so two threads exclude each other
too).  :func:`atomic_write` writes a temporary file in the target's folder, flushes it to disk
and ``os.replace``-s it over the target, so a reader sees the old or the new content, never a
torn file.  POSIX only (Linux, macOS); no third-party dependency.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Optional

__all__ = ["FileLock", "LockTimeout", "atomic_write"]


class LockTimeout(TimeoutError):
    """The lock stayed held by another process for longer than the timeout."""


class FileLock:
    """Exclusive advisory lock on ``path`` (created if missing; never deleted: deleting a lock
    file that another process has open would let two processes hold "the" lock).

    ``timeout`` None waits forever; otherwise :class:`LockTimeout` after that many seconds,
    polling every ``poll`` seconds.  Use as a context manager.
    """

    def __init__(self, path: str | os.PathLike[str], timeout: Optional[float] = None, poll: float = 0.05) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self.poll = poll
        self._file: Optional[IO[bytes]] = None

    @property
    def locked(self) -> bool:
        return self._file is not None

    def acquire(self) -> "FileLock":
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            raise OSError(f"FileLock: expected a POSIX system with fcntl, got {sys.platform}") from None
        if self._file is not None:
            raise RuntimeError(f"FileLock({self.path}): expected an unlocked lock, got one this object holds")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "ab")
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | (fcntl.LOCK_NB if deadline is not None else 0))
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() >= deadline:
                    f.close()
                    raise LockTimeout(f"expected to lock {self.path} within {self.timeout} s, "
                                      f"got it still held by another process") from None
                time.sleep(self.poll)
            except BaseException:
                f.close()
                raise
        self._file = f
        return self

    def release(self) -> None:
        if self._file is None:
            return
        import fcntl

        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
        finally:
            self._file.close()
            self._file = None

    def __enter__(self) -> "FileLock":
        return self.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def atomic_write(path: str | os.PathLike[str], data: bytes | str) -> None:
    """Replace ``path``'s content with ``data`` atomically (temporary file, fsync, ``os.replace``)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
