"""The AMD probe ties the amdgpu driver's kernel lines to its GPUs by PCI device, as the NVML probe
ties XIDs: a partitioned GPU's line is every partition's, a line of no GPU here is the node's, and a
GPU that stops saying who it is keeps this boot's identity and its line."""

from __future__ import annotations

from fakes.amdgpu_sysfs import add_card
from fakes.fake_amdsmi import STATUS, FakeAmdSmi
from paths import TESTS

from slurm_hooks.models import KERNEL_LOG
from slurm_hooks.probes.amdsmi import AmdSmiProbe
from slurm_hooks.probes.identity import bus_map, store_path

NO_DRM = "/nonexistent/sys/class/drm"
FIXTURE = f"{TESTS}/fixtures/kmsg/amdgpu-mi300x.log"
#: An 8 x MI300X platform's PCI buses, GPU 0..7, as the fixture's lines name them.
BUSES = (0x05, 0x26, 0x46, 0x65, 0x85, 0xA6, 0xC6, 0xE5)


def platform(boards: int = 8, partitions: int = 1) -> FakeAmdSmi:
    """``boards`` MI300X at the platform's buses; each partition shows its own PCI function."""
    fake = FakeAmdSmi.healthy(gpus=boards, partitions=partitions)
    for i in range(boards * partitions):
        board, part = divmod(i, partitions)
        fake.set(gpu=i, bdf=f"0000:{BUSES[board]:02x}:00.{part}")
    return fake


def probe(fake: FakeAmdSmi, kmsg: str, store: str = "") -> AmdSmiProbe:
    return AmdSmiProbe("mi300-1", amdsmi=fake, drm_root=NO_DRM, kmsg_path=kmsg, gpu_map_path=store)


def rules(gpu) -> list[tuple[str, str]]:
    return [(e.rule, e.subject) for e in gpu.xids]


def test_amdgpu_lines_are_tied_to_the_gpu_whose_pci_address_they_name():
    fake = platform()
    s = probe(fake, FIXTURE).snapshot()
    assert s.error is None and not s.unread(KERNEL_LOG)
    assert rules(s.gpus[2]) == [("amdgpu-ue-umc", "umc"), ("amdgpu-reset", ""), ("amdgpu-vram-lost", "")]
    assert rules(s.gpus[3]) == [("amdgpu-ring-timeout", "gfx_0.0.0")]
    assert rules(s.gpus[4]) == [("amdgpu-poison", "")]
    assert rules(s.gpus[6]) == [("amdgpu-reset", ""), ("amdgpu-reset-failed", "")]
    assert rules(s.gpus[7]) == [("amdgpu-ue-xgmi", "xgmi_wafl")]
    assert all((e.gpu, e.uuid) == (g.index, g.uuid) for g in s.gpus for e in g.xids)
    # The older kernel's DRM_ERROR names no device: the node's, never a guess at a GPU.
    assert [(e.rule, e.gpu) for e in s.node_xids] == [("amdgpu-ring-timeout", None)]


def test_a_line_naming_a_partitioned_gpus_device_is_every_partitions_and_no_other_boards(tmp_path):
    """CPX: eight logical GPUs on one board, each with its own PCI function; the driver names the
    board's device (function 0). A probe that matched the address exactly would give the fault to
    partition 0 alone, and the jobs on the other seven would run on a failing board."""
    log = tmp_path / "kmsg"
    log.write_text("[ 812.000001] amdgpu 0000:26:00.0: amdgpu: {3}socket: 0, die: 0, 1 new uncorrectable "
                   "hardware errors detected in umc block\n")
    s = probe(platform(boards=2, partitions=8), str(log)).snapshot()
    assert [g.index for g in s.gpus if rules(g) == [("amdgpu-ue-umc", "umc")]] == list(range(8, 16))
    assert all(g.xids == () for g in s.gpus[:8]) and s.node_xids == ()
    assert len({e.key for g in s.gpus for e in g.xids}) == 1  # one line, one event everywhere


