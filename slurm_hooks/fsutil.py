"""Small file helpers: atomic replace, advisory locks, tight modes, one JSON reader."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
from collections.abc import Iterator

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~3 ms to import: only checkers read these names
    from typing import Any

_COUNTER = itertools.count()


def atomic_write(path: str, data: str | bytes, mode: int = 0o644, durable: bool = True) -> None:
    """Write ``data`` so that no reader ever sees a half-written file.

    ``durable`` fsyncs before the rename; scratch state on the hot path may skip it.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=0o755, exist_ok=True)
    payload = data.encode() if isinstance(data, str) else data
    # Not tempfile.mkstemp: importing tempfile costs ~5 ms on the prolog's path.
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{next(_COUNTER)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def locked(path: str) -> Iterator[None]:
    """Hold an exclusive flock on ``path + '.lock'`` (read-modify-write of one file)."""
    lock = path + ".lock"
    os.makedirs(os.path.dirname(os.path.abspath(lock)), mode=0o755, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def try_locked(lock: str, dir_mode: int = 0o755) -> Iterator[bool]:
    """Try an exclusive flock on ``lock`` without waiting: yields False when another process holds
    it. The kernel drops the lock when its holder dies, so a crash never leaves it taken."""
    os.makedirs(os.path.dirname(os.path.abspath(lock)), mode=dir_mode, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def read_json(path: str, *, missing: Any, error: Any, message: str = "{path}: unreadable JSON ({reason})") -> Any:
    """The JSON document in the file ``path``.

    Each caller says at the call what a file that is not there and one that does not read (an
    ``OSError`` other than its absence, bytes that are not UTF-8, text that is not JSON) come to:

    - a value, returned as it is (``missing={}``, ``error=None``);
    - an exception class, raised with ``message`` (``{path}`` and ``{reason}``, the error's own text,
      filled in): ``error=MarkerUnreadable, message="{path}: unreadable drain marker ({reason})"``;
    - an exception, raised as it is (a file not there that says something else than a bad one);
    - any other callable, called with that message; what it returns is returned (to log and start
      afresh: ``error=lambda m: _say(m) or {}``).

    The document itself is not checked: a shape the caller does not expect is the caller's to judge.
    """
    import json  # most callers have it already; imported here so that fsutil's own import stays light

    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError as exc:
        return _rule(missing, message, path, exc)
    except (OSError, ValueError) as exc:
        return _rule(error, message, path, exc)


def _rule(rule: Any, message: str, path: str, exc: BaseException) -> Any:
    if isinstance(rule, type) and issubclass(rule, BaseException):
        raise rule(message.format(path=path, reason=exc)) from None
    if isinstance(rule, BaseException):
        raise rule from None
    if callable(rule):
        return rule(message.format(path=path, reason=exc))
    return rule
