"""``check_slurm_hooks`` inside the real LBNL NHC (from ../shared/third_party), without Slurm.

NHC runs from its unpacked tree as a site runs it; its offline/online helpers are stand-ins
that record what NHC asks of them (NHC calls them by ``eval``, the same way as its own), so
these tests see what NHC would do to the node. Our check runs with ``[check] drain = false``
here (no Slurm); what it does to Slurm under NHC is in test_e2e_nhc.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakes.config import write_sim_config
from paths import ROOT

from slurm_hooks.install import apply, layout
from slurm_hooks.lab import nhc
from slurm_hooks.probes import sim

MARK = """#!/bin/sh
echo "$(basename "$0") $*" >> {log}
"""


class NhcRun:
    """NHC's tree under tmp_path, our check in its INCDIR, a sim node n1."""

    def __init__(self, tmp_path: Path, tarball: str):
        self.tmp = tmp_path
        self.tree = nhc.NhcTree(str(tmp_path / "nhc"))
        self.tree.unpack(tarball)
        self.syslog = str(tmp_path / "syslog")
        self.tree.prepare(self.syslog)
        self.config = str(write_sim_config(tmp_path, "[check]\ndrain = false\n[expect]\ngpus = 8\n"))
        self.sim_dir = str(tmp_path / "sim")
        sim.init(self.sim_dir, "n1", 8)
        self.marks = str(tmp_path / "marks")
        for name in ("mark-offline", "mark-online"):
            path = tmp_path / name
            path.write_text(MARK.format(log=self.marks))
            path.chmod(0o755)
        self.install(sys.executable)
        self.tree.write_conf()
        self.tree.site_fault("n1", False)

    def install(self, python: str, config: str | None = None) -> None:
        """`slurm-hooks install --prefix <tmp>/opt` for ``python``; its NHC check linked into INCDIR."""
        self.prefix = str(self.tmp / "opt")
        apply.install(layout.Inputs(prefix=self.prefix, python=python, config=config or self.config,
                                    state_dir=str(self.tmp / "state"), audit=str(self.tmp / "audit.jsonl")),
                      write_config=False)
        self.tree.link_check(os.path.join(self.prefix, layout.NHC))

    def run(self, *extra: str, timeout: float = 60) -> subprocess.CompletedProcess:
        env = {"SLURMD_NODENAME": "n1", "PYTHONPATH": ROOT}
        argv = [self.tree.driver, "-c", self.tree.conf, f"INCDIR={self.tree.incdir}",
                f"HELPERDIR={self.tree.helpers}", "NHC_RM=slurm", "HOSTNAME=n1", "LOGFILE=-",
                f"OFFLINE_NODE={self.tmp}/mark-offline", f"ONLINE_NODE={self.tmp}/mark-online",
                f"PATH={self.tree.bin}:/sbin:/usr/sbin:/bin:/usr/bin", *extra]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=self.tmp)

    def marked(self) -> list[str]:
        try:
            return Path(self.marks).read_text().splitlines()
        except FileNotFoundError:
            return []

    def syslog_lines(self, tag: str = "slurm-hooks:") -> list[str]:
        """The testbed syslog's lines whose tag starts with ``tag`` (NHC's own: ``nhc[``)."""
        try:
            lines = Path(self.syslog).read_text().splitlines()
        except FileNotFoundError:
            return []
        return [line for line in lines if line.split(" ", 2)[1].startswith(tag)]

    def inject_xid79(self) -> None:
        sim.inject(self.sim_dir, "n1", 3, xid=79)


@pytest.fixture
def site(tmp_path) -> NhcRun:
    tarball = nhc.find_source(ROOT)
    if tarball is None:
        pytest.skip(f"NHC's source is neither named by ${nhc.SOURCE_ENV} (a mej/nhc checkout or tarball) nor "
                    "beside the project (../shared/third_party/lbnl-nhc-*.tar.gz)")
    return NhcRun(tmp_path, tarball)


