"""Checks of a GPU library's answers, for every vendor's probe (NVML's, amdsmi's): each gives the
clean value, or raises :class:`Garbled` when the library answered something that cannot be true
(the probe leaves that field ``None`` with one line in its errors)."""

from __future__ import annotations

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


class Garbled(ValueError):
    """The library answered, but the answer cannot be true."""


def text(value: Any) -> str:
    """A library's C string as clean text: never raises on bad bytes, never passes on a control character.

    The value ends at the first NUL (bytes after it are buffer garbage); undecodable bytes, lone
    surrogates and non-printable characters become U+FFFD, so a garbled name can reach a drain
    reason or a log line without breaking either.
    """
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).split(b"\0", 1)[0].decode("utf-8", "replace")
    if not isinstance(value, str):
        raise Garbled(f"expected text, got {type(value).__name__}")
    return "".join(c if c.isprintable() else "\ufffd" for c in value.split("\0", 1)[0]).strip()


def integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Garbled(f"expected an integer, got {value!r}")
    return value


def ranged(low: int, high: int) -> Callable[[Any], int]:
    """A check of an integer from ``low`` to ``high``."""
    def check(value: Any) -> int:
        n = integer(value)
        if not low <= n <= high:
            raise Garbled(f"{n} outside {low}..{high}")
        return n

    return check
