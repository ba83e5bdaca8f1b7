"""The epilog reads the job's exit status as Slurm gives it."""

from __future__ import annotations

from slurm_hooks.remedy.selfheal import exit_status


def test_the_exit_code_comes_from_exit_code2_else_from_the_wait_status():
    assert exit_status({"SLURM_JOB_EXIT_CODE2": "16:0", "SLURM_JOB_EXIT_CODE": "4096"}) == (16, 0)
    assert exit_status({"SLURM_JOB_EXIT_CODE": str(93 << 8)}) == (93, 0)
    assert exit_status({"SLURM_JOB_EXIT_CODE": "15"}) == (0, 15)  # killed by SIGTERM: no exit code
    assert exit_status({}) is None
