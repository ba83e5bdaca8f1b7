"""``slurm-hooks validate`` on an NHC site: NHC is the HealthCheckProgram and runs our check."""

from __future__ import annotations

import os
import sys
import tarfile

import pytest
from paths import ROOT
from preflight.test_validate import Cluster, by_check, only

from slurm_hooks import preflight as validate
from slurm_hooks.cli import main
from slurm_hooks.install import apply, layout
from slurm_hooks.lab import nhc as lab_nhc
from slurm_hooks.preflight import nhc

PASS, WARN, FAIL = validate.Status.PASS, validate.Status.WARN, validate.Status.FAIL


class NhcCluster(Cluster):
    """The good cluster, with HealthCheckProgram a wrapper that runs NHC on our files."""

    def __init__(self, root):
        super().__init__(root)
        self.nhc_conf = str(root / "etc" / "nhc" / "nhc.conf")
        self.incdir = str(root / "etc" / "nhc" / "scripts")
        os.makedirs(self.incdir)
        self.wrapper("-t 45")
        self.write_nhc_conf("* || check_slurm_hooks\n* || check_fs_mount_rw -f /\n")
        self.prefix = str(root / "opt")
        self.install_check(sys.executable)

    def wrapper(self, args: str = "") -> None:
        self.script("etc/healthcheck/slurm-hooks-check",
                    f"#!/bin/sh\n# NHC, the site's health check\nexec /usr/sbin/nhc -c {self.nhc_conf} "
                    f"INCDIR={self.incdir} {args}\n")

    def write_nhc_conf(self, text: str) -> None:
        with open(self.nhc_conf, "w") as fh:
            fh.write("# site checks\n" + text)

    def install_check(self, python: str, config: str | None = None) -> None:
        """`slurm-hooks install --prefix <root>/opt`, and its NHC check linked into NHC's scripts dir."""
        apply.install(layout.Inputs(prefix=self.prefix, python=python, config=config or self.config,
                                    state_dir=str(self.root / "state"), audit=str(self.root / "audit.jsonl")),
                      write_config=False)
        link = os.path.join(self.incdir, "slurm_hooks.nhc")
        if not os.path.lexists(link):
            os.symlink(os.path.join(self.prefix, layout.NHC), link)


@pytest.fixture
def site(tmp_path):
    return NhcCluster(tmp_path)


def lines(results):
    return [r.line() for r in results]


def test_nhc_running_check_slurm_hooks_first_for_every_gpu_node_passes(site, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["validate", "--config", site.config, "--slurm-conf", site.slurm_conf, "--node", "n1"])
    out = capsys.readouterr().out
    assert exc.value.code == 0, out
    assert all(line.startswith("PASS  ") for line in out.splitlines()), out
    assert "runs LBNL NHC" in out and "replace" not in out.lower()
    assert "check_slurm_hooks runs first, on 2 GPU node(s)" in out


def test_nhc_is_recognised_instead_of_told_to_exec_slurm_hooks(site):
    r = only(site.run(), "health-check-program")
    assert r.status is PASS and "/usr/sbin/nhc" in r.message and "check_slurm_hooks" in r.message
    assert r.where == f"{site.slurm_conf}:{site.line_of('HealthCheckProgram')}"


def test_the_real_nhc_driver_as_health_check_program_is_recognised(tmp_path):
    tarball = lab_nhc.find_source(ROOT)
    if tarball is None:
        pytest.skip("NHC's source (../shared/third_party/lbnl-nhc-*.tar.gz) is not beside the project")
    with tarfile.open(tarball) as tar:
        tar.extractall(tmp_path / "src", filter="data")
    driver = str(tmp_path / "src" / "nhc" / "nhc")
    os.chmod(driver, 0o755)
    assert nhc.is_driver(driver)
    setup = nhc.detect(driver, sysconfig_dirs=())
    assert (setup.conf, setup.incdir, setup.timeout) == ("/etc/nhc/nhc.conf", "/etc/nhc/scripts", 30)


