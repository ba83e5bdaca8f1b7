"""End to end on a real slurmctld and two slurmd's, slurm-hooks wired in as Slurm runs it.

Each test is one scenario from the Slurm integration issue. Detection is
`slurm-hooks check` run the way slurmd runs HealthCheckProgram (the testbed's
own wrapper, no PATH), so the timings are those of the real programs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from slurm_hooks.probes import sim

pytestmark = pytest.mark.slurm

#: A job that says when it got SIGTERM, then keeps its promise to exit.
TRAP_JOB = """#!/bin/sh
trap 'echo "got SIGTERM restart=${SLURM_RESTART_COUNT:-0} on $SLURMD_NODENAME"; exit 0' TERM
echo "start restart=${SLURM_RESTART_COUNT:-0} on $SLURMD_NODENAME gpus=$SLURM_JOB_GPUS"
while true; do sleep 0.1; done
"""


def healthcheck(tb, node: str) -> subprocess.CompletedProcess:
    """Run the HealthCheckProgram exactly as slurmd does: the wrapper, no PATH, SLURMD_NODENAME only."""
    return subprocess.run([os.path.join(tb.state_dir, "bin", "healthcheck")], env={"SLURMD_NODENAME": node},
                          capture_output=True, text=True, timeout=60)


def drained_by_us(node) -> bool:
    return node.drained and node.reason.startswith("slurm-hooks:")


def wait_running_elsewhere(tb, job: int, bad: str, timeout: float):
    """Until the job is RUNNING on a node other than ``bad``. (A job shows RUNNING while
    its prolog runs, so RUNNING on ``bad`` is not yet an answer.)"""
    deadline = time.monotonic() + timeout
    while True:
        info = tb.slurm.job(job)
        if info.state.startswith("RUNNING") and info.nodes and info.nodes != bad:
            return info
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job} not RUNNING off {bad} within {timeout:g}s: {info.state} on "
                                 f"{info.nodes or '-'} ({info.reason})")
        time.sleep(0.05)


def wait_started(tb, job: int, timeout: float = 15.0, restart: int = 0) -> tuple[str, int]:
    """Until the batch script itself runs (past the prolog); returns (node, first GPU index)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in tb.job_output(job).splitlines():
            if line.startswith(f"start restart={restart} "):
                fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
                return line.split(" on ")[1].split()[0], int(fields["gpus"].split(",")[0])
        time.sleep(0.05)
    raise AssertionError(f"job {job} never started: {tb.job_output(job)!r}")


def actions(tb, name: str) -> list[dict]:
    return [r for r in tb.audit_events() if r.get("kind") == "action" and r.get("action") == name]


def test_healthy_job_runs_and_nothing_is_drained(hooked_testbed):
    tb = hooked_testbed
    job = tb.sbatch("#!/bin/sh\necho hello from $SLURMD_NODENAME gpus=$SLURM_JOB_GPUS\n", "--gres=gpu:2")
    tb.wait_job(job, ("COMPLETED",), timeout=30)
    assert "hello from n" in tb.job_output(job)
    assert not any(n.drained for n in tb.slurm.nodes())
    assert not [r for r in tb.audit_events() if r.get("kind") in ("alert", "action")]


def test_fault_before_the_job_prolog_drains_and_job_runs_on_the_other_node_within_10s(hooked_testbed):
    tb = hooked_testbed
    sim.inject(tb.sim_dir, "n1", 3, xid=79)
    submitted = time.monotonic()
    # All 8 GPUs of a node, and n1 is Slurm's first choice: the job lands on the bad GPU.
    job = tb.sbatch(TRAP_JOB, "--gres=gpu:8", "--nodes=1")
    info = wait_running_elsewhere(tb, job, "n1", timeout=10)
    took = time.monotonic() - submitted
    assert info.nodes == "n2", info
    assert took < 10, took
    assert info.restarts == 1  # it was refused on n1 first
    n1 = tb.slurm.node("n1")
    assert drained_by_us(n1) and "XID 79 on GPU 3" in n1.reason, n1
    alerts = [r for r in tb.audit_events() if r.get("kind") == "alert"]
    assert any(r["context"] == "prolog" and r["gpu"] == 3 and r["check"] == "xid" for r in alerts), alerts
    # not held, and not waiting out the 121 s requeue delay
    assert "held" not in info.reason.lower()


