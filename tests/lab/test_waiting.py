"""The lab's one polling loop."""

from __future__ import annotations

import itertools
import time

from slurm_hooks.lab.waiting import poll


def test_poll_returns_the_first_truthy_value():
    asked = itertools.count(1)
    assert poll(lambda: next(asked) >= 3 and "third", 5, 0.001) == "third"
    assert next(asked) == 4  # asked exactly three times


def test_poll_gives_none_after_the_timeout_having_asked_once_more_at_the_deadline():
    asked = []
    started = time.monotonic()
    assert poll(lambda: asked.append(time.monotonic()) or 0, 0.1, 0.02) is None
    assert time.monotonic() - started >= 0.1 and asked[-1] - started >= 0.1