def test_nhc_conf_that_never_calls_our_check_fails_with_the_line_to_add(site):
    site.write_nhc_conf("* || check_fs_mount_rw -f /\n")
    r = only(site.run(), "nhc-conf")
    assert r.status is FAIL and "never calls check_slurm_hooks" in r.message
    assert "`* || check_slurm_hooks`" in r.fix and r.where == site.nhc_conf


def test_missing_nhc_conf_fails(site):
    os.unlink(site.nhc_conf)
    r = only(site.run(), "nhc-conf")
    assert r.status is FAIL and "does not exist" in r.message


@pytest.mark.parametrize("mask", ["*", "n*", "{n[1-2]}", "{n1,n2}", "/^n[0-9]+$/", "!login*"])
def test_host_masks_that_cover_the_gpu_nodes_pass(site, mask):
    site.write_nhc_conf(f"{mask} || check_slurm_hooks\n")
    assert [r.status for r in by_check(site.run(), "nhc-conf")] == [PASS]


@pytest.mark.parametrize("mask", ["n1", "{n[1-1]}", "/^n1$/", "!n2"])
def test_a_gpu_node_no_mask_matches_fails_naming_it(site, mask):
    site.write_nhc_conf(f"{mask} || check_slurm_hooks\n")
    r = only(site.run(), "nhc-conf")
    assert r.status is FAIL and "GPU node(s) n2" in r.message and r.where == f"{site.nhc_conf}:2"


def test_our_check_after_a_site_check_warns_to_move_it_first(site):
    site.write_nhc_conf("* || check_fs_mount_rw -f /\n* || check_slurm_hooks\n")
    results = site.run()
    r = only(results, "nhc-conf")
    assert r.status is WARN and "not the first check (check_fs_mount_rw" in r.message
    assert "less what the 1 check(s) before it take" in only(results, "nhc-timing").message


def test_report_mode_warns_what_it_gives_up(site):
    site.write_nhc_conf("* || check_slurm_hooks -r\n")
    r = only(site.run(), "nhc-conf")
    assert r.status is WARN and "report mode" in r.message
    assert all(word in r.message for word in ("requeue", "ladder", "resume"))


@pytest.mark.parametrize("args, error", [("-x", "unknown option -x"), ("-t soon", "-t wants whole seconds"),
                                         ("now", "unexpected argument")])
def test_a_typo_in_our_nhc_line_fails(site, args, error):
    site.write_nhc_conf(f"* || check_slurm_hooks {args}\n")
    r = by_check(site.run(), "nhc-conf")[0]
    assert r.status is FAIL and error in r.message and "runs nothing" in r.message


def test_no_script_defining_the_check_fails_before_nhc_drains_every_node(site):
    os.unlink(os.path.join(site.incdir, "slurm_hooks.nhc"))
    r = only(site.run(), "nhc-script")
    assert r.status is FAIL and "drains every node" in r.message and "share/nhc/slurm_hooks.nhc" in r.fix


def test_the_installed_health_check_it_runs_is_checked(site):
    r = only(site.run(), "nhc-script")
    assert r.status is PASS and f"runs {site.prefix}/bin/slurm-hooks-healthcheck" in r.message


def test_an_install_removed_from_under_the_nhc_check_fails(site):
    os.unlink(os.path.join(site.prefix, "bin", "slurm-hooks-healthcheck"))
    r = only(site.run(), "nhc-script")
    assert r.status is FAIL and f"{site.prefix}/bin/slurm-hooks-healthcheck, which is not there" in r.message


def test_an_install_with_another_config_warns(site, tmp_path):
    site.install_check(sys.executable, str(tmp_path / "other.toml"))
    r = only(site.run(), "nhc-script")
    assert r.status is WARN and "other.toml" in r.message


def test_nhc_default_timeout_warns_that_a_hung_probe_leaves_too_little_for_the_drain(site):
    site.wrapper("")  # NHC's 30 s; [gpu] probe_timeout 20 + [slurm] timeout 5 + 3 to start > 30 - 5
    r = only(site.run(), "nhc-timing")
    assert r.status is WARN
    assert "gets at most 25 s" in r.message and "TIMEOUT=30 s (default)" in r.message
    assert r.fix.startswith("TIMEOUT=34 for NHC") and "(below 60)" in r.fix


