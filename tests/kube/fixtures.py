"""pytest fixtures for the bridge's tests: ``pytest_plugins = ["kube.fixtures"]`` in a test module.

(The test modules live in ``tests/``, so a ``conftest.py`` here would not reach
them, and ``tests/conftest.py`` belongs to the Slurm testbed.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from slurm_hooks.bridge.settings import BridgeSection

from .doubles import Clock
from .memory import InMemoryKube


@pytest.fixture
def kube() -> InMemoryKube:
    return InMemoryKube()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def audit_path(tmp_path) -> str:
    return str(tmp_path / "audit.jsonl")


@pytest.fixture
def bridge_settings(tmp_path) -> BridgeSection:
    return BridgeSection(state_file=str(tmp_path / "bridge-state.json"), drain_pass_budget=10.0)


@pytest.fixture
def kube_server() -> Iterator[Any]:
    pytest.importorskip("kmock")
    pytest.importorskip("kubernetes")
    from .emulator import KubeServer

    server = KubeServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def kube_client(kube_server) -> Iterator[Any]:
    from slurm_hooks.bridge.kubeclient import connect

    client = connect(url=kube_server.url, timeout=5.0, retries=3, backoff=0.01, backoff_max=0.05)
    try:
        yield client
    finally:
        client.close()
