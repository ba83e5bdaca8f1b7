"""``import amdsmi`` in tests: the shared fake's :data:`fakes.fake_amdsmi.DEFAULT` (eight healthy
MI300X), put on ``sys.path`` only by the tests that need an importable amdsmi."""

import sys

from fakes.fake_amdsmi import DEFAULT

sys.modules[__name__] = DEFAULT
