"""A multi-node all-reduce test, one rank per node under ``srun``: ``isolate``'s test where
nccl-tests' ``all_reduce_perf`` is not installed.

    srun --ntasks-per-node=1 python3 collective.py [--backend auto|torch|tcp] [--size-mb 4] [--iters 20]

``torch``: ``torch.distributed.all_reduce`` over NCCL (GPUs) or gloo (CPU). ``tcp``: no
dependency at all (a star over TCP: every rank sends its buffer to rank 0, which adds them and
sends the sum back), for a Python without torch. ``auto``: torch when it imports. Rank 0
prints one line, ``collective: ok ranks=N backend=B busbw=X GB/s ...`` (the bus bandwidth of the
median iteration, as nccl-tests count it: 2(n-1)/n x size / time); any rank that cannot finish
within ``--timeout`` exits 1, so a hung or dropped peer fails the job.

The lab's fault knob (:meth:`slurm_hooks.lab.testbed.Testbed.set_fault`): where
``--fault-dir`` or ``SLURM_HOOKS_FAULT_DIR`` is set, the rank reads ``<dir>/<SLURMD_NODENAME>``: ``hang`` (it stops
before the collective), ``drop`` (it exits mid-test), ``slow F`` (each iteration F times as long).

Rendezvous: a file in ``--rdzv-dir`` (default: the working directory, a filesystem every node
sees, as the job's output directory is). A plain script: runs on Python 3.9, no slurm_hooks import.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import struct
import sys
import time


def fault(environ: dict | None = None, directory: str = "") -> tuple[str, float]:
    """(kind, factor) of this node's simulated fault; ("", 1.0) when none."""
    env = os.environ if environ is None else environ
    directory, node = directory or env.get("SLURM_HOOKS_FAULT_DIR", ""), env.get("SLURMD_NODENAME", "")
    if not directory or not node:
        return "", 1.0
    try:
        with open(os.path.join(directory, node), encoding="utf-8") as fh:
            words = fh.read().split()
    except OSError:
        return "", 1.0
    if not words:
        return "", 1.0
    if words[0] == "slow" and len(words) == 2:
        try:
            return "slow", max(1.0, float(words[1]))
        except ValueError:
            return "", 1.0
    return words[0], 1.0


class Faulty:
    """Applies this rank's simulated fault around each iteration."""

    def __init__(self, directory: str = "") -> None:
        self.kind, self.factor = fault(directory=directory)

    def before(self, iteration: int) -> None:
        if self.kind == "hang":
            while True:
                time.sleep(3600)
        if self.kind == "drop" and iteration == 1:
            print(f"rank on {os.environ.get('SLURMD_NODENAME')}: link dropped (simulated)", file=sys.stderr, flush=True)
            os._exit(1)

    def after(self, took: float) -> None:
        if self.kind == "slow":
            time.sleep((self.factor - 1.0) * max(took, 0.02))


def _recv(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(1 << 20, n - len(buf)))
        if not chunk:
            raise ConnectionError("peer closed the connection")
        buf += chunk
    return bytes(buf)


def _rendezvous_path(rdzv_dir: str) -> str:
    tag = f"{os.environ.get('SLURM_JOB_ID', 'local')}-{os.environ.get('SLURM_STEP_ID', '0')}"
    return os.path.join(rdzv_dir, f".collective-{tag}")


