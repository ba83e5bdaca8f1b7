"""``slurm-hooks validate``: a good setup passes; each broken setting is named with its fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from slurm_hooks import __version__
from slurm_hooks import preflight as validate
from slurm_hooks.cli import main
from slurm_hooks.install.layout import install_command
from slurm_hooks.probes import sim, simtools

GOOD_SLURM_CONF = """\
ClusterName=hooks-test
SlurmctldHost=localhost
HealthCheckProgram={root}/etc/healthcheck/slurm-hooks-check
HealthCheckInterval=300
HealthCheckNodeState=ANY
Prolog={root}/etc/prolog.d/*
Epilog={root}/etc/epilog.d/50-slurm-hooks
PrologEpilogTimeout=120
KillWait=120
MessageTimeout=5
RebootProgram=/usr/sbin/reboot
ResumeTimeout=900
JobRequeue=1
SchedulerParameters=bf_interval=30,nohold_on_prolog_fail
PrologFlags=Contain,ForceRequeueOnFail
GresTypes=gpu
NodeName=n[1-2] NodeHostname=localhost Gres=gpu:8
PartitionName=gpu Nodes=n[1-2] Default=YES
"""

GOOD_CONFIG = """\
[gpu]
backend = "sim"
sim_dir = "{root}/sim"
slurmd = "{root}/bin/slurmd"

[slurm]
bin_dir = "{root}/bin"
timeout = 5

[log]
audit = "{root}/log/audit.jsonl"

[state]
dir = "{root}/state"

[remediation]
requeue_grace = 120

[dcgm]
dcgmi = "{root}/bin/dcgmi"

[expect]
gpus = 8
"""

SCONTROL_UP = """#!/bin/sh
echo "Slurmctld(primary) at localhost is UP (SLURM_CONF=$SLURM_CONF)"
exit 0
"""
#: `srun --mpi=list` as Slurm 22.05.8 prints it.
SRUN = """#!/bin/sh
printf 'MPI plugin types are...\\n\\tpmix\\n\\tnone\\n\\tpmi2\\nspecific pmix plugin versions available: pmix_v4\\n'
"""
SCONTROL_DOWN = """#!/bin/sh
echo "Slurmctld(primary) at localhost is DOWN"
exit 1
"""


class Cluster:
    """A node's worth of files under tmp_path: slurm.conf, our config, wrappers, sim GPUs, scontrol."""

    def __init__(self, root):
        self.root = root
        self.slurm_conf = str(root / "etc" / "slurm.conf")
        self.config = str(root / "etc" / "config.toml")
        self.script("etc/healthcheck/slurm-hooks-check", "#!/bin/sh\nexec /usr/local/bin/slurm-hooks check\n")
        self.script("etc/prolog.d/10-site", "#!/bin/sh\nexit 0\n")
        self.script("etc/prolog.d/50-slurm-hooks", "#!/bin/sh\n# GPU health before the job\nexec /opt/sh/bin/python3 -m slurm_hooks prolog\n")
        self.script("etc/epilog.d/50-slurm-hooks", "#!/bin/bash\nset -e\n/usr/local/bin/slurm-hooks epilog --json\n")
        self.script("bin/scontrol", SCONTROL_UP)
        self.script("bin/srun", SRUN)
        self.write_slurm_conf(GOOD_SLURM_CONF)
        self.write_config(GOOD_CONFIG)
        (root / "etc" / "gres.conf").write_text("NodeName=n[1-2] Name=gpu File=/dev/nvidia[0-7]\n")
        self.slurmd_answers(range(8))
        sim.init(str(root / "sim"), "n1", gpus=8)
        simtools.install(str(root / "bin"), str(root / "sim"))  # a dcgmi: repairs are validated

    def slurmd_answers(self, minors):
        """The config's `slurmd -G`, answering as a healthy node's slurmd with this gres.conf order (the
        real one, run here, waits ~20 s for device files this machine lacks)."""
        self.script("bin/slurmd", "#!/bin/sh\ncat <<'EOF'\n" + "".join(
            f"slurmd-n1: Gres Name=gpu Type=(null) Count=1 Index={i} ID=7696487 File=/dev/nvidia{m} (null)\n"
            for i, m in enumerate(minors)) + "EOF\n")

    def script(self, rel, text, mode=0o755):
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        os.chmod(path, mode)
        return str(path)

    def write_slurm_conf(self, text):
        (self.root / "etc").mkdir(parents=True, exist_ok=True)
        (self.root / "etc" / "slurm.conf").write_text(text.format(root=self.root))

    def edit_slurm_conf(self, old, new):
        path = self.root / "etc" / "slurm.conf"
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new))

    def write_config(self, text):
        (self.root / "etc" / "config.toml").write_text(text.format(root=self.root))

    def run(self, node="n1"):
        return validate.run(self.config, self.slurm_conf, node)

    def line_of(self, key):
        for no, line in enumerate(open(self.slurm_conf), 1):
            if line.startswith(key + "="):
                return no
        raise AssertionError(key)


@pytest.fixture
def cluster(tmp_path):
    return Cluster(tmp_path)


def by_check(results, check):
    found = [r for r in results if r.check == check]
    assert found, f"no {check} result in {[r.line() for r in results]}"
    return found


def only(results, check):
    found = by_check(results, check)
    assert len(found) == 1, [r.line() for r in found]
    return found[0]


def test_good_cluster_passes_every_check_and_exits_0(cluster, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["validate", "--config", cluster.config, "--slurm-conf", cluster.slurm_conf, "--node", "n1"])
    out = capsys.readouterr().out.splitlines()
    assert exc.value.code == 0, "\n".join(out)
    assert out and all(line.startswith("PASS  ") for line in out), "\n".join(out)
    checks = {line.split()[1].rstrip(":") for line in out}
    assert {"config", "slurm-conf", "health-check-program", "prolog", "epilog", "health-check-interval",
            "health-check-node-state", "kill-wait", "prolog-epilog-timeout", "job-requeue", "nohold-on-prolog-fail",
            "force-requeue-on-fail", "gres", "controller-failover", "gpu-backend", "gpu-count", "scontrol", "audit-log", "state-dir",
            "gpu-map", "isolate-mpi"} <= checks


def test_json_output_lists_check_status_message_fix_and_where(cluster, capsys):
    cluster.edit_slurm_conf("KillWait=120", "KillWait=30")
    with pytest.raises(SystemExit) as exc:
        main(["validate", "--json", "--config", cluster.config, "--slurm-conf", cluster.slurm_conf, "--node", "n1"])
    assert exc.value.code == 0  # a WARN alone does not fail
    data = json.loads(capsys.readouterr().out)
    assert all(set(d) == {"check", "status", "message", "fix", "where"} for d in data)
    kill = [d for d in data if d["check"] == "kill-wait"][0]
    assert kill["status"] == "WARN"
    assert kill["where"] == f"{cluster.slurm_conf}:{cluster.line_of('KillWait')}"


def test_any_fail_exits_1(cluster, capsys):
    cluster.edit_slurm_conf("HealthCheckInterval=300", "HealthCheckInterval=0")
    with pytest.raises(SystemExit) as exc:
        main(["validate", "--config", cluster.config, "--slurm-conf", cluster.slurm_conf, "--node", "n1"])
    assert exc.value.code == 1
    assert "FAIL  health-check-interval:" in capsys.readouterr().out


def test_unknown_option_is_a_usage_error_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["validate", "--no-such-option"])
    assert exc.value.code == 2


# --- programs ------------------------------------------------------------------------


def test_missing_health_check_program_fails_with_an_example_wrapper(cluster):
    cluster.edit_slurm_conf(f"HealthCheckProgram={cluster.root}/etc/healthcheck/slurm-hooks-check\n", "")
    r = only(cluster.run(), "health-check-program")
    assert r.status is validate.Status.FAIL
    assert "HealthCheckProgram is not set" in r.message
    assert r.fix == f"HealthCheckProgram=/opt/slurm-hooks/bin/slurm-hooks-healthcheck (laid by `{install_command()}`)"
    assert install_command() == (f"/opt/slurm-hooks/venv-{__version__}/bin/slurm-hooks install "
                                 "--prefix /opt/slurm-hooks --config /etc/slurm-hooks/config.toml")


def test_program_that_does_not_run_slurm_hooks_fails(cluster):
    cluster.script("etc/healthcheck/slurm-hooks-check", "#!/bin/sh\n/usr/local/sbin/site-health\n")
    r = only(cluster.run(), "health-check-program")
    assert r.status is validate.Status.FAIL
    assert "does not run `slurm-hooks check`" in r.message
    assert r.where == f"{cluster.slurm_conf}:{cluster.line_of('HealthCheckProgram')}"


def test_wrapper_running_the_wrong_subcommand_is_not_ours(cluster):
    cluster.script("etc/epilog.d/50-slurm-hooks", "#!/bin/sh\nexec /usr/local/bin/slurm-hooks prolog\n")
    r = only(cluster.run(), "epilog")
    assert r.status is validate.Status.FAIL and "`slurm-hooks epilog`" in r.message


def test_missing_program_file_fails(cluster):
    os.unlink(cluster.root / "etc" / "epilog.d" / "50-slurm-hooks")
    r = only(cluster.run(), "epilog")
    assert r.status is validate.Status.FAIL and "does not exist" in r.message


def test_prolog_directory_without_glob_fails_with_glob_fix(cluster):
    cluster.edit_slurm_conf(f"Prolog={cluster.root}/etc/prolog.d/*", f"Prolog={cluster.root}/etc/prolog.d")
    r = only(cluster.run(), "prolog")
    assert r.status is validate.Status.FAIL and "is a directory" in r.message
    assert r.fix.startswith(f"Prolog={cluster.root}/etc/prolog.d/*")


def test_prolog_glob_without_our_script_fails(cluster):
    os.unlink(cluster.root / "etc" / "prolog.d" / "50-slurm-hooks")
    r = only(cluster.run(), "prolog")
    assert r.status is validate.Status.FAIL
    assert "does not run `slurm-hooks prolog`" in r.message
    assert r.fix.startswith(f"link /opt/slurm-hooks/bin/slurm-hooks-prolog into {cluster.root}/etc/prolog.d (laid by")


def test_group_writable_script_in_prolog_dir_fails_with_chmod_fix(cluster):
    path = cluster.script("etc/prolog.d/10-site", "#!/bin/sh\nexit 0\n", mode=0o775)
    r = only(cluster.run(), "prolog")
    assert r.status is validate.Status.FAIL
    assert "writable by group or others (mode 0775)" in r.message
    assert r.fix == f"chmod go-w {path}"


def test_script_that_is_not_executable_fails(cluster):
    path = cluster.script("etc/healthcheck/slurm-hooks-check", "#!/bin/sh\nexec /usr/local/bin/slurm-hooks check\n",
                          mode=0o644)
    r = only(cluster.run(), "health-check-program")
    assert r.status is validate.Status.FAIL and "is not executable" in r.message
    assert r.fix == f"chmod 755 {path}"


def test_script_in_a_world_writable_directory_fails(cluster):
    os.chmod(cluster.root / "etc" / "healthcheck", 0o1777)
    r = only(cluster.run(), "health-check-program")
    assert r.status is validate.Status.FAIL and "world-writable" in r.message
    assert r.fix.startswith(f"chmod o-w {cluster.root}/etc/healthcheck")


def test_bare_command_name_warns_because_slurmd_gives_no_path(cluster):
    cluster.script("etc/epilog.d/50-slurm-hooks", "#!/bin/sh\nexec slurm-hooks epilog\n")
    r = only(cluster.run(), "epilog")
    assert r.status is validate.Status.WARN
    assert "by bare name" in r.message and "absolute path" in r.fix


def test_bare_command_name_is_fine_when_the_script_sets_path(cluster):
    cluster.script("etc/epilog.d/50-slurm-hooks", "#!/bin/sh\nexport PATH=/usr/local/bin:/usr/bin\nexec slurm-hooks epilog\n")
    assert only(cluster.run(), "epilog").status is validate.Status.PASS


# --- scheduling settings ----------------------------------------------------------------


@pytest.mark.parametrize("setting", ["HealthCheckInterval=0", ""])
def test_health_check_interval_unset_or_zero_fails(cluster, setting):
    cluster.edit_slurm_conf("HealthCheckInterval=300\n", setting + ("\n" if setting else ""))
    r = only(cluster.run(), "health-check-interval")
    assert r.status is validate.Status.FAIL
    assert "never runs HealthCheckProgram" in r.message and r.fix.startswith("HealthCheckInterval=300")


@pytest.mark.parametrize("state,status", [
    ("ANY", "PASS"), ("ANY,CYCLE", "PASS"), ("IDLE,ALLOC,MIXED", "PASS"),
    ("IDLE", "WARN"),
    ("ALLOC,MIXED", "FAIL"), ("NONDRAINED_IDLE,ALLOC", "FAIL"), ("START_ONLY", "FAIL"), ("BUSY", "FAIL"),
])
def test_health_check_node_state_must_reach_drained_idle_nodes(cluster, state, status):
    cluster.edit_slurm_conf("HealthCheckNodeState=ANY", f"HealthCheckNodeState={state}")
    r = only(cluster.run(), "health-check-node-state")
    assert r.status.value == status, r.line()
    if status == "FAIL" and state != "BUSY":
        assert "stays drained after repair" in r.message
        assert r.fix.startswith("HealthCheckNodeState=ANY")
        assert "NONDRAINED_IDLE" in r.fix


def test_kill_wait_shorter_than_requeue_grace_warns_naming_file_and_line(cluster):
    cluster.edit_slurm_conf("KillWait=120", "KillWait=30")
    r = only(cluster.run(), "kill-wait")
    assert r.status is validate.Status.WARN
    assert r.line().startswith(f"WARN  kill-wait: {cluster.slurm_conf}:{cluster.line_of('KillWait')}: KillWait=30 is shorter")
    assert "requeue_grace = 120" in r.message
    assert r.fix.startswith("KillWait=120 in slurm.conf")


def test_a_checkpoint_grace_longer_than_kill_wait_warns_that_it_is_cut(cluster):
    assert only(cluster.run(), "checkpoint-grace").status is validate.Status.PASS  # 90 s <= KillWait=120
    cluster.edit_slurm_conf("KillWait=120", "KillWait=30")
    r = only(cluster.run(), "checkpoint-grace")
    assert r.status is validate.Status.WARN, r.line()
    assert "checkpoint_grace = 90 s is cut to KillWait=30" in r.message and "has 30 s to save" in r.message
    assert r.where == f"{cluster.slurm_conf}:{cluster.line_of('KillWait')}"
    assert r.fix == f"KillWait=90 in slurm.conf, or checkpoint_grace = 30 in {cluster.config}"


def test_kill_wait_unset_uses_slurms_default_of_30(cluster):
    cluster.edit_slurm_conf("KillWait=120\n", "")
    r = only(cluster.run(), "kill-wait")
    assert r.status is validate.Status.WARN and "KillWait unset (default 30)" in r.message


def test_kill_wait_that_is_not_a_number_fails(cluster):
    cluster.edit_slurm_conf("KillWait=120", "KillWait=2min")
    r = only(cluster.run(), "kill-wait")
    assert r.status is validate.Status.FAIL and "not a duration" in r.message


def test_prolog_epilog_timeout_unset_warns(cluster):
    cluster.edit_slurm_conf("PrologEpilogTimeout=120\n", "")
    r = only(cluster.run(), "prolog-epilog-timeout")
    assert r.status is validate.Status.WARN and "is not set" in r.message
    assert r.fix.startswith("PrologEpilogTimeout=120")


def test_prolog_epilog_timeout_below_our_deadline_warns(cluster):
    cluster.edit_slurm_conf("PrologEpilogTimeout=120", "PrologEpilogTimeout=20")
    r = only(cluster.run(), "prolog-epilog-timeout")
    assert r.status is validate.Status.WARN and "shorter than [check] deadline = 45 s" in r.message


def test_job_requeue_off_warns(cluster):
    cluster.edit_slurm_conf("JobRequeue=1", "JobRequeue=0")
    r = only(cluster.run(), "job-requeue")
    assert r.status is validate.Status.WARN and r.fix.startswith("JobRequeue=1")


def test_missing_nohold_on_prolog_fail_warns_and_fix_keeps_other_parameters(cluster):
    cluster.edit_slurm_conf("SchedulerParameters=bf_interval=30,nohold_on_prolog_fail",
                            "SchedulerParameters=bf_interval=30")
    r = only(cluster.run(), "nohold-on-prolog-fail")
    assert r.status is validate.Status.WARN and "HELD" in r.message
    assert r.fix == "SchedulerParameters=bf_interval=30,nohold_on_prolog_fail"


def test_gres_types_without_gpu_fails(cluster):
    cluster.edit_slurm_conf("GresTypes=gpu", "GresTypes=mps")
    r = only(cluster.run(), "gres")
    assert r.status is validate.Status.FAIL and r.fix == "GresTypes=mps,gpu"


def test_node_line_without_gpu_gres_fails(cluster):
    cluster.edit_slurm_conf("NodeName=n[1-2] NodeHostname=localhost Gres=gpu:8", "NodeName=n[1-2] NodeHostname=localhost")
    results = by_check(cluster.run(), "gres")
    assert {r.status for r in results} == {validate.Status.FAIL}
    assert any("no NodeName= line has gpu" in r.message for r in results)
    assert any("(this node, n1) has no gpu Gres" in r.message and r.fix == "add Gres=gpu:8 to that line" for r in results)


def test_gres_conf_with_fewer_gpus_than_slurm_conf_fails_with_the_fix(cluster):
    # slurm.conf Gres=gpu:8, gres.conf four files: slurmd registers 4, slurmctld drains the node; was a WARN
    # (the GPU map's) and validate exited 0.
    (cluster.root / "etc" / "gres.conf").write_text("NodeName=n[1-2] Name=gpu File=/dev/nvidia[0-3]\n")
    [r] = [r for r in by_check(cluster.run(), "gres") if r.status is validate.Status.FAIL]
    assert "offers 8 GPU(s) but" in r.message and "gives n1 4 (/dev/nvidia0, /dev/nvidia1, /dev/nvidia2, " in r.message
    assert "gres/gpu count reported lower than configured" in r.message
    assert r.fix.startswith("list all 8 device files for n1 in ") and r.fix.endswith("or Gres=gpu:4 on the NodeName= line")
    assert r.where == f"{cluster.slurm_conf}:{cluster.line_of('NodeName')}"


def test_gres_conf_that_autodetects_or_matches_the_count_passes(cluster):
    (cluster.root / "etc" / "gres.conf").write_text("AutoDetect=nvml\nName=gpu Type=h100\n")
    assert only(cluster.run(), "gres").status is validate.Status.PASS
    (cluster.root / "etc" / "gres.conf").write_text("NodeName=n1 Name=gpu File=/dev/nvidia[0-7]\n")
    assert only(cluster.run(), "gres").status is validate.Status.PASS


@pytest.mark.parametrize("autodetect", ["nvidia", "NVML", "rsmi", "oneapi"])
def test_gres_conf_that_autodetects_by_any_plugin_is_not_counted_against_slurm_conf(cluster, autodetect):
    # Slurm 24.11's AutoDetect=nvidia (no NVML needed) counts the GPUs itself, as nvml does: the Type= line that
    # only names them gave "offers 8 GPU(s) but gres.conf gives n1 1", a FAIL on a node that schedules fine.
    (cluster.root / "etc" / "gres.conf").write_text(f"AutoDetect={autodetect}\nName=gpu Type=h100\n")
    assert only(cluster.run(), "gres").status is validate.Status.PASS


def test_gres_conf_with_autodetect_off_is_counted(cluster):
    (cluster.root / "etc" / "gres.conf").write_text("AutoDetect=off\nNodeName=n[1-2] Name=gpu File=/dev/nvidia[0-3]\n")
    assert [r for r in by_check(cluster.run(), "gres") if r.status is validate.Status.FAIL]


def test_missing_force_requeue_on_fail_warns_with_the_reason_and_a_fix_that_keeps_other_flags(cluster):
    cluster.edit_slurm_conf("PrologFlags=Contain,ForceRequeueOnFail", "PrologFlags=Contain")
    r = only(cluster.run(), "force-requeue-on-fail")
    assert r.status is validate.Status.WARN and r.where == f"{cluster.slurm_conf}:{cluster.line_of('PrologFlags')}"
    assert "cancels a batch job submitted with --no-requeue" in r.message and "_launch_job_fail" in r.message
    assert r.fix == "PrologFlags=Contain,ForceRequeueOnFail"
    cluster.edit_slurm_conf("PrologFlags=Contain\n", "")
    r = only(cluster.run(), "force-requeue-on-fail")
    assert r.status is validate.Status.WARN and r.fix == "PrologFlags=ForceRequeueOnFail"


def test_node_gres_count_differing_from_the_group_warns(cluster):
    cluster.edit_slurm_conf("Gres=gpu:8", "Gres=gpu:h100:4")
    r = only(cluster.run(), "gres")
    assert r.status is validate.Status.WARN and "offers 4 GPU(s) but group default expects 8" in r.message


def test_missing_slurm_conf_fails_and_says_how_to_point_at_one(cluster, tmp_path):
    results = validate.run(cluster.config, str(tmp_path / "missing.conf"), "n1")
    r = only(results, "slurm-conf")
    assert r.status is validate.Status.FAIL and "file not found" in r.message and "--slurm-conf" in r.fix


# --- our config and the machine --------------------------------------------------------


def test_config_typo_fails_naming_file_line_and_key(cluster, capsys):
    cluster.write_config(GOOD_CONFIG.replace('backend = "sim"', 'bakend = "sim"'))
    with pytest.raises(SystemExit) as exc:
        main(["validate", "--config", cluster.config, "--slurm-conf", cluster.slurm_conf, "--node", "n1"])
    assert exc.value.code == 1
    out = capsys.readouterr().out
    assert f"FAIL  config: {cluster.config}:2: [gpu] bakend: unknown key" in out
    assert f"(fix: edit {cluster.config} line 2 ([gpu] bakend))" in out
    assert "PASS  health-check-interval" in out  # slurm.conf is still judged where it needs none of our settings
    assert "gpu-backend" not in out  # not with settings we could not read
    assert "  kill-wait:" not in out and f"WARN  config-dependent: {cluster.slurm_conf}: not judged while" in out


def test_after_a_config_error_slurm_conf_is_not_judged_against_built_in_defaults(cluster):
    # The config says reboot_timeout = 60 and slurm.conf ResumeTimeout=60: a typo elsewhere in the config must
    # not turn that into "ResumeTimeout=60 is shorter than [repair] reboot_timeout = 900" (the default).
    cluster.edit_slurm_conf("ResumeTimeout=900", "ResumeTimeout=60")
    cluster.write_config(GOOD_CONFIG + "[repair]\nenabled = true\nreboot_timeout = 60\n")
    assert {r.check: r.status for r in cluster.run()}["resume-timeout"] is validate.Status.PASS
    cluster.write_config(GOOD_CONFIG.replace("timeout = 5", "timeout = 5\ntimout = 6")
                         + "[repair]\nenabled = true\nreboot_timeout = 60\n")
    results = cluster.run()
    assert only(results, "config").status is validate.Status.FAIL
    assert not [r for r in results if r.check in ("resume-timeout", "kill-wait", "controller-failover")]
    skipped = only(results, "config-dependent")
    assert skipped.status is validate.Status.WARN and "resume-timeout" in skipped.message
    assert only(results, "health-check-interval").status is validate.Status.PASS


def test_missing_simulated_gpus_fail_with_sim_init_fix(cluster):
    os.unlink(cluster.root / "sim" / "n1.json")
    r = only(cluster.run(), "gpu-backend")
    assert r.status is validate.Status.FAIL and r.fix == "slurm-hooks sim init --node n1"


def test_validate_on_an_admin_host_that_is_no_simulated_node_warns_and_names_one_to_judge(cluster):
    """The testbed's config on the admin's own host ('vm'): the sim holds n1, not vm. Not a failure of
    the setup: a warning that names a node to judge instead."""
    sim.init(str(cluster.root / "sim"), "n2")
    r = only(cluster.run(node="vm"), "gpu-backend")
    assert r.status is validate.Status.WARN and "vm (this host) is none of the simulated nodes" in r.message
    assert "n1, n2" in r.message and r.fix == "slurm-hooks validate --node n1 judges a simulated node"


def test_gpu_count_different_from_expected_fails(cluster):
    sim.init(str(cluster.root / "sim"), "n1", gpus=7)
    r = only(cluster.run(), "gpu-count")
    assert r.status is validate.Status.FAIL and "n1 has 7 GPU(s), group default expects 8" in r.message


def test_gpu_count_comes_from_the_nodes_group(cluster):
    cluster.write_config(GOOD_CONFIG + '\n[groups.small]\nnodes = "n[1-4]"\ngpus = 4\n')
    sim.init(str(cluster.root / "sim"), "n1", gpus=4)
    results = cluster.run()
    assert only(results, "gpu-count").status is validate.Status.PASS
    assert "group small expects 4" in only(results, "gres").message  # slurm.conf says 8


def test_no_expected_gpu_count_warns(cluster):
    cluster.write_config(GOOD_CONFIG.replace("gpus = 8", ""))
    r = only(cluster.run(), "gpu-count")
    assert r.status is validate.Status.WARN and r.fix.startswith("set gpus = 8")


def test_scontrol_ping_gets_the_validated_slurm_conf(cluster):
    r = only(cluster.run(), "scontrol")
    assert r.status is validate.Status.PASS
    assert f"is UP (SLURM_CONF={cluster.slurm_conf})" in r.message


def test_scontrol_reporting_controller_down_fails(cluster):
    cluster.script("bin/scontrol", SCONTROL_DOWN)
    r = only(cluster.run(), "scontrol")
    assert r.status is validate.Status.FAIL
    assert "exited 1: Slurmctld(primary) at localhost is DOWN" in r.message


def test_scontrol_missing_from_bin_dir_fails(cluster):
    os.unlink(cluster.root / "bin" / "scontrol")
    r = only(cluster.run(), "scontrol")
    assert r.status is validate.Status.FAIL and "[slurm] bin_dir" in r.fix


def test_scontrol_that_hangs_times_out(cluster):
    cluster.write_config(GOOD_CONFIG.replace("timeout = 5", "timeout = 0.5"))
    cluster.script("bin/scontrol", "#!/bin/sh\nsleep 30\n")
    r = only(cluster.run(), "scontrol")
    assert r.status is validate.Status.FAIL and "did not answer within 0.5 s" in r.message


def test_audit_log_under_a_regular_file_fails(cluster):
    (cluster.root / "log").write_text("not a directory\n")
    r = only(cluster.run(), "audit-log")
    assert r.status is validate.Status.FAIL and "is not a directory" in r.message


def test_audit_log_directory_is_not_written_into(cluster):
    assert only(cluster.run(), "audit-log").status is validate.Status.PASS
    assert not (cluster.root / "log").exists()


def test_deadline_above_slurmds_healthcheck_kill_fails_the_config(cluster):
    cluster.write_config(GOOD_CONFIG + "\n[check]\ndeadline = 90\n")
    r = only(cluster.run(), "config")
    assert r.status is validate.Status.FAIL and "[check] deadline: must be > 0 and < 60" in r.message


# --- the bridge's Kubernetes access -----------------------------------------------------


class ReviewServer:
    """A real HTTP server answering SelfSubjectAccessReview like an RBAC-enforcing API server."""

    def __init__(self, denied=()):
        self.denied = set(denied)
        self.seen = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews" or \
                        self.headers.get("Authorization") != "Bearer test-token":
                    self.send_response(403)
                    self.end_headers()
                    return
                attrs = body["spec"]["resourceAttributes"]
                key = (attrs["verb"], attrs["resource"] + ("/" + attrs["subresource"] if attrs.get("subresource") else ""))
                outer.seen.append(key)
                allowed = key not in outer.denied
                body["status"] = {"allowed": allowed, "reason": "" if allowed else "no RBAC rule"}
                data = json.dumps(body).encode()
                self.send_response(201)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def kubeconfig(path, server):
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: t, cluster: {{server: "{server}"}}}}]
users: [{{name: u, user: {{token: test-token}}}}]
contexts: [{{name: c, context: {{cluster: t, user: u}}}}]
current-context: c
""")
    return str(path)


@pytest.fixture
def bridge_cluster(cluster):
    pytest.importorskip("kubernetes")
    servers = []

    def make(denied=()):
        server = ReviewServer(denied)
        servers.append(server)
        kc = kubeconfig(cluster.root / "kubeconfig", server.url)
        cluster.write_config(GOOD_CONFIG + f'\n[bridge]\nkubeconfig = "{kc}"\n')
        return server

    yield cluster, make
    for s in servers:
        s.close()


def test_bridge_credentials_with_every_permission_pass(bridge_cluster):
    cluster, make = bridge_cluster
    server = make()
    r = only(cluster.run(), "kube-access")
    assert r.status is validate.Status.PASS, r.line()
    assert ("create", "pods/eviction") in server.seen and ("patch", "nodes/status") in server.seen
    # exactly the ClusterRole `render` writes: nothing the bridge does not use (no watch, no get pods)
    assert sorted(server.seen) == sorted([("get", "nodes"), ("list", "nodes"), ("patch", "nodes"),
                                          ("patch", "nodes/status"), ("list", "pods"), ("create", "pods/eviction"),
                                          ("create", "events"), ("get", "leases"), ("create", "leases"),
                                          ("update", "leases")])


def test_bridge_missing_eviction_permission_fails_naming_the_rbac_rule(bridge_cluster):
    cluster, make = bridge_cluster
    make(denied={("create", "pods/eviction"), ("patch", "nodes/status")})
    results = by_check(cluster.run(), "kube-access")
    assert {r.status for r in results} == {validate.Status.FAIL}
    lines = [r.line() for r in results]
    assert any("not allowed to create pods/eviction: no RBAC rule" in line and
               'resources: ["pods/eviction"], verbs: ["create"]' in line for line in lines), lines
    assert any("not allowed to patch nodes/status" in line for line in lines)


def test_bridge_api_server_unreachable_fails(cluster):
    pytest.importorskip("kubernetes")
    kc = kubeconfig(cluster.root / "kubeconfig", "http://127.0.0.1:9")
    cluster.write_config(GOOD_CONFIG + f'\n[bridge]\nkubeconfig = "{kc}"\n')
    r = only(cluster.run(), "kube-access")
    assert r.status is validate.Status.FAIL and "cannot reach the API server" in r.message


def test_bridge_kubeconfig_that_is_missing_fails_naming_it(cluster):
    pytest.importorskip("kubernetes")
    cluster.write_config(GOOD_CONFIG + '\n[bridge]\nkubeconfig = "/nonexistent/kc"\n')
    r = only(cluster.run(), "kube-access")
    assert r.status is validate.Status.FAIL
    assert "cannot load Kubernetes credentials: kubeconfig /nonexistent/kc not found" in r.message


def test_bridge_section_typo_fails_naming_file_line_and_key(cluster):
    pytest.importorskip("slurm_hooks.bridge.settings")
    cluster.write_config(GOOD_CONFIG + '\n[bridge]\nkubconfig = "/etc/kube.conf"\n')
    line = cluster.root.joinpath("etc", "config.toml").read_text().splitlines().index('kubconfig = "/etc/kube.conf"') + 1
    r = only(cluster.run(), "bridge-config")
    assert r.status is validate.Status.FAIL
    assert r.where == f"{cluster.config}:{line}" and "kubconfig" in r.message


def test_bridge_without_kubernetes_client_warns(cluster):
    cluster.write_config(GOOD_CONFIG + '\n[bridge]\nkubeconfig = "/nonexistent"\n')
    code = ("import sys; sys.modules['kubernetes'] = None\n"  # as on a node without the [k8s] extra
            "from slurm_hooks.cli import main\n"
            f"main(['validate', '--json', '--config', {cluster.config!r}, '--slurm-conf', {cluster.slurm_conf!r},"
            " '--node', 'n1'])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    kube = [d for d in json.loads(proc.stdout) if d["check"] == "kube-access"]
    assert kube == [{"check": "kube-access", "status": "WARN",
                     "message": "kubernetes client not installed (bridge environment only)",
                     "fix": "run validate where the bridge runs, or pip install 'slurm-hooks[k8s]'", "where": ""}]


def test_validate_does_not_import_kubernetes_without_a_bridge_section(cluster):
    code = ("import sys\nfrom slurm_hooks import preflight as validate\n"
            f"validate.run({cluster.config!r}, {cluster.slurm_conf!r}, 'n1')\n"
            "assert 'kubernetes' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --- HA controllers -----------------------------------------------------------------------


def test_a_backup_controller_needs_a_timeout_that_outlasts_the_failover(cluster):
    cluster.edit_slurm_conf("SlurmctldHost=localhost\n", "SlurmctldHost=ctl1\nSlurmctldHost=ctl2(10.0.0.2)\n")
    cluster.edit_slurm_conf("MessageTimeout=5", "MessageTimeout=10")
    r = only(cluster.run(), "controller-failover")
    assert r.status is validate.Status.WARN
    # scontrol tries ctl1 (host down: up to TCPTimeout to connect), then ctl2 (up to MessageTimeout to answer).
    assert "2 controllers" in r.message and "MessageTimeout 10 s + 1 x TCPTimeout 2 s = 12 s" in r.message
    assert r.where == f"{cluster.slurm_conf}:{cluster.line_of('SlurmctldHost')}"
    assert r.fix.startswith("timeout = 14 in [slurm]")


def test_a_timeout_that_outlasts_the_failover_passes(cluster):
    cluster.edit_slurm_conf("SlurmctldHost=localhost\n", "SlurmctldHost=ctl1\nSlurmctldHost=ctl2\nTCPTimeout=1\n")
    cluster.write_config(GOOD_CONFIG.replace("timeout = 5", "timeout = 6"))
    r = only(cluster.run(), "controller-failover")
    assert r.status is validate.Status.PASS and "2 controllers" in r.message and "= 6 s" in r.message


def test_the_older_control_machine_and_backup_controller_keys_count_too(cluster):
    cluster.edit_slurm_conf("SlurmctldHost=localhost\n", "ControlMachine=ctl1\nBackupController=ctl2\n")
    r = only(cluster.run(), "controller-failover")
    assert r.status is validate.Status.WARN and "2 controllers" in r.message


def test_one_controller_slower_than_our_timeout_warns(cluster):
    cluster.edit_slurm_conf("MessageTimeout=5\n", "")  # Slurm's default: 10 s
    r = only(cluster.run(), "controller-failover")
    assert r.status is validate.Status.WARN and "one controller" in r.message and r.fix.startswith("timeout = 12")


def test_validate_reports_how_slurms_gpu_numbers_map_to_nvmls(cluster, capsys):
    (cluster.root / "etc" / "gres.conf").write_text("NodeName=n[1-2] Name=gpu File=/dev/nvidia[4-7],/dev/nvidia[0-3]\n")
    cluster.slurmd_answers([4, 5, 6, 7, 0, 1, 2, 3])
    with pytest.raises(SystemExit) as exc:
        main(["validate", "--config", cluster.config, "--slurm-conf", cluster.slurm_conf, "--node", "n1"])
    out = [line for line in capsys.readouterr().out.splitlines() if " gpu-map: " in line]
    assert exc.value.code == 0
    assert f"gres.conf {cluster.root}/etc/gres.conf: 8 GRES index(es), 8 numbered differently" in out[0]
    assert out[1].startswith("PASS  gpu-map: GRES 0 -> /dev/nvidia4 (minor 4) -> GPU 4 GPU-")
    if os.geteuid() == 0:  # validate asks slurmd -G only as root
        assert out[-1] == "PASS  gpu-map: slurmd -G agrees", out


def test_validate_warns_when_the_gpu_map_is_unknown_and_says_what_follows(cluster, capsys):
    (cluster.root / "etc" / "gres.conf").write_text("NodeName=n[1-2] Name=gpu File=/dev/nvidia[0-3]\n")
    with pytest.raises(SystemExit):
        main(["validate", "--config", cluster.config, "--slurm-conf", cluster.slurm_conf, "--node", "n1"])
    [line] = [x for x in capsys.readouterr().out.splitlines() if " gpu-map: " in x]
    assert line.startswith("WARN  gpu-map: ") and "Slurm gives this node 4 GPU(s), the probe sees 8" in line
    assert "requeues every GPU job on this node" in line


def test_validate_fails_when_gres_conf_and_slurmd_disagree(cluster, capsys):
    # slurmd -G as captured on the testbed with gres.conf in reverse order, against a gres.conf in order.
    from paths import FIXTURES

    captured = os.path.join(FIXTURES, "slurm", "slurmd-G-22.05-gres-reverse.txt")
    cluster.script("bin/slurmd", f"#!/bin/sh\ncat {captured}\n")  # the [gpu] slurmd of the config
    results = [r for r in cluster.run() if r.check == "gpu-map"]
    assert results == []  # preflight.run alone knows nothing of the map: the command adds it
    with pytest.raises(SystemExit) as exc:
        main(["validate", "--config", cluster.config, "--slurm-conf", cluster.slurm_conf, "--node", "n1"])
    out = capsys.readouterr().out
    assert exc.value.code == 1
    assert "FAIL  gpu-map: " in out and "disagree: GRES 0: /dev/nvidia0 vs " in out


def test_a_repair_ladder_that_validates_without_dcgmi_warns_that_nodes_will_wait_unverified(cluster):
    os.unlink(cluster.root / "bin" / "dcgmi")
    warn = only(cluster.run(), "repair-validation")
    assert warn.status.name == "WARN" and "[unverified]" in warn.message and "dcgm_level = 0" in warn.fix
    cluster.write_config(GOOD_CONFIG + "[repair]\ndcgm_level = 0\n")
    assert not [r for r in cluster.run() if r.check == "repair-validation"]


def test_validate_passes_on_the_projects_own_testbed(hooked_testbed, capsys):
    testbed = hooked_testbed
    # The testbed's real slurmd -G (22.05) prints its one File= list of 8 as one Count=8 record: that was
    # GRES 0,2,...,14 and a gpu-map FAIL against gres.conf.
    with pytest.raises(SystemExit) as exc:
        main(["validate", "--config", testbed.config_path, "--slurm-conf", testbed.slurm_conf, "--node", "n1"])
    out = capsys.readouterr().out
    assert exc.value.code == 0, out
    assert "PASS  gpu-map: slurmd -G agrees" in out.splitlines(), out


def test_slurmd_that_prints_no_gpu_list_leaves_the_map_uncompared_not_zero_gpus(cluster, capsys):
    cluster.script("bin/slurmd", "#!/bin/sh\nexit 0\n")  # Slurm 24.11.x: `slurmd -G` prints nothing
    with pytest.raises(SystemExit) as exc:
        main(["validate", "--config", cluster.config, "--slurm-conf", cluster.slurm_conf, "--node", "n1"])
    out = [line for line in capsys.readouterr().out.splitlines() if " gpu-map: " in line]
    assert exc.value.code == 0, out
    if os.geteuid() == 0:
        assert out[-1].startswith("PASS  gpu-map: slurmd -G not compared: slurmd -G printed no GPU list"), out


@pytest.mark.parametrize("script, said", [
    ("cat {fixtures}/slurm/slurmd-G-22.05-cores-mismatch.txt\n", "printed only GPUs it ignores or rejects"),
    ("echo 'slurmd: fatal: Unable to determine this slurmd NodeName' >&2\nexit 1\n", "failed"),
])
@pytest.mark.skipif(os.geteuid() != 0, reason="validate asks slurmd -G only as root")
def test_slurmd_that_rejects_every_gpu_or_fails_is_a_warning_not_a_pass(cluster, capsys, script, said):
    # Only 24.11's empty answer is a known gap (PASS, "not compared"); a slurmd that ignores every GPU (a Cores=
    # mismatch) or cannot start at all was "PASS  gpu-map: slurmd -G not compared: ...".
    from paths import FIXTURES

    cluster.script("bin/slurmd", "#!/bin/sh\n" + script.format(fixtures=FIXTURES))
    with pytest.raises(SystemExit):
        main(["validate", "--config", cluster.config, "--slurm-conf", cluster.slurm_conf, "--node", "n1"])
    out = [line for line in capsys.readouterr().out.splitlines() if " gpu-map: " in line]
    assert out[-1].startswith("WARN  gpu-map: ") and "slurmd -G not compared: " in out[-1] and said in out[-1], out


def test_a_hysteresis_memory_that_cannot_be_kept_is_a_warning_naming_it(cluster):
    """[hysteresis] on, and its memory where the state disk left a directory: every run would
    judge alone; validate says so (a warning: the node still works), and names the file."""
    cluster.write_config(GOOD_CONFIG + '[hysteresis]\nconfirm = "2/3"\n')
    assert only(cluster.run(), "hysteresis-memory").status is validate.Status.PASS
    (cluster.root / "state").mkdir(exist_ok=True)
    (cluster.root / "state" / "hysteresis-n1.json").mkdir()
    r = only(cluster.run(), "hysteresis-memory")
    assert r.status is validate.Status.WARN
    assert r.message.startswith("cannot remember readings: ") and "hysteresis-n1.json" in r.message


def test_hysteresis_off_needs_no_memory(cluster):
    assert not [r for r in cluster.run() if r.check == "hysteresis-memory"]


def test_a_kernel_log_the_probe_cannot_read_is_a_warning_in_validate(cluster, tmp_path):
    from fakes import FakeNvml

    from slurm_hooks import config
    from slurm_hooks.preflight.environment import gpu_results
    from slurm_hooks.probes.nvml import NvmlProbe

    log = tmp_path / "kmsg"
    log.mkdir()  # read() says EISDIR: the records cannot be read
    snap = NvmlProbe("n1", kmsg_path=str(log), nvml=FakeNvml.healthy(gpus=8)).snapshot()
    results = gpu_results(config.load(cluster.config), "n1", snap)
    r = only(results, "kernel-log")
    assert r.status is validate.Status.WARN and \
        r.message.startswith("kernel log unreadable: the GPU driver's events not seen")
    assert only(results, "gpu-backend").status is validate.Status.PASS


def test_validate_on_an_amd_node_without_amdsmi_says_the_ras_files_are_the_source(cluster, tmp_path):
    from fakes.amdgpu_sysfs import add_card

    from slurm_hooks import config
    from slurm_hooks.preflight.environment import gpu_results
    from slurm_hooks.probes.amdsmi import AmdSmiProbe

    sys_root = tmp_path / "sys"
    for card in range(2):
        add_card(sys_root, card, f"0000:{0x0c + 0x10 * card:02x}:00.0")
    cluster.write_config(GOOD_CONFIG.replace('backend = "sim"', 'backend = "auto"'))
    snap = AmdSmiProbe("n1", drm_root=str(sys_root / "class" / "drm")).snapshot()  # no amdsmi in the test venv
    results = gpu_results(config.load(cluster.config), "n1", snap)
    assert only(results, "gpu-backend").message == "auto (amdgpu-sysfs): 2 GPU(s): 2 x AMD Instinct MI300X"
    r = only(results, "gpu-source")
    assert r.status is validate.Status.WARN
    assert r.message.startswith("amdsmi not loadable (") and "read from the driver's RAS files" in r.message
    assert "amd-smi-lib" in r.fix


def test_validate_says_what_it_sees_on_an_amd_node_partitioned_or_not(cluster, tmp_path):
    """The models, and the boards a partitioned GPU's parts share: an admin sees CPX mode at a glance."""
    from slurm_hooks import config
    from slurm_hooks.preflight.environment import gpu_results

    sim_dir = str(tmp_path / "amd")
    sim.init(sim_dir, "n9", 8, vendor="amd", partition="cpx")
    sim.init(sim_dir, "n8", 8, vendor="amd")
    cfg = config.load(cluster.config)
    cpx = only(gpu_results(cfg, "n9", sim.SimProbe(sim_dir, "n9").snapshot()), "gpu-backend")
    spx = only(gpu_results(cfg, "n8", sim.SimProbe(sim_dir, "n8").snapshot()), "gpu-backend")
    assert cpx.message.startswith("sim: 64 GPU(s): 64 x AMD Instinct MI300X on 8 boards (8 parts each), driver ")
    assert spx.message.startswith("sim: 8 GPU(s): 8 x AMD Instinct MI300X, driver ")
    assert "NVIDIA" not in cpx.message + spx.message
