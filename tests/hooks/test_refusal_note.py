"""What the prolog's refusal tells a --no-requeue job (its AdminComment): Slurm cancels it, unless
slurm.conf's PrologFlags has ForceRequeueOnFail, when Slurm requeues it all the same."""

from __future__ import annotations

import pytest
from fakes.config import sim_config, sim_node

from slurm_hooks.hooks import jobhooks


@pytest.fixture
def node(tmp_path):
    cfg = sim_config(tmp_path)
    slurm, w = sim_node(cfg, "IDLE")
    slurm.add_job(7, "n1", batch=True, requeue=False)
    slurm.add_job(8, "n1", batch=True, requeue=True)
    slurm.add_job(9, "n1", batch=False, requeue=True)
    return w


def conf(tmp_path, monkeypatch, *lines: str) -> None:
    path = tmp_path / "slurm.conf"
    path.write_text("ClusterName=c\n" + "".join(f"{line}\n" for line in lines))
    monkeypatch.setenv("SLURM_CONF", str(path))


def test_without_force_requeue_on_fail_a_no_requeue_job_is_told_to_resubmit(node, tmp_path, monkeypatch):
    conf(tmp_path, monkeypatch, "PrologFlags=Contain")
    assert jobhooks._not_requeued_note(node, "7") == \
        "; --no-requeue: Slurm cancels the job rather than start it elsewhere, resubmit it"
    assert jobhooks._not_requeued_note(node, "8") == ""
    assert "interactive allocation" in jobhooks._not_requeued_note(node, "9")


def test_with_force_requeue_on_fail_in_an_included_file_the_job_is_told_it_is_requeued(node, tmp_path, monkeypatch):
    (tmp_path / "flags.conf").write_text("PrologFlags=Alloc,forcerequeueonfail\n")
    conf(tmp_path, monkeypatch, f"Include {tmp_path / 'flags.conf'}")
    assert jobhooks._not_requeued_note(node, "7") == \
        "; --no-requeue, but PrologFlags=ForceRequeueOnFail: Slurm requeues it all the same"


def test_an_unreadable_slurm_conf_says_what_slurm_does_by_default(node, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing.conf"))
    assert not jobhooks.force_requeue_on_fail()
    assert "resubmit it" in jobhooks._not_requeued_note(node, "7")
