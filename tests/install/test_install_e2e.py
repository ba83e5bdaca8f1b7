"""The roll-out, end to end: the wheel built from the checkout, README's install lines run as
written into a fresh venv with no checkout beside it, ``install --prefix`` wired into a real
slurmctld and two slurmd's (the testbed's ``programs`` switch), then the package pulled from
under the running cluster, and monitor-only with an XID 79."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT

from slurm_hooks import __version__
from slurm_hooks.install import layout
from slurm_hooks.probes import sim

README = Path(ROOT) / "README.md"
BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)


def readme_install_lines() -> list[str]:
    """The shell lines of README's install section (the block after its install-section marker)."""
    text = README.read_text()
    start = text.index("<!-- install-section:")
    block = text[start:].split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd="/", **kw)


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """``pip wheel`` of the checkout, as README says: our wheel (built without network: no build
    isolation, no index) and the dependencies' wheels beside it."""
    out = tmp_path_factory.mktemp("dist")
    r = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
             "-w", str(out), ROOT])
    assert r.returncode == 0, r.stderr
    r = run([sys.executable, "-m", "pip", "wheel", "-q", "-w", str(out), f"{out}/slurm_hooks-{__version__}-py3-none-any.whl"])
    if r.returncode != 0:  # our wheel is built; its dependencies' wheels come from the package index
        pytest.skip(f"the dependencies' wheels cannot be fetched here: {r.stderr.strip()[-300:]}")
    return out


@pytest.fixture(scope="module")
def site(tmp_path_factory, dist) -> dict[str, Path]:
    """README's install lines, as written, with the site's paths moved under a temp dir."""
    root = tmp_path_factory.mktemp("site")
    # An admin's shell: not this test run's PYTHONPATH (a checkout, whose egg-info `pip wheel` left
    # there tells the venv's pip that slurm-hooks is installed already: no programs laid).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    paths = {"prefix": root / "opt" / "slurm-hooks", "config": root / "etc" / "slurm-hooks" / "config.toml"}
    for line in readme_install_lines():
        line = (line.replace("/opt/slurm-hooks", str(paths["prefix"]))
                .replace("/etc/slurm-hooks", str(paths["config"].parent))
                .replace("--find-links dist", f"--find-links {dist}"))
        argv = shlex.split(line)
        if argv[0] == "python3":
            argv[0] = BASE_PYTHON
        r = run(argv, env=env)
        if "validate" in argv:
            # validate judges this machine (no slurm.conf at the default path, no GPUs): FAILs, one line each
            assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stderr
        else:
            assert r.returncode == 0, f"{line}: {r.stderr}"
    paths["venv"] = paths["prefix"] / f"venv-{__version__}"
    return paths


def test_readme_install_lays_the_programs_from_a_venv_with_no_checkout_beside_it(site):
    py = site["venv"] / "bin" / "python"
    r = run([str(py), "-I", "-c", "import slurm_hooks; print(slurm_hooks.__file__)"])
    where = r.stdout.strip()
    assert where.startswith(str(site["venv"])) and not where.startswith(ROOT + "/slurm_hooks")
    for hook in ("healthcheck", "prolog", "epilog"):
        assert os.access(site["prefix"] / "bin" / f"slurm-hooks-{hook}", os.X_OK)
        text = (site["prefix"] / "bin" / f"slurm-hooks-{hook}").read_text()
        assert re.search(rf"\n{re.escape(str(site['venv']))}/bin/python[0-9.]* -I -m slurm_hooks ", text)
    assert (site["prefix"] / layout.UNIT).is_file() and (site["prefix"] / layout.NHC).is_file()
    assert os.stat(site["config"]).st_mode & 0o777 == 0o600


# --- on the real testbed ---------------------------------------------------------------------------


def submit_on(tb, node: str, gpus: int = 1) -> int:
    return tb.sbatch("#!/bin/sh\necho ran on $SLURMD_NODENAME gpus=$SLURM_JOB_GPUS\n", f"--gres=gpu:{gpus}",
                     f"--nodelist={node}")


def jobs_run_on_both_nodes_and_nothing_drains(tb) -> None:
    jobs = {node: submit_on(tb, node) for node in tb.nodes}
    for node, job in jobs.items():
        tb.wait_job(job, ("COMPLETED",), timeout=60)
        assert f"ran on {node}" in tb.job_output(job)
    assert not any(n.drained for n in tb.slurm.nodes()), [(n.name, n.state, n.reason) for n in tb.slurm.nodes()]


