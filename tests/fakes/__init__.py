"""Shared fakes, one per thing that cannot run here. Tests import them as ``from fakes import ...``."""

from __future__ import annotations

from .fake_nvml import FakeLink, FakeNvml, healthy_gpu

__all__ = ["FakeLink", "FakeNvml", "healthy_gpu"]