def test_a_line_for_an_address_of_no_gpu_here_is_the_nodes(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text("[ 9.5] amdgpu 0000:f1:00.0: amdgpu: GPU reset(1) failed\n")
    s = probe(platform(boards=2), str(log)).snapshot()
    assert all(g.xids == () for g in s.gpus)
    assert [(e.rule, e.pci_bus_id, e.gpu) for e in s.node_xids] == [("amdgpu-reset-failed", "00000000:F1:00.0", None)]


def test_an_unreadable_kernel_log_is_said_and_the_gpus_stand():
    s = probe(platform(boards=2), "/nonexistent/kmsg").snapshot()
    assert s.error is None and len(s.gpus) == 2
    assert "cannot read kernel log /nonexistent/kmsg" in s.unread(KERNEL_LOG)


def test_a_gpu_that_stops_saying_who_it_is_keeps_this_boots_identity_and_its_line(tmp_path):
    """A GPU gone bad answers amdsmi's identity calls with errors. Its UUID, serial and address come
    from this boot's record, so the driver's line for its address is its own and the page names the
    board; without the record the line would be the node's and the alert would carry no UUID."""
    log, store = tmp_path / "kmsg", store_path(str(tmp_path), "mi300-1")
    log.write_text("")
    fake = platform(boards=4)
    probe(fake, str(log), store).snapshot()  # a run while GPU 2 still answered
    was = fake.gpus[2]
    for fn in ("amdsmi_get_gpu_device_uuid", "amdsmi_get_gpu_device_bdf", "amdsmi_get_gpu_board_info"):
        fake.fail(fn, gpu=2, code=STATUS["NOT_FOUND"])
    log.write_text("[ 8123.456789] amdgpu 0000:46:00.0: amdgpu: {3}socket: 0, die: 0, 1 new uncorrectable "
                   "hardware errors detected in umc block\n")
    s = probe(fake, str(log), store).snapshot()
    gone = s.gpus[2]
    assert gone.remembered and (gone.uuid, gone.serial, gone.pci_bus_id) == (was["uuid"], was["serial"], "0000:46:00.0")
    assert [(e.rule, e.gpu, e.uuid) for e in gone.xids] == [("amdgpu-ue-umc", 2, was["uuid"])]
    assert s.node_xids == ()
    assert bus_map(store)["00000000:46:00.0"] == (2, was["uuid"])  # kept for the watcher and the next run


def test_without_amdsmi_the_ras_files_and_the_kernel_lines_still_judge(tmp_path):
    """The sysfs fallback (the test venv has no amdsmi) reads the same kernel lines for its GPUs."""
    for card, bus in enumerate(BUSES[:4]):
        add_card(tmp_path, card, f"0000:{bus:02x}:00.0")
    log = tmp_path / "kmsg"
    log.write_text("[ 9300.0] amdgpu 0000:a6:00.0: amdgpu: Saved bad pages 176 reaches threshold value 128\n"
                   "[ 9400.0] amdgpu 0000:65:00.0: amdgpu: GPU reset(3) failed\n")
    s = AmdSmiProbe("mi300-1", drm_root=str(tmp_path / "class" / "drm"), kmsg_path=str(log)).snapshot()
    assert s.backend == "amdgpu-sysfs"
    assert rules(s.gpus[3]) == [("amdgpu-reset-failed", "")]
    assert [(e.rule, e.pci_bus_id) for e in s.node_xids] == [("amdgpu-bad-pages", "00000000:A6:00.0")]


def test_the_configured_amd_probe_reads_the_configured_kernel_log_and_keeps_identities_in_the_state_dir(tmp_path):
    from slurm_hooks import config, probes

    for backend in ("amdsmi", "auto"):
        cfg = config.parse(f'[gpu]\nbackend = "{backend}"\n[watch]\nkmsg = "{tmp_path}/kmsg"\n'
                           f'[state]\ndir = "{tmp_path}/state"\n')
        probe = probes.from_config(cfg, "mi300-1")
        amd = probe._amd() if backend == "auto" else probe
        assert (amd.name, amd.kmsg_path, amd.gpu_map_path) == (
            "amdsmi", f"{tmp_path}/kmsg", store_path(f"{tmp_path}/state", "mi300-1")), backend
