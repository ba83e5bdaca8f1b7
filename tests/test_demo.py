"""`slurm-hooks demo` end to end: its own cluster, a training job, XID 79, recovery in seconds."""

from __future__ import annotations

import os

import pytest

from slurm_hooks import demo

pytestmark = pytest.mark.slurm


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
    assert "drain   n" in text and "slurm-hooks: XID 79 on GPU" in text  # the timeline was shown
