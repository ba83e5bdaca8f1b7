"""validate and the repair ladder's reboot: RebootProgram, ResumeTimeout, HealthCheckTimeout, a volatile state dir."""

from __future__ import annotations

import pytest
from preflight.test_validate import Cluster, only

from slurm_hooks import preflight as validate
from slurm_hooks.preflight.environment import fs_type


@pytest.fixture
def cluster(tmp_path):
    return Cluster(tmp_path)


def _config_line(cluster, text):
    for no, line in enumerate(open(cluster.config), 1):
        if line.strip() == text:
            return no
    raise AssertionError(text)


def test_no_reboot_program_fails_naming_the_config_line_that_turns_the_rung_on(cluster):
    cluster.edit_slurm_conf("RebootProgram=/usr/sbin/reboot\n", "")
    with open(cluster.config, "a", encoding="utf-8") as fh:
        fh.write("\n[repair]\nreboot = true\n")
    r = only(cluster.run(), "reboot-program")
    assert r.status is validate.Status.FAIL
    assert r.where == f"{cluster.config}:{_config_line(cluster, 'reboot = true')}"
    assert "RebootProgram is not set" in r.message and "refuses `scontrol reboot`" in r.message
    assert r.fix.startswith("RebootProgram=")


def test_no_reboot_program_is_fine_with_the_reboot_rung_off(cluster):
    cluster.edit_slurm_conf("RebootProgram=/usr/sbin/reboot\n", "")
    with open(cluster.config, "a", encoding="utf-8") as fh:
        fh.write("\n[repair]\nreboot = false\n")
    assert only(cluster.run(), "reboot-program").status is validate.Status.PASS


def test_resume_timeout_shorter_than_our_reboot_timeout_fails_naming_its_line(cluster):
    cluster.edit_slurm_conf("ResumeTimeout=900", "ResumeTimeout=300")
    r = only(cluster.run(), "resume-timeout")
    assert r.status is validate.Status.FAIL
    assert r.where == f"{cluster.slurm_conf}:{cluster.line_of('ResumeTimeout')}"
    assert "reboot_timeout = 900" in r.message and r.fix.startswith("ResumeTimeout=900")


def test_resume_timeout_unset_is_slurms_60_s(cluster):
    cluster.edit_slurm_conf("ResumeTimeout=900\n", "")
    r = only(cluster.run(), "resume-timeout")
    assert r.status is validate.Status.FAIL and "ResumeTimeout unset (default 60)" in r.message


def test_health_check_timeout_of_26_05_is_read_not_assumed(cluster):
    assert only(cluster.run(), "health-check-timeout").status is validate.Status.PASS  # 45 s < 60 s
    cluster.edit_slurm_conf("HealthCheckInterval=300", "HealthCheckInterval=300\nHealthCheckTimeout=30")
    r = only(cluster.run(), "health-check-timeout")
    assert r.status is validate.Status.FAIL and "HealthCheckTimeout=30" in r.message


def test_a_state_dir_on_tmpfs_warns(cluster, tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/sda1 / ext4 rw 0 0\ntmpfs /run tmpfs rw 0 0\ntmpfs /var/lib/slurm-hooks tmpfs rw 0 0\n")
    assert fs_type("/var/lib/slurm-hooks/state", str(mounts)) == "tmpfs"
    assert fs_type("/var/lib/other", str(mounts)) == "ext4"
    assert fs_type("/run", str(mounts)) == "tmpfs"
    results = cluster.run()
    volatile = [r for r in results if r.check == "state-dir-volatile"]
    assert bool(volatile) == (fs_type(str(tmp_path / "state")) in ("tmpfs", "ramfs"))