@pytest.mark.slurm
def test_the_installed_programs_run_jobs_fail_safe_without_the_package_and_monitor_only_holds(
        site, dist, testbed, tmp_path):
    tb = testbed
    venv = site["venv"]
    prefix = tmp_path / "opt"
    cli = [str(venv / "bin" / "slurm-hooks"), "install", "--prefix", str(prefix), "--config", tb.config_path,
           "--env", f"SLURM_CONF={tb.slurm_conf}"]
    r = run(cli)
    assert r.returncode == 0, r.stderr
    assert f"Prolog={prefix}/bin/slurm-hooks-prolog" in r.stdout
    try:
        tb.set_programs(str(prefix))
        tb.set_hooks(True)
        tb.reset()
        conf = Path(tb.slurm_conf).read_text()
        for hook, key in (("healthcheck", "HealthCheckProgram"), ("prolog", "Prolog"), ("epilog", "Epilog")):
            assert f"\n{key}={prefix}/bin/slurm-hooks-{hook}\n" in conf

        # 1. the wheel's programs run the jobs; nothing drains
        jobs_run_on_both_nodes_and_nothing_drains(tb)
        state = tb.tb.hooks_state_dir
        assert layout.read_status(state) == {}

        # the opt-in to fail closed, laid beside (used by hand below, not by slurmd)
        refuse = tmp_path / "opt-refuse"
        r = run([*cli[:3], str(refuse), *cli[4:], "--on-internal-error", "refuse"])
        assert r.returncode == 0, r.stderr

        # 2. the package removed from under the cluster: jobs still run on both nodes, nothing drains,
        #    one line on stderr, and a status file validate reports
        r = run([str(venv / "bin" / "pip"), "uninstall", "-y", "-q", "slurm-hooks"])
        assert r.returncode == 0, r.stderr
        jobs_run_on_both_nodes_and_nothing_drains(tb)
        status = layout.read_status(state)
        assert {status[h]["action"] for h in ("prolog", "epilog")} == {"allowed"}
        hc = run([str(prefix / "bin" / "slurm-hooks-healthcheck")], env={"SLURMD_NODENAME": "n1"})
        assert hc.returncode == 0
        assert "slurm-hooks check could not run (exit 1): the node stays in service" in hc.stderr
        assert "No module named slurm_hooks" in hc.stderr
        r = run([sys.executable, "-m", "slurm_hooks", "validate", "--config", tb.config_path,
                 "--slurm-conf", tb.slurm_conf, "--json"])
        failed = [x for x in json.loads(r.stdout) if x["check"] == "wrappers"]
        assert {x["status"] for x in failed} == {"FAIL"} and len(failed) == 3
        # with --on-internal-error refuse, the health check drains its node instead, for an admin
        hc = run([str(refuse / "bin" / "slurm-hooks-healthcheck")], env={"SLURMD_NODENAME": "n2"})
        assert hc.returncode == 1 and "the node is drained" in hc.stderr
        n2 = tb.slurm.node("n2")
        assert n2.drained and n2.reason == "slurm-hooks cannot run (exit 1): see syslog" and not n2.ours
        tb.scontrol("update", "NodeName=n2", "State=RESUME")
        tb.wait_node("n2", lambda n: not n.drained, timeout=30)

        # restored: all is back, and the first good run of each program clears its record
        r = run([str(venv / "bin" / "pip"), "install", "-q", "--no-index", "--find-links", str(dist), "slurm-hooks"])
        assert r.returncode == 0, r.stderr
        jobs_run_on_both_nodes_and_nothing_drains(tb)
        assert run([str(prefix / "bin" / "slurm-hooks-healthcheck")], env={"SLURMD_NODENAME": "n1"}).returncode == 0
        assert layout.read_status(state) == {}

        # 3. monitor-only: XID 79 on n1 under the job's GPUs; the job runs, n1 stays, the audit has it
        monitor = tmp_path / "monitor.toml"
        monitor.write_text(Path(tb.config_path).read_text() + "\n[check]\ndrain = false\n")
        r = run([*cli[:5], str(monitor), *cli[6:]])  # an upgrade in place: the new version switched in
        assert r.returncode == 0 and "switch " in r.stdout, r.stdout + r.stderr
        sim.inject(tb.sim_dir, "n1", 3, xid=79)
        job = submit_on(tb, "n1", gpus=8)
        tb.wait_job(job, ("COMPLETED",), timeout=60)
        assert "ran on n1" in tb.job_output(job)
        assert not tb.slurm.node("n1").drained
        audit = tb.audit_events()
        assert any(a["kind"] == "alert" and a.get("context") == "prolog" and a.get("monitor_only")
                   and a.get("gpu") == 3 for a in audit)
        assert any(a["kind"] == "action" and a.get("result") == "monitor-only" and a.get("context") == "prolog"
                   for a in audit)
    finally:
        tb.set_programs("")
        tb.set_hooks(False)
        sim.init(tb.sim_dir, "n1", tb.settings.gpus)
    # and uninstall leaves nothing of the install behind
    r = run([str(venv / "bin" / "slurm-hooks"), "install", "--uninstall", "--prefix", str(prefix)])
    assert r.returncode == 0, r.stderr
    assert not prefix.exists()
