"""Where amdsmi is missing, the amdgpu driver's RAS files (sysfs, in the kernel's formats) still
judge ECC and retired pages, and validate says which source it used."""

from __future__ import annotations

from fakes.amdgpu_sysfs import add_card, err_count
from fakes.fake_amdsmi import FakeAmdSmi

from slurm_hooks import engine
from slurm_hooks.models import Action, BadPages, Context, EccBlock, Expectations, Scope
from slurm_hooks.probes import amdras
from slurm_hooks.probes.amdras import SysfsRasProbe, parse_bad_pages, parse_err_count
from slurm_hooks.probes.amdsmi import AmdSmiProbe


def node(tmp_path, cards=4, **faults):
    for card in range(cards):
        add_card(tmp_path, card, f"0000:{0x0c + 0x10 * card:02x}:00.0", **faults.get(f"card{card}", {}))
    return str(tmp_path / "class" / "drm")


def missing_amdsmi(drm_root: str) -> AmdSmiProbe:
    """The AMD probe on a node whose amdsmi cannot be imported (the test venv has none)."""
    return AmdSmiProbe("mi300-1", drm_root=drm_root)


def test_err_count_in_both_kernel_formats():
    assert parse_err_count("ue: 2\nce: 11\n") == (2, 11, None)
    assert parse_err_count("ue: 0\nce: 5\nde: 1\n") == (0, 5, 1)
    assert parse_err_count("Query currently inaccessible\n") == (None, None, None)


def test_bad_pages_counted_by_their_flag():
    text = "0x00001a2b : 0x00001000 : R\n0x00001a2c : 0x00001000 : R\n0x00002000 : 0x00001000 : P\n" \
           "0x00003000 : 0x00001000 : F\n"
    assert parse_bad_pages(text) == {"reserved": 2, "pending": 1, "unreservable": 1}


def test_without_amdsmi_the_ras_files_are_read_with_identity_and_said(tmp_path):
    drm = node(tmp_path, card2={"ras": {"umc": err_count(ue=3, ce=7, de=0)}, "pages": [(0x1a2b, "R")]})
    s = missing_amdsmi(drm).snapshot()
    assert s.error is None and s.backend == "amdgpu-sysfs" and len(s.gpus) == 4
    g = s.gpus[2]
    assert (g.pci_bus_id, g.minor, g.serial) == ("0000:2C:00.0", 130, "PCB0002A1B2C")
    assert g.rocm_uuid == "GPU-d1cb9b1a4e0a7a20"  # the driver's unique_id, as rocminfo names the GPU
    assert EccBlock("UMC", 7, 3, 0) in g.ecc_blocks and g.ecc_volatile_uncorrectable == 3
    assert g.bad_pages == BadPages(1, 0, 0, None)
    assert s.unread(amdras.AMDSMI).startswith("amdsmi not loadable (")
    assert all(gpu.errors == () for gpu in s.gpus)


def test_uncorrectable_umc_error_from_sysfs_drains_naming_the_gpu_and_block(tmp_path):
    drm = node(tmp_path, card1={"ras": {"umc": err_count(ue=1, ce=0, de=0)}})
    snap = missing_amdsmi(drm).snapshot()
    report = engine.judge(snap, engine.JudgeRequest(Expectations(gpus=4), Context.CHECK, deadline_s=30))
    (f,) = report.drain_findings()
    assert (f.summary, f.action, f.scope) == ("ECC uncorrectable 1 on GPU 1, block UMC", Action.RESET, Scope.GPU)


def test_healthy_node_from_sysfs_passes(tmp_path):
    snap = missing_amdsmi(node(tmp_path, card0={"pages": []})).snapshot()
    report = engine.judge(snap, engine.JudgeRequest(Expectations(gpus=4), Context.CHECK, deadline_s=30))
    assert report.findings == ()


def test_a_ras_file_the_driver_cannot_answer_is_a_warning_not_a_count(tmp_path):
    drm = node(tmp_path, cards=1, card0={"ras": {"gfx": "Query currently inaccessible\n"}})
    g = missing_amdsmi(drm).snapshot().gpus[0]
    assert EccBlock("GFX", None, None, None) in g.ecc_blocks
    assert g.errors == (("ecc.GFX", f"{tmp_path}/devices/pci0000:00/0000:0c:00.0/ras/gfx_err_count says "
                                    "'Query currently inaccessible'"),)


def test_other_vendors_cards_are_not_amd_gpus(tmp_path):
    add_card(tmp_path, 0, "0000:17:00.0", vendor="0x10de")
    add_card(tmp_path, 1, "0000:0c:00.0")
    s = missing_amdsmi(str(tmp_path / "class" / "drm")).snapshot()
    assert [g.pci_bus_id for g in s.gpus] == ["0000:0C:00.0"]


def test_no_amdsmi_and_no_amd_gpu_is_a_node_error(tmp_path):
    s = missing_amdsmi(str(tmp_path / "class" / "drm")).snapshot()
    assert s.error.startswith("amdsmi not loadable (") and s.error.endswith("and no GPU of the amdgpu driver in "
                                                                             f"{tmp_path}/class/drm")


def test_threshold_from_the_drivers_module_parameter(tmp_path):
    drm = node(tmp_path, cards=1, card0={"pages": [(1, "R")]})
    param = tmp_path / "module" / "amdgpu" / "parameters" / "bad_page_threshold"
    param.parent.mkdir(parents=True)
    param.write_text("64\n")
    assert SysfsRasProbe("n", drm, threshold_param=str(param)).snapshot().gpus[0].bad_pages.threshold == 64
    param.write_text("-1\n")  # the driver's own default: not told here
    assert SysfsRasProbe("n", drm, threshold_param=str(param)).snapshot().gpus[0].bad_pages.threshold is None


def test_amdsmi_without_enumeration_info_finds_the_render_minor_in_sysfs(tmp_path):
    drm = node(tmp_path, cards=2)
    fake = FakeAmdSmi.healthy(gpus=2).remove("amdsmi_get_gpu_enumeration_info")
    s = AmdSmiProbe("n", amdsmi=fake, drm_root=drm).snapshot()
    assert [g.minor for g in s.gpus] == [128, 129]


def test_a_gpu_whose_driver_has_no_unique_id_has_no_rocm_name(tmp_path):
    add_card(tmp_path, 0, "0000:0c:00.0", unique_id=0)
    (g,) = missing_amdsmi(str(tmp_path / "class" / "drm")).snapshot().gpus
    assert g.rocm_uuid is None and g.errors == ()
