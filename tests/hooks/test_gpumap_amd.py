"""AMD Instinct GPUs in Slurm's GRES: ``File=/dev/dri/renderD<minor>`` tied to amdsmi's render
minor, compute partitions and an MI250X's two dies each a Slurm GPU, so a fault requeues exactly
the jobs on that GPU (the shared fake amdsmi; the shared in-memory Slurm)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from fakes.config import sim_config
from fakes.fake_amdsmi import FakeAmdSmi
from fakes.slurm import FakeSlurm

from slurm_hooks import engine
from slurm_hooks.hooks import healthcheck, jobhooks
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.probes.amdsmi import AmdSmiProbe
from slurm_hooks.remedy import gpumap
from slurm_hooks.remedy.wiring import Wiring
from slurm_hooks.slurm import gres
from slurm_hooks.slurm.scontrol import parse_job_gpus


def render_conf(minors) -> str:
    return "NodeName=n1 Name=gpu File=" + ",".join(f"/dev/dri/renderD{m}" for m in minors) + "\n"


def node(tmp_path, fake: FakeAmdSmi, conf: str):
    (tmp_path / "gres.conf").write_text(conf)
    cfg = sim_config(tmp_path, f"[expect]\ngpus = {len(fake.gpus)}")
    slurm = FakeSlurm()
    slurm.add_node("n1", "IDLE")
    probe = AmdSmiProbe("n1", amdsmi=fake, drm_root=str(tmp_path / "no-drm"))
    w = Wiring(cfg, "n1", AuditLog(cfg.log.audit), probe_override=probe, slurm_override=slurm)
    return SimpleNamespace(w=w, slurm=slurm, audit=w.audit, fake=fake)


def run_jobs(t, jobs: dict[int, int]) -> None:
    """Job id -> the GRES index it holds on n1, as ``scontrol -d show job`` says it."""
    for job_id, index in jobs.items():
        t.slurm.add_job(job_id, "n1")
        line = f"JobId={job_id} JobName=x   Nodes=n1 CPU_IDs=0-1 Mem=0 GRES=gpu:1(IDX:{index}) MinCPUsNode=1"
        t.slurm.set_job_gpus(job_id, parse_job_gpus(line, "n1"))


def requeued(t) -> list[str]:
    return sorted(r["target"] for r in t.audit.read() if r.get("action") == "requeue" and r["result"] == "ok")


def test_render_nodes_tie_gres_to_amdsmi_gpus_whatever_the_order(tmp_path):
    t = node(tmp_path, FakeAmdSmi.healthy(gpus=8), render_conf(range(135, 127, -1)))
    snap = t.w.probe().snapshot()
    gmap = gpumap.current(t.w, snap)
    assert gmap.known, gmap.problem
    assert [(s.gres, s.minor, s.gpu) for s in gmap.slots] == [(k, 135 - k, 7 - k) for k in range(8)]
    assert gmap.describe()[0] == f"GRES 0 -> /dev/dri/renderD135 (minor 135) -> GPU 7 {snap.gpu(7).uuid}"


def test_umc_error_requeues_exactly_the_job_on_that_gpu(tmp_path):
    t = node(tmp_path, FakeAmdSmi.healthy(gpus=8), render_conf(range(135, 127, -1)))
    run_jobs(t, {101: 0, 102: 1, 103: 7})
    t.fake.set(gpu=7, ecc={"UMC": (0, 2, 0)})  # renderD135: GRES index 0
    healthcheck.run(t.w, follow="none")
    assert requeued(t) == ["101"]
    reason = t.slurm.peek("n1").reason
    assert "ECC uncorrectable 2 on GPU 7, block UMC" in reason and "XID" not in reason


def test_a_partitioned_gpus_fault_requeues_the_jobs_of_its_partitions_only(tmp_path):
    fake = FakeAmdSmi.healthy(gpus=2, partitions=4)  # CPX-like: 8 Slurm GPUs on 2 boards
    t = node(tmp_path, fake, render_conf(range(128, 136)))
    run_jobs(t, {201: 1, 202: 4, 203: 6, 204: 3})
    fake.set(gpu=4, ecc={"UMC": (0, 1, 0)})  # read on partition 0 of board 1
    healthcheck.run(t.w, follow="none")
    assert requeued(t) == ["202", "203"]


def test_one_die_of_an_mi250x_is_one_slurm_gpu(tmp_path):
    fake = FakeAmdSmi.healthy(gpus=4, model="AMD Instinct MI250X")
    t = node(tmp_path, fake, render_conf(range(128, 136)))
    run_jobs(t, {301: 2, 302: 3})  # the two dies of board 1
    fake.set(gpu=3, ecc={"UMC": (0, 1, 0)})
    healthcheck.run(t.w, follow="none")
    assert requeued(t) == ["302"]


@pytest.mark.parametrize("variable", ["SLURM_JOB_GPUS", "ROCR_VISIBLE_DEVICES"])
def test_prolog_judges_the_gpu_behind_the_jobs_gres_index_and_never_calls_it_missing(tmp_path, variable):
    """The map names a GPU by its UUID, and amdsmi's have no ``GPU-`` prefix: a prolog that did not
    know them would call a healthy job's GPU missing and drain the node, and this test fails."""
    t = node(tmp_path, FakeAmdSmi.healthy(gpus=8), render_conf(range(135, 127, -1)))
    t.fake.set(gpu=0, ecc={"UMC": (0, 1, 0)})  # renderD128: GRES index 7
    assert jobhooks.prolog(t.w, {"SLURM_JOB_ID": "401", variable: "0"}) == 0
    assert not t.slurm.peek("n1").drained
    assert jobhooks.prolog(t.w, {"SLURM_JOB_ID": "402", variable: "7"}) != 0
    assert "block UMC" in t.slurm.peek("n1").reason


