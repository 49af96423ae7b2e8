"""Atomic writes and file locks: everything two runs could touch at once goes through here."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rocmforge.errors import UserError


def atomic_write(path: str | os.PathLike[str], data: str | bytes, *, mode: int = 0o644) -> Path:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never half.

    The temp file lives in the same directory so that the final ``os.replace`` is a rename
    within one filesystem (atomic on POSIX).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


@contextlib.contextmanager
def file_lock(
    path: str | os.PathLike[str],
    *,
    what: str = "",
    timeout: float | None = None,
    on_wait=None,
    inherit: bool = False,
) -> Iterator[Path]:
    """Hold an exclusive ``flock`` on ``path`` (created if needed) for the ``with`` block.

    The lock file records the holder's pid and purpose so that a second run can say who holds
    it. ``on_wait(holder_text)`` is called once if we have to wait; ``timeout`` (seconds) turns
    a long wait into a ``UserError`` naming the holder. The kernel drops the lock when the
    holder dies, so a killed run never leaves a stale lock behind.

    ``inherit``: the commands this process runs meanwhile (:func:`inherited_lock_fds`) hold the
    lock too, so a build step orphaned by a killed run keeps it until the step ends; the next
    run waits for the orphan instead of deleting the directory it is still writing.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            holder = _read_holder(path)
            if on_wait is not None:
                on_wait(holder)
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError:
                    if deadline is not None and time.monotonic() > deadline:
                        raise UserError(
                            f"{path} is locked by {holder or 'another run'}; wait for it to finish or stop it"
                        ) from None
                    time.sleep(0.2)
        line = f"pid {os.getpid()} {what}".strip().encode()
        os.pwrite(fd, line, 0)
        # Truncate only what is left of a longer holder line: a truncate is a journaled
        # metadata change, and a no-op session takes several locks per package.
        if os.fstat(fd).st_size > len(line):
            os.ftruncate(fd, len(line))
        if inherit:
            _inherited.append(fd)
        yield path
    finally:
        if fd in _inherited:
            _inherited.remove(fd)
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


_inherited: list[int] = []  # fds of the locks held with inherit=True


def inherited_lock_fds() -> tuple[int, ...]:
    """The lock fds a command started now must keep open (``subprocess`` ``pass_fds``)."""
    return tuple(_inherited)


def remove_temp_files(directory: str | os.PathLike[str]) -> list[Path]:
    """Remove the temp files :func:`atomic_write` leaves when killed (``.NAME.XXXX.tmp``).

    Call it only under the lock that every writer of ``directory`` holds, so that no temp file
    being written now is taken for a leftover.
    """
    gone = []
    for path in Path(directory).glob(".*.tmp"):
        if path.is_file() or path.is_symlink():
            path.unlink(missing_ok=True)
            gone.append(path)
    return gone


def _read_holder(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return ""


_SPECIAL = {
    stat.S_IFIFO: "a named pipe",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def refuse_special(path: str | os.PathLike[str], what: str) -> None:
    """A ``UserError`` when ``path`` is a named pipe, device or socket (symlinks followed).

    Reading one would block until some writer appears, or never end (``/dev/zero``); a command
    given one by mistake says so at once instead. Missing files and directories are left to the
    caller, whose message knows what it wanted.
    """
    try:
        kind = _SPECIAL.get(stat.S_IFMT(os.stat(path).st_mode))
    except OSError:
        return
    if kind:
        raise UserError(f"{path}: {kind}, not a regular file; give {what}")


_TEXT_CONTROLS = set(b"\t\n\r\x1b\x08\x0c")  # tabs, newlines, ANSI colours, backspace, form feed


def looks_binary(data: bytes) -> bool:
    """Whether ``data`` (the first block of a file) is not text: a NUL byte, or more than 10% of
    it control characters or invalid UTF-8. Logs with colours and progress bars stay text."""
    if b"\0" in data:
        return True
    text = data.decode("utf-8", errors="replace")
    odd = sum(1 for ch in text if ch == "\ufffd" or (ord(ch) < 32 and ord(ch) not in _TEXT_CONTROLS))
    return odd > len(text) // 10


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in chunks (wheels and archives can be gigabytes)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_json(path: str | os.PathLike[str]) -> Any:
    """The JSON in ``path``, or None when it is missing, unreadable or damaged.

    For stamps, states and caches that are simply made again when they cannot be read.
    """
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):  # ValueError covers JSONDecodeError and UnicodeDecodeError
        return None


def json_sha256(data: object) -> str:
    """Hex sha256 of ``data`` as JSON with sorted keys: a fingerprint that ignores dict order."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()