def test_xid79_mid_job_drains_sigterms_requeues_and_runs_on_healthy_node_within_10s(hooked_testbed):
    tb = hooked_testbed
    job = tb.sbatch(TRAP_JOB, "--gres=gpu:1", "--requeue", "--open-mode=append")
    bad, gpu = wait_started(tb, job)
    sim.inject(tb.sim_dir, bad, gpu, xid=79)
    detected = time.monotonic()
    res = healthcheck(tb, bad)
    assert res.returncode == 1, res.stderr
    node = tb.slurm.node(bad)
    assert drained_by_us(node) and f"XID 79 on GPU {gpu}" in node.reason, node
    again = wait_running_elsewhere(tb, job, bad, timeout=10)
    took = time.monotonic() - detected
    assert again.restarts == 1
    assert took < 10, took
    assert wait_started(tb, job, restart=1)[0] == again.nodes
    assert f"got SIGTERM restart=0 on {bad}" in tb.job_output(job)
    assert [r["result"] for r in actions(tb, "requeue")] == ["ok"]
    assert [r["result"] for r in actions(tb, "start_now")] == ["ok"]


def test_a_requeued_job_says_why_in_its_admin_comment_and_keeps_the_one_it_had(hooked_testbed):
    tb = hooked_testbed
    job = tb.sbatch(TRAP_JOB, "--gres=gpu:1", "--requeue", "--open-mode=append")
    bad, gpu = wait_started(tb, job)
    # `sbatch --admin-comment` needs an admin: root sets one, as a site's tooling would.
    subprocess.run([os.path.join(tb.slurm.bin_dir, "scontrol"), "update", f"JobId={job}",
                    "AdminComment=site: project X; budget 42"], env=tb.env, check=True, timeout=10)
    sim.inject(tb.sim_dir, bad, gpu, xid=79)
    res = healthcheck(tb, bad)
    assert res.returncode == 1, res.stderr
    assert [r["result"] for r in actions(tb, "requeue")] == ["ok"]
    shown = subprocess.run([os.path.join(tb.slurm.bin_dir, "scontrol"), "show", "job", str(job)], env=tb.env,
                           capture_output=True, text=True, timeout=10, check=True).stdout
    [line] = [x.strip() for x in shown.splitlines() if x.strip().startswith("AdminComment=")]
    assert line.startswith(f"AdminComment=site: project X; budget 42; slurm-hooks: requeued from {bad}, "
                           f"XID 79 on GPU {gpu}, "), line
    assert [r["result"] for r in actions(tb, "annotate")] == ["ok"]
    wait_running_elsewhere(tb, job, bad, timeout=15)  # and the requeue went on as before


def test_a_job_the_prolog_refuses_says_why_in_its_admin_comment(hooked_testbed):
    tb = hooked_testbed
    sim.inject(tb.sim_dir, "n1", 3, xid=79)
    job = tb.sbatch(TRAP_JOB, "--gres=gpu:8", "--nodes=1")
    wait_running_elsewhere(tb, job, "n1", timeout=15)
    assert tb.slurm.admin_comment(job).startswith("slurm-hooks: refused by the prolog on n1, XID 79 on GPU 3, ")


def test_leftover_process_after_a_job_makes_the_epilog_drain(hooked_testbed):
    tb = hooked_testbed
    job = tb.sbatch(TRAP_JOB, "--gres=gpu:1")
    where, gpu = wait_started(tb, job)
    # A process that survives the job on its GPU (the sim stands in for an unkillable CUDA context).
    sim.inject(tb.sim_dir, where, gpu, process=424242)
    subprocess.run(["/usr/bin/scancel", str(job)], env=tb.env, check=True, timeout=10)
    node = tb.wait_node(where, drained_by_us, timeout=20)
    assert f"GPU {gpu}" in node.reason and "processes" in node.reason, node
    alerts = [r for r in tb.audit_events() if r.get("kind") == "alert"]
    assert any(r["context"] == "epilog" and r["check"] == "leftover" for r in alerts), alerts


