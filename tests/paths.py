"""Where the tests find the checkout and their fixture files, whatever folder a test lives in."""

from __future__ import annotations

import os

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
FIXTURES = os.path.join(TESTS, "fixtures")