def test_autodetect_rsmi_alone_is_an_unknown_map_that_says_what_to_do():
    snap = AmdSmiProbe("n1", amdsmi=FakeAmdSmi.healthy(gpus=8), drm_root="/nonexistent").snapshot()
    gmap = gpumap.build(gres.parse("AutoDetect=rsmi\n", "n1"), snap)
    assert not gmap.known and 'gres_source = "slurmd"' in gmap.problem


def rocm_name(fake: FakeAmdSmi, gpu: int) -> str:
    """The GPU as rocminfo and ROCR_VISIBLE_DEVICES name it: GPU- and its ASIC's unique id."""
    return "GPU-" + fake.gpus[gpu]["asic_serial"][2:].lower()


def test_prolog_judges_the_gpu_a_rocm_uuid_in_rocr_visible_devices_names(tmp_path, capsys):
    """ROCm's GPU-<unique id> is not amdsmi's UUID: a prolog that did not read the ASIC serial
    would call a healthy job's GPU missing and drain the node, and this test fails."""
    t = node(tmp_path, FakeAmdSmi.healthy(gpus=8), render_conf(range(128, 136)))
    t.fake.set(gpu=5, ecc={"UMC": (0, 1, 0)})
    env = {"SLURM_JOB_ID": "501", "ROCR_VISIBLE_DEVICES": f"{rocm_name(t.fake, 2)},{rocm_name(t.fake, 3).upper()}"}
    assert jobhooks.prolog(t.w, env) == 0
    assert not t.slurm.peek("n1").drained and "GPU-" not in capsys.readouterr().err
    assert jobhooks.prolog(t.w, {"SLURM_JOB_ID": "502", "ROCR_VISIBLE_DEVICES": rocm_name(t.fake, 5)}) != 0
    assert "ECC uncorrectable 1 on GPU 5, block UMC" in t.slurm.peek("n1").reason


def test_a_rocm_uuid_on_a_partitioned_board_judges_every_partition_of_it(tmp_path):
    fake = FakeAmdSmi.healthy(gpus=2, partitions=4)
    t = node(tmp_path, fake, render_conf(range(128, 136)))
    snap = t.w.probe().snapshot()
    assert engine.select_gpus(snap, [rocm_name(fake, 5)]) == ((4, 5, 6, 7), [], [])


@pytest.mark.parametrize("serial, why", [
    ("N/A", "the amdsmi probe read no ASIC unique id here, so cannot tell which GPU it is"),
    ("0xD1CB9B1A4E0A7AFF", "no GPU here has that ASIC unique id"),
])
def test_a_rocm_uuid_that_names_no_gpu_is_said_and_judges_every_gpu_never_a_missing_one(tmp_path, capsys, serial,
                                                                                       why):
    """Where amdsmi gives no ASIC serial (or the job's id is of another form), the job's GPU cannot
    be told: the prolog says so and judges the whole node, so a healthy node is never drained for
    a name, and a faulty GPU is still found."""
    fake = FakeAmdSmi.healthy(gpus=8)
    for gpu in range(8):
        fake.set(gpu=gpu, asic_serial=serial if serial == "N/A" else fake.gpus[gpu]["asic_serial"])
    t = node(tmp_path, fake, render_conf(range(128, 136)))
    job = "GPU-d1cb9b1a4e0a7aff"
    assert jobhooks.prolog(t.w, {"SLURM_JOB_ID": "601", "ROCR_VISIBLE_DEVICES": job}) == 0
    assert not t.slurm.peek("n1").drained
    assert f"job GPU {job}: {why}; judging every GPU of the node instead" in capsys.readouterr().err
    fake.set(gpu=6, ecc={"UMC": (0, 1, 0)})
    assert jobhooks.prolog(t.w, {"SLURM_JOB_ID": "602", "ROCR_VISIBLE_DEVICES": job}) != 0
    assert "block UMC" in t.slurm.peek("n1").reason and "missing" not in t.slurm.peek("n1").reason


def test_rocrs_name_for_a_gpu_without_a_unique_id_judges_every_gpu():
    snap = AmdSmiProbe("n1", amdsmi=FakeAmdSmi.healthy(gpus=2), drm_root="/nonexistent").snapshot()
    assert engine.select_gpus(snap, ["GPU-XX"]) == ((0, 1), [], ["GPU-XX"])
    assert engine.unnamed_gpu_note(snap, "GPU-XX").startswith("job GPU GPU-XX: ROCm gives it no unique id;")
