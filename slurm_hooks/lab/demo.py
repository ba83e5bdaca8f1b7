"""The whole story on a local cluster: a training job, XID 79 under it, the recovery.

Brings up the testbed (2 nodes, 8 simulated GPUs each, slurm-hooks wired in as
HealthCheckProgram, Prolog and Epilog), starts the XID watcher on each node,
submits a checkpointing training job, injects XID 79 on the job's GPU, and
reports each milestone live as Slurm shows it: drained, requeued, running
again on the healthy node, resumed from its checkpoint. Then, with the job gone
from it, the repair ladder takes the drained node back by itself (XID 79 starts at
the reboot: ``scontrol reboot`` through the testbed's RebootProgram, a check on the
new boot, resumed). Ends with the audit log's timeline and the durations beside
published field numbers.

Where ``/usr/bin/python3`` has PyTorch (Debian's ``python3-torch``), the demo is the talk's
instead: a real PyTorch DDP job (:mod:`slurm_hooks.lab.ddp_train`) launched by ``sbatch -N2`` on
a 3-node testbed, XID 79 on the GPU it holds on one node, and the job requeued once, running on
the two healthy nodes, resumed from the checkpoint rank 0 wrote on SIGTERM, the bad node drained.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from slurm_hooks import REASON_PREFIX
from slurm_hooks.errors import SlurmHooksError
from slurm_hooks.lab import ddp_train
from slurm_hooks.lab.testbed import LabSettings, Testbed
from slurm_hooks.observe import events, incidents, timeline
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.probes import sim
from slurm_hooks.runner import Spawned, run_command, spawn_detached
from slurm_hooks.slurm import JobInfo, JobState, hostlist

Say = Callable[[str], None]

#: Crusoe AutoClusters, as presented: node replaced in ~5 min, downtime under 15 min.
FIELD_NUMBERS = {"node replaced": 300.0, "total downtime": 900.0}

#: Slurm's HealthCheckInterval on the demo's cluster: the check on the new boot that puts the
#: rebooted node back in service runs at most this long after the reboot.
HEALTH_CHECK_INTERVAL = 5

_GPUS = re.compile(r"GPUs (\S+)")
_RESUMED = re.compile(r"resumed from step (\d+) \(restart (\d+)\) on (\S+)")
_SAVED = re.compile(r"^signal (\S+): saved step (\d+)")
#: The demo job's own checkpoint signal (PyTorch Lightning's contract: it saves on it and
#: requeues itself); slurm-hooks sends it first on a fault.
JOB_SIGNAL = "USR1"
_STEP = re.compile(r"^step (\d+)")


class DemoError(SlurmHooksError):
    pass


@dataclass
class Milestones:
    injected: float = 0.0
    times: dict[str, float] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)

    def mark(self, name: str, detail: str = "", at: float | None = None) -> bool:
        """Record ``name`` as seen at ``at`` (``time.time()``; now by default), once."""
        if name in self.times:
            return False
        self.times[name] = (time.time() if at is None else at) - self.injected
        self.details[name] = detail
        return True


def find_train_script() -> str:
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(here, "examples", "train.py")
    if not os.path.exists(path):
        raise DemoError(f"examples/train.py not found next to the package ({path}): run the demo from a checkout")
    return path


def run(state_dir: str, keep: bool = False, say: Say = print, steps_before_fault: int = 8,
        timeout: float = 120.0, ddp: bool | None = None) -> Milestones:
    """The demo; ``ddp``: the PyTorch DDP job on two nodes (True), the one-node job (False), or the
    DDP job where ``/usr/bin/python3`` has torch (None)."""
    if ddp is None:
        why = ddp_train.torch_missing()
        if why:
            say(f"(no PyTorch for {ddp_train.TORCH_PYTHON}: the one-node training job instead; for the talk's "
                "demo, a PyTorch DDP job across two nodes: apt-get install python3-torch)")
        ddp = not why
    if ddp:
        return run_ddp(state_dir, keep=keep, say=say, steps_before_fault=max(steps_before_fault, 20),
                       timeout=timeout)
    tb = Testbed(state_dir, LabSettings(nodes=2, kill_wait=10, requeue_grace=10.0, health_check_interval=HEALTH_CHECK_INTERVAL,
                                     repair=True),
                 progress=lambda m: say(f"  {m}"))
    say("== 1. a local Slurm cluster with 2 nodes x 8 simulated H100s, slurm-hooks wired in")
    tb.up()
    # A clean cluster each run: healthy GPUs, no jobs, and no hook state left from an earlier run
    # (the ladder would count an earlier run's reboot as the fault coming back, and replace).
    tb.reset()
    watchers = _start_watchers(tb, say)
    job_id = None
    try:
        say(f"== 2. a training job that checkpoints every 5 steps, and on SIG{JOB_SIGNAL} saves and requeues "
            f"itself (#SBATCH --signal={JOB_SIGNAL}@90, as PyTorch Lightning does)")
        work = tb.path("demo")
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work, mode=0o755)
        out = os.path.join(work, "train.out")
        job_id = _submit(tb, work, out)
        say(f"  submitted job {job_id}; output {out}")
        node, gpu = _wait_running(tb, job_id, out, steps_before_fault, timeout, say)
        ms = Milestones()
        _inject_xid79(tb, node, gpu, ms, say, "the running job")
        repair = _RepairWatch(tb, node, ms, say)
        _follow(tb, job_id, node, out, ms, timeout, say, also=repair.poll)
        say(f"== 4. the job has moved on: the repair ladder takes {node} back by itself (XID 79: reboot)")
        repair.follow(timeout)
        _tell_incident(tb, node, ms, say, "== 5.")
        _summary(ms, say)
        return ms
    finally:
        _wind_down(tb, watchers, job_id, keep, say)


def _inject_xid79(tb: Testbed, node: str, gpu: int, ms: Milestones, say: Say, under: str) -> None:
    """The fault, on the demo's clock (``ms.injected``: its zero)."""
    say(f"== 3. XID 79 (GPU has fallen off the bus) on {node} GPU {gpu}, under {under}")
    ms.injected = time.time()
    sim.inject(tb.sim_dir, node, gpu, xid=79)