def test_a_timeout_that_leaves_no_room_fails(site):
    site.wrapper("TIMEOUT=12")
    r = only(site.run(), "nhc-timing")
    assert r.status is FAIL and "gets at most 7 s" in r.message and "never runs" in r.message


def test_our_own_t_below_the_minimum_fails_with_its_fix(site):
    site.write_nhc_conf("* || check_slurm_hooks -t 5\n")
    r = only(site.run(), "nhc-timing")
    assert r.status is FAIL and "-t 5" in r.message and r.fix == f"-t {nhc.MIN_S} or more"


def test_a_watchdog_slurm_kills_first_warns(site):
    site.wrapper("-t 90")
    results = by_check(site.run(), "nhc-timing")
    assert any(r.status is WARN and "slurmd kills it at 60 s" in r.message for r in results), lines(results)


def test_health_check_timeout_replaces_slurms_60_s(site):
    site.edit_slurm_conf("HealthCheckInterval=300\n", "HealthCheckInterval=300\nHealthCheckTimeout=120\n")
    site.wrapper("-t 90")
    r = only(site.run(), "nhc-timing")
    assert r.status is PASS and "Slurm's kill at 120 s" in r.message


def test_an_nhc_command_continued_over_lines_is_read_whole(tmp_path):
    prog = tmp_path / "hc"
    prog.write_text("#!/bin/sh\nSLURM_CONF=/x/nhcsite/slurm.conf\nexec /opt/nhc/nhc -c /site/nhc.conf \\\n"
                    "    INCDIR=/site/scripts \\\n    TIMEOUT=45\n")
    setup = nhc.detect(str(prog), sysconfig_dirs=())
    assert (setup.driver, setup.conf, setup.incdir, setup.timeout) == ("/opt/nhc/nhc", "/site/nhc.conf", "/site/scripts", 45)


def test_sysconfig_is_read_after_the_command_line_and_wins(tmp_path):
    (tmp_path / "default").mkdir()
    (tmp_path / "default" / "nhc").write_text("# site\nexport TIMEOUT=50\nCONFFILE=/site/nhc.conf\n")
    prog = tmp_path / "hc"
    prog.write_text("#!/bin/sh\nexec /usr/sbin/nhc -t 20 INCDIR=/site/scripts\n")
    setup = nhc.detect(str(prog), sysconfig_dirs=(str(tmp_path / "default"),))
    assert (setup.conf, setup.incdir, setup.timeout) == ("/site/nhc.conf", "/site/scripts", 50)
    assert setup.timeout_from == f"{tmp_path}/default/nhc:2"


def test_a_program_that_is_neither_ours_nor_nhc_still_fails():
    assert nhc.detect("/nonexistent") is None


@pytest.mark.parametrize("args, parsed", [((), (False, None, "")), (("-r",), (True, None, "")),
                                          (("-t", "20"), (False, 20, "")), (("-rt20",), (True, 20, "")),
                                          (("-t",), (False, None, "-t wants whole seconds, not ''"))])
def test_our_line_is_parsed_as_the_checks_getopts_reads_it(args, parsed):
    assert nhc.parse_args(args) == parsed


def test_the_template_and_validate_agree_on_the_times(tmp_path):
    text = layout.render(layout.Inputs(prefix="/p", python="/py", config="/c", state_dir="/s", audit="/a")).files[layout.NHC][0]
    assert f"SLURM_HOOKS_NHC_MIN={nhc.MIN_S}\n" in text
    assert f'RESERVE="${{SLURM_HOOKS_NHC_RESERVE:-{nhc.RESERVE_S}}}"' in text
    assert f'KILL="${{SLURM_HOOKS_NHC_KILL:-{nhc.SLURM_KILL_S}}}"' in text
    assert f"--deadline $((BUDGET - {nhc.START_S}))" in text
