"""One config key, declared once, on the field of its section's class.

:func:`setting` gives a field its default, the values it can take (a :class:`Range` of numbers or a
tuple of ``choices``) and what it does (``doc``, one line): :mod:`slurm_hooks.config` checks a file
against them, ``tools/gen_config_doc.py`` writes the example config and docs/configuration.md from
them. The TOML types a key accepts follow from the field's declared type (``float``: any number,
kept as a float; ``tuple[str, ...]``: a list, kept as a tuple; ``dict[str, str]``: a table).
"""

from __future__ import annotations

from slurm_hooks.values import MISSING, Field, dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


@dataclass(frozen=True)
class Range:
    """The values a number can take and still work; ``open`` ends exclude the bound itself."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    why: str = ""

    def admits(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))

    def describe(self) -> str:
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if self.high is not None:
            parts.append(f"{'<' if self.high_open else '<='} {self.high:g}")
        return "must be " + " and ".join(parts) + (f" ({self.why})" if self.why else "")


POSITIVE = Range(0, low_open=True)


def setting(default: Any, *, range: Range | None = None, choices: tuple[str, ...] | None = None, doc: str = "",
            example: Any = MISSING) -> Any:
    """A section's field for one key: its ``default``, the ``range`` or ``choices`` it must be in, and
    ``doc``, what it does. ``example``: the example config shows the key commented out with this value
    (a key whose default is "unset", or a table)."""
    meta: dict[str, Any] = {"doc": doc}
    if range is not None:
        meta["range"] = range
    if choices is not None:
        meta["choices"] = choices
    if example is not MISSING:
        meta["example"] = example
    if isinstance(default, dict):  # a table: each instance its own (only {} is a default here)
        return Field(MISSING, dict, metadata=meta)
    return Field(default, metadata=meta)  # as values.field(default=..., metadata=...), one call less