def test_healthy_node_passes_and_nhc_marks_it_online(site):
    r = site.run()
    assert r.returncode == 0, r.stdout + r.stderr
    assert site.marked() == ["mark-online n1"]
    assert site.syslog_lines() == [] and site.syslog_lines("nhc") == []


def test_normal_mode_gpu_fault_passes_so_nhc_never_drains_a_second_time(site):
    site.inject_xid79()
    r = site.run()
    assert r.returncode == 0, r.stdout + r.stderr
    assert site.marked() == ["mark-online n1"]  # NHC's online helper leaves a reason it did not write
    assert site.syslog_lines() == []


def test_report_mode_gpu_fault_makes_nhc_drain_with_our_reason(site):
    site.tree.write_conf("check_slurm_hooks -r")
    site.inject_xid79()
    r = site.run()
    assert r.returncode == 1, r.stdout + r.stderr
    assert site.marked() == ["mark-offline n1 slurm-hooks: XID 79 on GPU 3"]
    assert [line.split(": ", 1)[1] for line in site.syslog_lines("nhc[")] == \
        ["Health check failed:  slurm-hooks: XID 79 on GPU 3"]


def test_report_mode_acts_on_nothing_and_a_cleared_fault_passes(site):
    site.tree.write_conf("check_slurm_hooks -r")
    site.inject_xid79()
    site.run()
    assert not os.path.exists(os.path.join(site.tmp, "state", "drained-n1"))
    sim.clear(site.sim_dir, "n1")
    r = site.run()
    assert r.returncode == 0 and site.marked()[-1] == "mark-online n1", r.stdout


def test_nhcs_own_site_check_still_fails_after_ours_passes(site):
    site.tree.site_fault("n1", True)
    r = site.run()
    assert r.returncode == 1
    assert site.marked() == [f"mark-offline n1 check_file_test:  -e {site.tree.site_ok('n1')} returned 1."]


def wrapper_said(site, code: int) -> None:
    """The installed wrapper's one line (syslog and NHC's log) and its status file; nothing of ours on top."""
    lines = site.syslog_lines()
    assert len(lines) == 1, lines
    assert f"slurm-hooks check could not run (exit {code}): the node stays in service" in lines[0]
    assert site.syslog_lines("nhc[") == []
    status = layout.read_status(str(site.tmp / "state"))
    assert status["healthcheck"]["exit"] == str(code), status


@pytest.mark.parametrize("mode", ["check_slurm_hooks", "check_slurm_hooks -r"])
def test_interpreter_gone_passes_with_the_wrappers_one_syslog_line(site, mode):
    site.tree.write_conf(mode)
    site.inject_xid79()
    site.install("/nonexistent/venv/bin/python3")
    r = site.run()
    assert r.returncode == 0 and site.marked() == ["mark-online n1"], r.stdout
    wrapper_said(site, 127)


def test_package_not_in_the_venv_passes_with_the_wrappers_one_syslog_line(site, tmp_path):
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site.tree.write_conf("check_slurm_hooks -r")
    site.inject_xid79()
    site.install(str(venv / "bin" / "python"))
    r = site.run()
    assert r.returncode == 0 and site.marked() == ["mark-online n1"], r.stdout
    wrapper_said(site, 1)
    assert "No module named slurm_hooks" in r.stdout  # the wrapper's program's stderr, in NHC's log


