"""`slurm-hooks demo` end to end: its own cluster, a training job, XID 79, recovery in seconds."""

from __future__ import annotations

import os
import time

import pytest

from slurm_hooks.lab import demo
from slurm_hooks.slurm import JobInfo, NodeInfo


@pytest.mark.slurm
def test_demo_recovers_the_training_job_from_its_checkpoint_in_seconds(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the demo's testbed needs root")
    lines: list[str] = []
    ms = demo.run(str(tmp_path / "demo"), say=lines.append, steps_before_fault=6, timeout=90)
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
