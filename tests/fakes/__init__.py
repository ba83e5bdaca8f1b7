"""Shared fakes, one per thing that cannot run here. Tests import them as ``from fakes import ...``."""

from __future__ import annotations

from .fake_nvml import XID79_GPU2, FakeLink, FakeNvml, healthy_gpu

__all__ = ["XID79_GPU2", "FakeLink", "FakeNvml", "healthy_gpu"]
