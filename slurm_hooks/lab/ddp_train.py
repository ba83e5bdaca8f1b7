"""A real ``torch.distributed`` training job that survives a requeue: DDP, its signal, a checkpoint.

The talk's demo job: one rank per node (``sbatch -N2 --ntasks-per-node=1``, launched by
``srun``), a small model trained with DistributedDataParallel over gloo on CPU (NCCL where
GPUs exist). On SIGTERM (what ``scontrol requeue`` sends to every step on every node) or
its ``--signal`` (SIGUSR1/SIGUSR2) each rank records the signal; at the end of the step the
ranks agree (an all-reduce of the flag, so all stop at the same step even when the signals
arrive apart), rank 0 saves the checkpoint atomically (temp file, fsync, rename) and every
rank exits :data:`EXIT_REQUEUE`. On start it resumes from the newest checkpoint.

Runs as a plain script under any Python that has torch (Debian's ``python3-torch``:
``/usr/bin/python3``), with no slurm_hooks import::

    #SBATCH -N2 --ntasks-per-node=1 --open-mode=append --requeue
    srun /usr/bin/python3 ddp_train.py --ckpt-dir DIR --log DIR/steps.log

Rendezvous: ``env://`` when MASTER_ADDR is set, else a FileStore in ``--ckpt-dir`` (a shared
filesystem, as a checkpoint directory is); on one host (the testbed) ``GLOO_SOCKET_IFNAME=lo``. Each rank prints ``start restart=R step=S on NODE
rank=K``, ``got SIGTERM at step=S on NODE rank=K`` when its own signal came before the step's
all-reduce, and ``stopping at step=S on NODE rank=K on its own signal|a peer's signal``: a rank whose
peer's signal came first stops at the same step before its own arrives (Slurm signals each node's
steps apart), so only the stop lines, not the signal lines, are there for every rank; rank 0 logs ``<step> <unix time>
<restart>`` per step to ``--log``, so the work lost to a fault is read back exactly.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import re
import signal
import socket
import sys
import tempfile
import time

EXIT_REQUEUE = 75
#: Debian's python3-torch is installed for the system interpreter.
TORCH_PYTHON = "/usr/bin/python3"
_NAME = re.compile(r"^ckpt-(\d{10})\.pt$")


def newest(directory: str) -> str | None:
    """The newest checkpoint's path in ``directory`` (None when there is none)."""
    try:
        names = sorted(n for n in os.listdir(directory) if _NAME.match(n))
    except FileNotFoundError:
        return None
    return os.path.join(directory, names[-1]) if names else None