def test_a_config_typo_passes_with_the_wrappers_one_syslog_line(site, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[gpu]\nbackend = "nvlm"\n')
    site.tree.write_conf("check_slurm_hooks -r")
    site.inject_xid79()
    site.install(sys.executable, str(bad))
    r = site.run()
    assert r.returncode == 0 and site.marked() == ["mark-online n1"], r.stdout
    wrapper_said(site, 2)
    assert "bad.toml:2: [gpu] backend" in r.stdout


def test_the_installed_program_gone_passes_with_our_one_syslog_line(site):
    site.tree.write_conf("check_slurm_hooks -r")
    site.inject_xid79()
    os.unlink(os.path.join(site.prefix, "bin", "slurm-hooks-healthcheck"))
    r = site.run()
    assert r.returncode == 0 and site.marked() == ["mark-online n1"], r.stdout
    lines = site.syslog_lines()
    assert len(lines) == 1, lines
    assert f"check_slurm_hooks on n1: cannot run {site.prefix}/bin/slurm-hooks-healthcheck (exit 127)" in lines[0]


@pytest.mark.parametrize("line, said", [
    ("check_slurm_hooks -x", "unknown option -x in nhc.conf"),
    ("check_slurm_hooks -t", "option -t needs a value"),
    ("check_slurm_hooks -t soon", "-t wants whole seconds"),
    ("check_slurm_hooks now", 'unexpected argument "now"'),
])
def test_a_typo_in_our_nhc_line_passes_with_one_syslog_line(site, line, said):
    site.tree.write_conf(line)
    site.inject_xid79()
    r = site.run()
    assert r.returncode == 0 and site.marked() == ["mark-online n1"], r.stdout
    lines = site.syslog_lines()
    assert len(lines) == 1 and said in lines[0], lines


def test_too_little_of_nhcs_timeout_left_skips_the_run_and_says_so(site):
    site.tree.write_conf("check_slurm_hooks -r")
    site.inject_xid79()
    r = site.run("TIMEOUT=12")
    assert r.returncode == 0, r.stdout
    lines = site.syslog_lines()
    # 12 s less the 5 s reserve, less what NHC took to get here (a second on a loaded machine)
    assert len(lines) == 1 and re.search(r"only [67]s left of NHC's TIMEOUT=12s .*: not run", lines[0]), lines


def test_our_own_t_below_the_minimum_skips_the_run_and_says_so(site):
    site.tree.write_conf("check_slurm_hooks -t 5")
    r = site.run()
    assert r.returncode == 0 and site.marked() == ["mark-online n1"], r.stdout
    lines = site.syslog_lines()
    assert len(lines) == 1 and "-t 5 is below the 8s a run needs: not run" in lines[0], lines


def test_a_hung_run_is_killed_at_its_share_and_nhc_goes_on(site, tmp_path):
    hang = tmp_path / "hang"
    hang.write_text("#!/bin/sh\nexec sleep 100\n")
    hang.chmod(0o755)
    site.tree.write_conf("check_slurm_hooks -t 8")
    site.install(str(hang))
    started = time.monotonic()
    r = site.run()
    took = time.monotonic() - started
    assert r.returncode == 0 and site.marked() == ["mark-online n1"], r.stdout
    assert 6.5 < took < 12, took
    lines = site.syslog_lines()
    assert len(lines) == 1 and "ran past its 8s share and was killed" in lines[0]


def test_a_quote_in_a_reason_cannot_break_nhcs_eval(site, tmp_path):
    liar = tmp_path / "liar"
    liar.write_text("#!/bin/sh\necho \"slurm-hooks-verdict: slurm-hooks: GPU 3's bus '; touch /tmp/x #\"\nexit 99\n")
    liar.chmod(0o755)
    site.tree.write_conf("check_slurm_hooks -r")
    site.install(str(liar))
    r = site.run()
    assert r.returncode == 1
    assert site.marked() == ["mark-offline n1 slurm-hooks: GPU 3s bus ; touch /tmp/x #"]


def test_nhcs_source_is_taken_from_the_environment_variable_first(tmp_path):
    tree = tmp_path / "nhc-checkout"
    tree.mkdir()
    (tree / "nhc").write_text("#!/bin/bash\n")
    assert nhc.find_source(str(tmp_path), {nhc.SOURCE_ENV: str(tree)}) == str(tree)
    tarball = tmp_path / "lbnl-nhc-1.4.3.tar.gz"
    tarball.write_bytes(b"x")
    assert nhc.find_source(str(tmp_path), {nhc.SOURCE_ENV: str(tarball)}) == str(tarball)
    assert nhc.find_source(str(tmp_path), {}) is None  # nothing beside tmp_path
    with pytest.raises(nhc.NhcError, match="SLURM_HOOKS_NHC_SRC=.*not NHC's source"):
        nhc.find_source(str(tmp_path), {nhc.SOURCE_ENV: str(tmp_path / "typo")})
