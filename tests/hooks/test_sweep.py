"""The sweep's decisions without a cluster: how many nodes at once, the summary line, the
verdict read back from a job's AdminComment, and bad input. The sweep itself, with Slurm's
reservations and jobs, is in test_e2e_sweep.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
from fakes.config import sim_node, write_sim_config
from fakes.slurm import FakeSlurm

from slurm_hooks import config
from slurm_hooks.errors import ConfigError
from slurm_hooks.hooks import sweep
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.remedy.wiring import Wiring


@pytest.mark.parametrize("share,chosen,width", [("1", 10, 1), ("4", 10, 4), ("10%", 64, 6), ("10%", 5, 1),
                                                ("100%", 3, 3)])
def test_max_parallel_is_a_count_or_a_share_of_the_nodes_chosen_and_at_least_one(share, chosen, width):
    assert sweep.parallel(share, chosen) == width


def test_the_summary_line_names_failed_and_skipped_nodes_and_counts_each_verdict():
    s = sweep.Summary(2, [sweep.NodeResult("n1", "failed", "drained: slurm-hooks: DCGM diag L2 failed on GPU 3 [reset]"),
                          sweep.NodeResult("n2", "passed", "DCGM diag L2 passed"),
                          sweep.NodeResult("n3", "skipped", "running job(s) 12")], seconds=7.25)
    assert s.line() == ("sweep L2: 3 node(s): 1 passed (n2), 1 failed (n1: drained: slurm-hooks: DCGM diag L2 failed "
                        "on GPU 3 [reset]), 0 unverified, 1 skipped (n3: running job(s) 12) in 7.2s")
    assert not s.ok and s.to_dict()["counts"] == {"passed": 1, "failed": 1, "unverified": 0, "skipped": 1}


def test_a_sweep_that_validated_no_node_is_not_a_success():
    assert not sweep.Summary(1, [sweep.NodeResult("n9", "skipped", "cannot read the node: no such node")]).ok
    assert not sweep.Summary(1, []).ok
    assert sweep.Summary(1, [sweep.NodeResult("n1", "passed"), sweep.NodeResult("n2", "skipped", "busy")]).ok


@pytest.mark.parametrize("comment,verdict", [
    ("user note; slurm-hooks: sweep L2 failed: drained: slurm-hooks: DCGM diag L2 failed on GPU 3 [reset]", "failed"),
    ("slurm-hooks: sweep L3 passed: DCGM diag L3 passed", "passed"),
    ("", "unverified"),  # the job died before it could say anything
])
def test_the_verdict_comes_from_the_jobs_admin_comment_and_none_is_unverified(tmp_path, comment, verdict):
    cfg = config.load(str(write_sim_config(tmp_path)))
    slurm = FakeSlurm()
    slurm.add_node("n1", "IDLE")
    slurm.add_job(5, "n1", "COMPLETED")
    if comment:
        slurm.set_admin_comment(5, comment)
    w = Wiring(cfg, "admin", AuditLog(cfg.log.audit), slurm_override=slurm)
    result = sweep._judge(w, "n1", "5", "COMPLETED", 3.0)
    assert result.verdict == verdict
    if verdict == "failed":
        assert result.detail == "drained: slurm-hooks: DCGM diag L2 failed on GPU 3 [reset]"


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "slurm_hooks", *args], capture_output=True, text=True, timeout=60,
                          env=env)


@pytest.mark.parametrize("args,message", [
    (["sweep"], "give --nodes LIST or --partition NAME"),
    (["sweep", "--nodes", "n1", "--partition", "gpu"], "give --nodes LIST or --partition NAME"),
    (["sweep", "--nodes", "n1", "--max-parallel", "0"], "must be a count of nodes"),
    (["sweep", "--nodes", "n1", "--max-parallel", "150%"], "must be a count of nodes"),
    (["sweep", "--nodes", "n1", "--level", "5"], "--level"),
    (["sweep", "--partition", "gpu;reboot"], "'gpu;reboot' is not a partition name"),  # was exit 3: "Slurm did not answer"
])
def test_bad_sweep_input_is_one_line_and_exit_2_before_anything_is_reserved(tmp_path, args, message):
    done = _cli(*args, "--config", str(write_sim_config(tmp_path)))
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


def test_a_bad_max_parallel_in_the_config_names_file_line_and_key(tmp_path):
    path = write_sim_config(tmp_path, '[sweep]\nmax_parallel = "ten"\n')
    with pytest.raises(ConfigError, match=r"config.toml:\d+: \[sweep\] max_parallel: must be a count"):
        config.load(str(path))


def test_repair_validate_refuses_under_monitor_only(tmp_path):
    path = write_sim_config(tmp_path, "[check]\ndrain = false\n")
    done = _cli("repair", "--validate", "--config", str(path), "--node", "n1")
    assert done.returncode == 2 and "monitor-only" in done.stderr


def _tool(path, code, text=""):
    path.write_text(f"#!/bin/sh\necho '{text}'\nexit {code}\n")
    path.chmod(0o755)
    return str(path)


def test_the_validation_job_runs_dcgm_then_nvbandwidth_and_nccl_where_installed_and_drains_on_a_failure(tmp_path):
    from fakes.config import repair_config

    from slurm_hooks.probes import sim

    nvb = _tool(tmp_path / "nvbandwidth", 1, "device to device bandwidth 12 GB/s below 300 GB/s")
    nccl = _tool(tmp_path / "all_reduce_perf", 0, "# Avg bus bandwidth : 180.5")
    cfg = repair_config(tmp_path, f'[sweep]\nnvbandwidth = "{nvb}"\nall_reduce_perf = "{nccl}"\n')
    slurm, w = sim_node(cfg, "ALLOCATED", 9)
    sim.set_diag_seconds(cfg.gpu.sim_dir, "n1", 0.0)
    verdict, detail = sweep.validate_here(w, 2, 60.0, job="9")
    assert verdict == "failed"
    tests = [(r["test"], r["result"]) for r in w.audit.read() if r.get("action") == "sweep-test"]
    assert tests == [("dcgmi diag -r 2", "passed"), ("nvbandwidth", "failed"), ("all_reduce_perf", "passed"),
                     ("nccl-nics", "not-run"), ("ib_write_bw", "not-run")]  # no result table; no HCA
    node = slurm.peek("n1")
    assert node.drained and node.reason.startswith("slurm-hooks: nvbandwidth failed [drain")
    assert detail == f"drained: {node.reason}"
    assert slurm.admin_comment(9).startswith("slurm-hooks: sweep L2 failed: drained: slurm-hooks: nvbandwidth failed")


def test_a_validation_job_that_passes_drains_nothing_and_says_so_in_its_admin_comment(tmp_path):
    from fakes.config import repair_config

    from slurm_hooks.probes import sim

    cfg = repair_config(tmp_path, f'[sweep]\nnvbandwidth = "{tmp_path}/none"\nall_reduce_perf = "{tmp_path}/none"\n')
    slurm, w = sim_node(cfg, "ALLOCATED", 9)
    sim.set_diag_seconds(cfg.gpu.sim_dir, "n1", 0.0)
    assert sweep.validate_here(w, 3, 60.0, job="9") == ("passed", "DCGM diag L3 passed")
    assert not slurm.peek("n1").drained and slurm.called("drain") == []
    assert slurm.admin_comment(9) == "slurm-hooks: sweep L3 passed: DCGM diag L3 passed"



class _SubmitSlurm(FakeSlurm):
    """FakeSlurm with the sweep's reservation and sbatch calls; ``refused``: partition lists sbatch refuses."""

    def __init__(self, refused=()):
        super().__init__()
        self.refused, self.submitted = set(refused), []

    def create_reservation(self, name, node, minutes, flags="MAINT"):
        self._call("create_reservation", name)

    def delete_reservation(self, name):
        self._call("delete_reservation", name)

    def submit(self, argv, *, name, node, reservation, minutes, output="/dev/null", partition=""):
        self.submitted.append(partition)
        if partition in self.refused:
            from slurm_hooks.slurm.errors import SlurmCommandFailed

            raise SlurmCommandFailed("sbatch: error: Batch job submission failed: Invalid account or "
                                     "account/partition combination specified")
        return "77"