def save(torch, directory: str, step: int, state: dict, keep: int = 2) -> str:
    """Write ``ckpt-<step>.pt`` atomically (temp file, fsync, rename, fsync the directory)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"ckpt-{step:010d}.pt")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".ckpt-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save({"step": step, **state}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    for old in sorted(n for n in os.listdir(directory) if _NAME.match(n))[:-keep]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, old))
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--log", default="", help="rank 0's step log")
    p.add_argument("--step-s", type=float, default=0.1, help="seconds per step (paced)")
    p.add_argument("--steps", type=int, default=0, help="stop after this step (0: run until signalled)")
    p.add_argument("--save-every", type=int, default=0, help="also save every N steps (0: only on a signal)")
    p.add_argument("--timeout", type=float, default=60.0, help="collective timeout (s)")
    args = p.parse_args(argv)

    got: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, lambda s, f: got.append(s))

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    env = os.environ
    elastic = "TORCHELASTIC_RUN_ID" in env  # a worker of torchrun: its rank, world and restarts are torchrun's
    if elastic:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        restart = f"{env.get('SLURM_RESTART_COUNT', '0')}.{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    else:
        rank = int(env.get("SLURM_PROCID", env.get("RANK", "0")))
        world = int(env.get("SLURM_NTASKS", env.get("WORLD_SIZE", "1")))
        restart = env.get("SLURM_RESTART_COUNT", "0")
    node = env.get("SLURMD_NODENAME") or socket.gethostname()
    job = env.get("SLURM_JOB_ID", "local")
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(env.get("SLURM_LOCALID", "0")) % torch.cuda.device_count())
    os.makedirs(args.ckpt_dir, exist_ok=True)
    init = "env://" if env.get("MASTER_ADDR") else \
        "file://" + os.path.join(os.path.abspath(args.ckpt_dir), f".rdzv-{job}-{restart}")
    dist.init_process_group("nccl" if cuda else "gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.timeout))
    device = torch.device("cuda") if cuda else torch.device("cpu")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    step = 0
    latest = newest(args.ckpt_dir)
    if latest:
        data = torch.load(latest, map_location=device)
        model.load_state_dict(data["model"])
        opt.load_state_dict(data["opt"])
        step = int(data["step"])
    print(f"start restart={restart} step={step} on {node} rank={rank} world={world} "
          f"backend={dist.get_backend()}", flush=True)
    flag = torch.zeros(1, device=device)
    gen = torch.Generator().manual_seed(1000 * rank + step)
    while not args.steps or step < args.steps:
        t0 = time.monotonic()
        x = torch.randn(64, 32, generator=gen).to(device)
        loss = ((ddp(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if rank == 0 and args.log:
            with open(args.log, "a", encoding="utf-8") as fh:
                fh.write(f"{step} {time.time():.3f} {restart}" + (f" {world}" if elastic else "") + "\n")
        time.sleep(max(0.0, args.step_s - (time.monotonic() - t0)))
        seen = got[:]  # a signal that lands after this look counts at the next step, never lost
        flag[0] = 1.0 if seen else 0.0
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank stops at the same step
        stopping = bool(flag.item())
        why = "its own signal" if seen else "a peer's signal"  # a peer's all-reduce can come before ours
        for signum in seen:
            print(f"got {signal.Signals(signum).name} at step={step} on {node} rank={rank}", flush=True)
        del got[:len(seen)]
        if stopping or (args.save_every and step % args.save_every == 0):
            if rank == 0:
                path = save(torch, args.ckpt_dir, step, {"model": model.state_dict(), "opt": opt.state_dict()})
                print(f"saved step={step} at={time.time():.3f} to {path}", flush=True)
            dist.barrier()
        if stopping:
            print(f"stopping at step={step} on {node} rank={rank} on {why}: checkpoint saved, exit {EXIT_REQUEUE}",
                  flush=True)
            dist.destroy_process_group()
            return EXIT_REQUEUE
    dist.destroy_process_group()
    print(f"done step={step} on {node} rank={rank}", flush=True)
    return 0


#: torch_missing's answers, by interpreter: importing torch takes seconds, and a test run asks more than once.
_MISSING: dict[str, str] = {}
#: torchrun_missing's answers, by interpreter (each probe imports torch too).
_TORCHRUN_MISSING: dict[str, str] = {}


def torch_missing(python: str = TORCH_PYTHON) -> str:
    """Why ``python`` cannot run this job ("" when it can): what a test skips with, what the demo says.
    Asked once per interpreter and process."""
    if python not in _MISSING:
        _MISSING[python] = _torch_missing(python)
    return _MISSING[python]


def torchrun_missing(python: str = TORCH_PYTHON) -> str:
    """Why ``python``'s torchrun cannot rendezvous here ("" when it can). Debian 13's torch 2.6 is
    built without libuv, yet its c10d rendezvous and its workers' store ask for libuv TCP stores
    ("use_libuv was requested but PyTorch was build without libuv support"), whatever
    ``use_libuv=0``/``USE_LIBUV=0`` say: its torchrun cannot start a job at all. Asked once per
    interpreter and process, as :func:`torch_missing` is."""
    why = torch_missing(python)
    if why:
        return why
    if python not in _TORCHRUN_MISSING:
        _TORCHRUN_MISSING[python] = _torchrun_missing(python)
    return _TORCHRUN_MISSING[python]


def _torchrun_missing(python: str) -> str:
    import subprocess

    probe = ("import torch.distributed as d\n"
             "try:\n    d.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False, use_libuv=True)\n"
             "except TypeError:\n    pass\n"
             "except RuntimeError as e:\n    print(e)\n")
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python} does not run: {exc}"
    said = done.stdout.strip()
    if "libuv" in said:
        return (f"{python}'s torch cannot make the libuv TCP stores its torchrun's rendezvous asks for ({said}): "
                "its torchrun cannot start a job here (Debian 13's python3-torch 2.6)")
    return ""


def _torch_missing(python: str) -> str:
    import subprocess

    try:
        done = subprocess.run([python, "-c", "import torch.distributed as d; assert d.is_available()"],
                              capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python} does not run: {exc}"
    if done.returncode != 0:
        return (f"{python} has no torch.distributed (install Debian's python3-torch: apt-get install -y "
                "python3-torch; scripts/setup does as root)")
    return ""


def batch_script(workdir: str, *, nodes: int = 2, python: str = TORCH_PYTHON, signal_spec: str = "",
                 step_s: float = 0.1, extra: str = "") -> str:
    """The sbatch script of this job on ``nodes`` nodes, one rank and one GPU each, keeping its
    checkpoints (``ckpt/``) and rank 0's step log (``steps.log``) in ``workdir``."""
    import shlex

    ckpt, log = os.path.join(workdir, "ckpt"), os.path.join(workdir, "steps.log")
    os.makedirs(ckpt, exist_ok=True)
    argv = [python, os.path.abspath(__file__), "--ckpt-dir", ckpt, "--log", log, "--step-s", f"{step_s:g}"]
    lines = ["#!/bin/sh", f"#SBATCH --nodes={nodes}", "#SBATCH --ntasks-per-node=1", "#SBATCH --gres=gpu:1",
             "#SBATCH --open-mode=append", "#SBATCH --requeue"] + (
        [f"#SBATCH --signal={signal_spec}"] if signal_spec else []) + [
        "export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo}",
        f"exec srun --unbuffered --kill-on-bad-exit=0 {' '.join(shlex.quote(a) for a in argv)} {extra}".rstrip()]
    return "\n".join(lines) + "\n"


