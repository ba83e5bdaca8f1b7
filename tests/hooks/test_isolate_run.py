"""``isolate`` through the Slurm interface, on the shared FakeSlurm given isolate's calls
(reservations, sbatch, squeue -n, scancel): each test job runs on a simulated fabric
(:class:`slurm_hooks.remedy.culprit.Fabric`) and writes the built-in test's output line."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import pytest
from fakes.config import sim_config
from fakes.slurm import FakeSlurm

from slurm_hooks.errors import EXIT_INCONCLUSIVE, EXIT_OK, EXIT_UNHEALTHY
from slurm_hooks.hooks import isolate as isolating
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.remedy import culprit
from slurm_hooks.remedy.wiring import Wiring
from slurm_hooks.slurm import JobState


class IsolateSlurm(FakeSlurm):
    """FakeSlurm with reservations and test jobs; a job submitted runs at once on ``fabric``."""

    def __init__(self, fabric: culprit.Fabric):
        super().__init__()
        self.fabric = fabric
        self.held: dict[str, list[str]] = {}
        self.next_id = 1000
        for node in fabric.nodes:
            self.add_node(node)

    def create_reservation(self, name, node, minutes, flags="MAINT"):
        self._call("create_reservation", name, minutes)
        self.held[name] = [node] if isinstance(node, str) else list(node)

    def delete_reservation(self, name):
        self._call("delete_reservation", name)
        self.held.pop(name, None)

    def reservations(self):
        self._call("reservations")
        return list(self.held)

    def add_test_job(self, name: str, nodes: list[str], state: str = JobState.RUNNING) -> str:
        self.next_id += 1
        self.add_job(self.next_id, ",".join(nodes), state, name=name)
        return str(self.next_id)

    def submit(self, argv, *, name, node, reservation, minutes, output="/dev/null", partition="",
               ntasks_per_node=0, chdir="", srun=False, gpus_per_node=0):
        self._call("submit", name, reservation)
        group = [node] if isinstance(node, str) else list(node)
        outcome, _ = self.fabric.test(group)
        job = self.add_test_job(name, group, JobState.COMPLETED if outcome.completed else JobState.FAILED)
        with open(output.replace("%j", job), "w", encoding="utf-8") as fh:
            fh.write(f"ranks={len(group)} busbw={outcome.bandwidth:.3f}\n" if outcome.completed else "hung\n")
        return job

    def jobs_named(self, name):
        self._call("jobs_named", name)
        return [str(j.job_id) for j in self._jobs.values() if j.name == name and not j.finished]

    def cancel(self, ref):
        self._call("cancel", ref)
        self._update(self._job(ref), state=JobState.CANCELLED)


def wiring(tmp_path, slurm, extra=""):
    cfg = sim_config(tmp_path, f'[isolate]\ncommand = ["true"]\nmin_busbw_gbps = 50.0\n{extra}')
    return Wiring(cfg, "admin", AuditLog(cfg.log.audit), slurm_override=slurm)


def nodes(n):
    return [f"n{k}" for k in range(1, n + 1)]


def run(w, names, **kw):
    return isolating.isolate(w, names, mode="bisect", ratio=0.5, test_timeout=60.0, budget=600.0, max_tests=64, **kw)


def test_a_healthy_fabric_after_a_failed_job_is_inconclusive_naming_the_job_and_a_plain_run_is_ok(tmp_path):
    slurm = IsolateSlurm(culprit.Fabric(nodes(8), {}, seed=1))
    w = wiring(tmp_path, slurm)
    after = run(w, nodes(8), started_by="job 4242")
    assert after.verdict == "inconclusive" and after.exit_code() == EXIT_INCONCLUSIVE
    assert "the failure did not reproduce in" in after.line() and "started by job 4242" in after.line()
    assert after.to_dict()["started_by"] == "job 4242" and after.drained == {}
    plain = run(w, nodes(8))
    assert plain.verdict == "ok" and plain.exit_code() == EXIT_OK and "reproduce" not in plain.line()


def test_a_suspected_node_that_passes_its_screen_is_tested_in_pairs_before_the_run_ends(tmp_path):
    slurm = IsolateSlurm(culprit.Fabric(nodes(8), {}, seed=2))
    summary = run(wiring(tmp_path, slurm, "repeats = 2\n"), nodes(8), started_by="failed jobs 1,2 on n3",
                  suspected=["n3"])
    pairs = [t["nodes"] for t in summary.to_dict()["tests"] if t["purpose"] == "confirm"]
    assert [p[1] for p in pairs] == ["n3", "n3"] and pairs[0][0] != pairs[1][0]
    assert summary.exit_code() == EXIT_INCONCLUSIVE


def test_a_hung_node_after_failed_jobs_is_found_and_drained(tmp_path):
    slurm = IsolateSlurm(culprit.Fabric(nodes(8), {"n6": "hang"}, seed=3))
    summary = run(wiring(tmp_path, slurm), nodes(8), started_by="job 7", suspected=["n6"])
    assert list(summary.drained) == ["n6"] and summary.exit_code() == EXIT_UNHEALTHY
    assert slurm.peek("n6").drained and not any(slurm.peek(n).drained for n in nodes(8) if n != "n6")
    assert slurm.held == {}
    assert os.path.exists(summary.evidence)


@pytest.mark.parametrize("args, started_by, suspected", [
    ({"job": "42 (TIMEOUT)"}, "job 42 (TIMEOUT)", []),
    ({"after_jobs": "7,9"}, "failed jobs 7,9 on n1,n2", ["n1", "n2"]),
    ({"recorded": {"n2": ("7", "9")}}, "suspects n2 (jobs 7, 9)", ["n2"]),
    ({}, "", []),
])
def test_what_started_a_run_by_hand(args, started_by, suspected):
    from slurm_hooks.commands.isolate import _started_by

    got = _started_by(["n1", "n2"], args.get("job"), args.get("after_jobs"), args.get("recorded", {}))
    assert got == (started_by, suspected)


# -- two isolates at once: a run deletes only what is provably abandoned ------------------------

HOST = socket.gethostname()


def dead_pid() -> int:
    """A pid no process holds now (a child that has exited and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def leftover(slurm, name, nodes):
    slurm.held[name] = list(nodes)
    return slurm.add_test_job(name, list(nodes))


def test_a_run_is_named_by_its_host_pid_and_end_and_so_are_its_test_jobs(tmp_path):
    slurm = IsolateSlurm(culprit.Fabric(nodes(4), {}, seed=1))
    run(wiring(tmp_path, slurm), nodes(4))
    [(_, name, minutes)] = slurm.called("create_reservation")
    host, pid, until = re.match(r"slurm-hooks-isolate-(.+)-(\d+)-(\d+)$", name).groups()
    assert (host, int(pid)) == (HOST.split(".")[0], os.getpid())
    assert minutes * 60 >= int(until) - time.time() >= isolating.lifetime(600.0, 60.0) - 5
    assert {c[1] for c in slurm.called("submit")} == {name} and slurm.held == {}


def test_another_hosts_live_run_keeps_its_reservation_and_test_jobs(tmp_path):
    slurm = IsolateSlurm(culprit.Fabric(nodes(8), {}, seed=1))
    theirs = culprit.run_name("other-host", 4242, time.time() + 900)
    job = leftover(slurm, theirs, ["n7", "n8"])
    summary = run(wiring(tmp_path, slurm), nodes(6))
    assert summary.verdict == "ok"
    assert list(slurm.held) == [theirs] and slurm.peek_job(int(job)).state == JobState.RUNNING
    assert ("cancel", int(job)) not in slurm.calls and ("delete_reservation", theirs) not in slurm.calls


def test_a_live_run_of_this_host_under_another_state_dir_is_left_alone(tmp_path):
    slurm = IsolateSlurm(culprit.Fabric(nodes(8), {}, seed=1))
    theirs = culprit.run_name(HOST, os.getppid(), time.time() + 900)
    job = leftover(slurm, theirs, ["n7", "n8"])
    assert isolating.cleanup_leftovers(wiring(tmp_path, slurm), lambda line: None) == []
    assert list(slurm.held) == [theirs] and slurm.peek_job(int(job)).state == JobState.RUNNING


def test_a_run_of_this_host_whose_process_is_gone_and_one_past_its_end_are_cleaned_up(tmp_path):
    slurm = IsolateSlurm(culprit.Fabric(nodes(8), {}, seed=1))
    killed = culprit.run_name(HOST, dead_pid(), time.time() + 900)
    expired = culprit.run_name("other-host", 4242, time.time() - 5)
    jobs = [leftover(slurm, killed, ["n5", "n6"]), leftover(slurm, expired, ["n7", "n8"])]
    said = []
    deleted = isolating.cleanup_leftovers(wiring(tmp_path, slurm), said.append)
    assert sorted(deleted) == sorted([killed, expired]) and slurm.held == {}
    assert [slurm.peek_job(int(j)).state for j in jobs] == [JobState.CANCELLED] * 2
    assert any("is gone" in line for line in said) and any(re.search(r"its run ended [56]s ago", x) for x in said)


def test_an_older_runs_bare_names_are_cleaned_up_only_once_it_is_over(tmp_path):
    slurm = IsolateSlurm(culprit.Fabric(nodes(8), {}, seed=1))
    w = wiring(tmp_path, slurm)
    recent = f"{culprit.ISOLATE_PREFIX}-{int(time.time()) - 60}"
    job = leftover(slurm, recent, ["n7", "n8"])
    slurm._update(slurm.peek_job(int(job)), name=culprit.ISOLATE_PREFIX)  # the older runs named jobs by the prefix
    assert isolating.cleanup_leftovers(w, lambda line: None) == []
    assert slurm.peek_job(int(job)).state == JobState.RUNNING
    assert isolating.cleanup_leftovers(w, lambda line: None, now=time.time() + culprit.LEGACY_RUN_S) == [recent]
    assert slurm.peek_job(int(job)).state == JobState.CANCELLED


def test_which_names_are_provably_abandoned():
    now = 10_000.0
    gone, alive = (lambda pid: False), (lambda pid: True)
    assert culprit.abandoned(culprit.run_name("a.example.org", 7, now + 60), now, "a", gone) == \
        "its run (pid 7 on this host) is gone"
    assert culprit.abandoned(culprit.run_name("a", 7, now + 60), now, "a", alive) == ""
    assert culprit.abandoned(culprit.run_name("b-2", 7, now + 60), now, "a", gone) == ""  # another host's
    assert culprit.abandoned(culprit.run_name("b-2", 7, now - 1), now, "a", alive) == "its run ended 1s ago"
    assert culprit.abandoned("slurm-hooks-isolate-9000", now, "a", gone) == ""
    assert culprit.abandoned("slurm-hooks-isolate-9000", now, "a", gone, legacy_s=500) == \
        "an older isolate's, started 1000s ago"
    assert culprit.abandoned("maint-window", now, "a", gone) == ""
