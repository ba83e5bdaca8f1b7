"""What marks a job as healing itself: its declaration, or what its script and command line show."""

from __future__ import annotations

from slurm_hooks.slurm.jobheal import Heals, from_comment, from_text, parse_declared
from slurm_hooks.slurm.scontrol import parse_job_record


def test_a_comment_word_declares_the_frameworks_and_unknown_words_are_left_out():
    assert from_comment("run 7; heals=nvrx,megatron,bogus") == {Heals.NVRX, Heals.MEGATRON}
    assert from_comment("no heals here") == frozenset()
    assert parse_declared("in-place") == {Heals.IN_PLACE}


def test_ft_launcher_in_a_script_marks_nvrx():
    assert Heals.NVRX in from_text(b"#!/bin/bash\nsrun --kill-on-bad-exit=0 ft_launcher --nnodes=2 train.py\n")


def test_torchrun_is_in_place_only_with_an_elastic_node_range_and_restarts():
    elastic = "srun torchrun --nnodes=1:4 --max-restarts=3 --nproc-per-node=8 train.py"
    assert from_text(elastic) == {Heals.TORCHRUN}
    assert from_text("python -m torch.distributed.run --nnodes=2:4 --max_restarts=1 x.py") == {Heals.TORCHRUN}
    # fixed membership waits for every node; no restarts cannot go on at all
    assert from_text("torchrun --nnodes=4 --max-restarts=3 train.py") == frozenset()
    assert from_text("torchrun --nnodes=1:4 train.py") == frozenset()


def test_megatron_is_seen_by_name_and_a_plain_script_is_nothing():
    assert from_text("srun python pretrain_gpt.py --rerun-mode validate_results") == {Heals.MEGATRON}
    assert from_text("#!/bin/sh\nexit 16\n") == frozenset()


def test_scontrol_show_job_gives_comment_command_batch_host_exit_code_and_exclusions():
    text = ("JobId=42 JobName=train\n   UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A\n"
            "   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=16:0\n"
            "   NodeList=n1\n   BatchHost=n1\n   ReqNodeList=(null) ExcNodeList=n[3-4]\n"
            "   Command=/home/alice/run.sh\n   WorkDir=/home/alice\n   Comment=heals=megatron nightly \n")
    rec = parse_job_record(text)
    assert (rec.comment, rec.command, rec.batch_host, rec.exit_code, rec.excluded) == (
        "heals=megatron nightly", "/home/alice/run.sh", "n1", 16, "n[3-4]")
    assert parse_job_record("JobId=1 JobName=x\n   ExcNodeList=(null)\n").excluded == ""