def torchrun_script(workdir: str, *, nodes: str = "1:2", max_restarts: int = 3, python: str = TORCH_PYTHON,
                    step_s: float = 0.1, save_every: int = 10) -> str:
    """The sbatch script of this job under torchrun (:mod:`slurm_hooks.lab.torchrun`), one agent per
    node of ``nodes`` (``MIN:MAX``: elastic, it goes on without a node; ``N``: it waits for all N),
    one worker each, c10d rendezvous hosted by the batch host's agent, a checkpoint every
    ``save_every`` steps. ``srun --kill-on-bad-exit=0``: one node's agent ending does not end the others."""
    import shlex

    ckpt, log = os.path.join(workdir, "ckpt"), os.path.join(workdir, "steps.log")
    os.makedirs(ckpt, exist_ok=True)
    count = int(nodes.split(":")[-1])
    launcher = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchrun.py")
    train = [os.path.abspath(__file__), "--ckpt-dir", ckpt, "--log", log, "--step-s", f"{step_s:g}",
             "--save-every", str(save_every)]
    agent = (f"exec {shlex.quote(python)} {shlex.quote(launcher)} --nnodes={nodes} --nproc_per_node=1 "
             f"--max_restarts={max_restarts} --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:$PORT "
             "--rdzv_id=$SLURM_JOB_ID --rdzv_conf=is_host=$HOST,last_call_timeout=1,use_libuv=0 --monitor_interval=1 "
             + " ".join(shlex.quote(a) for a in train))
    lines = ["#!/bin/sh", f"#SBATCH --nodes={count}", "#SBATCH --ntasks-per-node=1", "#SBATCH --gres=gpu:1",
             "#SBATCH --open-mode=append", "#SBATCH --requeue",
             "export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo}",
             # torch >= 2.4 makes its TCP stores with libuv, which Debian 13's torch 2.6 is built without
             # ("use_libuv was requested but PyTorch was built without libuv support"): the rendezvous's
             # store (use_libuv=0 above, where torch reads it) and the workers' env:// store (USE_LIBUV)
             # use the plain one. Debian 13's torch 2.6 reads neither: torchrun_missing says so.
             "export USE_LIBUV=0",
             # A port free now on the batch host (the rendezvous store's): one derived from the job id
             # is the same in every testbed, and two clusters' jobs 1 would share it.
             "export PORT=$(" + shlex.quote(python) + " -c 'import socket; s = socket.socket(); "
             "s.bind((\"127.0.0.1\", 0)); print(s.getsockname()[1])')",
             "exec srun --unbuffered --kill-on-bad-exit=0 sh -c "
             + shlex.quote('HOST=$([ "$SLURM_NODEID" = 0 ] && echo 1 || echo 0); ' + agent)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
