"""``slurm-hooks install``: the layout, idempotence, atomic version switch, uninstall, and
wrappers that fail safe when slurm-hooks itself cannot run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fakes.config import write_sim_config

from slurm_hooks.install import apply, layout
from slurm_hooks.preflight.environment import check_wrappers
from slurm_hooks.preflight.results import Status

PY = os.path.abspath(sys.executable)


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "slurm_hooks", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})}, cwd="/")


def tree(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` with what makes it what it is: type, mode, content or link, mtime."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            what = os.readlink(p) if os.path.islink(p) else (
                Path(p).read_bytes() if os.path.isfile(p) else None)
            out[os.path.relpath(p, root)] = (st.st_mode, what, st.st_mtime_ns, st.st_ino)
    return out


def inputs(tmp_path: Path, **kw) -> layout.Inputs:
    base = dict(prefix=str(tmp_path / "opt"), python=PY, config=str(tmp_path / "etc" / "config.toml"),
                state_dir=str(tmp_path / "state"), audit=str(tmp_path / "log" / "audit.jsonl"))
    return layout.Inputs(**{**base, **kw})


# --- the layout --------------------------------------------------------------------------------


def test_install_lays_the_programs_unit_and_nhc_check_with_paths_baked_in_and_prints_slurm_conf(tmp_path):
    prefix, conf = tmp_path / "opt", tmp_path / "etc" / "config.toml"
    r = cli("install", "--prefix", str(prefix), "--config", str(conf))
    assert r.returncode == 0, r.stderr
    for hook, key in (("healthcheck", "HealthCheckProgram"), ("prolog", "Prolog"), ("epilog", "Epilog")):
        program = prefix / "bin" / f"slurm-hooks-{hook}"
        assert os.access(program, os.X_OK)
        text = program.read_text()
        assert f"{PY} -I -m slurm_hooks {'check' if hook == 'healthcheck' else hook} --config {conf} \"$@\"\n" in text
        assert f"  {key}={program}\n" in r.stdout
    for line in ("RebootProgram=", "ResumeTimeout=", "HealthCheckNodeState=ANY", "nohold_on_prolog_fail"):
        assert line in r.stdout
    unit = (prefix / layout.UNIT).read_text()
    assert f"ExecStart={PY} -I -m slurm_hooks watch --config {conf}\n" in unit
    nhc = (prefix / layout.NHC).read_text()
    assert "function check_slurm_hooks()" in nhc and str(prefix / "bin" / "slurm-hooks-healthcheck") in nhc
    # the example config, where none existed, with a tight mode (it may come to hold webhook secrets)
    assert conf.read_text() == layout.example_config()
    assert os.stat(conf).st_mode & 0o777 == 0o600
    # every stable path goes through `current`, one symlink
    assert os.readlink(prefix / "bin" / "slurm-hooks-prolog") == "../current/bin/slurm-hooks-prolog"
    assert os.readlink(prefix / "current").startswith("versions/0.1.0-")


def test_the_watchers_unit_lets_it_make_the_nvrx_socket_where_the_config_puts_it(tmp_path):
    """The unit runs under ProtectSystem=strict: /run/slurm-hooks is its runtime directory, and a
    socket put elsewhere has its directory made writable, or the watcher could not make it."""
    prefix, conf = tmp_path / "opt", tmp_path / "etc" / "config.toml"
    conf.parent.mkdir()
    conf.write_text(write_sim_config(tmp_path, '[interop]\nnvrx_socket = "/var/run/nvhcd/nvhcd.sock"\n').read_text())
    r = cli("install", "--prefix", str(prefix), "--config", str(conf))
    assert r.returncode == 0, r.stderr
    unit = (prefix / layout.UNIT).read_text()
    assert "RuntimeDirectory=slurm-hooks\n" in unit and "RuntimeDirectoryMode=0755\n" in unit
    [paths] = [line for line in unit.splitlines() if line.startswith("ReadWritePaths=")]
    assert "-/var/run/nvhcd" in paths.split("=", 1)[1].split()


def test_a_config_that_does_not_load_stops_the_install_before_anything_is_laid(tmp_path):
    conf = tmp_path / "config.toml"
    conf.write_text("[gpu]\nbakend = 1\n")
    r = cli("install", "--prefix", str(tmp_path / "opt"), "--config", str(conf))
    assert r.returncode == 2 and "bakend" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "opt").exists()


def test_an_existing_config_is_never_overwritten(tmp_path):
    conf = tmp_path / "config.toml"
    conf.write_text("[check]\ndrain = false\n")
    conf.chmod(0o640)
    assert cli("install", "--prefix", str(tmp_path / "opt"), "--config", str(conf)).returncode == 0
    assert conf.read_text() == "[check]\ndrain = false\n" and os.stat(conf).st_mode & 0o777 == 0o640


def test_a_site_file_where_a_program_goes_is_left_alone_and_nothing_is_changed(tmp_path):
    prefix = tmp_path / "opt"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "slurm-hooks-prolog").write_text("#!/bin/sh\n# the site's own\n")
    before = tree(prefix)
    r = cli("install", "--prefix", str(prefix), "--config", str(tmp_path / "c.toml"))
    assert r.returncode == 2 and "was not laid by `slurm-hooks install`" in r.stderr
    assert tree(prefix) == before and not (tmp_path / "c.toml").exists()


def test_dry_run_changes_nothing(tmp_path):
    r = cli("install", "--prefix", str(tmp_path / "opt"), "--config", str(tmp_path / "c.toml"), "--dry-run")
    assert r.returncode == 0 and "would create" in r.stdout
    assert os.listdir(tmp_path) == []


# --- idempotent, versions, uninstall -------------------------------------------------------------


def test_a_second_install_over_the_first_changes_nothing(tmp_path):
    args = ("install", "--prefix", str(tmp_path / "opt"), "--config", str(tmp_path / "etc" / "config.toml"))
    assert cli(*args).returncode == 0
    before = tree(tmp_path)
    r = cli(*args)
    assert r.returncode == 0 and "already in place, nothing changed" in r.stdout
    assert tree(tmp_path) == before


def test_uninstall_leaves_nothing_behind(tmp_path):
    prefix = tmp_path / "opt"
    assert cli("install", "--prefix", str(prefix), "--config", str(tmp_path / "etc" / "config.toml")).returncode == 0
    r = cli("install", "--uninstall", "--prefix", str(prefix))
    assert r.returncode == 0, r.stderr
    assert os.listdir(tmp_path) == []


def test_uninstall_also_removes_the_hooks_parsed_copy_of_the_config(tmp_path):
    from slurm_hooks.config import cache as confcache

    prefix, cfg = tmp_path / "opt", tmp_path / "etc" / "config.toml"
    assert cli("install", "--prefix", str(prefix), "--config", str(cfg)).returncode == 0
    with open(confcache.cache_path(str(cfg)), "wb") as fh:  # as a hook run leaves it
        fh.write(b"cache")
    r = cli("install", "--uninstall", "--prefix", str(prefix))
    assert r.returncode == 0, r.stderr
    assert os.listdir(tmp_path) == []


def test_uninstall_keeps_what_it_did_not_make_and_what_was_changed_since(tmp_path):
    prefix = tmp_path / "opt"
    (prefix / "venv").mkdir(parents=True)  # the venv lives in the prefix: not ours to remove
    conf = tmp_path / "etc" / "config.toml"
    assert cli("install", "--prefix", str(prefix), "--config", str(conf)).returncode == 0
    (prefix / "bin" / "site-tool").write_text("x")
    conf.write_text(conf.read_text() + "\n# edited by the admin\n")
    r = cli("install", "--uninstall", "--prefix", str(prefix))
    assert r.returncode == 0 and f"kept {conf} (changed since install)" in r.stdout
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "etc", "etc/config.toml", "opt", "opt/bin", "opt/bin/site-tool", "opt/venv"]


def test_install_says_what_its_slurm_conf_settings_do_to_every_job_and_which_to_merge(tmp_path):
    r = cli("install", "--prefix", str(tmp_path / "opt"), "--config", str(tmp_path / "c.toml"))
    assert r.returncode == 0, r.stderr
    notes = r.stdout.split("What these do to every job on the cluster", 1)[1]
    assert "KillWait=120: every job Slurm ends" in notes and "JobRequeue=1: every batch job is requeueable" in notes
    assert "SchedulerParameters is ONE comma-separated list: add nohold_on_prolog_fail" in notes
    assert "PrologFlags is ONE comma-separated list" in notes and "ForceRequeueOnFail" in notes
    assert "SchedulerParameters=nohold_on_prolog_fail   # MERGE into your existing line" in r.stdout


def _slurm_conf_naming(tmp_path, prefix):
    """A slurm.conf that names the installed prolog, through an Include as sites split theirs."""
    (tmp_path / "slurm.d").mkdir()
    (tmp_path / "slurm.d" / "hooks.conf").write_text(f"Prolog={prefix}/bin/slurm-hooks-prolog\n"
                                                     f"HealthCheckProgram={prefix}/bin/slurm-hooks-healthcheck\n")
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=c\nInclude slurm.d/*.conf\nKillWait=120\n")
    return conf


def test_uninstall_is_refused_while_slurm_conf_names_the_programs_and_forced_with_force(tmp_path):
    prefix = tmp_path / "opt"
    assert cli("install", "--prefix", str(prefix), "--config", str(tmp_path / "etc" / "config.toml")).returncode == 0
    conf = _slurm_conf_naming(tmp_path, prefix)
    r = cli("install", "--uninstall", "--prefix", str(prefix), env={"SLURM_CONF": str(conf)})
    assert r.returncode == 2, r.stdout + r.stderr
    assert "refusing to uninstall: slurm.conf still names its programs" in r.stderr
    assert f"hooks.conf:1: Prolog={prefix}/bin/slurm-hooks-prolog" in r.stderr
    assert f"hooks.conf:2: HealthCheckProgram={prefix}/bin/slurm-hooks-healthcheck" in r.stderr
    assert os.path.exists(prefix / "bin" / "slurm-hooks-prolog")  # nothing removed
    r = cli("install", "--uninstall", "--prefix", str(prefix), "--force", "--slurm-conf", str(conf))
    assert r.returncode == 0, r.stderr
    assert "warning: slurm.conf still names a removed program" in r.stderr
    assert not os.path.lexists(prefix / "bin" / "slurm-hooks-prolog")


def test_uninstall_goes_ahead_once_slurm_conf_no_longer_names_the_programs(tmp_path):
    prefix = tmp_path / "opt"
    assert cli("install", "--prefix", str(prefix), "--config", str(tmp_path / "etc" / "config.toml")).returncode == 0
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=c\n# Prolog=" + str(prefix) + "/bin/slurm-hooks-prolog\nProlog=/etc/slurm/prolog.sh\n")
    r = cli("install", "--uninstall", "--prefix", str(prefix), "--slurm-conf", str(conf))
    assert r.returncode == 0 and not r.stderr, r.stderr


def test_uninstall_that_cannot_read_slurm_conf_says_it_did_not_check(tmp_path):
    # It went ahead in silence: on a node whose slurm.conf lives elsewhere (configless, a site path), the
    # admin was never told that nothing was checked.
    prefix = tmp_path / "opt"
    assert cli("install", "--prefix", str(prefix), "--config", str(tmp_path / "etc" / "config.toml")).returncode == 0
    missing = tmp_path / "nowhere" / "slurm.conf"
    r = cli("install", "--uninstall", "--prefix", str(prefix), "--slurm-conf", str(missing))
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [f"warning: cannot read {missing} (file not found): not checked whether "
                                     "slurm.conf still names the removed programs (pass --slurm-conf FILE)"]
    assert not os.path.lexists(prefix / "bin" / "slurm-hooks-prolog")


def test_uninstall_without_a_manifest_says_so(tmp_path):
    r = cli("install", "--uninstall", "--prefix", str(tmp_path))
    assert r.returncode == 2 and "install-manifest.json not found" in r.stderr


def test_an_upgrade_is_laid_beside_and_switched_with_one_rename_and_rolls_back(tmp_path):
    v1 = inputs(tmp_path)
    v2 = inputs(tmp_path, on_error="refuse")
    v3 = inputs(tmp_path, env=(("SLURM_CONF", "/etc/slurm/other.conf"),))
    prefix = Path(v1.prefix)
    first = apply.install(v1)
    prolog = prefix / "bin" / "slurm-hooks-prolog"
    assert "exit 0\n" in prolog.read_text()
    second = apply.install(v2)
    assert second.version_id != first.version_id
    assert [line for line in second.lines if line.startswith("switch")] == [
        f"switch {prefix}/current -> versions/{second.version_id} (was versions/{first.version_id})"]
    assert not any(line.startswith("link") for line in second.lines)  # the stable links stay; `current` moves
    assert "exit 1\n" in prolog.read_text()
    assert sorted(os.listdir(prefix / "versions")) == sorted([first.version_id, second.version_id])
    # rollback: the older inputs lay the older version again (the same id) and switch back
    back = apply.install(v1)
    assert back.version_id == first.version_id and "exit 0\n" in prolog.read_text()
    # a third version: only the current one and the one before stay
    third = apply.install(v3)
    assert sorted(os.listdir(prefix / "versions")) == sorted([first.version_id, third.version_id])
    manifest = json.loads((prefix / layout.MANIFEST).read_text())
    assert (manifest["current"], manifest["previous"]) == (third.version_id, first.version_id)
    apply.uninstall(str(prefix))
    assert not prefix.exists()


def test_a_half_written_version_left_by_a_dead_install_is_cleared(tmp_path):
    inp = inputs(tmp_path)
    apply.install(inp)
    junk = Path(inp.prefix) / "versions" / ".tmp-0.1.0-dead-123"
    junk.mkdir()
    (junk / "x").write_text("half")
    apply.install(inp)
    assert not junk.exists()


# --- wrappers that fail safe ----------------------------------------------------------------------


def run_program(prefix: str, hook: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """As slurmd runs it: no PATH, cwd /, only the Slurm variables."""
    return subprocess.run([os.path.join(prefix, "bin", f"slurm-hooks-{hook}")], capture_output=True, text=True,
                          env={"SLURMD_NODENAME": "n1", **(env or {})}, cwd="/", timeout=60)


@pytest.mark.parametrize("hook", ["healthcheck", "prolog", "epilog"])
def test_interpreter_gone_exits_0_with_one_line_and_a_status_that_validate_reports(tmp_path, hook):
    inp = inputs(tmp_path, python=str(tmp_path / "venv-gone" / "bin" / "python3"))
    apply.install(inp)
    r = run_program(inp.prefix, hook, {"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0"})
    assert r.returncode == 0
    [line] = [x for x in r.stderr.splitlines() if x.startswith("slurm-hooks ")]
    command = "check" if hook == "healthcheck" else hook
    assert line.startswith(f"slurm-hooks {command} could not run (exit 127): ")
    status = layout.read_status(inp.state_dir)[hook]
    assert (status["exit"], status["action"], status["hook"]) == ("127", "allowed", hook)
    assert os.stat(layout.status_path(inp.state_dir, hook)).st_mode & 0o777 == 0o600
    cfg = _config_with_state(tmp_path, inp.state_dir)
    [res] = check_wrappers(cfg)
    assert res.status is Status.FAIL and "could not run" in res.message and "(exit 127)" in res.message
    assert res.fix.startswith(f"run {inp.prefix}/bin/slurm-hooks-{hook} by hand as root")


def _config_with_state(tmp_path: Path, state_dir: str):
    from slurm_hooks import config

    return config.parse(f'[state]\ndir = "{state_dir}"\n', str(tmp_path / "c.toml"))


def test_unreadable_config_lets_the_job_run_and_a_good_run_clears_the_status(tmp_path):
    conf = write_sim_config(tmp_path)
    inp = inputs(tmp_path, config=str(tmp_path / "missing.toml"), state_dir=str(tmp_path / "state"))
    apply.install(inp, write_config=False)
    r = run_program(inp.prefix, "prolog", {"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0"})
    assert r.returncode == 0 and "could not run (exit 2): the job runs" in r.stderr
    assert "missing.toml: file not found" in r.stderr
    assert layout.read_status(inp.state_dir)["prolog"]["exit"] == "2"
    # the config is back: the next run goes well and the record goes away
    apply.install(inputs(tmp_path, config=str(conf), state_dir=str(tmp_path / "state")))
    subprocess.run([PY, "-m", "slurm_hooks", "sim", "init", "--node", "n1", "--gpus", "2", "--config", str(conf)],
                   check=True, capture_output=True)
    r = run_program(inp.prefix, "prolog", {"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0"})
    assert (r.returncode, r.stderr) == (0, "")
    assert layout.read_status(inp.state_dir) == {}
    assert check_wrappers(_config_with_state(tmp_path, inp.state_dir))[0].status is Status.PASS


def test_a_python_that_fails_as_an_import_error_would_is_not_taken_for_a_verdict(tmp_path):
    """`python -m slurm_hooks` without the package exits 1, as an import error does: the wrapper lets
    the job run (the tool's own verdict "refuse" is a code of its own under the wrapper)."""
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\necho 'No module named slurm_hooks' >&2\nexit 1\n")
    fake.chmod(0o755)
    inp = inputs(tmp_path, python=str(fake))
    apply.install(inp)
    r = run_program(inp.prefix, "prolog", {"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0"})
    assert r.returncode == 0 and "could not run (exit 1): the job runs" in r.stderr


def test_refuse_opt_in_fails_closed(tmp_path):
    inp = inputs(tmp_path, python=str(tmp_path / "gone"), on_error="refuse")
    apply.install(inp)
    r = run_program(inp.prefix, "prolog", {"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0"})
    assert r.returncode == 1 and "the job is refused and Slurm drains the node" in r.stderr
    assert layout.read_status(inp.state_dir)["prolog"]["action"] == "refused"


def _fake_scontrol(tmp_path, reason: str):
    """An scontrol that logs each call and shows node n1 with ``reason`` ("" for none), as 22.05 prints it."""
    log = tmp_path / "scontrol.log"
    shown = "NodeName=n1 Arch=x86_64\n   State=IDLE ThreadsPerCore=1\n   Partitions=gpu\n" + (
        f"   Reason={reason} [root@2026-12-01T10:00:00]\n" if reason else "")
    fake = tmp_path / "scontrol"
    fake.write_text(f"#!/bin/sh\necho \"$*\" >>{log}\n[ \"$1\" = show ] && printf '%s' '{shown}'\nexit 0\n")
    fake.chmod(0o755)
    return str(fake), log


@pytest.mark.parametrize("reason", ["admin: bad fan", "NHC: check_fs_mount: /scratch", "slurm-hooks: XID 79 on GPU 3 [reboot]"])
def test_refuse_mode_never_overwrites_a_reason_already_on_the_node(tmp_path, reason):
    scontrol, log = _fake_scontrol(tmp_path, reason)
    inp = inputs(tmp_path, python=str(tmp_path / "gone"), on_error="refuse", scontrol=scontrol)
    apply.install(inp)
    r = run_program(inp.prefix, "healthcheck")
    assert r.returncode == 1 and "node not drained: it already carries a reason" in r.stderr
    assert log.read_text() == "show node n1\n"


def test_refuse_mode_drains_a_node_without_a_reason(tmp_path):
    scontrol, log = _fake_scontrol(tmp_path, "")
    inp = inputs(tmp_path, python=str(tmp_path / "gone"), on_error="refuse", scontrol=scontrol)
    apply.install(inp)
    assert run_program(inp.prefix, "healthcheck").returncode == 1
    assert log.read_text() == ("show node n1\nupdate NodeName=n1 State=DRAIN Reason=slurm-hooks cannot run "
                               "(exit 127): see syslog\n")


def test_the_verdict_unhealthy_passes_through_the_wrapper_as_exit_1_without_a_status(tmp_path):
    conf = write_sim_config(tmp_path, "[check]\ndrain = false\n")
    inp = inputs(tmp_path, config=str(conf), state_dir=str(tmp_path / "state"))
    apply.install(inp)
    env = {"SLURM_HOOKS_CONFIG": str(conf)}
    assert cli("sim", "init", "--node", "n1", "--gpus", "2", env=env).returncode == 0
    assert cli("sim", "inject", "--node", "n1", "--gpu", "1", "--xid", "79", env=env).returncode == 0
    r = run_program(inp.prefix, "healthcheck")
    assert r.returncode == 1 and "could not run" not in r.stderr
    assert layout.read_status(inp.state_dir) == {}


def test_metrics_textfile_says_the_wrapper_failed(tmp_path):
    inp = inputs(tmp_path, python=str(tmp_path / "gone"), textfile_dir=str(tmp_path / "prom"))
    apply.install(inp)
    run_program(inp.prefix, "epilog")
    text = (tmp_path / "prom" / "slurm_hooks_wrapper_epilog.prom").read_text()
    assert 'slurm_hooks_wrapper_failed{hook="epilog",exit_code="127"} 1\n' in text


def test_validate_passes_the_programs_install_lays(tmp_path):
    """validate's program checks (exists, safe to run as root, runs slurm-hooks <command> by absolute
    path) pass for the installed programs, followed through their symlinks."""
    from slurm_hooks.preflight import slurmconf
    from slurm_hooks.preflight.slurmconf_checks import PROGRAMS, check_program

    inp = inputs(tmp_path)
    os.chmod(tmp_path, 0o755)
    apply.install(inp)
    conf = slurmconf.parse("\n".join(layout.slurm_conf_lines(inp.prefix)) + "\n", str(tmp_path / "slurm.conf"))
    for key, check, sub, _ in PROGRAMS:
        [result] = check_program(conf, key, check, sub, "")
        assert result.status is Status.PASS, result
        assert result.message.endswith(f"runs `slurm-hooks {sub}`")


def test_env_is_quoted_for_sh_in_the_programs_and_for_systemd_in_the_unit(tmp_path):
    laid = layout.render(inputs(tmp_path, env=(("SLURM_CONF", '/etc/slurm a/"x".conf'),))).files
    assert 'Environment="SLURM_CONF=/etc/slurm a/\\"x\\".conf"\n' in laid[layout.UNIT][0]
    prolog = tmp_path / "prolog"
    prolog.write_text(laid["bin/slurm-hooks-prolog"][0].replace(f"{PY} -I -m slurm_hooks prolog",
                                                                 'echo "$SLURM_CONF" #'))
    out = subprocess.run(["sh", str(prolog)], capture_output=True, text=True, env={})
    assert out.stdout == '/etc/slurm a/"x".conf\n'


def test_programs_started_during_upgrades_run_one_version_or_the_other_never_neither(tmp_path):
    """Versions switched back and forth while the prolog keeps starting: every start finds a
    program (no window without one) and runs exactly one version."""
    import threading

    fakes = {}
    for name in ("A", "B"):
        fake = tmp_path / f"python-{name}"
        fake.write_text(f"#!/bin/sh\necho {name}\nexit 0\n")
        fake.chmod(0o755)
        fakes[name] = inputs(tmp_path, python=str(fake))
    apply.install(fakes["A"])
    stop = threading.Event()
    switches = []

    def switch() -> None:
        while not stop.is_set():
            for name in ("B", "A"):
                apply.install(fakes[name])
                switches.append(name)

    t = threading.Thread(target=switch)
    t.start()
    seen = []
    try:
        # At least 60 starts and 11 switches among them, however the machine's load paces the two.
        while len(seen) < 60 or (len(switches) <= 10 and len(seen) < 2000):
            seen.append(run_program(fakes["A"].prefix, "prolog"))
    finally:
        stop.set()
        t.join()
    assert len(switches) > 10
    assert all(r.returncode == 0 for r in seen), [r.stderr for r in seen if r.returncode]
    assert {r.stdout for r in seen} <= {"A\n", "B\n"}
