"""What a test job's output says to ``isolate``: its rank count against nodes x GPUs, then its bus
bandwidth; anything else could not run (no evidence for or against its nodes). And the step that
asks for every GPU of each node, one rank per GPU, through Slurm's MPI plugin."""

from __future__ import annotations

import os

from slurm_hooks.hooks.isolate import ended_why, gres_gpus, judge_output, step_argv

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "nccl_tests")


def captured(name: str) -> str:
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as fh:
        return fh.read()


def test_all_reduce_perf_listing_every_rank_of_the_job_gives_its_average_bus_bandwidth():
    out = judge_output(captured("all_reduce_perf_1node_8gpu.txt"), ranks=8)
    assert (out.ran, out.completed, out.bandwidth) == (True, True, 68.6248)


def test_all_reduce_perf_run_as_one_node_tests_is_could_not_run_never_a_pass():
    """Two nodes x 8 GPUs, but nccl-tests without MPI: each node ran alone and listed its own 8 ranks."""
    one = captured("all_reduce_perf_1node_8gpu.txt")
    out = judge_output(one + one, ranks=16)
    assert not out.ran and out.bandwidth is None and "8 rank(s) listed 16 time(s), expected 16" in out.detail
    assert not judge_output(one, ranks=16).ran


def test_mpirun_prefixed_output_is_read_too():
    text = "".join(f"[1,0]<stdout>:#  Rank  {r} Group  0 Pid 29947{r} on lab device  {r} [0000:02:00] NVIDIA\n"
                   for r in range(2)) + "[1,0]<stdout>:# Avg bus bandwidth    : 1.57614 \n"
    out = judge_output(text, ranks=2)
    assert (out.ran, out.bandwidth) == (True, 1.57614)


def test_the_built_in_test_says_its_ranks_and_a_wrong_count_or_no_figure_could_not_run():
    line = "collective: ok ranks=16 backend=tcp-ring@127.1.3.1 size=1048576 iters=8 median_ms=9.1 busbw=0.2101 GB/s\n"
    assert judge_output(line, ranks=16).bandwidth == 0.2101
    assert judge_output(line, ranks=32).detail == "could not run: ranks=16, expected 32"
    assert not judge_output("collective: ok ranks=16\n", ranks=16).ran
    assert not judge_output("hello\n", ranks=2).ran


def test_a_nodes_gpus_come_from_its_gres():
    assert gres_gpus("gpu:8") == 8
    assert gres_gpus("gpu:h100:4(S:0-1),shard:16") == 4
    assert gres_gpus("gpu:a100:2,gpu:t4:1") == 3
    assert gres_gpus("") == 0 and gres_gpus("(null)") == 0


def test_the_step_asks_for_every_gpu_one_rank_each_with_nvlink_and_shm_off():
    step = step_argv(["/usr/bin/all_reduce_perf", "-g", "1"], 8, "pmix")
    assert step[:6] == ["srun", "--kill-on-bad-exit=1", "--ntasks-per-node=8", "--gres=gpu:8", "--gpus-per-task=1",
                        "--mpi=pmix"]
    assert step[6] == "--export=ALL,NCCL_P2P_DISABLE=1,NCCL_SHM_DISABLE=1"
    built_in = step_argv(["/usr/bin/python3", "collective.py"], 0, "pmix")
    assert built_in[:3] == ["srun", "--kill-on-bad-exit=1", "--ntasks-per-node=1"]
    assert not any(a.startswith(("--gres", "--mpi")) for a in built_in)


def test_the_step_lays_ranks_out_in_the_groups_order_not_slurms():
    """Slurm numbers tasks in its node order (n2 before n4); the group (n4, n2) means n4 is rank 0."""
    step = step_argv(["/usr/bin/all_reduce_perf"], 2, "pmix", ("n4", "n2"))
    assert step[:5] == ["srun", "--kill-on-bad-exit=1", "--ntasks=4", "--distribution=arbitrary",
                        "--nodelist=n4,n4,n2,n2"]
    assert "--gres=gpu:2" in step and "--gpus-per-task=1" in step and not any("per-node" in a for a in step)
    assert step_argv(["/usr/bin/python3", "collective.py"], 0, "", ("n9", "n1"))[2:5] == [
        "--ntasks=2", "--distribution=arbitrary", "--nodelist=n9,n1"]


def test_a_failed_jobs_why_is_its_ranks_last_words_not_the_launchers():
    """Captured from the testbed: rank 0 gave up on its hung peer, srun ended the step, and n2's
    slurmstepd wrote the last line."""
    text = ("collective: failed on n3 rank=0: RuntimeError: Wait timeout\n"
            "srun: error: n3: task 0: Exited with exit code 1\n"
            "srun: launch/slurm: _step_signal: Terminating StepId=50.0\n"
            "slurmstepd-n2: error: *** STEP 50.0 ON n2 CANCELLED AT 2026-12-06T11:39:28 ***\n"
            "srun: error: n2: task 1: Terminated\n"
            "srun: Force Terminated StepId=50.0\n")
    assert ended_why("FAILED", text) == "ended FAILED: collective: failed on n3 rank=0: RuntimeError: Wait timeout"
    assert ended_why("FAILED", "srun: error: n3: task 0: Exited with exit code 1\n") == "ended FAILED"
    assert ended_why("NODE_FAIL", "NCCL WARN Net : Connection closed by remote peer\n") == (
        "ended NODE_FAIL: NCCL WARN Net : Connection closed by remote peer")
