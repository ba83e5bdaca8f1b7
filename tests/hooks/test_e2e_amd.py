"""AMD Instinct nodes on the real testbed, beside an NVIDIA one: one cluster, n1 with simulated
NVIDIA GPUs, n2 with simulated MI300X (gres.conf ``File=.../dev/dri/renderD128,...``), the health
check every 2 s as slurmd runs it, the repair ladder on.

The amdgpu driver's own line for an uncorrectable UMC error under two jobs drains n2 naming the
GPU and the block, requeues the job on that GPU alone, and the ladder resets the GPU with amd-smi,
validates with rvs and returns the node; one ``status``, one report and one pager see both nodes,
each in its vendor's words; a board past its bad-page threshold goes on the RMA list by its serial.

A cluster of its own (one module).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import audit_records, module_testbed, wait_for
from hooks.test_e2e_slurm import TRAP_JOB, wait_started

from slurm_hooks import fsutil
from slurm_hooks.lab.testbed import LabSettings
from slurm_hooks.probes import sim, sim_amd
from slurm_hooks.remedy.repair import read_rma
from slurm_hooks.runner import run_command

pytestmark = pytest.mark.slurm
pytest_plugins = ["fakes.webhook"]

SETTINGS = LabSettings(nodes=2, gpus=4, hooks=True, kill_wait=2, health_check_interval=2, requeue_grace=3.0,
                       repair=True, vendors={"n2": "amd"})
#: What no word about an AMD node may say: NVIDIA's error ids, links, library, tools.
NVIDIA_WORDS = ("XID", "NVLink", "NVML", "nvidia", "DCGM", "dcgmi")

bed, tb = module_testbed("amdbed", SETTINGS)


def records(tb, node=None, action=None, result=None):
    return [r for r in audit_records(tb.audit_log)
            if (node is None or r.get("node") == node) and (action is None or r.get("action") == action)
            and (result is None or r.get("result") == result)]


def nvidia_words(thing) -> list[str]:
    """NVIDIA's words in what ``thing`` says: its text, not its JSON keys (a field such as ``xid`` is
    there, empty, for every vendor)."""
    texts = []

    def walk(x):
        if isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        elif isinstance(x, str):
            texts.append(x.lower())

    walk(thing)
    return [w for w in NVIDIA_WORDS if any(w.lower() in t for t in texts)]


def cli(tb, *args):
    done = subprocess.run([sys.executable, "-m", "slurm_hooks", *args], env=tb.env(), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode in (0, 1), (args, done.returncode, done.stdout, done.stderr)
    return json.loads(done.stdout)


@pytest.fixture
def repair_off(tb):
    """The ladder off for one test (each hook reads the config as it starts), so drains stay as they are."""
    with open(tb.config_path, encoding="utf-8") as fh:
        original = fh.read()
    assert "[repair]\nenabled = true\n" in original
    fsutil.atomic_write(tb.config_path, original.replace("[repair]\nenabled = true\n", "[repair]\nenabled = false\n"),
                        mode=0o600)
    yield tb
    fsutil.atomic_write(tb.config_path, original, mode=0o600)


def test_the_amd_nodes_gpus_are_render_nodes_in_gres_conf_and_a_job_sees_them_as_slurm_numbers_them(tb):
    for i in range(4):
        st = os.stat(tb.path("dev", "dri", f"renderD{128 + i}"))
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (226, 128 + i)
    with open(tb.path("gres.conf"), encoding="utf-8") as fh:
        lines = [line for line in fh.read().splitlines() if line.startswith("NodeName=")]
    assert lines == [f"NodeName=n1 Name=gpu File={','.join(tb.path('dev', f'nvidia{i}') for i in range(4))}",
                     f"NodeName=n2 Name=gpu File={','.join(tb.path('dev', 'dri', f'renderD{128 + i}') for i in range(4))}"]
    assert sim.read(tb.sim_dir, "n2")["vendor"] == "amd" and sim.vendor(tb.sim_dir, "n1") == "nvidia"


def test_a_umc_error_under_two_jobs_requeues_the_one_on_that_gpu_and_the_ladder_resets_validates_and_returns_n2(tb):
    jobs = [tb.sbatch(TRAP_JOB, "-w", "n2", "--gres=gpu:1", "--requeue", "--open-mode=append") for _ in range(2)]
    (hit, (node, gpu)), (spared, (other_node, other)) = [(job, wait_started(tb, job, timeout=30)) for job in jobs]
    assert (node, other_node) == ("n2", "n2") and gpu != other
    slurm = tb.slurm()
    sim.inject(tb.sim_dir, "n2", gpu, ras_ue="umc")  # the driver's two lines, the RAS file's ue: 1
    reason = f"slurm-hooks: uncorrectable ECC in UMC block on GPU {gpu} [reset]"
    tb.wait_node("n2", lambda n: n.drained, timeout=15)
    assert slurm.node("n2").reason == reason
    wait_for(lambda: slurm.job(hit).restarts == 1, 20, f"job {hit} requeued")
    job = slurm.job(spared)
    assert (job.base_state, job.nodes, job.restarts) == ("RUNNING", "n2", 0), job
    assert "got SIGTERM" not in tb.job_output(spared)
    assert [r["target"] for r in records(tb, "n2", "requeue", "ok")] == [str(hit)]
    assert [r["target"] for r in records(tb, "n2", "requeue", "spared")] == [str(spared)]
    assert not records(tb, action="repair-reset"), "no repair while a job runs on the node"

    run_command([os.path.join(tb.slurm_bin, "scancel"), str(spared)], 10, env=tb.env())
    wait_for(lambda: records(tb, "n2", "repair-reset", "ok"), 60, "the GPU reset, validated and n2 resumed",
             seen=lambda: f"n2 {slurm.node('n2')}; {[(r['action'], r['result']) for r in records(tb, 'n2')]}")
    assert wait_started(tb, hit, timeout=30, restart=1)[0] == "n2"  # the requeued job runs on n2 again
    [start] = records(tb, "n2", "repair-reset", "start")
    assert (start["backend"], start["gpus"]) == ("sim", [gpu])
    [validated] = records(tb, "n2", "repair-validate", "ok")
    assert validated["level"] == 2
    assert sim.gpu_entry(sim.read(tb.sim_dir, "n2"), gpu)["resets"] == 1
    with open(sim.kernel_log(tb.sim_dir, "n2"), encoding="ascii") as fh:  # amd-smi's reset, said by the driver
        assert fh.read().rstrip().endswith("amdgpu: GPU reset(1) succeeded!")
    node = slurm.node("n2")
    assert not node.drained and (not node.reason or tb.keeps_reasons), node
    # Every record about n2 in AMD's words, the validation's verdict included ("RVS diagnostic L2 passed").
    said = records(tb, "n2")
    assert {r["action"] for r in said} >= {"drain", "requeue", "repair-reset", "repair-validate", "resume"}, said
    assert nvidia_words(said) == [], said


def test_a_mixed_fleet_is_one_status_one_report_and_one_pager_each_node_in_its_vendors_words(repair_off, receiver):
    tb = repair_off
    with open(tb.config_path, encoding="utf-8") as fh:
        text = fh.read()
    fsutil.atomic_write(tb.config_path, text + f'\n[[notify.webhook]]\nname = "oncall"\nurl = "{receiver.url()}"\n'
                                               'format = "json"\n', mode=0o600)
    sim.inject(tb.sim_dir, "n1", 0, xid=79)
    sim.inject(tb.sim_dir, "n2", 2, ras_ue="umc")
    reasons = {"n1": "slurm-hooks: XID 79 on GPU 0 [reboot]",
               "n2": "slurm-hooks: uncorrectable ECC in UMC block on GPU 2 [reset]"}
    for name in reasons:
        tb.wait_node(name, lambda n: n.drained and n.reason == reasons[n.name], timeout=20)

    status = cli(tb, "status", "--json", "--max-wait", "1h")
    rows = {r["node"]: r for r in status["nodes"]}
    assert sorted(rows) == ["n1", "n2"], status
    assert all(rows[name]["reason"] == reason for name, reason in reasons.items()), rows
    assert "XID 79" in json.dumps(rows["n1"]) and nvidia_words(rows["n2"]) == [], rows

    report = cli(tb, "report", "--json", "--no-accounting", "--since", "1h")
    incidents = {i["node"]: i for i in report["incidents"]}
    assert sorted(incidents) == ["n1", "n2"], report["incidents"]
    nodes = {n["node"]: n for n in report["nodes"]}
    assert "XID 79" in nodes["n1"]["findings"] and nvidia_words(nodes["n2"]) == [], nodes
    assert nvidia_words(incidents["n2"]) == [], incidents["n2"]
    [gpu] = nodes["n2"]["gpus"]
    assert gpu["serial"] == sim.gpu_entry(sim.read(tb.sim_dir, "n2"), 2)["serial"]

    def drain_pages():
        pages = {b["node"]: b for b in receiver.delivered() if b.get("kind") == "opened"}
        return pages if pages.keys() >= {"n1", "n2"} else None

    paged = wait_for(drain_pages, 20, "a page for each node's incident", seen=receiver.delivered)
    assert "XID 79" in paged["n1"]["text"] and nvidia_words(paged["n2"]) == [], paged["n2"]
    assert "uncorrectable ECC in UMC block on GPU 2" in paged["n2"]["text"]
    assert f"serial {gpu['serial']}" in paged["n2"]["text"]


def test_a_board_past_its_bad_page_threshold_goes_on_the_rma_list_and_in_the_report_by_its_amd_serial(tb):
    sim.inject(tb.sim_dir, "n2", 1, bad_pages=sim_amd.BAD_PAGE_THRESHOLD)
    wait_for(lambda: records(tb, "n2", "repair-replace", "ok"), 30, "n2 drained [replace]")
    board = sim.gpu_entry(sim.read(tb.sim_dir, "n2"), 1)
    assert tb.slurm().node("n2").reason == "slurm-hooks: retired pages at threshold on GPU 1 [replace]"
    rma = read_rma(os.path.join(tb.hooks_state_dir, "rma.json"))
    assert [(e["node"], e["gpu"], e["serial"], e["uuid"], e["pci_bus_id"]) for e in rma] == [
        ("n2", 1, board["serial"], board["uuid"], board["pci_bus_id"])]
    assert board["serial"].startswith("SIM") and nvidia_words(rma) == []
    report = cli(tb, "report", "--json", "--no-accounting", "--since", "1h")
    assert [(c["node"], c["serial"]) for c in report["rma_candidates"]] == [("n2", board["serial"])]
    rows = cli(tb, "status", "--json", "--max-wait", "1h")["nodes"]
    assert [(r["node"], r["tag"], r["next"]) for r in rows] == [("n2", "[replace]", "a person")]
    assert board["serial"] in rows[0]["todo"]
