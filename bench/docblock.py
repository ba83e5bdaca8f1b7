"""The figures a benchmark writes into a doc page, and the dated notes beside them: every measured
figure in docs/ is one or the other, and ``tests/test_docs.py`` reads both through this module.

A generated block lies between two marker lines; the first names the bench, the commit it ran at
(clean: a run on uncommitted code is not written) and the day, and a digest of the block's text, so
that a hand edit of the figures (or of the stamp) fails the test::

    <!-- bench_isolate: written by bench/bench_isolate.py at 95f4d47, 2026-12-03; sha256 1f2e3d4c5b6a7988 -->
    ...
    <!-- /bench_isolate -->

A block its bench has not yet written at a commit of this repository is empty, its first marker
``<!-- NAME: written by bench/NAME.py; not yet run -->``.

A dated note holds figures measured once and not rerun by a script (a real cluster's hour, another
machine); its first line says when and at which commit, for the reader::

    <!-- dated note -->
    *Dated note (2026-12-01, figures committed in 5f11f36; not rerun since):* ...
    <!-- /dated note -->
"""

from __future__ import annotations

import datetime
import hashlib
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_BLOCK = re.compile(r"^<!-- (?P<name>\w+): written by bench/(?P=name)\.py"
                    r"(?:; not yet run| at (?P<commit>[0-9a-f]{7,40}), (?P<date>\d{4}-\d\d-\d\d); sha256 (?P<digest>[0-9a-f]{16}))"
                    r" -->\n(?P<body>.*?)^<!-- /(?P=name) -->", re.M | re.S)
_NOTE = re.compile(r"^[ \t]*<!-- dated note -->\n(?P<body>.*?)^[ \t]*<!-- /dated note -->", re.M | re.S)
#: The first line of a dated note: its day, and the commit(s) its figures were measured at or committed in.
NOTE_HEAD = re.compile(r"^[ \t]*\*Dated note \((?P<date>\d{4}-\d\d-\d\d)(?: to \d{4}-\d\d-\d\d)?, [^)]*?"
                       r"(?P<commits>\b[0-9a-f]{7,40}\b(?:(?:, | and | to )[0-9a-f]{7,40}\b)*)[^)]*\):\*")


def digest(name: str, commit: str, date: str, body: str) -> str:
    """What the stamp's ``sha256`` says: the block's name, commit, day and text, hashed together."""
    return hashlib.sha256(f"{name} {commit} {date}\n{body}".encode()).hexdigest()[:16]


def blocks(text: str) -> list[dict[str, str | None]]:
    """Every generated block of a page: name, commit, date, digest (None: not yet run) and body."""
    return [m.groupdict() for m in _BLOCK.finditer(text)]


def notes(text: str) -> list[str]:
    """Every dated note of a page, its text."""
    return [m.group("body") for m in _NOTE.finditer(text)]


def spans(text: str) -> list[tuple[int, int]]:
    """Where the page's generated blocks and dated notes lie (start, end offsets)."""
    return [m.span() for m in (*_BLOCK.finditer(text), *_NOTE.finditer(text))]


def clean_commit(root: str = ROOT) -> str:
    """The checkout's commit, short; SystemExit when code is uncommitted (changes under docs/ aside:
    they are where figures go), as figures must name the code they measured."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                          timeout=10)
    if head.returncode != 0:
        raise SystemExit(f"not a git checkout ({head.stderr.strip()}): figures need the commit they ran at")
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True,
                           text=True, timeout=30).stdout.splitlines()
    changed = [line[3:] for line in dirty if not line[3:].startswith("docs/")]
    if changed:
        raise SystemExit(f"uncommitted changes ({', '.join(changed[:5])}): commit them, then run this again, so "
                         "that the figures name the code they measured (or run it without writing the page)")
    return head.stdout.strip()


class DocBlock:
    """The block ``NAME`` of ``page``."""

    def __init__(self, page: str, name: str):
        self.page = page
        self.name = name

    def _find(self) -> tuple[str, re.Match[str]] | None:
        with open(self.page, encoding="utf-8") as fh:
            text = fh.read()
        found = next((m for m in _BLOCK.finditer(text) if m.group("name") == self.name), None)
        return (text, found) if found else None

    def found(self) -> bool:
        return self._find() is not None

    def check(self, root: str) -> int:
        """``--check-markers``: say whether the page has the markers; the exit status."""
        ok = self.found()
        print(f"{os.path.relpath(self.page, root)}: {'markers found' if ok else 'markers missing'}")
        return 0 if ok else 1

    def ready(self) -> str:
        """Before a run that will write: the commit it runs at (SystemExit when it cannot be written)."""
        if not self.found():
            raise SystemExit(f"{self.page} lacks the markers of {self.name}")
        return clean_commit(ROOT)

    def write(self, body: str, commit: str | None = None) -> None:
        """Put ``body`` between the markers, stamped with ``commit`` (that of :meth:`ready`, taken
        before the run) and today's date."""
        commit = commit or clean_commit(ROOT)
        parts = self._find()
        if parts is None:
            raise SystemExit(f"{self.page} lacks the markers of {self.name}")
        text, m = parts
        date = datetime.date.today().isoformat()
        head = (f"<!-- {self.name}: written by bench/{self.name}.py at {commit}, {date}; "
                f"sha256 {digest(self.name, commit, date, body)} -->\n")
        with open(self.page, "w", encoding="utf-8") as fh:
            fh.write(f"{text[:m.start()]}{head}{body}<!-- /{self.name} -->{text[m.end():]}")