def _idle_node_in(tmp_path, partitions: str, refused=()):
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = config.load(str(write_sim_config(tmp_path)))
    slurm = _SubmitSlurm(refused)
    slurm.add_node("n1", "IDLE").extra["Partitions"] = partitions
    return slurm, Wiring(cfg, "n1", AuditLog(cfg.log.audit), slurm_override=slurm)


def test_a_node_given_by_name_gets_its_job_in_its_own_partitions_and_partition_wins(tmp_path):
    slurm, w = _idle_node_in(tmp_path, "gpu,debug")
    assert isinstance(sweep._start(w, "n1", 1, 60.0), tuple)
    assert isinstance(sweep._start(w, "n1", 1, 60.0, "gpu"), tuple)
    assert slurm.submitted == ["gpu,debug", "gpu"]


def test_a_partition_list_slurm_refuses_falls_back_to_the_default_partition(tmp_path):
    # One of the node's partitions refuses root's account and sbatch rejects the whole list: the default
    # partition (where a node in it ran its sweep before --nodes asked for its own) is asked next.
    slurm, w = _idle_node_in(tmp_path, "gpu,vip", refused={"gpu,vip"})
    assert isinstance(sweep._start(w, "n1", 1, 60.0), tuple)
    assert slurm.submitted == ["gpu,vip", ""]
    slurm, w = _idle_node_in(tmp_path / "given", "gpu,vip", refused={"vip"})
    result = sweep._start(w, "n1", 1, 60.0, "vip")  # --partition given: no second guess
    assert result.verdict == "unverified" and "Invalid account" in result.detail
    assert slurm.submitted == ["vip"]