def _tell_incident(tb: Testbed, node: str, ms: Milestones, say: Say, heading: str) -> None:
    """The incident since the fault, as ``slurm-hooks events`` shows it from the audit log."""
    say(f"{heading} the incident, as the audit log tells it (slurm-hooks events)")
    records = events.select(AuditLog(tb.audit_log).read(), node=node, since=ms.injected - 1)
    for line in timeline.render(timeline.by_incident(incidents.build(records), records)):
        say(f"  {line}")


def _wind_down(tb: Testbed, watchers: list[Spawned], job_id: int | None, keep: bool, say: Say) -> None:
    """Stop the watchers; the cluster goes down (with the job) unless ``keep``."""
    for watcher in watchers:
        if watcher.proc is not None:
            watcher.proc.terminate()
    for watcher in watchers:
        watcher.stop(5)
    if keep:
        say(f"cluster left up (--keep): SLURM_CONF={tb.slurm_conf} SLURM_HOOKS_CONFIG={tb.config_path}; "
            "`slurm-hooks testbed down` stops it")
    else:
        if job_id is not None:
            run_command(["/usr/bin/scancel", str(job_id)], 10, env=tb.env(), check=False)
        tb.down()


def _start_watchers(tb: Testbed, say: Say) -> list[Spawned]:
    procs = []
    for node in tb.node_names:
        spawned = spawn_detached([sys.executable, "-m", "slurm_hooks", "watch", "--node", node], env=tb.env(),
                                 cwd=None, output=tb.path("log", f"watch-{node}.log"))
        if not spawned.started:
            for started in procs:
                started.stop()
            raise DemoError(f"XID watcher for {node}: {spawned.error}")
        procs.append(spawned)
    say(f"  XID watcher running on {', '.join(tb.node_names)}")
    return procs


def _submit(tb: Testbed, work: str, out: str) -> int:
    script = os.path.join(work, "train.sh")
    with open(script, "w", encoding="utf-8") as fh:
        fh.write("#!/bin/sh\n"
                 f"#SBATCH --signal={JOB_SIGNAL}@90\n"
                 'echo "job $SLURM_JOB_ID restart ${SLURM_RESTART_COUNT:-0} on $SLURMD_NODENAME '
                 'GPUs ${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-none}}"\n'
                 f"exec srun --unbuffered {sys.executable} {find_train_script()} --steps 100000 --every 5 "
                 f"--step-time 0.2 --ckpt-dir {os.path.join(work, 'ckpt')} --checkpoint-signal {JOB_SIGNAL} "
                 "--requeue-self\n")
    os.chmod(script, 0o755)
    argv = ["/usr/bin/sbatch", "--parsable", "--job-name=train-demo", "--gres=gpu:1", "--requeue",
            "--open-mode=append", f"--output={out}", f"--chdir={work}", script]
    res = run_command(argv, 30, env=tb.env())
    return int(res.stdout.strip().split(";")[0])


