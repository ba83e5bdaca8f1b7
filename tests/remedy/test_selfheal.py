"""The epilog reads the job's exit status as Slurm gives it; a fault finds the job's processes on the node
by what their environments say, as the kernel shows them under /proc."""

from __future__ import annotations

from slurm_hooks.remedy.checkpoint import environment_value
from slurm_hooks.remedy.selfheal import exit_status, job_processes, ranks


def test_the_exit_code_comes_from_exit_code2_else_from_the_wait_status():
    assert exit_status({"SLURM_JOB_EXIT_CODE2": "16:0", "SLURM_JOB_EXIT_CODE": "4096"}) == (16, 0)
    assert exit_status({"SLURM_JOB_EXIT_CODE": str(93 << 8)}) == (93, 0)
    assert exit_status({"SLURM_JOB_EXIT_CODE": "15"}) == (0, 15)  # killed by SIGTERM: no exit code
    assert exit_status({}) is None


def proc_tree(tmp_path, monkeypatch, *procs):
    """A /proc of ``procs``: (pid, environment, command line), each as the kernel writes it (NUL-separated)."""
    monkeypatch.delenv("SLURM_CONF", raising=False)
    for pid, env, cmd in procs:
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
        (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in cmd) + b"\0")
    (tmp_path / "self").mkdir()  # not a pid
    return str(tmp_path)


def test_the_jobs_processes_on_this_node_are_told_by_their_job_id_and_node(tmp_path, monkeypatch):
    job = {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "n1", "SBATCH_SIGNAL": "B:USR1@60"}
    proc = proc_tree(tmp_path, monkeypatch,
                     (100, job, ["/bin/sh", "job.sh"]),
                     (101, {**job, "SLURM_STEP_ID": "0"}, ["torchrun", "--nnodes=1:2", "train.py"]),
                     (102, {**job, "SLURMD_NODENAME": "n2", "SLURM_STEP_ID": "0"}, ["other", "node"]),
                     (103, {"SLURM_JOB_ID": "421", "SLURMD_NODENAME": "n1", "SLURM_STEP_ID": "0"}, ["other", "job"]))
    found = sorted(job_processes(42, "n1", proc), key=lambda p: p.pid)
    assert [(p.pid, p.step, p.cmdline) for p in found] == [(100, "", "/bin/sh job.sh"),
                                                           (101, "0", "torchrun --nnodes=1:2 train.py")]
    assert [p.pid for p in ranks(found)] == [101]
    assert environment_value(42, "SBATCH_SIGNAL", "n1", proc) == "B:USR1@60"
    assert environment_value(421, "SBATCH_SIGNAL", "n1", proc) is None  # that job's process does not have it
    assert environment_value(42, "SBATCH_SIGNAL", "n3", proc) is None  # none of the job's runs on n3
    assert job_processes(7, "n1", proc) == [] and job_processes(42, "n1", str(tmp_path / "none")) == []
