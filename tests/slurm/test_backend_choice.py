"""How a run picks its Slurm backend, and what validate says of it: no Slurm needed.

pyslurm is never imported to decide: ``import pyslurm`` initialises libslurm, and a
libslurm with no slurm.conf to read ends the process at once (``fatal: Could not
establish a configuration source``, exit 1), as under slurmd's health check, which
runs with only ``PWD`` and ``SLURMD_NODENAME``. The pyslurm these tests install (in a
temporary folder on PYTHONPATH) does at import what libslurm does: it reads SLURM_CONF,
else its compiled-in slurm.conf, else dies so; its version is ``pyslurm/version.py``,
a module, as in pyslurm itself. Every choice that could import it runs in a child
process, so a wrong choice shows as that child's death, not this session's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from slurm_hooks.errors import ConfigError
from slurm_hooks.preflight.environment import check_slurm_backend
from slurm_hooks.preflight.results import Status
from slurm_hooks.slurm.conffile import DEFAULT_PATHS
from slurm_hooks.slurm.errors import classify_message
from slurm_hooks.slurm.factory import choose, from_config, usable_pyslurm, versions_match
from slurm_hooks.slurm.scontrol import ScontrolSlurm

REPO = Path(__file__).resolve().parents[2]
FATAL = "fatal: Could not establish a configuration source"

#: libslurm's _establish_config_source, as pyslurm's import runs it (slurm_init at import).
PYSLURM_INIT = '''\
import os, sys
from .version import __version__
_conf = os.environ.get("SLURM_CONF") or next(
    (p for p in ({compiled!r}, "/run/slurm/conf/slurm.conf") if os.path.exists(p)), None)
if _conf is None:
    sys.stderr.write("{fatal}\\n")
    sys.stderr.flush()
    os._exit(1)
IMPORTED_WITH = _conf
class RPCError(Exception):
    pass
'''


def host_slurm_conf() -> str:
    return next((p for p in DEFAULT_PATHS if os.path.exists(p)), "")


needs_no_host_conf = pytest.mark.skipif(bool(host_slurm_conf()),
                                        reason=f"this host has a slurm.conf at {host_slurm_conf()}: libslurm finds it")


def install_pyslurm(root: Path, version: str = "25.11.2") -> Path:
    """A pyslurm under ``root/site`` built for a Slurm installed at ``root/slurm`` (not yet configured)."""
    package = root / "site" / "pyslurm"
    package.mkdir(parents=True)
    (package / "version.py").write_text(f'__version__ = "{version}"\n')
    (package / "__init__.py").write_text(PYSLURM_INIT.format(compiled=str(root / "nowhere" / "slurm.conf"),
                                                             fatal=FATAL))
    (root / "slurm" / "bin").mkdir(parents=True)
    return root / "site"


CHILD = '''\
import json, sys
from types import SimpleNamespace
from slurm_hooks.runner import Completed
from slurm_hooks.slurm.factory import backend_for
asked = []
def runner(argv, timeout, **kw):
    asked.append([argv, (kw.get("env") or {{}}).get("SLURM_CONF")])
    return Completed(tuple(argv), 0, {scontrol_says!r}, "")
config = SimpleNamespace(path="/etc/slurm-hooks/config.toml",
                         slurm=SimpleNamespace(backend={backend!r}, bin_dir={bin_dir!r}, timeout=7.0))
try:
    slurm, choice = backend_for(config, runner=runner)
except Exception as exc:
    print(json.dumps({{"error": f"{{type(exc).__name__}}: {{exc}}", "asked": asked}}))
    sys.exit(0)
ps = sys.modules.get("pyslurm")
print(json.dumps({{"class": type(slurm).__name__, "backend": choice.backend, "why": choice.why, "asked": asked,
                  "imported_with": getattr(ps, "IMPORTED_WITH", None) if ps else None}}))
'''


def choose_in_child(tmp_path: Path, site: Path, *, backend: str = "auto", slurm_conf: str | None = None,
                    scontrol_says: str = "slurm 25.11.7\n") -> dict:
    """What a fresh process (a hook run) picks, with ``site`` on its path and SLURM_CONF as given."""
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)])
    if slurm_conf is not None:
        env["SLURM_CONF"] = slurm_conf
    code = CHILD.format(scontrol_says=scontrol_says, backend=backend, bin_dir=str(tmp_path / "slurm" / "bin"))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, f"the run died (exit {done.returncode}): {done.stderr.strip()[-500:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_no_host_conf
def test_a_run_where_libslurm_would_find_no_slurm_conf_takes_scontrol_without_importing_pyslurm(tmp_path):
    got = choose_in_child(tmp_path, install_pyslurm(tmp_path))
    assert (got["class"], got["backend"], got["imported_with"]) == ("ScontrolSlurm", "scontrol", None)
    assert "pyslurm 25.11.2 is installed, but libslurm would find no slurm.conf" in got["why"]
    assert got["asked"] == []  # not even `scontrol --version`, which dies the same way


@needs_no_host_conf
def test_asking_for_pyslurm_where_slurm_conf_is_missing_still_runs_with_scontrol(tmp_path):
    """Not a config error: the environment of this run, whose Slurm calls then fail as the
    controller being unreachable, so the action is kept pending."""
    got = choose_in_child(tmp_path, install_pyslurm(tmp_path), backend="pyslurm")
    assert got.get("backend") == "scontrol", got


def test_a_slurm_conf_named_but_missing_keeps_pyslurm_unimported(tmp_path):
    missing = str(tmp_path / "gone" / "slurm.conf")
    got = choose_in_child(tmp_path, install_pyslurm(tmp_path), slurm_conf=missing)
    assert (got["backend"], got["imported_with"]) == ("scontrol", None)
    assert f"SLURM_CONF names {missing}, which does not exist" in got["why"]


def test_a_matching_pyslurm_is_imported_with_the_slurm_conf_of_its_own_slurm_install(tmp_path):
    site = install_pyslurm(tmp_path)
    conf = tmp_path / "slurm" / "etc" / "slurm.conf"  # a --prefix build's compiled-in place
    conf.parent.mkdir(parents=True)
    conf.write_text("ClusterName=c\n")
    got = choose_in_child(tmp_path, site)
    assert (got["class"], got["backend"], got["imported_with"]) == ("PyslurmSlurm", "pyslurm", str(conf))
    assert got["why"] == f"auto: pyslurm 25.11.2 matches Slurm 25.11 (slurm.conf {conf})"
    [[argv, asked_with]] = got["asked"]
    assert argv[1:] == ["--version"] and asked_with == str(conf)


def test_a_pyslurm_of_another_slurm_is_never_imported_and_asking_for_it_is_a_config_error(tmp_path):
    site = install_pyslurm(tmp_path, version="24.11.0")
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=c\n")
    auto = choose_in_child(tmp_path, site, slurm_conf=str(conf))
    assert (auto["backend"], auto["imported_with"]) == ("scontrol", None)
    assert "pyslurm 24.11 does not match Slurm 25.11" in auto["why"]
    asked = choose_in_child(tmp_path, site, backend="pyslurm", slurm_conf=str(conf))
    assert asked["error"].startswith("ConfigError: ") and "[slurm] backend" in asked["error"]


@needs_no_host_conf
def test_the_backend_tests_survive_a_missing_slurm_conf(tmp_path):
    """Collecting them (this module's skip conditions ask the factory) and running what needs no
    cluster, with a pyslurm for the Slurm on this host installed and SLURM_CONF unset."""
    site = install_pyslurm(tmp_path, version="22.05.0")  # what Debian 12's scontrol reports, were it asked
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)])
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slurm",
                           "-k", "not survive_a_missing_slurm_conf", str(REPO / "tests" / "slurm" / "test_slurm_adapter.py"),
                           __file__],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"exit {done.returncode}: {(done.stdout + done.stderr).strip()[-800:]}"
    assert FATAL not in done.stderr and " passed" in done.stdout


# --- what Slurm's failures mean, whichever backend met them ----------------------------------


@pytest.mark.parametrize("text, kind", [
    ("pyslurm load node n99: Node 'n99' does not exist", "not_found"),  # pyslurm's Node.load
    ("scontrol: error: Invalid node name specified", "not_found"),
    ("slurm_load_jobs error: Invalid job id specified", "not_found"),
    # libslurm with no slurm.conf (configless: slurmctld could not be asked for one): retry later
    ("scontrol: error: _establish_config_source: failed to fetch config\nscontrol: " + FATAL, "unavailable"),
    ("Unable to contact slurm controller (connect failure)", "unavailable"),
    ("Job not heterogeneous job leader", None),
])
def test_slurm_error_texts_of_both_backends_are_classified_alike(text, kind):
    assert classify_message(text) == kind


# --- the version rule, and the choice as validate reports it ------------------------------------


def _config(backend: str, bin_dir: str = "/usr/bin", path: str = "/etc/slurm-hooks/config.toml"):
    return SimpleNamespace(path=path, slurm=SimpleNamespace(backend=backend, bin_dir=bin_dir, timeout=7.0))


@pytest.mark.parametrize("pyslurm_version, slurm_text, ok", [
    ("25.11.0", "slurm 25.11.2", True),
    ("23.2.1", "slurm-wlm 23.02.7", True),
    ("25.11.0", "slurm-wlm 22.05.8", False),
    ("24.5.0", "slurm 24.11.1", False),
    ("", "slurm 25.11.0", False),
    ("25.11.0", "garbage", False),
])
def test_pyslurm_is_used_only_for_the_same_slurm_major_minor(pyslurm_version, slurm_text, ok):
    matched, why = versions_match(pyslurm_version, slurm_text)
    assert matched is ok
    assert (why == "") is ok


def test_version_mismatch_says_which_versions_disagree():
    _, why = versions_match("25.11.0", "slurm-wlm 22.05.8")
    assert "pyslurm 25.11" in why and "Slurm 22.05" in why


def test_scontrol_backend_is_used_when_asked():
    slurm = from_config(_config("scontrol"))
    assert isinstance(slurm, ScontrolSlurm)
    assert slurm.timeout == 7.0 and slurm.bin_dir == "/usr/bin"


@pytest.mark.skipif(usable_pyslurm()[0] is not None, reason="pyslurm matching this Slurm is installed")
def test_auto_falls_back_to_scontrol_without_a_matching_pyslurm():
    assert isinstance(from_config(_config("auto")), ScontrolSlurm)
    assert usable_pyslurm()[1]  # says why not


@pytest.mark.skipif(choose("auto").backend == "pyslurm" or not choose("auto").permanent,
                    reason="pyslurm is installed here and may match this Slurm")
def test_asking_for_pyslurm_where_it_cannot_work_is_a_config_error():
    with pytest.raises(ConfigError) as err:
        from_config(_config("pyslurm"))
    assert "[slurm] backend" in str(err.value) and "pyslurm" in str(err.value)


VALIDATE = '''\
import json, sys
from types import SimpleNamespace
from slurm_hooks.preflight.environment import check_slurm_backend
lines = []
for backend in ("auto", "scontrol", "pyslurm"):
    config = SimpleNamespace(path="/etc/slurm-hooks/config.toml",
                             slurm=SimpleNamespace(backend=backend, bin_dir={bin_dir!r}, timeout=7.0))
    [line] = check_slurm_backend(config)
    lines.append([line.check, line.status.value, line.message])
print(json.dumps({{"lines": lines, "imported": "pyslurm" in sys.modules}}))
'''


@pytest.mark.parametrize("slurm_says, auto, asked", [
    ("slurm 25.11.7", ["PASS", "pyslurm: auto: pyslurm 25.11.2 matches Slurm 25.11 (slurm.conf {conf})"],
     ["PASS", "pyslurm: pyslurm: pyslurm 25.11.2 matches Slurm 25.11 (slurm.conf {conf})"]),
    ("slurm 24.11.1", ["PASS", "scontrol: auto: pyslurm 25.11 does not match Slurm 24.11 (pyslurm X.Y works only "
                               "with Slurm X.Y)"],
     ["FAIL", "scontrol: pyslurm: pyslurm 25.11 does not match Slurm 24.11 (pyslurm X.Y works only with Slurm X.Y)"]),
])
def test_validate_names_the_backend_and_why_without_importing_pyslurm(tmp_path, slurm_says, auto, asked):
    site = install_pyslurm(tmp_path)
    conf = tmp_path / "slurm" / "etc" / "slurm.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("ClusterName=c\n")
    scontrol = tmp_path / "slurm" / "bin" / "scontrol"
    scontrol.write_text(f"#!/bin/sh\necho '{slurm_says}'\n")
    os.chmod(scontrol, 0o755)
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)])
    done = subprocess.run([sys.executable, "-c", VALIDATE.format(bin_dir=str(scontrol.parent))], env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    got = json.loads(done.stdout)
    assert got["lines"] == [["slurm-backend", *(w.format(conf=conf) for w in auto)],
                            ["slurm-backend", "PASS", 'scontrol: [slurm] backend = "scontrol"'],
                            ["slurm-backend", *(w.format(conf=conf) for w in asked)]]
    assert got["imported"] is False  # validate decides as a hook run does


def test_validate_says_auto_takes_scontrol_where_pyslurm_is_not_installed(monkeypatch):
    if choose("auto").why != "auto: pyslurm is not installed":
        pytest.skip("pyslurm is installed here")
    [line] = check_slurm_backend(_config("auto"))
    assert (line.status, line.message) == (Status.PASS, "scontrol: auto: pyslurm is not installed")