def tcp_allreduce(rank: int, world: int, size: int, iters: int, timeout: float, rdzv_dir: str,
                  faulty: Faulty) -> list[float]:
    """Iteration times (s) at this rank of a star all-reduce of ``size`` bytes."""
    path = _rendezvous_path(rdzv_dir)
    deadline = time.monotonic() + timeout
    payload = os.urandom(size)
    times: list[float] = []
    if rank == 0:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("0.0.0.0", 0))
        server.listen(world)
        server.settimeout(timeout)
        host = os.environ.get("SLURM_HOOKS_COLLECTIVE_ADDR") or socket.gethostbyname(socket.gethostname())
        with open(path + ".tmp", "w", encoding="ascii") as fh:
            fh.write(f"{host} {server.getsockname()[1]}\n")
        os.replace(path + ".tmp", path)
        peers = []
        try:
            while len(peers) < world - 1:
                conn, _ = server.accept()
                conn.settimeout(timeout)
                peers.append(conn)
        finally:
            server.close()
            with contextlib.suppress(OSError):
                os.unlink(path)
        for it in range(iters):
            faulty.before(it)
            t0 = time.monotonic()
            for conn in peers:
                conn.sendall(b"G")
            total = int.from_bytes(payload[:8], "little")
            for conn in peers:
                total = (total + int.from_bytes(_recv(conn, size)[:8], "little")) % (1 << 64)
            result = struct.pack("<Q", total) + payload[8:]
            for conn in peers:
                conn.sendall(result)
            took = time.monotonic() - t0
            faulty.after(took)
            times.append(time.monotonic() - t0)
        for conn in peers:
            conn.close()
        return times
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 did not publish its address in {path} within {timeout:g}s")
        time.sleep(0.05)
    with open(path, encoding="ascii") as fh:
        host, port = fh.read().split()
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    with sock:
        for it in range(iters):
            faulty.before(it)
            t0 = time.monotonic()
            _recv(sock, 1)
            sock.sendall(payload)
            _recv(sock, size)
            took = time.monotonic() - t0
            faulty.after(took)
            times.append(time.monotonic() - t0)
    return times


def torch_allreduce(rank: int, world: int, size: int, iters: int, timeout: float, rdzv_dir: str,
                    faulty: Faulty) -> tuple[list[float], str]:
    import datetime

    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("SLURM_LOCALID", "0")) % torch.cuda.device_count())
    init = "env://" if os.environ.get("MASTER_ADDR") else "file://" + os.path.abspath(_rendezvous_path(rdzv_dir))
    dist.init_process_group("nccl" if cuda else "gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout))
    buf = torch.ones(size // 4, dtype=torch.float32, device="cuda" if cuda else "cpu")
    times = []
    for it in range(iters):
        faulty.before(it)
        t0 = time.monotonic()
        dist.all_reduce(buf)
        if cuda:
            torch.cuda.synchronize()
        took = time.monotonic() - t0
        faulty.after(took)
        times.append(time.monotonic() - t0)
    backend = dist.get_backend()
    dist.destroy_process_group()
    if rank == 0:
        with contextlib.suppress(OSError):
            os.unlink(_rendezvous_path(rdzv_dir))
    return times, backend


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("auto", "torch", "tcp"), default="auto")
    p.add_argument("--size-mb", type=float, default=4.0)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds any rank waits for its peers")
    p.add_argument("--rdzv-dir", default=".")
    p.add_argument("--fault-dir", default="", help="the testbed's fault files (default: $SLURM_HOOKS_FAULT_DIR)")
    args = p.parse_args(argv)
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    world = int(os.environ.get("SLURM_NTASKS", "1"))
    node = os.environ.get("SLURMD_NODENAME", socket.gethostname())
    size = max(8, int(args.size_mb * (1 << 20)) // 8 * 8)
    backend = args.backend
    if backend == "auto":
        try:
            import torch.distributed  # noqa: F401
            backend = "torch"
        except ImportError:
            backend = "tcp"
    faulty = Faulty(args.fault_dir)
    try:
        if backend == "torch":
            times, backend = torch_allreduce(rank, world, size, args.iters, args.timeout, args.rdzv_dir, faulty)
        else:
            times = tcp_allreduce(rank, world, size, args.iters, args.timeout, args.rdzv_dir, faulty)
    except Exception as exc:  # a peer gone or late: this rank fails, and so the job
        print(f"collective: failed on {node} rank={rank}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    if rank == 0:
        median = statistics.median(times[1:] or times)  # the first iteration warms up
        busbw = 2 * (world - 1) / world * size / median / 1e9 if world > 1 else 0.0
        print(f"collective: ok ranks={world} backend={backend} size={size} iters={len(times)} "
              f"median_ms={median * 1e3:.2f} busbw={busbw:.4f} GB/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
