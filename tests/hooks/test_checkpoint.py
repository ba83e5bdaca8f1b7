"""The deliver-first path with the shared in-memory Slurm: a job's own signal, its grace, exactly one requeue.

The real frameworks' jobs on the real testbed are in test_e2e_checkpoint.py; here each branch
of the path is driven by what Slurm reports about the job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import wait_for
from fakes.config import sim_config
from fakes.slurm import FakeSlurm

from slurm_hooks.errors import ConfigError, PermanentError
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.remedy import checkpoint, follower, requeue
from slurm_hooks.remedy.follower import Phase
from slurm_hooks.remedy.outcome import Outcome
from slurm_hooks.remedy.wiring import Wiring

USR2_SCRIPT = b"#!/bin/bash\n#SBATCH --gres=gpu:1\n#SBATCH --signal=USR2@90\nsrun python -m submitit.core._submit x\n"


@pytest.fixture
def t(tmp_path):
    spool = tmp_path / "spool" / "%n"
    cfg = sim_config(tmp_path, f'[requeue]\nspool_dir = "{spool}"\ncheckpoint_grace = 5.0\n'
                               f'[metrics]\ntextfile_dir = "{tmp_path}/prom"\n')
    os.makedirs(tmp_path / "prom")
    slurm = FakeSlurm()
    slurm.add_node("n1", "MIXED")
    slurm.add_job(101, "n1")
    w = Wiring(cfg, "n1", AuditLog(cfg.log.audit), slurm_override=slurm)
    return SimpleNamespace(w=w, slurm=slurm, tmp=tmp_path, spool=tmp_path / "spool" / "n1")


def sent(slurm):
    """The signals sent, less the SIGCONT that goes before each (checked once, on its own)."""
    return [c for c in slurm.called("signal") if c[2] != "CONT"]


def steps(t, action):
    return [(r["target"], r["result"]) for r in t.w.audit.read() if r.get("action") == action]


def requeue_now(t):
    outcome = Outcome()
    requeue.requeue_jobs(t.w, outcome, follow="none", fault_at=time.time() - 0.5)
    return outcome


def test_a_job_with_a_signal_gets_it_first_and_is_not_requeued_yet(t):
    t.slurm.scripts[101] = USR2_SCRIPT
    outcome = requeue_now(t)
    assert (outcome.requeued, outcome.signalled) == ([], ["101"])
    # SIGCONT first, as Slurm sends its warning signal: a stopped or suspended job could not act on it
    assert t.slurm.called("signal") == [("signal", 101, "CONT", "steps"), ("signal", 101, "USR2", "steps")]
    assert t.slurm.called("requeue") == []
    rec = follower.read_record(t.w, "101")
    assert (rec.phase, rec.signal, rec.source) == (Phase.GRACE, "USR2@90", "script")
    assert 4.5 < rec.grace_until - rec.signalled_at <= 5.0  # [requeue] checkpoint_grace, under @90 and KillWait 30


def test_a_job_that_requeues_itself_is_started_now_and_never_requeued_again(t):
    t.slurm.scripts[101] = USR2_SCRIPT
    requeue_now(t)
    t.slurm.job_states(101, ["PENDING"], restarts=1, reason="BeginTime", nodes="")
    assert follower.finish_followed(t.w) == {"101": "ok"}
    assert t.slurm.called("requeue") == [] and t.slurm.called("start_now") == [("start_now", 101)]
    [self_requeue] = [r for r in t.w.audit.read() if r.get("action") == "requeue"]
    assert (self_requeue["result"], self_requeue["requeued_by"], self_requeue["signal"]) == ("self", "self", "USR2@90")
    assert "requeued itself" in t.slurm.admin_comments[101] and "USR2@90 (checkpoint)" in t.slurm.admin_comments[101]
    prom = (t.tmp / "prom" / "slurm_hooks.prom").read_text()
    assert 'slurm_hooks_requeue_seconds_count{node="n1",kind="self"} 1' in prom
    # A later run on the node does not touch it again.
    assert follower.finish_followed(t.w) == {} and requeue_now(t).requeued == []


def test_a_job_still_running_when_the_grace_is_over_is_requeued_once_by_us(t):
    t.slurm.scripts[101] = USR2_SCRIPT
    requeue_now(t)
    assert follower.finish_followed(t.w) == {"101": "timed out"}  # in its grace: left running
    assert t.slurm.called("requeue") == []
    rec = follower.read_record(t.w, "101")
    follower.write_record(t.w, follower.replace(rec, grace_until=time.time() - 0.1))  # the grace passes
    follower.finish_followed(t.w)
    assert t.slurm.called("requeue") == [("requeue", 101)]
    [ours] = [r for r in t.w.audit.read() if r.get("action") == "requeue"]
    assert (ours["result"], ours["requeued_by"]) == ("ok", "ours")
    assert "no checkpoint: requeued after the grace" in ours["detail"]
    assert follower.read_record(t.w, "101").phase is Phase.REQUEUED
    t.slurm.job_states(101, ["PENDING"], restarts=1, nodes="")
    assert follower.finish_followed(t.w) == {"101": "ok"}
    assert t.slurm.called("requeue") == [("requeue", 101)]  # once


def test_another_run_during_the_grace_leaves_the_job_to_its_follower(t):
    t.slurm.scripts[101] = USR2_SCRIPT
    requeue_now(t)
    again = requeue_now(t)  # the watcher and the health check on the same fault
    assert (again.requeued, again.signalled) == ([], [])
    assert len(sent(t.slurm)) == 1
    assert steps(t, "requeue") == []  # the first run's signal record says it all


def test_a_job_that_ends_in_its_grace_is_not_requeued(t):
    t.slurm.scripts[101] = USR2_SCRIPT
    requeue_now(t)
    t.slurm.job_states(101, ["COMPLETED"])
    assert follower.finish_followed(t.w) == {"101": "ended COMPLETED"}
    assert t.slurm.called("requeue") == []


def test_a_signal_that_cannot_be_sent_means_the_plain_requeue_at_once(t):
    t.slurm.scripts[101] = USR2_SCRIPT
    t.slurm.fail("signal", PermanentError("scancel: error: Kill job error on job id 101"))
    outcome = requeue_now(t)
    assert outcome.requeued == ["101"] and outcome.signalled == []
    assert steps(t, "signal") == [("101", "failed")]


def test_a_job_without_a_signal_keeps_todays_path(t):
    outcome = requeue_now(t)
    assert outcome.requeued == ["101"] and t.slurm.called("signal") == []
    [r] = [r for r in t.w.audit.read() if r.get("action") == "requeue"]
    assert r["requeued_by"] == "ours" and r["seconds_from_fault"] >= 0.5


def test_the_command_line_wins_over_the_environment_and_the_script(t):
    t.slurm.scripts[101] = USR2_SCRIPT
    t.slurm.submit_lines[101] = "sbatch --signal=B:USR1@20 job.sh"
    requeue_now(t)
    assert sent(t.slurm) == [("signal", 101, "USR1", "batch")]
    rec = follower.read_record(t.w, "101")
    assert (rec.signal, rec.source) == ("B:USR1@20", "submit-line")


def test_the_batch_hosts_spool_copy_is_read_before_asking_slurm(t):
    (t.spool / "job00101").mkdir(parents=True)
    (t.spool / "job00101" / "slurm_script").write_bytes(b"#!/bin/sh\n#SBATCH --signal=B:USR1@60\nsleep 1\n")
    t.slurm.scripts[101] = USR2_SCRIPT  # what scontrol would say: not asked
    requeue_now(t)
    assert sent(t.slurm) == [("signal", 101, "USR1", "batch")]


def test_a_spool_copy_that_is_a_link_or_a_fifo_is_not_read(t, tmp_path):
    (t.spool / "job00101").mkdir(parents=True)
    secret = tmp_path / "secret"
    secret.write_bytes(b"#!/bin/sh\n#SBATCH --signal=USR1\n")
    os.symlink(secret, t.spool / "job00101" / "slurm_script")
    assert checkpoint.spool_script(str(t.spool.parent / "%n"), "n1", 101) is None
    os.unlink(t.spool / "job00101" / "slurm_script")
    os.mkfifo(t.spool / "job00101" / "slurm_script")
    assert checkpoint.spool_script(str(t.spool.parent / "%n"), "n1", 101) is None  # and returns at once


def test_the_sites_policy_per_partition_for_jobs_that_declare_none(tmp_path):
    cfg = sim_config(tmp_path, '[requeue]\nsignal = "USR1@30"\npartitions = { debug = "", gpu = "B:USR2" }\n')
    slurm = FakeSlurm()
    slurm.add_node("n1", "MIXED")
    for job_id, part in ((1, "gpu"), (2, "debug"), (3, "batch")):
        slurm.add_job(job_id, "n1")
        slurm.partitions[job_id] = part
    w = Wiring(cfg, "n1", AuditLog(cfg.log.audit), slurm_override=slurm)
    outcome = Outcome()
    requeue.requeue_jobs(w, outcome, follow="none")
    assert sent(slurm) == [("signal", 1, "USR2", "batch"), ("signal", 3, "USR1", "steps")]
    assert outcome.requeued == ["2"]
    assert follower.read_record(w, "1").source == "policy"


def test_the_grace_never_outlasts_killwait_nor_the_jobs_own_time(t):
    t.slurm.kill_wait_s = 2.0
    t.slurm.scripts[101] = USR2_SCRIPT
    requeue_now(t)
    rec = follower.read_record(t.w, "101")
    assert rec.grace_until - rec.signalled_at == pytest.approx(2.0, abs=0.05)


@pytest.mark.parametrize("text, where", [
    ('[requeue]\nsignal = "KILL"\n', "signal"),
    ('[requeue]\nsignal = "USR1@"\n', "signal"),
    ('[requeue]\npartitions = { gpu = 5 }\n', "partitions"),
    ('[requeue]\ncheckpoint_grace = 7200\n', "checkpoint_grace"),
])
def test_a_bad_requeue_policy_is_a_config_error_naming_its_key(tmp_path, text, where):
    with pytest.raises(ConfigError) as err:
        sim_config(tmp_path, text)
    assert f"[requeue] {where}" in str(err.value)


def test_a_record_from_before_this_change_reads_as_requeued(t):
    os.makedirs(t.w.state_path("following"), exist_ok=True)
    with open(t.w.state_path("following", "n1@101"), "w") as fh:
        json.dump({"ref": "101", "node": "n1", "ts": time.time(), "pid": None}, fh)
    assert follower.read_record(t.w, "101").phase is Phase.REQUEUED


def test_the_health_check_signals_first_and_the_incident_names_the_signal_and_the_self_requeue(t):
    from slurm_hooks.hooks import healthcheck
    from slurm_hooks.observe import incidents
    from slurm_hooks.probes import sim

    sim.init(t.w.config.gpu.sim_dir, "n1", 8)
    t.slurm.scripts[101] = USR2_SCRIPT
    sim.inject(t.w.config.gpu.sim_dir, "n1", 3, xid=79)
    _, outcome = healthcheck.run(t.w, follow="none")
    assert outcome.drained and outcome.signalled == ["101"] and t.slurm.called("requeue") == []
    t.slurm.job_states(101, ["PENDING"], restarts=1, nodes="")
    assert follower.finish_followed(t.w) == {"101": "ok"}
    [inc] = incidents.build(t.w.audit.read())
    [job] = incidents.summary(inc)["jobs"]
    assert (job["job_id"], job["signal"], job["requeued_by"], job["checkpoint"]) == (
        "101", "USR2@90", "self", "requeued itself")
    assert 0 <= job["requeue_s"] < 5


def test_jobs_the_watchers_thread_follows_are_left_to_it_by_the_other_hooks(t):
    import subprocess
    import sys

    t.slurm.scripts[101] = USR2_SCRIPT
    requeue_now(t)
    watcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "slurm_hooks", "watch"])
    try:
        # Popen returns before the child has exec'd: until then /proc shows pytest's argv
        wait_for(lambda: b"watch" in Path(f"/proc/{watcher.pid}/cmdline").read_bytes().split(b"\0"),
                 10, "the stand-in watcher runs")
        rec = follower.read_record(t.w, "101")
        follower.write_record(t.w, follower.replace(rec, pid=watcher.pid, grace_until=time.time() - 1))
        assert follower.finish_followed(t.w) == {}  # the epilog on the node does not take it over
        assert t.slurm.called("requeue") == []
    finally:
        watcher.kill()
        watcher.wait()
    assert follower.finish_followed(t.w) == {"101": "timed out"}  # the watcher is gone: the next run does it
    assert t.slurm.called("requeue") == [("requeue", 101)]


def test_the_watcher_signals_first_and_its_thread_sees_the_job_requeue_itself(t):
    from slurm_hooks.hooks.watch import Watcher
    from slurm_hooks.probes import sim

    sim_dir = t.w.config.gpu.sim_dir
    sim.init(sim_dir, "n1", 8)
    t.slurm.scripts[101] = b"#!/bin/sh\n#SBATCH --signal=B:USR1@60\n"
    sim.inject(sim_dir, "n1", 3, xid=79)
    [event] = [e for g in sim.SimProbe(sim_dir, "n1").snapshot().gpus for e in g.xids]
    Watcher(t.w, source=None, log=lambda m: None).handle(event)
    assert sent(t.slurm) == [("signal", 101, "USR1", "batch")]
    t.slurm.job_states(101, ["PENDING"], restarts=1, nodes="")
    deadline = time.monotonic() + 10
    while not t.slurm.called("start_now") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert t.slurm.called("start_now") == [("start_now", 101)] and t.slurm.called("requeue") == []
    assert ("101", "self") in steps(t, "requeue")


def test_full_delivery_where_configured_reaches_the_batch_shell_and_every_step(tmp_path):
    cfg = sim_config(tmp_path, f'[requeue]\nfull = true\nspool_dir = "{tmp_path}/spool/%n"\n')
    slurm = FakeSlurm()
    slurm.add_node("n1", "MIXED")
    slurm.add_job(7, "n1")
    slurm.scripts[7] = b"#!/bin/sh\n#SBATCH --signal=R:USR2@90\n"
    w = Wiring(cfg, "n1", AuditLog(cfg.log.audit), slurm_override=slurm)
    requeue.requeue_jobs(w, Outcome(), follow="none")
    assert sent(slurm) == [("signal", 7, "USR2", "full")]


def test_a_real_process_with_the_same_job_id_and_node_is_not_this_tests_job(tmp_path):
    """This machine's /proc holds the testbeds' real jobs, with the same ids and node names as the
    in-memory Slurm's: an elastic torchrun agent of job 1 on n1 here is not the unit test's job 1,
    whose requeue must neither read it as healing in place nor signal it (tests/conftest.py)."""
    hit = tmp_path / "hit"
    code = ("import signal, sys, time\n"
            f"signal.signal(signal.SIGTERM, lambda s, f: open({str(hit)!r}, 'a').write('TERM'))\n"
            "print('ready', flush=True)\ntime.sleep(60)\n")
    env = {**os.environ, "SLURM_JOB_ID": "1", "SLURMD_NODENAME": "n1", "SLURM_STEP_ID": "0"}
    env.pop("SLURM_CONF", None)
    decoy = subprocess.Popen([sys.executable, "-c", code, "torchrun", "--nnodes=1:2", "--max_restarts=3"], env=env,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert decoy.stdout.readline().strip() == "ready"
        cfg = sim_config(tmp_path, "")
        slurm = FakeSlurm()
        slurm.add_node("n1", "MIXED")
        slurm.add_job(1, "n1")
        w = Wiring(cfg, "n1", AuditLog(cfg.log.audit), slurm_override=slurm)
        outcome = Outcome()
        requeue.requeue_jobs(w, outcome, follow="none")
        assert outcome.requeued == ["1"] and outcome.signalled == []
        time.sleep(0.2)
        assert not hit.exists()
    finally:
        decoy.kill()
        decoy.wait(timeout=10)