def test_fault_cleared_node_is_resumed_by_us(hooked_testbed):
    tb = hooked_testbed
    sim.inject(tb.sim_dir, "n1", 5, ecc_uncorrectable=2)
    assert healthcheck(tb, "n1").returncode == 1
    assert drained_by_us(tb.slurm.node("n1"))
    assert healthcheck(tb, "n1").returncode == 1  # still broken: stays drained
    assert drained_by_us(tb.slurm.node("n1"))
    drained = tb.slurm.node("n1").reason
    sim.clear(tb.sim_dir, "n1")
    assert healthcheck(tb, "n1").returncode == 0
    node = tb.slurm.node("n1")
    # Resumed: on 23.11+ without accounting (Debian 13's 24.11) Slurm keeps our text on the IDLE node.
    assert not node.drained and node.reason == (drained if tb.keeps_reasons else ""), node
    assert [r["result"] for r in actions(tb, "resume")] == ["ok"]


def test_node_drained_by_an_admin_is_never_resumed_nor_relabelled(hooked_testbed):
    tb = hooked_testbed
    tb.scontrol("update", "NodeName=n1", "State=DRAIN", "Reason=bob: memory test, do not touch")
    assert healthcheck(tb, "n1").returncode == 0
    assert tb.slurm.node("n1").reason == "bob: memory test, do not touch"
    sim.inject(tb.sim_dir, "n1", 2, xid=48)
    assert healthcheck(tb, "n1").returncode == 1
    node = tb.slurm.node("n1")
    assert node.drained and node.reason == "bob: memory test, do not touch", node
    assert [r["result"] for r in actions(tb, "drain")] == ["skipped"]
    sim.clear(tb.sim_dir, "n1")
    assert healthcheck(tb, "n1").returncode == 0
    assert tb.slurm.node("n1").reason == "bob: memory test, do not touch"
    assert not actions(tb, "resume")


def test_hostile_job_name_and_comment_change_nothing(hooked_testbed, tmp_path):
    tb = hooked_testbed
    canary = tmp_path / f"pwned-{uuid.uuid4().hex}"
    hostile = f"x\"'; touch {canary}; $(touch {canary}) `touch {canary}` \\n"
    job = tb.sbatch(TRAP_JOB, "--gres=gpu:1", "--open-mode=append", f"--job-name={hostile}", f"--comment={hostile}")
    where, gpu = wait_started(tb, job)
    sim.inject(tb.sim_dir, where, gpu, xid=79)
    assert healthcheck(tb, where).returncode == 1
    again = wait_running_elsewhere(tb, job, where, timeout=10)
    assert again.restarts == 1
    node = tb.slurm.node(where)
    assert node.reason == f"slurm-hooks: XID 79 on GPU {gpu} [reboot]", node
    assert not canary.exists()
    assert tb.slurm.job(job).name == again.name  # the name went through untouched


def test_hanging_scontrol_is_bounded_and_audited(clean_testbed, tmp_path):
    # Hooks off: slurmd's own HealthCheckProgram (every 30 s, with the real scontrol) would drain n1
    # for the injected XID if it fired during the test, and the last assertion would fail (seen once).
    tb = clean_testbed
    assert not tb.slurm.node("n1").drained
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    hang = fake_bin / "scontrol"
    hang.write_text("#!/bin/sh\nsleep 60\n")
    hang.chmod(0o755)
    cfg = tmp_path / "config.toml"
    text = open(tb.config_path).read().replace('bin_dir = "/usr/bin"', f'bin_dir = "{fake_bin}"')
    cfg.write_text(text.replace("[slurm]", "[slurm]\ntimeout = 1.5"))
    sim.inject(tb.sim_dir, "n1", 1, xid=79)
    started = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "slurm_hooks", "check", "--config", str(cfg), "--node", "n1"],
                         capture_output=True, text=True, timeout=60, env=tb.env)
    took = time.monotonic() - started
    assert res.returncode == 1
    assert took < 10, took
    assert "Traceback" not in res.stderr
    assert "could not drain" in res.stderr and "timed out" in res.stderr, res.stderr
    failed = [r for r in actions(tb, "drain") if r["result"] == "failed"]
    assert failed and "timed out" in failed[0]["error"]
    assert not tb.slurm.node("n1").drained  # nothing half-done on the real cluster


