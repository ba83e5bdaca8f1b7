"""A new admin's first incidents on the testbed, read from the pages a webhook receiver got.

Three nodes, the repair ladder on, the health check every 2 s as slurmd runs it, one JSON webhook
receiver on 127.0.0.1 in the config's kept lines. An XID 79 under a job drains its node and
requeues the job, which runs on another node; the ladder reboots the node and it comes back by
itself. On n2 an XID 48 that neither a reset nor a reboot mends climbs to ``[replace]``: that page,
read alone, says who acts, what to do, which serial to send back and where the evidence is. A person
drains n2 for their own reason and later resumes it: the page says it returned to service by a
person with the GPU still marked (never "back in service"), the person's choice stands (a job runs
there, no drain again), ``status`` and the report list n2 alike as waiting for a person, and
``slurm-hooks rma clear`` ends the mark with an audit record naming who cleared it.

A cluster of its own (one module, one test): every wait has a deadline and polls its condition.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import audit_records, own_testbed, wait_for

from slurm_hooks import fsutil
from slurm_hooks.lab.testbed import KEEP_BELOW, LabSettings
from slurm_hooks.probes import sim

pytestmark = pytest.mark.slurm
pytest_plugins = ["fakes.webhook"]

SETTINGS = LabSettings(nodes=3, gpus=4, hooks=True, kill_wait=2, health_check_interval=2, requeue_grace=3.0,
                       repair=True)
#: n2's GPU that goes [replace].
BAD = 1
CABLING = "maint: admin checks cabling"

#: A requeueable job that says where it runs and leaves at once on SIGTERM.
TRAP_JOB = """#!/bin/sh
trap 'echo "got SIGTERM restart=${SLURM_RESTART_COUNT:-0} on $SLURMD_NODENAME"; exit 0' TERM
echo "start restart=${SLURM_RESTART_COUNT:-0} on $SLURMD_NODENAME gpus=$SLURM_JOB_GPUS"
while true; do sleep 0.1; done
"""


@pytest.fixture
def tb(tmp_path_factory, receiver):
    with own_testbed(tmp_path_factory, "replacebed", SETTINGS) as bed:
        # What an admin adds below the testbed's line: a receiver, kept by every `testbed up`.
        with open(bed.config_path, encoding="utf-8") as fh:
            text = fh.read()
        assert KEEP_BELOW in text
        text += f'\n[[notify.webhook]]\nname = "oncall"\nurl = "{receiver.url()}"\nformat = "json"\n'
        fsutil.atomic_write(bed.config_path, text, mode=0o600)
        yield bed


def records(tb, node=None, action=None, result=None):
    return [r for r in audit_records(tb.audit_log)
            if (node is None or r.get("node") == node) and (action is None or r.get("action") == action)
            and (result is None or r.get("result") == result)]


def pages(receiver, node, kind=None):
    """What the receiver kept about ``node`` (one per Idempotency-Key), oldest first."""
    return [b for b in receiver.delivered() if b.get("node") == node and (kind is None or b.get("kind") == kind)]


def started(tb, job, restart):
    """(node, first GPU) once the batch script runs (past the prolog) for the ``restart``-th time."""
    for line in tb.job_output(job).splitlines():
        if line.startswith(f"start restart={restart} "):
            fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
            return line.split(" on ")[1].split()[0], int(fields["gpus"].split(",")[0])
    return None


def cli(tb, *args, ok=(0,), env=None):
    done = subprocess.run([sys.executable, "-m", "slurm_hooks", *args], env={**tb.env(), **(env or {})},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode in ok, (args, done.returncode, done.stdout, done.stderr)
    return done


def for_a_person(tb):
    """(what ``status --json`` says waits for a person, what ``report --json`` says): node -> what to do."""
    status = json.loads(cli(tb, "status", "--json", "--max-wait", "0").stdout)
    report = json.loads(cli(tb, "report", "--json", "--no-accounting", "--since", "1h").stdout)
    return ({r["node"]: r["todo"] for r in status["nodes"] if r["next"] == "a person"},
            {w["node"]: w["todo"] for w in report["waiting_for_a_person"] if w["who"] == "a person"})


def test_replace_page_tells_a_person_what_to_do_and_a_persons_resume_keeps_the_gpu_marked_until_rma_clear(
        tb, receiver):
    story = time.monotonic()
    slurm = tb.slurm()

    def seen():
        return (f"nodes {[(n.name, n.state, n.reason) for n in slurm.nodes()]}; "
                f"actions {[(r.get('node'), r.get('action'), r.get('result')) for r in records(tb)][-12:]}; "
                f"pages {[(b.get('node'), b.get('kind'), b.get('action')) for b in receiver.delivered()]}")

    # -- XID 79 under a job: drained, requeued, the job runs on another node; the node comes back by itself.
    job = tb.sbatch(TRAP_JOB, "--gres=gpu:1", "--requeue", "--open-mode=append", "--exclude=n2", "--job-name=train")
    hit, gpu = wait_for(lambda: started(tb, job, 0), 30, f"job {job} runs", seen=seen)
    other = "n3" if hit == "n1" else "n1"
    sim.inject(tb.sim_dir, hit, gpu, xid=79)
    fault = time.monotonic()
    tb.wait_node(hit, lambda n: n.drained and n.reason.startswith(f"slurm-hooks: XID 79 on GPU {gpu}"), timeout=15)
    drained_s = time.monotonic() - fault
    where, _ = wait_for(lambda: started(tb, job, 1), 30, f"job {job} runs again after its requeue", seen=seen)
    assert where == other and f"got SIGTERM restart=0 on {hit}" in tb.job_output(job)
    elsewhere_s = time.monotonic() - fault
    assert [r["result"] for r in records(tb, action="requeue")] == ["ok"]
    tb.wait_node(hit, lambda n: n.state.upper() == "IDLE" and not n.drained, timeout=90)
    [back] = wait_for(lambda: pages(receiver, hit, "resolved"), 30, f"{hit}'s closing page", seen=seen)
    assert back["text"].startswith(f"{hit} back in service after ") and "(resumed by slurm-hooks" in back["text"]
    [opened] = pages(receiver, hit, "opened")
    assert "XID 79" in opened["text"] and f"requeued: job {job} (root, train)" in opened["text"], opened["text"]
    assert sim.read(tb.sim_dir, hit)["boots"] == 1

    # -- n2: an XID 48 that neither a reset nor a reboot mends climbs to [replace].
    sim.inject(tb.sim_dir, "n2", BAD, xid=48, cleared_by="never")
    wait_for(lambda: records(tb, "n2", "repair-replace", "ok"), 150, "n2 given up on ([replace])", seen=seen)
    board = sim.gpu_entry(sim.read(tb.sim_dir, "n2"), BAD)
    serial, uuid = board["serial"], board["uuid"]
    assert [(r["action"], r["result"]) for r in records(tb, "n2") if r.get("action") in
            ("repair-reset", "repair-reboot")] == [("repair-reset", "start"), ("repair-reset", "failed"),
                                                    ("repair-reboot", "start"), ("repair-reboot", "failed")]
    [page] = wait_for(lambda: [b for b in pages(receiver, "n2") if b.get("action") == "replace"
                               and b["kind"] in ("opened", "escalated")], 30, "n2's [replace] page", seen=seen)
    text = page["text"]
    # Read alone: who acts, what to do, which board goes back, where the evidence is.
    assert "n2 escalated to [replace]: XID 48" in text, text
    assert (f"Next: a person must replace GPU {BAD} ({uuid}, serial {serial}) on n2 and send it back for RMA; "
            "new hardware is validated and returns the node to service by itself") in text, text
    assert f"slurm-hooks rma clear --node n2 --gpu {BAD}" in text, text
    assert "Evidence: " in text and " (on n2)." in text.split("Evidence: ", 1)[1], text
    named = text.split("Evidence: ", 1)[1].split(" (on n2).", 1)[0].split(", ")
    kept = {r["evidence"] for r in records(tb, "n2") if r.get("evidence")}  # the ladder's bundles on n2
    assert named and set(named) <= kept and all(os.path.isdir(d) and os.listdir(d) for d in named), (named, kept)
    assert page["waiting_for"] == "a person" and page["next"]["who"] == "a person"
    held, listed = for_a_person(tb)
    assert held.keys() == {"n2"} and held == listed and serial in held["n2"], (held, listed)

    # -- A person drains n2 for their own reason, over our [replace]: it still waits for a person.
    tb.scontrol("update", "NodeName=n2", "State=DRAIN", f"Reason={CABLING}")
    drained = time.time()
    wait_for(lambda: [r for r in records(tb, "n2", "drain", "skipped") if r["ts"] > drained], 20,
             "a check on n2 that leaves the person's drain as it is", seen=seen)
    assert slurm.node("n2").reason == CABLING  # theirs stands: our [replace] does not take it back
    held, listed = for_a_person(tb)
    assert held.keys() == {"n2"} and held == listed, (held, listed)

    # -- ... and later resumes it: told as a return by a person with the GPU still marked, never "back in service".
    resumed = time.time()
    tb.scontrol("update", "NodeName=n2", "State=RESUME")
    [told] = wait_for(lambda: pages(receiver, "n2", "resolved"), 30, "n2's page on the person's resume", seen=seen)
    assert told["text"].startswith("n2 returned to service by a person after "), told["text"]
    assert f"with GPU {BAD} ({uuid}, serial {serial}) still marked for replacement" in told["text"], told["text"]
    assert f"slurm-hooks rma clear --node n2 --gpu {BAD}" in told["text"]
    assert not [b for b in pages(receiver, "n2") if "back in service" in b["text"]]
    assert [(r["action"], r["result"]) for r in records(tb, "n2") if r.get("action") == "repair-replace"] == \
        [("repair-replace", "ok"), ("repair-replace", "resumed")]

    # The person's choice stands: a job on every GPU of n2 runs, and no check drains n2 again.
    ran = tb.sbatch("#!/bin/sh\necho ran on $SLURMD_NODENAME gpus=$SLURM_JOB_GPUS\n", "-w", "n2", "--gres=gpu:4")
    tb.wait_job(ran, ("COMPLETED",), timeout=30)
    assert "ran on n2" in tb.job_output(ran)
    node = slurm.node("n2")
    assert not node.drained and not [r for r in records(tb, "n2", "drain", "ok") if r["ts"] > resumed]
    held, listed = for_a_person(tb)
    assert held.keys() == {"n2"} and held == listed, (held, listed)
    assert f"serial {serial}) on n2 at its next maintenance" in held["n2"]

    # -- rma clear ends the mark, audited with who cleared it; status and the report drop n2 alike.
    done = cli(tb, "rma", "clear", "--node", "n2", "--gpu", str(BAD), env={"SUDO_USER": "alice"})
    assert f"n2 GPU {BAD} ({uuid}, serial {serial}): no longer marked" in done.stdout, done.stdout
    [cleared] = records(tb, "n2", "rma-clear", "ok")
    assert cleared["user"] == "alice" and [g["serial"] for g in cleared["gpu_ids"]] == [serial]
    assert for_a_person(tb) == ({}, {})
    took = time.monotonic() - story
    print(f"drained in {drained_s:.2f}s, running on {other} {elsewhere_s:.2f}s after the fault; story {took:.0f}s")
