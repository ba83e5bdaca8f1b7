"""A job's ``--signal``, read from what the user wrote: scripts, SBATCH_SIGNAL, submit lines."""

from __future__ import annotations

import pytest

from slurm_hooks.slurm.jobsignal import (
    SCRIPT_MAX_BYTES,
    JobSignal,
    Source,
    Target,
    environ_value,
    from_environment,
    from_script,
    from_submit_line,
    parse_spec,
)


@pytest.mark.parametrize("spec, want", [
    ("USR2@90", ("USR2", 90, Target.STEPS, False)),
    ("SIGUSR1@90", ("USR1", 90, Target.STEPS, False)),
    ("B:USR1@60", ("USR1", 60, Target.BATCH, False)),
    ("R:TERM", ("TERM", 60, Target.STEPS, True)),
    ("RB:10@5", ("USR1", 5, Target.BATCH, True)),
    ("usr1", ("USR1", 60, Target.STEPS, False)),
])
def test_signal_specs_read_as_sbatch_reads_them(spec, want):
    sig = parse_spec(spec)
    assert (sig.name, sig.warn_s, sig.target, sig.reservation) == want


@pytest.mark.parametrize("spec", ["KILL@90", "STOP", "9", "USR1@70000", "X:USR1", "USR1@", "$(reboot)", "USR1;ls"])
def test_a_signal_no_job_can_checkpoint_on_or_a_bad_spec_is_refused(spec):
    with pytest.raises(ValueError):
        parse_spec(spec)


def test_submitits_script_says_usr2_at_90():
    script = (b"#!/bin/bash\n\n# Parameters\n#SBATCH --gres=gpu:1\n#SBATCH --job-name=submitit\n"
              b"#SBATCH --open-mode=append\n#SBATCH --signal=USR2@90\n#SBATCH --time=60\n\n"
              b"# command\nexport SUBMITIT_EXECUTOR=slurm\nsrun --unbuffered python -u -m submitit.core._submit x\n")
    assert from_script(script) == JobSignal("USR2", 90, Target.STEPS, False, Source.SCRIPT)


def test_only_the_leading_sbatch_block_counts_and_the_last_signal_in_it_wins():
    script = (b"#!/bin/sh\n#SBATCH --signal=USR1@30\n#SBATCH -p gpu --signal B:USR2@45  # trailing\n"
              b"echo hi\n#SBATCH --signal=TERM@10\n")
    assert from_script(script).spec == "B:USR2@45"


def test_a_hostile_script_is_data():
    assert from_script(b"#!/bin/sh\n#SBATCH --signal='$(touch /tmp/x)'\n#SBATCH --signal=\"unclosed\n") is None
    assert from_script(b"\xff\xfe#SBATCH\x00--signal=USR1\n" * 10) is None
    huge = b"#!/bin/sh\n" + b"#SBATCH --comment=x\n" * (SCRIPT_MAX_BYTES // 20) + b"#SBATCH --signal=USR1@5\n"
    assert from_script(huge) is None  # past the head read: not looked at


def test_the_environment_and_the_submit_line():
    assert from_environment("B:USR1@120").spec == "B:USR1@120"
    assert from_environment("garbage") is None and from_environment(None) is None
    line = "sbatch --gres=gpu:1 --signal=SIGUSR1@90 --wrap='srun python train.py --signal=TERM'"
    sig = from_submit_line(line)
    assert (sig.spec, sig.source) == ("USR1@90", Source.SUBMIT_LINE)
    assert from_submit_line("sbatch job.sh") is None
    assert from_submit_line("salloc --signal=USR1") is None
    assert from_submit_line("/usr/bin/sbatch --signal USR2@30 -- job.sh --signal=TERM").spec == "USR2@30"


@pytest.mark.parametrize(("line", "spec"), [
    ("sbatch job.sh --signal=USR1@30", None),  # the script's own argument, not sbatch's
    ("sbatch -p gpu job.sh --signal USR1@30", None),  # -p takes "gpu": job.sh is the script
    ("sbatch --signal=USR2@60 job.sh --signal=TERM@5", "USR2@60"),
    ("sbatch --partition gpu -N2 --requeue --signal B:USR1@90 train.sh --epochs 3", "B:USR1@90"),
    ("sbatch -Hvp gpu --signal=USR1@10 run.sh", "USR1@10"),  # flags, then -p's value as the next word
    ("sbatch --time 10 --wrap 'python t.py --signal=TERM' --signal=USR1@20", "USR1@20"),
    ("sbatch -a 0-3 --signal=B:USR1@60 job.sh", "B:USR1@60"),  # -a (--array) takes a value
    ("sbatch --kill-on-invalid-dep yes --signal=USR1@30 job.sh", "USR1@30"),  # and so does this one
])
def test_a_signal_after_the_script_name_belongs_to_the_script(line, spec):
    found = from_submit_line(line)
    assert (found.spec if found else None) == spec


def test_environ_blobs():
    blob = b"PATH=/bin\0SLURM_JOB_ID=12\0SBATCH_SIGNAL=B:USR1@9\0"
    assert environ_value(blob, "SBATCH_SIGNAL") == "B:USR1@9"
    assert environ_value(blob, "SLURM_JOB") is None