# --- requeue exactly the job that was hit -------------------------------------------------------


def _wiring(tb, node: str):
    from slurm_hooks.config import load
    from slurm_hooks.observe.audit import AuditLog
    from slurm_hooks.remedy.wiring import Wiring

    cfg = load(tb.config_path)
    return Wiring(cfg, node, AuditLog(cfg.log.audit), slurm_override=tb.slurm)


def test_an_array_task_on_the_bad_node_is_requeued_alone_even_the_one_carrying_the_arrays_id(hooked_testbed):
    tb = hooked_testbed
    array = tb.sbatch(TRAP_JOB, "--array=0-3", "--gres=gpu:4")
    deadline = time.monotonic() + 20
    while True:
        tasks = [j for n in tb.nodes for j in tb.slurm.jobs_on_node(n) if j.array_job_id == array]
        if len(tasks) == 4 and all(j.base_state == "RUNNING" for j in tasks):
            break
        assert time.monotonic() < deadline, tasks
        time.sleep(0.1)
    for task in tasks:  # past the prolog: an XID while a task's prolog runs is the prolog's to refuse
        wait_started(tb, task.job_id)
    base = next(j for j in tasks if j.job_id == array)  # Slurm gives one task the array's own id
    bad = base.nodes
    assert {j.nodes for j in tasks} == {"n1", "n2"}, tasks
    # The fault is on a GPU of the task carrying the array's id: only that task goes (GPU scope),
    # addressed as <array>_<task>, not by the id that names every task.
    sim.inject(tb.sim_dir, bad, tb.slurm.job_gpus(base.ref, bad)[0], xid=79)
    assert healthcheck(tb, bad).returncode == 1
    requeues = actions(tb, "requeue")
    assert [r["target"] for r in requeues if r["result"] == "ok"] == [base.ref], requeues
    # the requeued task's epilog judges the node again and may log the neighbour spared once more
    assert {r["target"] for r in actions(tb, "requeue") if r["result"] == "spared"} == \
        {j.ref for j in tasks if j.nodes == bad and j.ref != base.ref}
    time.sleep(1.0)
    for task in tasks:
        now = tb.slurm.job(task.ref)
        if task.ref == base.ref:
            assert now.restarts == 1, now
        else:
            assert (now.base_state, now.nodes, now.restarts) == ("RUNNING", task.nodes, 0), now


def test_a_job_that_completes_while_its_node_is_drained_is_not_run_again(hooked_testbed):
    tb = hooked_testbed
    epilog = tb.path("bin", "epilog")
    os.rename(epilog, epilog + ".real")
    with open(epilog, "w", encoding="utf-8") as fh:  # the job stays COMPLETING while the epilog runs
        fh.write(f"#!/bin/sh\nsleep 8\nexec {epilog}.real \"$@\"\n")
    os.chmod(epilog, 0o755)
    try:
        job = tb.sbatch("#!/bin/sh\necho ran restart=${SLURM_RESTART_COUNT:-0}\nsleep 1\n", "--gres=gpu:1",
                        "--requeue", "--open-mode=append")
        node = tb.wait_job(job, ["COMPLETING"], timeout=20, interval=0.05).nodes
        sim.inject(tb.sim_dir, node, 0, xid=79)
        assert healthcheck(tb, node).returncode == 1
        assert drained_by_us(tb.slurm.node(node))
        done = tb.wait_job(job, ["COMPLETED"], timeout=30)
    finally:
        os.replace(epilog + ".real", epilog)
    assert done.restarts == 0
    assert tb.job_output(job).count("ran restart=") == 1, tb.job_output(job)
    assert not [r for r in actions(tb, "requeue") if r["result"] == "ok"]


