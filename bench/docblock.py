"""The block a benchmark writes into a doc page, between its two marker lines: figures come from
the bench that measured them, never from a hand edit."""

from __future__ import annotations

import os


class DocBlock:
    """``<!-- NAME: written by bench/NAME.py -->`` ... ``<!-- /NAME -->`` in ``page``."""

    def __init__(self, page: str, name: str):
        self.page = page
        self.begin = f"<!-- {name}: written by bench/{name}.py -->"
        self.end = f"<!-- /{name} -->"

    def _parts(self) -> tuple[str, str] | None:
        with open(self.page, encoding="utf-8") as fh:
            text = fh.read()
        head, sep, rest = text.partition(self.begin)
        _, sep2, tail = rest.partition(self.end)
        return (head, tail) if sep and sep2 else None

    def found(self) -> bool:
        return self._parts() is not None

    def check(self, root: str) -> int:
        """``--check-markers``: say whether the page has the markers; the exit status."""
        ok = self.found()
        print(f"{os.path.relpath(self.page, root)}: {'markers found' if ok else 'markers missing'}")
        return 0 if ok else 1

    def write(self, block: str) -> None:
        parts = self._parts()
        if parts is None:
            raise SystemExit(f"{self.page} lacks the markers {self.begin} ... {self.end}")
        head, tail = parts
        with open(self.page, "w", encoding="utf-8") as fh:
            fh.write(f"{head}{self.begin}\n{block}{self.end}{tail}")