def _tail(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().splitlines()
    except FileNotFoundError:
        return []


def _wait_running(tb: Testbed, job_id: int, out: str, steps: int, timeout: float, say: Say) -> tuple[str, int]:
    slurm = tb.slurm()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = slurm.job(job_id)
        lines = _tail(out)
        step_lines = [ln for ln in lines if _STEP.match(ln)]
        if job.running and len(step_lines) >= steps:
            m = next((_GPUS.search(ln) for ln in lines if _GPUS.search(ln)), None)
            gpu = int(m.group(1).split(",")[0]) if m and m.group(1)[:1].isdigit() else 0
            say(f"  job {job_id} RUNNING on {job.nodes}, GPU {gpu}, at {step_lines[-1]}")
            return job.nodes, gpu
        time.sleep(0.2)
    raise DemoError(f"job {job_id} did not reach {steps} steps within {timeout:g}s (see {out})")


def _follow(tb: Testbed, job_id: int, bad: str, out: str, ms: Milestones, timeout: float, say: Say,
            also: Callable[[float], object] | None = None) -> None:
    """Follow the job's recovery; ``also``: one more look in each poll, at that poll's time."""
    last_step = None

    def show(name: str, detail: str, at: float) -> None:
        _show(ms, say, name, detail, at)

    def look(new: list[str], job: JobInfo, now: float) -> bool:
        nonlocal last_step
        _job_moved(ms, say, job_id, job, bad, now)
        for ln in new:
            saved = _SAVED.match(ln)
            if saved:
                name = "job checkpointed" if "requeued itself" in ln else f"job got {saved.group(1)}"
                show(name, ln, now)
            m = _RESUMED.search(ln)
            if m:
                show("resumed from checkpoint", f"step {m.group(1)} (restart {m.group(2)}) on {m.group(3)}", now)
                if last_step is not None and "steps lost" not in ms.details:
                    ms.details["steps lost"] = str(max(0, last_step - int(m.group(1))))
            s = _STEP.match(ln)
            if s:
                last_step = int(s.group(1))
        if also is not None:
            try:
                also(now)
            except DemoError:
                raise
            except SlurmHooksError as exc:
                say(f"  (slurm: {exc})")
        if "resumed from checkpoint" in ms.times and "node drained" in ms.times and last_step is not None \
                and "job running again" in ms.times:
            show("training continues", f"step {last_step}", now)
            return True
        return False

    _poll_recovery(tb, job_id, bad, out, ms, timeout, say, lambda: _tail(out), look)


def _poll_recovery(tb: Testbed, job_id: int, bad: str, out: str, ms: Milestones, timeout: float, say: Say,
                   read: Callable[[], list[str]], look: Callable[[list[str], JobInfo, float], bool]) -> None:
    """Poll until ``look(new, job, now)`` says the training continues (it shows the milestones in the
    output's ``new`` lines and in the job; the node's drain is shown here); DemoError after ``timeout``.

    One poll, read against the order things happen (output, then job, then node), is one instant:
    whatever shows in an earlier read has its causes in the later ones, so every milestone seen in
    this poll gets the same time and their order holds. ``read()``: the output's lines (and anything
    else a demo reads first).
    """
    slurm = tb.slurm()
    deadline = time.monotonic() + timeout
    seen_lines = len(read())
    while time.monotonic() < deadline:
        lines = read()
        try:
            job = slurm.job(job_id)
            node = slurm.node(bad)
        except SlurmHooksError as exc:
            say(f"  (slurm: {exc})")
            time.sleep(0.2)
            continue
        now = time.time()
        if node.drained and node.reason.startswith(REASON_PREFIX):
            _show(ms, say, "node drained", f"{bad}: {node.reason}", now)
        if look(lines[seen_lines:], job, now):
            return
        seen_lines = len(lines)
        time.sleep(0.1)
    missing = [m for m in ("node drained", "job running again", "resumed from checkpoint") if m not in ms.times]
    raise DemoError(f"recovery incomplete after {timeout:g}s: no {', '.join(missing) or 'step after the resume'} "
                    f"(see {out} and {tb.audit_log})")


def _job_moved(ms: Milestones, say: Say, job_id: int, job: JobInfo, bad: str, now: float) -> None:
    """The job requeued (PENDING again), then running again without ``bad``."""
    if job.restarts >= 1 and job.base_state == JobState.PENDING:
        _show(ms, say, "job requeued", f"job {job_id} PENDING ({job.reason or 'requeued'})", now)
    if job.restarts >= 1 and job.running and job.nodes and bad not in hostlist.expand(job.nodes):
        _show(ms, say, "job running again", f"job {job_id} RUNNING on {job.nodes} (restart {job.restarts})", now)


def _show(ms: Milestones, say: Say, name: str, detail: str, at: float) -> None:
    if ms.mark(name, detail, at):
        say(f"  +{ms.times[name]:6.2f}s  {name:<24} {detail}")


class _RepairWatch:
    """The milestones of the repair, on the demo's clock: the ladder's reboot requested (its audit
    record), the node rebooted (the simulated node's boot count), the new boot checked healthy
    (the rung's result), the node back in service (IDLE, no reason). Polled from the first look
    after the fault on (the epilog of the job's last step on the node may climb at once)."""

    def __init__(self, tb: Testbed, bad: str, ms: Milestones, say: Say):
        self.tb, self.bad, self.ms, self.say = tb, bad, ms, say
        self.audit = AuditLog(tb.audit_log)

    def poll(self, now: float | None = None) -> bool:
        """One look; True once the node is back in service. Read against the order things happen
        (node, then the sim's boots, then the audit log), as in _follow: one poll is one instant."""
        node = self.tb.slurm().node(self.bad)
        boots = sim.read(self.tb.sim_dir, self.bad).get("boots", 0)
        reboots = [r for r in self.audit.read() if r.get("node") == self.bad and r.get("action") == "repair-reboot"
                   and float(r.get("ts", 0)) >= self.ms.injected - 1]
        now = time.time() if now is None else now
        ms, say, bad = self.ms, self.say, self.bad
        for rec in reboots:
            if rec.get("result") == "failed":
                raise DemoError(f"the reboot of {bad} failed: {rec.get('detail', '')} (see {self.tb.audit_log})")
            _show(ms, say, "reboot requested", f"{bad}: {rec.get('reason', '')}", now)
        if boots >= 1:
            _show(ms, say, "node rebooted", f"{bad}: boot {boots}", now)
        for rec in reboots:
            if rec.get("result") == "ok":
                _show(ms, say, "checked healthy", f"{bad}: {rec.get('detail', '')}", now)
        if "checked healthy" in ms.times and node.ready:  # 23.11+ may keep the reason
            _show(ms, say, "back in service", f"{bad}: {node.state}", now)
        return "back in service" in ms.times

    def follow(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.poll():
                    return
            except SlurmHooksError as exc:
                if isinstance(exc, DemoError):
                    raise
                self.say(f"  (slurm: {exc})")
            time.sleep(0.2)
        missing = [m for m in ("reboot requested", "node rebooted", "checked healthy", "back in service")
                   if m not in self.ms.times]
        raise DemoError(f"{self.bad} not back in service after {timeout:g}s: no {', '.join(missing)} "
                        f"(see {self.tb.audit_log})")


def _summary(ms: Milestones, say: Say) -> None:
    say("== 6. how long it took")
    for name in ("node drained", "job checkpointed", "job requeued", "job running again", "resumed from checkpoint",
                 "reboot requested", "node rebooted", "back in service"):
        if name in ms.times:
            say(f"  XID -> {name:<24} {ms.times[name]:6.2f} s")
    lost = ms.details.get("steps lost")
    if lost is not None:
        how = "on its own signal" if "job checkpointed" in ms.times else "on SIGTERM"
        say(f"  steps lost: {lost} (it checkpointed {how}: the steps done before the fault and not in the "
            "checkpoint it resumed from)")
    down = ms.times.get("job running again")
    if down is not None:
        say(f"  field numbers (Crusoe AutoClusters): node replaced ~{FIELD_NUMBERS['node replaced'] / 60:.0f} min, "
            f"total downtime < {FIELD_NUMBERS['total downtime'] / 60:.0f} min; here the job lost {down:.1f} s")
    back = ms.times.get("back in service")
    if back is not None:
        say(f"  the node: back in service {back:.1f} s after the fault, by itself (reboot through Slurm, "
            f"checked on the new boot; HealthCheckInterval={HEALTH_CHECK_INTERVAL} s)")


# -- the talk's demo: a PyTorch DDP job across two nodes ---------------------------------------

#: Two nodes for the job, a third to take the bad node's place when it is requeued.
DDP_NODES = 3
#: Seconds per step of the DDP job: rank 0's step log gives the work lost to the step.
DDP_STEP_S = 0.1
#: Searched, not matched at a line's start: two ranks' lines through one srun may share a line.
_START = re.compile(r"start restart=(\d+) step=(\d+) on (\S+) rank=(\d+)")
_GOT = re.compile(r"got (SIG\w+) at step=(\d+) on \S+ rank=\d+")
_DDP_SAVED = re.compile(r"saved step=(\d+) at=")


def run_ddp(state_dir: str, keep: bool = False, say: Say = print, steps_before_fault: int = 20,
            timeout: float = 120.0) -> Milestones:
    """The talk's demo: :mod:`slurm_hooks.lab.ddp_train` by ``sbatch -N2`` on a 3-node testbed,
    XID 79 under its rank 1, and the job requeued once onto the healthy nodes, resumed from its
    checkpoint. ``timeout``: per phase (the start waits at least 120 s: torch's import and gloo's
    rendezvous take seconds per rank on a loaded machine)."""
    settings = LabSettings(nodes=DDP_NODES, kill_wait=15, requeue_grace=20.0, checkpoint_grace=8.0,
                        health_check_interval=HEALTH_CHECK_INTERVAL, own_addresses=True)
    tb = Testbed(state_dir, settings, progress=lambda m: say(f"  {m}"))
    say(f"== 1. a local Slurm cluster with {DDP_NODES} nodes x 8 simulated H100s, slurm-hooks wired in")
    current = tb.status()
    if current.up and len(current.nodes) != DDP_NODES:
        say(f"  the cluster in {state_dir} is up with {len(current.nodes)} nodes: starting it afresh with {DDP_NODES}")
        tb.down()
    tb.up()
    tb.reset()
    watchers = _start_watchers(tb, say)
    job_id = None
    try:
        say("== 2. a PyTorch DDP training job on 2 nodes (sbatch -N2, srun, one rank per node, gloo on CPU); on "
            "SIGTERM the ranks agree on a step, rank 0 checkpoints it, and the job resumes from its newest checkpoint")
        work = tb.path("demo-ddp")
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work, mode=0o755)
        job_id = tb.sbatch(ddp_train.batch_script(work, nodes=2, step_s=DDP_STEP_S), "--job-name=ddp-demo")
        out = os.path.join(tb.jobs_dir, f"{job_id}.out")
        say(f"  submitted job {job_id}; output {out}")
        used = _wait_ddp_running(tb, job_id, work, out, steps_before_fault, max(timeout, 120.0), say)
        bad, good = used[1], used[0]  # the node without the batch step: the job's other half
        gpus = tb.slurm().job_gpus(job_id, bad) or (0,)
        ms = Milestones()
        _inject_xid79(tb, bad, gpus[0], ms, say, "the job's rank 1")
        _follow_ddp(tb, job_id, bad, work, out, ms, max(timeout, 120.0), say)
        _requeued_once(tb, job_id, good, ms, say)
        _tell_incident(tb, bad, ms, say, "== 4.")
        _summary_ddp(ms, say)
        return ms
    finally:
        _wind_down(tb, watchers, job_id, keep, say)


def _complete_lines(path: str) -> list[str]:
    """The file's lines up to its last newline: a line being written is read once it is whole."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except FileNotFoundError:
        return []
    return text[:text.rfind("\n") + 1].splitlines()


def _steps_log(work: str) -> list[tuple[int, float, str]]:
    """Rank 0's ``<step> <unix time> <restart>`` lines."""
    rows = []
    for line in _complete_lines(os.path.join(work, "steps.log")):
        parts = line.split()
        if len(parts) == 3 and parts[0].isdigit():
            rows.append((int(parts[0]), float(parts[1]), parts[2]))
    return rows


def _wait_ddp_running(tb: Testbed, job_id: int, work: str, out: str, steps: int, timeout: float,
                      say: Say) -> list[str]:
    slurm = tb.slurm()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = slurm.job(job_id)
        done = _steps_log(work)
        if job.running and len(done) >= steps:
            ranks = {m.group(4): m.group(3) for ln in _tail(out) for m in _START.finditer(ln)}
            say(f"  job {job_id} RUNNING on {job.nodes}: "
                + ", ".join(f"rank {r} on {n}" for r, n in sorted(ranks.items())) + f", at step {done[-1][0]}")
            return hostlist.expand(job.nodes)
        time.sleep(0.2)
    raise DemoError(f"DDP job {job_id} did not reach {steps} steps within {timeout:g}s (see {out})")


def _follow_ddp(tb: Testbed, job_id: int, bad: str, work: str, out: str, ms: Milestones, timeout: float,
                say: Say) -> None:
    """The DDP job's recovery, milestone by milestone, read as in :func:`_follow` (one poll, one instant)."""
    resumed = None
    done: list[tuple[int, float, str]] = []

    def show(name: str, detail: str, at: float) -> None:
        _show(ms, say, name, detail, at)

    def read() -> list[str]:
        lines = _complete_lines(out)
        done[:] = _steps_log(work)
        return lines

    def look(new: list[str], job: JobInfo, now: float) -> bool:
        nonlocal resumed
        for ln in new:
            got = _GOT.search(ln)
            if got:
                show(f"job got {got.group(1)}", got.group(0), now)
            saved = _DDP_SAVED.search(ln)
            if saved:
                show("job checkpointed", f"rank 0 saved step {saved.group(1)}", now)
            for start in _START.finditer(ln):
                if start.group(1) == "0" or start.group(4) != "0":
                    continue
                resumed = int(start.group(2))
                show("resumed from checkpoint", f"step {resumed} (restart {start.group(1)}) on {start.group(3)}, "
                     "rank 0", now)
                reached = max((s for s, t, r in done if r == "0" and t <= ms.injected), default=0)
                ms.details["steps lost"] = str(max(0, reached - resumed))
        _job_moved(ms, say, job_id, job, bad, now)
        after = [s for s, t, r in done if r != "0"]
        if resumed is not None and after and max(after) > resumed and "node drained" in ms.times \
                and "job running again" in ms.times:
            show("training continues", f"step {max(after)}", now)
            return True
        return False

    _poll_recovery(tb, job_id, bad, out, ms, timeout, say, read, look)


def _requeued_once(tb: Testbed, job_id: int, good: str, ms: Milestones, say: Say) -> None:
    """What the other node's hooks and the watcher did not do: a second requeue, a drain of the
    healthy node the job left. Read once the job trains again (its hooks have run by then)."""
    job = tb.slurm().job(job_id)
    requeues = [r for r in AuditLog(tb.audit_log).read() if r.get("kind") == "action" and r.get("action") == "requeue"
                and r.get("result") not in ("already", "skipped") and float(r.get("ts", 0)) >= ms.injected - 1]
    healthy = tb.slurm().node(good)
    ms.details["restarts"] = str(job.restarts)
    ms.details["requeues"] = str(len(requeues))
    ms.details["healthy node"] = f"{good}: {healthy.state}" + (f" ({healthy.reason})" if healthy.reason else "")
    ms.details["healthy node drained"] = "yes" if healthy.drained else "no"
    say(f"  requeued {'once' if job.restarts == 1 else f'{job.restarts} times'} (Restarts={job.restarts}; "
        f"requeues by slurm-hooks: {len(requeues)}); {good}, the healthy node it shared, "
        + ("DRAINED: " + healthy.reason if healthy.drained else f"not drained ({healthy.state})"))


def _summary_ddp(ms: Milestones, say: Say) -> None:
    say("== 5. how long it took")
    for name in ("node drained", "job got SIGTERM", "job checkpointed", "job requeued", "job running again",
                 "resumed from checkpoint"):
        if name in ms.times:
            say(f"  XID -> {name:<24} {ms.times[name]:6.2f} s")
    lost = ms.details.get("steps lost")
    if lost is not None:
        say(f"  steps lost: {lost} ({int(lost) * DDP_STEP_S:.1f} s of training at {DDP_STEP_S:g} s a step: rank 0 "
            "checkpointed the step every rank had reached when SIGTERM came)")
    down = ms.times.get("job running again")
    if down is not None:
        say(f"  field numbers (Crusoe AutoClusters): node replaced ~{FIELD_NUMBERS['node replaced'] / 60:.0f} min, "
            f"total downtime < {FIELD_NUMBERS['total downtime'] / 60:.0f} min; here the job was back on two healthy "
            f"nodes {down:.1f} s after the fault")
