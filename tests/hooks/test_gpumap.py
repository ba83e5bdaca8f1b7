"""One GPU, one identity: Slurm's GRES index -> device file -> minor -> NVML, and the jobs a fault touches.

Simulated GPUs (the sim backend) and real NVML answers through the shared fake NVML; Slurm's side is
a gres.conf file, ``slurmd -G`` output captured on real nodes (tests/fixtures/slurm) and literal
``scontrol -d show job`` detail lines, fed to the shared in-memory Slurm.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from fakes import FakeNvml
from fakes.config import sim_config
from fakes.slurm import FakeSlurm
from paths import FIXTURES

from slurm_hooks.hooks import healthcheck, jobhooks
from slurm_hooks.models import GpuSnapshot, MigDevice, NodeSnapshot
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.probes import sim
from slurm_hooks.probes.nvml import NvmlProbe
from slurm_hooks.remedy import gpumap, requeue
from slurm_hooks.remedy.outcome import Outcome
from slurm_hooks.remedy.wiring import Wiring
from slurm_hooks.slurm import gres
from slurm_hooks.slurm.scontrol import parse_job_gpus

SLURM = Path(FIXTURES) / "slurm"
REVERSE = "NodeName=n1 Name=gpu File=" + ",".join(f"/dev/nvidia{k}" for k in range(7, -1, -1)) + "\n"


def node(tmp_path, gres_conf: str | None = REVERSE, gpus: int = 8, mig: int = 0, minors=None):
    if gres_conf is not None:
        (tmp_path / "gres.conf").write_text(gres_conf)
    cfg = sim_config(tmp_path, f"[expect]\ngpus = {gpus}")
    if gres_conf is None:
        (tmp_path / "gres.conf").unlink()
    sim.init(cfg.gpu.sim_dir, "n1", gpus, minors=minors, mig=mig)
    slurm = FakeSlurm()
    slurm.add_node("n1", "IDLE")
    w = Wiring(cfg, "n1", AuditLog(cfg.log.audit), slurm_override=slurm)
    return SimpleNamespace(w=w, slurm=slurm, sim_dir=cfg.gpu.sim_dir, audit=w.audit)


def detail(gres_value: str) -> tuple[int, ...] | None:
    """What Slurm says a job holds on n1, from its ``scontrol -d show job`` detail line."""
    return parse_job_gpus(f"JobId=1 JobName=x   Nodes=n1 CPU_IDs=0-1 Mem=0 GRES={gres_value} MinCPUsNode=1", "n1")


def run_jobs(t, jobs: dict[int, str]) -> None:
    for job_id, gres_value in jobs.items():
        t.slurm.add_job(job_id, "n1")
        t.slurm.set_job_gpus(job_id, detail(gres_value))


def requeues(t) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in t.audit.read():
        if r.get("action") == "requeue":
            out.setdefault(r["result"], []).append(r["target"])
    return out


def snap_of(*gpus: GpuSnapshot) -> NodeSnapshot:
    return NodeSnapshot("n1", "test", gpus=gpus, taken_at=time.time())


# --- the map -----------------------------------------------------------------------------------


def test_reverse_gres_conf_maps_gres_0_to_the_gpu_behind_dev_nvidia7(tmp_path):
    t = node(tmp_path)
    snap = t.w.probe().snapshot()
    gmap = gpumap.current(t.w, snap)
    assert gmap.known, gmap.problem
    assert [(s.gres, s.minor, s.gpu) for s in gmap.slots] == [(k, 7 - k, 7 - k) for k in range(8)]
    assert gmap.slot(0).uuid == snap.gpu(7).uuid
    assert gmap.describe()[0].startswith(f"GRES 0 -> /dev/nvidia7 (minor 7) -> GPU 7 {snap.gpu(7).uuid}")


def test_nvml_minor_numbers_tie_files_to_gpus_whatever_nvmls_order(tmp_path):
    fake = FakeNvml.healthy(gpus=4)
    for k, minor in enumerate([2, 3, 0, 1]):  # PCI order and the driver's device numbers disagree
        fake.set(k, minor=minor)
    snap = NvmlProbe("n1", kmsg_path="/nonexistent", nvml=fake).snapshot()
    assert [g.minor for g in snap.gpus] == [2, 3, 0, 1]
    gmap = gpumap.build(gres.parse("Name=gpu File=/dev/nvidia[0-3]\n", "n1"), snap)
    assert [s.gpu for s in gmap.slots] == [2, 3, 0, 1] and gmap.known


def test_the_map_is_cached_for_the_boot_and_keeps_a_gpu_that_fell_off_the_bus(tmp_path):
    t = node(tmp_path)
    first = gpumap.current(t.w, t.w.probe().snapshot())
    sim.inject(t.sim_dir, "n1", 7, lost=True)
    lost = t.w.probe().snapshot()
    assert lost.gpu(7).lost
    again = gpumap.current(t.w, lost)
    assert again.known and again.slot(0).uuid == first.slot(0).uuid
    assert gpumap.cached(t.w) == again


@pytest.mark.parametrize("conf, why", [
    (None, "gres.conf unreadable"),
    ("Name=gpu File=/dev/nvidia[0-3]\n", "Slurm gives this node 4 GPU(s), the probe sees 8"),
    ("Name=gpu File=/dev/nvidia[0-8]\n", "GRES 8 (/dev/nvidia8, minor 8) names no GPU the probe sees"),
    ("Name=gpu Count=8\n", "without File="),
])
def test_an_unknown_or_inconsistent_map_says_why(tmp_path, conf, why):
    t = node(tmp_path, conf)
    gmap = gpumap.current(t.w, t.w.probe().snapshot())
    assert not gmap.known and why in gmap.problem


@pytest.mark.parametrize("detect", ["nvml", "nvidia"])  # nvidia: 24.11's autodetection without NVML
def test_autodetect_alone_numbers_gpus_in_nvmls_order(tmp_path, detect):
    t = node(tmp_path, f"AutoDetect={detect}\n", minors=[3, 2, 1, 0, 4, 5, 6, 7])
    gmap = gpumap.current(t.w, t.w.probe().snapshot())
    assert gmap.known and [(s.gres, s.gpu, s.file) for s in gmap.slots[:2]] == [(0, 0, "/dev/nvidia3"),
                                                                                  (1, 1, "/dev/nvidia2")]


# --- which jobs a fault touches ----------------------------------------------------------------


def test_xid79_on_the_gpu_behind_gres_0_requeues_that_job_not_its_neighbour(tmp_path):
    t = node(tmp_path)
    run_jobs(t, {101: "gpu:1(IDX:0)", 102: "gpu:1(IDX:1)"})
    sim.inject(t.sim_dir, "n1", 7, xid=79)  # NVML GPU 7 is /dev/nvidia7: GRES index 0
    healthcheck.run(t.w, follow="none")
    assert requeues(t) == {"ok": ["101"], "spared": ["102"]}


def test_cpu_only_job_beside_a_gpu_job_is_never_touched_by_a_gpu_fault(tmp_path):
    t = node(tmp_path)
    run_jobs(t, {201: "", 202: "gpu:1(IDX:1)"})  # GRES index 1 is NVML 6
    sim.inject(t.sim_dir, "n1", 3, xid=79)
    healthcheck.run(t.w, follow="none")
    assert requeues(t) == {"spared": ["201", "202"]}
    spared = {r["target"]: r["detail"] for r in t.audit.read() if r.get("result") == "spared"}
    assert "no GPU on this node" in spared["201"] and "GPU 6" in spared["202"]


def test_a_job_whose_requeue_is_under_way_is_not_logged_as_left_to_run(tmp_path):
    # A requeued job still COMPLETING on the node shows no GPUs any more: the next run (its
    # epilog) must not call it spared, "left to run".
    t = node(tmp_path)
    run_jobs(t, {101: "gpu:1(IDX:0)", 102: "gpu:1(IDX:1)"})
    t.slurm.add_job(103, "n1", "COMPLETING")
    t.slurm.set_job_gpus(103, detail(""))
    sim.inject(t.sim_dir, "n1", 7, xid=79)
    healthcheck.run(t.w, follow="none")
    assert requeues(t) == {"ok": ["101"], "spared": ["102"], "skipped": ["103"]}


def test_shard_job_on_the_faulty_gpu_is_requeued_one_on_another_is_not(tmp_path):
    t = node(tmp_path)
    run_jobs(t, {301: "shard:2(0/4,2/4,0/4,0/4,0/4,0/4,0/4,0/4)",  # GRES 1: NVML 6
                 302: "shard:1(IDX:2)"})  # Slurm 22.05's form: GRES 2, NVML 5
    sim.inject(t.sim_dir, "n1", 6, xid=79)
    healthcheck.run(t.w, follow="none")
    assert requeues(t) == {"ok": ["301"], "spared": ["302"]}


def test_unknown_map_requeues_every_gpu_job_and_says_so_but_spares_cpu_only_jobs(tmp_path):
    t = node(tmp_path, None)
    run_jobs(t, {401: "gpu:1(IDX:0)", 402: "gpu:1(IDX:5)", 403: ""})
    sim.inject(t.sim_dir, "n1", 3, xid=79)
    healthcheck.run(t.w, follow="none")
    assert requeues(t) == {"ok": ["401", "402"], "spared": ["403"]}
    ok = [r for r in t.audit.read() if r.get("result") == "ok" and r.get("action") == "requeue"]
    assert all(r["scope"] == "node" and "GPU map unknown (gres.conf unreadable" in r["fallback"] for r in ok)


def test_a_job_whose_gpus_slurm_does_not_say_is_touched(tmp_path):
    t = node(tmp_path)
    run_jobs(t, {501: "mps(CNT:50)", 502: "gpu:1(IDX:7)"})
    sim.inject(t.sim_dir, "n1", 3, xid=79)
    healthcheck.run(t.w, follow="none")
    assert requeues(t) == {"ok": ["501"], "spared": ["502"]}


def test_explain_names_the_job_on_the_faulty_gpu_through_the_map(tmp_path):
    t = node(tmp_path)
    run_jobs(t, {601: "gpu:1(IDX:0)", 602: "gpu:1(IDX:7)"})
    sim.inject(t.sim_dir, "n1", 7, xid=79)
    report = healthcheck.judge(t.w, healthcheck.Context.CHECK)
    [xid] = [e for e in requeue.explain(t.w, report) if e["check"] == "xid"]
    assert xid["requeues"] == ["601"] and xid["gpu_map"] == "known"


# --- MIG ---------------------------------------------------------------------------------------


def mig_gpu(index: int, minor: int, uuid: str, instances: list[tuple[str, int]]) -> GpuSnapshot:
    return GpuSnapshot(index, uuid, minor=minor, mig=tuple(MigDevice(u, gi, 0) for u, gi in instances))


def test_slurmd_log_of_mig_instances_maps_each_to_its_parent_and_gpu_instance():
    conf = gres.parse_slurmd_g((SLURM / "slurmd-log-mig-a100.txt").read_text())
    parent = "GPU-ede6b90f-50d8-42f2-57a1-8a531adc3192"
    snap = snap_of(mig_gpu(0, 1, parent, [(f"MIG-{k}", gi) for k, gi in enumerate([9, 10, 11, 12])]))
    gmap = gpumap.build(conf, snap, "slurmd -G")
    assert gmap.known, gmap.problem
    assert [(s.gres, s.gpu, s.instance) for s in gmap.slots] == [(0, 0, 12), (1, 0, 11), (2, 0, 10), (3, 0, 9)]
    # A whole-GPU fault (XID 79) touches every instance's job; an instance's fault, that instance's only.
    assert gpumap.touches(gmap, (2,), frozenset({0}))
    assert gpumap.touches(gmap, (0,), frozenset(), frozenset({(0, 12)}))
    assert not gpumap.touches(gmap, (1,), frozenset(), frozenset({(0, 12)}))


def test_mig_instance_xid_touches_only_that_instances_job(tmp_path):
    t = node(tmp_path, "AutoDetect=nvml\n", gpus=2, mig=3)
    state = sim.read(t.sim_dir, "n1")
    # slurmd -G on this node: GRES 0..5 are GPU 0's instances 1..3, then GPU 1's.
    uid = [m["uuid"] for g in state["gpus"] for m in g["mig"]]
    gmap = gpumap.build(gres.parse_slurmd_g("\n".join(
        f"Gres Name=gpu Type=1g.10gb Count=1 Index=0 ID=7696487 File=/dev/nvidia{k // 3},"
        f"/dev/nvidia-caps/nvidia-cap{10 + k} Links=(null) Flags=HAS_FILE UniqueId={uid[k]}" for k in range(6))),
        t.w.probe().snapshot())
    assert gmap.known and [(s.gpu, s.instance) for s in gmap.slots] == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]
    sim.inject(t.sim_dir, "n1", 1, xid=95, instance=2)
    report = healthcheck.judge(t.w, healthcheck.Context.CHECK)
    assert report.requeue_gpus() == frozenset() and report.requeue_instances() == frozenset({(1, 2)})
    assert [gpumap.touches(gmap, (k,), report.requeue_gpus(), report.requeue_instances()) for k in range(6)] == [
        False, False, False, False, True, False]


def test_mig_indexed_prolog_never_drains_a_healthy_node(tmp_path):
    t = node(tmp_path, "AutoDetect=nvml\n", gpus=8, mig=7)
    gmap = gpumap.current(t.w, t.w.probe().snapshot())
    assert not gmap.known and "MIG" in gmap.problem
    for env in ({"SLURM_JOB_ID": "12", "SLURM_JOB_GPUS": "12", "CUDA_VISIBLE_DEVICES": "12"},
                {"SLURM_JOB_ID": "55", "SLURM_JOB_GPUS": "55"},
                {"SLURM_JOB_ID": "56", "CUDA_VISIBLE_DEVICES": sim.read(t.sim_dir, "n1")["gpus"][3]["mig"][2]["uuid"]}):
        assert jobhooks.prolog(t.w, env) == 0
    assert not t.slurm.peek("n1").drained and t.slurm.calls == []


def test_mig_uuid_token_judges_its_parent_gpu(tmp_path):
    t = node(tmp_path, "AutoDetect=nvml\n", gpus=2, mig=2)
    state = sim.read(t.sim_dir, "n1")
    sim.inject(t.sim_dir, "n1", 0, xid=79)
    env = {"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": state["gpus"][1]["mig"][0]["uuid"]}
    assert jobhooks.prolog(t.w, env) == 0  # its parent (GPU 1) is healthy: GPU 0's XID is not its
    env = {"SLURM_JOB_ID": "8", "CUDA_VISIBLE_DEVICES": state["gpus"][0]["mig"][1]["uuid"]}
    assert jobhooks.prolog(t.w, env) == 1
    assert t.slurm.peek("n1").reason == "slurm-hooks: XID 79 on GPU 0 [reboot]"


def test_prolog_judges_the_gpu_behind_its_gres_index_not_nvmls_same_number(tmp_path):
    t = node(tmp_path)
    sim.inject(t.sim_dir, "n1", 0, xid=79)  # NVML 0 is /dev/nvidia0: GRES index 7
    assert jobhooks.prolog(t.w, {"SLURM_JOB_ID": "9", "SLURM_JOB_GPUS": "0"}) == 0
    assert jobhooks.prolog(t.w, {"SLURM_JOB_ID": "10", "SLURM_JOB_GPUS": "7"}) == 1


def test_an_instance_fault_on_another_gpu_spares_a_whole_gpu_job(tmp_path):
    t = node(tmp_path)
    run_jobs(t, {701: "gpu:1(IDX:0)"})
    gpumap.current(t.w, t.w.probe().snapshot())  # a run of this boot built the map
    out = Outcome()
    requeue.requeue_jobs(t.w, out, follow="none", gpus=frozenset(), instances=frozenset({(5, 1)}))
    assert out.requeued == [] and requeues(t) == {"spared": ["701"]}


def test_slurmd_g_of_mig_multiplefiles_names_instances_through_the_drivers_mig_minors():
    # Captured on the testbed (`testbed up --gres-order 7,...,0 --mig 2`, Slurm 22.05.8): each instance
    # is a MultipleFiles GRES, its GPU's file then its nvidia-cap; slurmd prints no UniqueId for them.
    conf = gres.parse_slurmd_g((SLURM / "slurmd-G-22.05-mig-multiplefiles.txt").read_text())
    assert len(conf.devices) == 16 and all(d.mig and not d.unique_id for d in conf.devices)
    snap = snap_of(*(mig_gpu(k, k, f"GPU-{k}", [(f"MIG-{k}-{gi}", gi) for gi in (1, 2)]) for k in range(8)))
    minors = gpumap.parse_mig_minors(sim.mig_minors(list(range(8)), 2))
    gmap = gpumap.build(conf, snap, "slurmd -G", minors)
    assert gmap.known, gmap.problem
    assert [(s.gpu, s.instance, s.mig_uuid) for s in gmap.slots[:3]] == [(7, 1, "MIG-7-1"), (7, 2, "MIG-7-2"),
                                                                        (6, 1, "MIG-6-1")]
    assert not gpumap.build(conf, snap, "slurmd -G").known  # without mig-minors, no instance is named


def test_mig_minors_lines_as_the_driver_writes_them():
    text = "config 1\nmonitor 2\ngpu0/gi1/access 21\ngpu0/gi1/ci0/access 22\ngpu3/gi13/access 174\nbogus\n"
    assert gpumap.parse_mig_minors(text) == {21: (0, 1), 22: (0, 1), 174: (3, 13)}


def test_sim_init_cli_takes_minors_and_mig(tmp_path, capsys):
    from slurm_hooks.cli import main

    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[gpu]\nbackend = "sim"\nsim_dir = "{tmp_path}/sim"\n')
    argv = ["sim", "init", "--config", str(cfg), "--node", "n1", "--gpus", "2"]
    with pytest.raises(SystemExit) as ok:
        main([*argv, "--minors", "1,0", "--mig", "3"])
    assert ok.value.code == 0
    gpus = sim.read(f"{tmp_path}/sim", "n1")["gpus"]
    assert [g["minor"] for g in gpus] == [1, 0] and [len(g["mig"]) for g in gpus] == [3, 3]
    with pytest.raises(SystemExit) as bad:
        main([*argv, "--minors", "1,1"])
    err = capsys.readouterr().err
    assert bad.value.code != 0 and "distinct minor numbers" in err and "Traceback" not in err


def test_admin_comment_names_the_jobs_gpu_as_slurm_numbers_it_when_nvmls_differs(tmp_path):
    t = node(tmp_path)
    run_jobs(t, {801: "gpu:1(IDX:0)"})
    sim.inject(t.sim_dir, "n1", 7, xid=79)
    healthcheck.run(t.w, follow="none")
    assert t.slurm.admin_comments[801].startswith(
        "slurm-hooks: requeued from n1, XID 79 on GPU 7 (the job's GPU 0 as Slurm numbers them), ")
    (tmp_path / "p").mkdir()
    refused = node(tmp_path / "p")
    sim.inject(refused.sim_dir, "n1", 6, xid=79)
    refused.slurm.add_job(802, "n1")
    assert jobhooks.prolog(refused.w, {"SLURM_JOB_ID": "802", "SLURM_JOB_GPUS": "1"}) == 1
    assert "XID 79 on GPU 6 (the job's GPU 1 as Slurm numbers them)" in refused.slurm.admin_comments[802]


def test_incident_names_each_requeued_jobs_gpu_as_slurm_numbers_it(tmp_path):
    from slurm_hooks.observe import incidents

    t = node(tmp_path)
    run_jobs(t, {901: "gpu:2(IDX:0-1)", 902: "gpu:1(IDX:2)"})
    sim.inject(t.sim_dir, "n1", 6, xid=79)  # NVML 6 is GRES 1
    healthcheck.run(t.w, follow="none")
    [inc] = incidents.build(t.audit.read())
    summary = incidents.summary(inc)
    assert summary["gpus"][0]["index"] == 6
    assert [(j["job_id"], j["how"], j.get("gpus")) for j in summary["jobs"]] == [("901", "requeued", [0, 1])]


def test_explain_says_when_the_map_is_unknown_and_counts_every_gpu_job(tmp_path, capsys):
    from slurm_hooks.commands.check import print_explained

    t = node(tmp_path, None)
    run_jobs(t, {1001: "gpu:1(IDX:0)", 1002: "gpu:1(IDX:7)", 1003: ""})
    sim.inject(t.sim_dir, "n1", 7, xid=79)
    report = healthcheck.judge(t.w, healthcheck.Context.CHECK)
    entries = requeue.explain(t.w, report)
    [xid] = [e for e in entries if e["check"] == "xid"]
    assert xid["requeues"] == ["1001", "1002"] and xid["gpu_map"].startswith("gres.conf unreadable")
    print_explained(report, entries, as_json=False)
    line = next(x for x in capsys.readouterr().out.splitlines() if " xid: " in x)
    assert "requeue 1001, 1002 (every GPU job: GPU map unknown, gres.conf unreadable" in line


def test_nvml_probe_reads_mig_instances_and_a_gpu_lost_mid_read_keeps_its_minor():
    import pynvml

    fake = FakeNvml.healthy(gpus=2)
    fake.set(1, mig=[("MIG-5c1e-a", 1, 0), ("MIG-5c1e-b", 2, 0)])
    snap = NvmlProbe("n1", kmsg_path="/nonexistent", nvml=fake).snapshot()
    assert snap.gpus[0].mig == () and snap.gpus[1].mig == (MigDevice("MIG-5c1e-a", 1, 0), MigDevice("MIG-5c1e-b", 2, 0))
    fake.fail("nvmlDeviceGetTotalEccErrors", gpu=1, code=pynvml.NVML_ERROR_GPU_IS_LOST)
    lost = NvmlProbe("n1", kmsg_path="/nonexistent", nvml=fake).snapshot().gpus[1]
    assert lost.lost and lost.minor == 1 and lost.uuid


def test_gres_source_slurmd_builds_the_map_from_slurmd_g_and_says_why_when_it_fails(tmp_path):
    captured = SLURM / "slurmd-G-22.05-gres-reverse.txt"
    script = tmp_path / "slurmd"
    script.write_text(f"#!/bin/sh\n[ \"$1 $2 $3\" = '-G -N n1' ] || exit 3\ncat {captured}\n")
    script.chmod(0o755)
    (tmp_path / "gres.conf").write_text("Name=gpu File=/dev/nvidia[0-7]\n")  # what slurmd says wins
    cfg = sim_config(tmp_path, '[expect]\ngpus = 8\n').path
    text = Path(cfg).read_text().replace("[gpu]\n", f'[gpu]\ngres_source = "slurmd"\nslurmd = "{script}"\n')
    Path(cfg).write_text(text)
    from slurm_hooks import config

    loaded = config.load(cfg)
    sim.init(loaded.gpu.sim_dir, "n1", 8)
    w = Wiring(loaded, "n1", AuditLog(loaded.log.audit), slurm_override=FakeSlurm())
    gmap = gpumap.current(w, w.probe().snapshot())
    assert gmap.known and gmap.source == "slurmd -G" and [s.gpu for s in gmap.slots] == list(range(7, -1, -1))
    script.write_text("#!/bin/sh\necho 'slurmd: fatal: Unable to determine this slurmd NodeName' >&2\nexit 1\n")
    gmap = gpumap.read(w, w.probe().snapshot())[0]
    assert not gmap.known and "slurmd -G -N n1 failed" in gmap.problem


def test_epilog_judges_the_gpu_behind_its_gres_index(tmp_path):
    t = node(tmp_path)
    env = {"SLURM_JOB_ID": "1101", "SLURM_JOB_GPUS": "0"}  # GRES 0 is NVML 7
    assert jobhooks.prolog(t.w, env) == 0
    sim.inject(t.sim_dir, "n1", 0, xid=79)  # NVML 0: not this job's GPU
    assert jobhooks.epilog(t.w, env) == 0 and not t.slurm.peek("n1").drained
    env = {"SLURM_JOB_ID": "1102", "SLURM_JOB_GPUS": "0"}
    assert jobhooks.prolog(t.w, env) == 0
    sim.inject(t.sim_dir, "n1", 7, ecc_uncorrectable=2)  # during the job, on its own GPU
    assert jobhooks.epilog(t.w, env) == 0
    assert t.slurm.peek("n1").drained and "GPU 7" in t.slurm.peek("n1").reason
