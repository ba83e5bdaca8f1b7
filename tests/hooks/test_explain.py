"""``check --explain`` as an admin runs it on day one: a healthy node says so in one line."""

from __future__ import annotations

import os
import subprocess
import sys

from fakes.config import write_sim_config


def sim(conf, *args):
    r = subprocess.run([sys.executable, "-m", "slurm_hooks", "sim", *args, "--config", str(conf)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def explain(conf, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_HOOKS_CONFIG", "SLURMD_NODENAME")}
    return subprocess.run([sys.executable, "-m", "slurm_hooks", "check", "--explain", "--config", str(conf),
                           "--node", "n1", *args], capture_output=True, text=True, env=env, timeout=60)


def with_slurm(tmp_path, **tools: str):
    """A sim config whose Slurm is these scripts (``scontrol=...``, ``squeue=...``) in its own bin_dir."""
    bin_dir = tmp_path / "slurm-bin"
    bin_dir.mkdir()
    for name, script in tools.items():
        (bin_dir / name).write_text(script)
        (bin_dir / name).chmod(0o755)
    return write_sim_config(tmp_path, f"[expect]\ngpus = 8\n[slurm]\nbackend = \"scontrol\"\nbin_dir = \"{bin_dir}\"")


#: ``scontrol`` as 22.05 answers for an idle node in service (the only Slurm call of a healthy explain).
SCONTROL = """#!/bin/sh
case "$*" in
  --version) echo "slurm 22.05.8" ;;
  *"show node"*) echo "NodeName=n1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=8 Gres=gpu:8 State=IDLE Partitions=gpu" ;;
  *) exit 1 ;;
esac
"""


def test_a_healthy_node_explained_is_one_line_naming_its_gpus_and_no_findings(tmp_path):
    conf = with_slurm(tmp_path, scontrol=SCONTROL)
    sim(conf, "init", "--node", "n1", "--gpus", "8")
    r = explain(conf)
    assert (r.returncode, r.stdout, r.stderr) == (0, "n1: 8 GPUs, 0 findings\n", "")


def test_a_faulty_node_explained_lists_its_findings_without_the_healthy_line(tmp_path):
    conf = write_sim_config(tmp_path, "[expect]\ngpus = 8")
    sim(conf, "init", "--node", "n1", "--gpus", "8")
    sim(conf, "inject", "--node", "n1", "--gpu", "3", "--xid", "79")
    r = explain(conf)
    assert r.returncode == 1 and "gpu3 xid: XID 79" in r.stdout and "0 findings" not in r.stdout, r.stdout


#: ``scontrol`` as 22.05 answers for n1 drained by us [replace] (and nothing else: an explain only reads).
SCONTROL_REPLACE = """#!/bin/sh
case "$*" in
  --version) echo "slurm 22.05.8" ;;
  *"show node"*) echo "NodeName=n1 Arch=x86_64 CPUAlloc=0 CPUTot=8 Gres=gpu:8 State=IDLE+DRAIN Partitions=gpu Reason=slurm-hooks: XID 79 on GPU 3 [replace] [root@2026-11-29T21:27:07]" ;;
  *) exit 1 ;;
esac
"""


def test_a_node_held_for_replacement_explained_says_it_waits_for_a_person_not_that_it_drains_again(tmp_path):
    conf = with_slurm(tmp_path, scontrol=SCONTROL_REPLACE, squeue="#!/bin/sh\nexit 0\n")  # no job on it
    sim(conf, "init", "--node", "n1", "--gpus", "8")
    sim(conf, "inject", "--node", "n1", "--gpu", "3", "--xid", "79")
    r = explain(conf, "--dry-run")
    [line] = [x for x in r.stdout.splitlines() if x.startswith("gpu3 xid")]
    assert line.endswith("its rule says reboot -> nothing more: the node is held [replace], waiting for a person to "
                         "replace the GPU"), line
    assert "drain now" not in r.stdout
