"""What a preflight check says: a :class:`Result` line (PASS, WARN or FAIL, what was found,
how to fix it, and where)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any


class Status(str, Enum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"


@dataclass(frozen=True)
class Result:
    check: str
    status: Status
    message: str
    fix: str = ""
    #: ``file:line`` (or a path) the admin should look at; "" when nowhere in particular.
    where: str = ""

    def line(self) -> str:
        what = f"{self.where}: {self.message}" if self.where else self.message
        tail = f" (fix: {self.fix})" if self.fix and self.status is not Status.PASS else ""
        return f"{self.status.value}  {self.check}: {what}{tail}"

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "status": self.status.value, "message": self.message,
                "fix": self.fix, "where": self.where}


def passed(results: Iterable[Result]) -> bool:
    return not any(r.status is Status.FAIL for r in results)
