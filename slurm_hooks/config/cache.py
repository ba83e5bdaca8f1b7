"""The config file's parsed TOML, kept beside it so that a health check or prolog need not load a
TOML parser (``tomllib`` and what it imports: ~5 ms of every run's start-up).

The cache ``<dir>/.<name>.parsed`` holds, in :mod:`marshal` form (built in, nothing to import), the
file's whole text with the table parsed from it. It is used only when that text equals the file's
text as read now, so any edit is seen at once (same second, same size, mtime set back: all the
same), and only when it was written by this version on this Python. It is read only when it is a
plain file owned by this user, with one link, writable by no one else (root runs this: a file
someone else could have written is never decoded). Anything else -- missing, corrupt, foreign,
stale -- and the caller parses the file as before. The programs Slurm runs write it
(:func:`enable`, from :mod:`slurm_hooks.entry`) when they may write in the file's directory; other
commands only read it, so no file appears beside a config that a test or an admin merely validates.
"""

from __future__ import annotations

import marshal
import os
import stat
import sys

from slurm_hooks import __version__

_FORMAT = 1
#: Far above any real config: a bigger file is not read.
_MAX_BYTES = 4 << 20
_writing = False


def enable() -> None:
    """Write the cache on a miss (the hook programs' fast path)."""
    global _writing
    _writing = True


def cache_path(path: str) -> str:
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}.parsed")


def _key(path: str, text: str) -> tuple:
    return (_FORMAT, __version__, tuple(sys.version_info[:2]), os.path.abspath(path), text)


def read(path: str, text: str) -> dict | None:
    """The table parsed from ``text`` (the file at ``path`` as just read), or None: parse it."""
    try:
        fd = os.open(cache_path(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022
                or st.st_nlink != 1 or st.st_size > _MAX_BYTES):
            return None
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(_MAX_BYTES + 1)
        record = marshal.loads(data)
    except (OSError, EOFError, ValueError, TypeError):
        return None
    finally:
        os.close(fd)
    if type(record) is not tuple or len(record) != 2 or record[0] != _key(path, text):
        return None
    raw = record[1]
    return raw if type(raw) is dict else None


def write(path: str, text: str, raw: dict) -> None:
    """Keep ``raw`` (parsed from ``text``) for the next run; silently nothing when not enabled, when
    the directory is not ours to write, or when the table holds what marshal cannot keep (dates)."""
    if not _writing:
        return
    try:
        data = marshal.dumps((_key(path, text), raw))
    except ValueError:  # a TOML date or time: those runs parse the file
        return
    from slurm_hooks import fsutil

    try:
        fsutil.atomic_write(cache_path(path), data, mode=0o600, durable=False)
    except OSError:
        pass
