"""The NVML probe against a real driver and GPU. Skipped where NVML cannot initialise."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from slurm_hooks.probes.nvml import NvmlProbe

pynvml = pytest.importorskip("pynvml")


def _nvml_works() -> bool:
    try:
        pynvml.nvmlInit()
    except Exception:
        return False
    pynvml.nvmlShutdown()
    return True


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _nvml_works(), reason="NVML does not initialise here (no GPU)")]


@pytest.fixture(scope="module")
def snapshot():
    return NvmlProbe("real-node", kmsg_path="/dev/kmsg").snapshot()


def test_real_snapshot_has_gpus_with_uuids_and_identity(snapshot):
    assert snapshot.error is None
    assert snapshot.gpus, "NVML initialised but reported no GPUs"
    assert snapshot.driver_version
    for gpu in snapshot.gpus:
        assert not gpu.lost
        assert gpu.uuid.startswith("GPU-"), gpu.uuid
        assert gpu.model.startswith("NVIDIA"), gpu.model
        assert gpu.pci_bus_id.count(":") == 2, gpu.pci_bus_id
    assert len({g.uuid for g in snapshot.gpus}) == len(snapshot.gpus)


def test_real_values_are_sane(snapshot):
    for gpu in snapshot.gpus:
        assert gpu.temperature_c is not None and 5 <= gpu.temperature_c <= 100, gpu.temperature_c
        if gpu.power_w is not None and gpu.power_limit_w is not None:
            assert 0 < gpu.power_w <= gpu.power_limit_w * 1.5
        if gpu.pcie_width is not None and gpu.pcie_width_max is not None:
            assert gpu.pcie_width <= gpu.pcie_width_max
        assert gpu.memory_used_mib is not None and gpu.memory_used_mib >= 0


def test_no_real_answer_is_called_garbled(snapshot):
    """A healthy GPU's answers must pass the probe's sanity checks, or every node gets a false warning."""
    garbled = [(g.index, name, why) for g in snapshot.gpus for name, why in g.errors]
    assert garbled == []


def test_uuids_match_nvidia_smi(snapshot):
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi not installed")
    out = subprocess.run([smi, "--query-gpu=index,uuid", "--format=csv,noheader"], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    want = [tuple(part.strip() for part in line.split(",")) for line in out.splitlines() if line.strip()]
    assert [(str(g.index), g.uuid) for g in snapshot.gpus] == want


def test_real_snapshot_takes_under_a_second():
    probe = NvmlProbe("real-node", kmsg_path="/dev/kmsg")
    probe.snapshot()  # the first call loads libnvidia-ml
    start = time.perf_counter()
    probe.snapshot()
    assert time.perf_counter() - start < 1.0