@pytest.mark.parametrize("hold", ["hold", "uhold"])
def test_an_admins_or_users_hold_is_never_released(clean_testbed, hold):
    tb = clean_testbed
    from slurm_hooks.remedy import follower

    job = tb.sbatch(TRAP_JOB, "--begin=now+1hour")
    tb.wait_job(job, ["PENDING"])
    tb.scontrol(hold, str(job))
    reason = {"hold": "JobHeldAdmin", "uhold": "JobHeldUser"}[hold]
    assert tb.slurm.job(job).reason == reason
    results = follower.follow_requeued(_wiring(tb, "n1"), [job], timeout=3)
    assert results == {str(job): f"held: {reason}"}
    after = tb.slurm.job(job)
    assert (after.base_state, after.reason, after.priority) == ("PENDING", reason, "0")


def test_a_two_node_job_on_two_bad_nodes_checked_at_once_is_requeued_exactly_once(hooked_testbed):
    tb = hooked_testbed
    job = tb.sbatch(TRAP_JOB, "-N", "2", "--gres=gpu:1", "--open-mode=append")
    wait_started(tb, job)
    for node in ("n1", "n2"):
        sim.inject(tb.sim_dir, node, 0, xid=79)
    runs = [subprocess.Popen([os.path.join(tb.state_dir, "bin", "healthcheck")], env={"SLURMD_NODENAME": n},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for n in ("n1", "n2")]
    assert [p.wait(timeout=60) for p in runs] == [1, 1]
    time.sleep(2.0)
    assert tb.slurm.job(job).restarts == 1
    assert [r["result"] for r in actions(tb, "requeue")].count("ok") == 1


def test_a_job_name_that_is_not_utf8_on_the_bad_node_is_still_requeued(hooked_testbed):
    tb = hooked_testbed
    name = os.fsdecode(b"bad\xffname")  # reaches sbatch's argv as the raw byte 0xff
    job = tb.sbatch(TRAP_JOB, "--gres=gpu:1", "--open-mode=append", "-J", name)
    bad, gpu = wait_started(tb, job)
    assert tb.slurm.job(job).name == "bad\ufffdname"
    sim.inject(tb.sim_dir, bad, gpu, xid=79)
    res = healthcheck(tb, bad)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    again = wait_running_elsewhere(tb, job, bad, timeout=10)
    assert again.restarts == 1
    assert [r["result"] for r in actions(tb, "requeue")] == ["ok"]


# --- the requeue follower reports; what it leaves, the next hook run finishes ---------------------


def _requeue_on_bad_node(tb):
    from slurm_hooks.remedy.outcome import Outcome
    from slurm_hooks.remedy.requeue import requeue_jobs

    job = tb.sbatch(TRAP_JOB, "--gres=gpu:1", "--requeue", "--open-mode=append")
    bad, gpu = wait_started(tb, job)
    sim.inject(tb.sim_dir, bad, gpu, xid=79)
    tb.slurm.drain(bad, f"slurm-hooks: XID 79 on GPU {gpu} [reboot]")
    w = _wiring(tb, bad)
    outcome = Outcome()
    requeue_jobs(w, outcome, follow="none")
    assert outcome.requeued == [str(job)]
    return w, job, bad


def test_a_follower_whose_interpreter_is_unusable_is_audited_and_the_job_still_starts_at_once(hooked_testbed):
    tb = hooked_testbed
    from slurm_hooks.remedy import follower

    w, job, bad = _requeue_on_bad_node(tb)
    requeued = time.monotonic()
    spawned = follower.follow_jobs(w, [str(job)], "detached", python="/nonexistent/python3")
    assert not spawned.started
    [rec] = actions(tb, "follow")
    assert rec["result"] == "failed" and "cannot start" in rec["error"], rec
    again = wait_running_elsewhere(tb, job, bad, timeout=15)
    assert again.restarts == 1 and time.monotonic() - requeued < 15  # not the 121 s requeue delay


def test_a_job_whose_follower_died_is_made_eligible_by_the_next_health_check(hooked_testbed, monkeypatch):
    tb = hooked_testbed
    from slurm_hooks.remedy import follower

    monkeypatch.setattr(follower, "FOLLOW_FALLBACK_S", 0.0)  # the hook takes one look, then goes
    w, job, bad = _requeue_on_bad_node(tb)
    follower.follow_jobs(w, [str(job)], "detached", python="/nonexistent/python3")
    pending = tb.wait_job(job, ["PENDING"], timeout=15)
    if pending.reason != "BeginTime":
        pytest.skip(f"the hook's one look already caught the job PENDING ({pending.reason})")
    res = healthcheck(tb, bad)  # the node's next HealthCheckProgram run, as slurmd starts it
    assert res.returncode == 1, res.stderr
    again = wait_running_elsewhere(tb, job, bad, timeout=10)
    assert again.restarts == 1
    assert [r["result"] for r in actions(tb, "start_now")] == ["ok"]


def test_a_no_requeue_job_the_prolog_refuses_is_cancelled_and_its_admin_comment_says_why(hooked_testbed):
    """slurmd's ``_launch_job_fail``: Slurm does not requeue a ``--no-requeue`` batch job whose prolog
    failed (without PrologFlags=ForceRequeueOnFail): it is cancelled, not started elsewhere."""
    tb = hooked_testbed
    sim.inject(tb.sim_dir, "n1", 3, xid=79)
    job = tb.sbatch(TRAP_JOB, "--gres=gpu:8", "--nodes=1", "--no-requeue")
    ended = tb.wait_job(job, ("FAILED", "CANCELLED", "NODE_FAIL", "COMPLETED", "BOOT_FAIL"), timeout=30)
    time.sleep(2.0)
    info = tb.slurm.job(job)
    assert (info.base_state, info.restarts) == ("CANCELLED", 0), (ended, info)
    assert "start restart=" not in tb.job_output(job)
    comment = tb.slurm.admin_comment(job)
    assert comment.startswith("slurm-hooks: refused by the prolog on n1, XID 79 on GPU 3, --no-requeue: Slurm cancels "
                              "the job rather than start it elsewhere"), comment


def test_an_srun_allocation_the_prolog_refuses_is_cancelled_and_its_admin_comment_says_why(hooked_testbed):
    """Slurm cannot requeue an interactive allocation whose prolog failed: srun fails, the job is
    ended (cancelled), never requeued, and its AdminComment (sacct, scontrol show job) says why."""
    tb = hooked_testbed
    sim.inject(tb.sim_dir, "n1", 3, xid=79)
    name = f"srun-{uuid.uuid4().hex[:8]}"
    ran = subprocess.run([os.path.join(tb.slurm.bin_dir, "srun"), "-J", name, "--gres=gpu:8", "-N1", "-w", "n1",
                          "echo", "ran"], env=tb.env, capture_output=True, text=True, timeout=60)
    assert ran.returncode != 0 and "ran" not in ran.stdout, (ran.stdout, ran.stderr)
    listed = subprocess.run([os.path.join(tb.slurm.bin_dir, "squeue"), "-h", "-t", "all", "-n", name, "-o", "%i"],
                            env=tb.env, capture_output=True, text=True, timeout=30, check=True).stdout.split()
    [job] = listed
    info = tb.wait_job(int(job), ("FAILED", "CANCELLED", "NODE_FAIL", "COMPLETED", "BOOT_FAIL"), timeout=30)
    # Slurm ends it CANCELLED, or FAILED where srun's aborted step is recorded first (seen under load)
    assert info.base_state in ("CANCELLED", "FAILED") and (info.restarts, info.batch) == (0, False), info
    comment = tb.slurm.admin_comment(job)
    assert comment.startswith("slurm-hooks: refused by the prolog on n1, XID 79 on GPU 3, an interactive allocation "
                              "cannot be requeued: Slurm ends it"), comment
