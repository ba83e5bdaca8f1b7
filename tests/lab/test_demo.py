"""`slurm-hooks demo` end to end: its own cluster, a training job, XID 79, recovery in seconds."""

from __future__ import annotations

import os
import time

import pytest

from slurm_hooks.lab import ddp_train, demo
from slurm_hooks.slurm import JobInfo, NodeInfo


@pytest.mark.slurm
def test_demo_recovers_the_training_job_from_its_checkpoint_in_seconds(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the demo's testbed needs root")
    lines: list[str] = []
    ms = demo.run(str(tmp_path / "demo"), say=lines.append, steps_before_fault=6, timeout=90, ddp=False)
    text = "\n".join(lines)
    assert ms.times["node drained"] < 2.0, text
    assert ms.times["job running again"] < 10.0, text
    assert ms.times["node drained"] <= ms.times["job running again"] <= ms.times["resumed from checkpoint"]
    resumed = ms.details["resumed from checkpoint"]
    assert "(restart 1)" in resumed, resumed
    step = int(resumed.split()[1])
    assert step >= 5  # it kept what it had learned: at least the first checkpoint
    # It got its own signal first, saved, requeued itself: nothing lost.
    assert "requeued itself" in ms.details["job checkpointed"], ms.details
    assert ms.times["job checkpointed"] <= ms.times["job running again"]
    assert ms.details["steps lost"] == "0" and "steps lost: 0" in text, text
    assert "drain   n" in text and "slurm-hooks: XID 79 on GPU" in text  # the timeline was shown
    # The job has moved on; the drained node comes back by itself: reboot through Slurm, checked, IDLE.
    assert ms.details["reboot requested"].endswith("[reboot 1/1]"), ms.details
    assert ms.details["node rebooted"].endswith("boot 1"), ms.details
    assert "checked healthy on the new boot" in ms.details["checked healthy"], ms.details
    assert ms.details["back in service"].endswith(": IDLE"), ms.details
    assert ms.times["job running again"] <= ms.times["back in service"] < 60.0, text
    assert ms.times["reboot requested"] <= ms.times["node rebooted"] <= ms.times["checked healthy"] \
        <= ms.times["back in service"], ms.times
    assert "repair-reboot n1 ok" in text and "XID -> back in service" in text


class _World:
    """Slurm and the job's output as the demo sees them: the requeued job starts on n2 and
    prints its resume line the moment slurmctld is first asked about it."""

    def __init__(self, out: str):
        self.out = out
        self.asked = 0

    def slurm(self):
        return self

    def job(self, job_id: int) -> JobInfo:
        self.asked += 1
        if self.asked == 1:
            with open(self.out, "a", encoding="utf-8") as fh:
                fh.write("resumed from step 5 (restart 1) on n2\nstep 6 loss 0.5\n")
        return JobInfo(job_id, "train-demo", "RUNNING", nodes="n2", restarts=1)

    def node(self, name: str) -> NodeInfo:
        return NodeInfo(name, "IDLE+DRAIN", reason="slurm-hooks: XID 79 on GPU 0 [reboot]")


def test_milestones_seen_in_one_poll_keep_the_order_they_happened_in(tmp_path):
    out = tmp_path / "train.out"
    out.write_text("step 1 loss 0.9\n")
    world = _World(str(out))
    ms = demo.Milestones(injected=time.time())
    slow_terminal = lambda line: time.sleep(0.01)  # noqa: E731 - printing each line takes a moment
    demo._follow(world, 1, "n1", str(out), ms, timeout=10, say=slow_terminal)
    assert ms.times["node drained"] <= ms.times["job running again"] <= ms.times["resumed from checkpoint"], ms.times


@pytest.mark.slurm
def test_the_talks_demo_a_ddp_job_on_two_nodes_is_requeued_once_onto_the_healthy_nodes_and_resumes(tmp_path):
    why = ddp_train.torch_missing()  # asked here, not at import: collecting starts no torch
    if why:
        pytest.skip(why)
    if os.geteuid() != 0:
        pytest.skip("the demo's testbed needs root")
    lines: list[str] = []
    ms = demo.run(str(tmp_path / "demo"), say=lines.append, timeout=120)  # torch here: the DDP job
    text = "\n".join(lines)
    assert "PyTorch DDP training job on 2 nodes" in text and "rank 0 on n" in text and "rank 1 on n" in text, text
    bad = ms.details["node drained"].split(":")[0]
    assert "slurm-hooks: XID 79 on GPU" in ms.details["node drained"], ms.details
    assert ms.details["job got SIGTERM"].startswith("got SIGTERM"), ms.details
    running = ms.details["job running again"]
    assert "(restart 1)" in running and bad not in running.split(" on ")[1], running
    assert ms.details["restarts"] == "1" and ms.details["requeues"] == "1", ms.details  # once, by one hook
    assert ms.details["healthy node drained"] == "no", ms.details
    assert "(restart 1)" in ms.details["resumed from checkpoint"], ms.details
    assert int(ms.details["steps lost"]) * demo.DDP_STEP_S <= 2.0, ms.details
    assert ms.times["node drained"] <= ms.times["job running again"] <= ms.times["resumed from checkpoint"]
    assert "requeued once (Restarts=1" in text and "steps lost: " in text and "drain   " + bad in text, text


def test_without_torch_the_demo_says_how_to_get_it_in_one_line_and_runs_the_one_node_job(tmp_path, monkeypatch):
    monkeypatch.setattr(ddp_train, "torch_missing", lambda python=ddp_train.TORCH_PYTHON: "no torch here")

    class OneNode:
        def __init__(self, state_dir, settings, progress=None):
            raise demo.DemoError(f"testbed of {settings.nodes} nodes")

    monkeypatch.setattr(demo, "Testbed", OneNode)
    lines: list[str] = []
    with pytest.raises(demo.DemoError, match="testbed of 2 nodes"):
        demo.run(str(tmp_path / "demo"), say=lines.append)
    assert len(lines) == 1 and "apt-get install python3-torch" in lines[0], lines
