"""A multi-node all-reduce test under ``srun``: ``isolate``'s test where nccl-tests'
``all_reduce_perf`` is not installed.

    srun --ntasks-per-node=G python3 collective.py [--backend auto|torch|tcp] [--size-mb 4] [--iters 20]

``torch``: ``torch.distributed.all_reduce`` over NCCL (GPUs) or gloo (CPU). ``tcp``: no
dependency at all, for a Python without torch: a ring, as NCCL's, in which every rank sends
1/n of the buffer to the next and receives 1/n from the previous, 2(n-1) times per iteration,
so every node's link carries the same traffic and a slow one slows the whole ring whatever its
rank (it moves the bytes an all-reduce moves; it adds nothing up). ``auto``: torch when it
imports. Rank 0 prints one line, ``collective: ok ranks=N backend=B busbw=X GB/s ...`` (the bus
bandwidth over the mean iteration, as nccl-tests time and count it: 2(n-1)/n x size / time; a
median would let a link that runs fast for a burst and then crawls pass); any rank that
cannot finish within ``--timeout`` exits 1, so a hung or dropped peer fails the job.

Each rank binds and publishes the address toward its peers, in the TCP ring and in gloo alike
(gloo's process group gets a device bound to it): the interface named by ``NCCL_SOCKET_IFNAME``
or ``GLOO_SOCKET_IFNAME`` where set (the fabric's; gloo asks its own first), else the node's
``NodeAddr`` as Slurm knows it, else what its name resolves to; never ``gethostbyname(gethostname())``
(127.0.1.1 on Debian, the management network on a multi-homed host), which gloo left to itself
binds. NCCL (GPUs) finds its own interfaces (``NCCL_SOCKET_IFNAME``).

Rendezvous: files in ``--rdzv-dir`` (default: the working directory, a filesystem every node
sees, as the job's output directory is). A plain script: runs on Python 3.9, no slurm_hooks import.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time

#: SIOCGIFADDR (linux/sockios.h): an interface's IPv4 address.
_SIOCGIFADDR = 0x8915


def interface_address(name: str) -> str:
    """The IPv4 address of interface ``name`` ("" when it has none)."""
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
        except OSError:
            return ""
    return socket.inet_ntoa(packed[20:24])


def _node_addr(node: str, timeout: float) -> str:
    """The node's NodeAddr from ``scontrol show node`` ("" when Slurm does not say, or it is a name)."""
    try:
        out = subprocess.run(["scontrol", "-o", "show", "node", node], capture_output=True, text=True,
                             timeout=timeout, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    for word in out.split():
        if word.startswith("NodeAddr="):
            addr = word.split("=", 1)[1]
            with contextlib.suppress(ValueError):
                return str(ipaddress.IPv4Address(addr))
    return ""


def own_address(environ: dict | None = None, timeout: float = 5.0,
                ifname_vars: tuple[str, ...] = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")) -> str:
    """The address this rank binds and publishes; see the module docstring. ``ifname_vars``: the
    variables naming interfaces, first found first (gloo asks ``GLOO_SOCKET_IFNAME`` before NCCL's)."""
    env = os.environ if environ is None else environ
    for var in ifname_vars:
        names = [n.lstrip("=") for n in env.get(var, "").split(",") if n and not n.startswith("^")]
        for name in names:
            addr = interface_address(name)
            if addr:
                return addr
    node = env.get("SLURMD_NODENAME", "")
    if node:
        addr = _node_addr(node, timeout)
        if addr:
            return addr
        with contextlib.suppress(OSError):
            return socket.getaddrinfo(node, None, socket.AF_INET)[0][4][0]
    return socket.gethostbyname(socket.gethostname())


def _recv(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(1 << 20, n - len(buf)))
        if not chunk:
            raise ConnectionError("peer closed the connection")
        buf += chunk
    return bytes(buf)


def _rendezvous_path(rdzv_dir: str, rank: int | None = None) -> str:
    tag = f"{os.environ.get('SLURM_JOB_ID', 'local')}-{os.environ.get('SLURM_STEP_ID', '0')}"
    return os.path.join(rdzv_dir, f".collective-{tag}" + ("" if rank is None else f"-{rank}"))


def _publish(path: str, text: str) -> None:
    with open(path + ".tmp", "w", encoding="ascii") as fh:
        fh.write(text)
    os.replace(path + ".tmp", path)


def _read_peer(path: str, deadline: float) -> tuple[str, int]:
    while True:
        with contextlib.suppress(OSError, ValueError):
            with open(path, encoding="ascii") as fh:
                host, port = fh.read().split()
            return host, int(port)
        if time.monotonic() > deadline:
            raise TimeoutError(f"the next rank did not publish its address in {path}")
        time.sleep(0.05)


def tcp_ring(rank: int, world: int, size: int, iters: int, timeout: float, rdzv_dir: str,
             addr: str) -> list[float]:
    """Iteration times (s) at this rank of a ring all-reduce's traffic over TCP, bound to ``addr``."""
    deadline = time.monotonic() + timeout
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((addr, 0))
    server.listen(1)
    server.settimeout(timeout)
    mine = _rendezvous_path(rdzv_dir, rank)
    _publish(mine, f"{addr} {server.getsockname()[1]}\n")
    host, port = _read_peer(_rendezvous_path(rdzv_dir, (rank + 1) % world), deadline)
    nxt = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    nxt.settimeout(timeout)
    nxt.bind((addr, 0))  # its packets leave from this node's address, as they arrive at it
    try:
        nxt.connect((host, port))
        prev, _ = server.accept()
    finally:
        server.close()
        with contextlib.suppress(OSError):
            os.unlink(mine)
    prev.settimeout(timeout)
    chunk = max(1, size // world)
    payload = os.urandom(chunk)
    times: list[float] = []
    failure: list[BaseException] = []

    def send() -> None:
        try:
            nxt.sendall(payload)
        except BaseException as exc:  # noqa: BLE001 - handed to the receiving side
            failure.append(exc)

    with nxt, prev:
        for _ in range(iters):
            t0 = time.monotonic()
            for _step in range(2 * (world - 1)):
                sender = threading.Thread(target=send, daemon=True)
                sender.start()
                _recv(prev, chunk)
                sender.join(max(0.0, deadline + timeout - time.monotonic()))
                if failure or sender.is_alive():
                    raise failure[0] if failure else TimeoutError("sending to the next rank did not finish")
            times.append(time.monotonic() - t0)
    return times


def torch_allreduce(rank: int, world: int, size: int, iters: int, timeout: float,
                    rdzv_dir: str, addr: str = "") -> tuple[list[float], str]:
    """Iteration times of ``torch.distributed``'s all-reduce: NCCL on GPUs, else gloo, whose
    process group is built with a device bound to ``addr`` (see :func:`gloo_address`): left to
    itself, gloo binds what the host's name resolves to."""
    import datetime

    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("SLURM_LOCALID", "0")) % torch.cuda.device_count())
    limit = datetime.timedelta(seconds=timeout)
    buf = torch.ones(size // 4, dtype=torch.float32, device="cuda" if cuda else "cpu")
    if cuda:
        init = "env://" if os.environ.get("MASTER_ADDR") else "file://" + os.path.abspath(_rendezvous_path(rdzv_dir))
        dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world, timeout=limit)
        reduce = lambda: dist.all_reduce(buf)  # noqa: E731
    else:
        addr = addr or gloo_address(timeout)
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = limit
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=addr)]
        store = dist.FileStore(os.path.abspath(_rendezvous_path(rdzv_dir)), world)
        store.set_timeout(limit)  # a rank > 0 waits for rank 0 on the store's clock, not on gloo's
        group = dist.ProcessGroupGloo(store, rank, world, opts)
        reduce = lambda: group.allreduce([buf]).wait()  # noqa: E731
    times = []
    for _ in range(iters):
        t0 = time.monotonic()
        reduce()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.monotonic() - t0)
    if cuda:
        backend = dist.get_backend()
        dist.destroy_process_group()
    else:
        backend = f"gloo@{addr}"
        group.barrier().wait()  # every rank done with the store before rank 0 removes it
    if rank == 0:
        with contextlib.suppress(OSError):
            os.unlink(_rendezvous_path(rdzv_dir))
    return times, backend


def gloo_address(timeout: float) -> str:
    """gloo's address toward its peers: ``GLOO_SOCKET_IFNAME``'s interface, else ``NCCL_SOCKET_IFNAME``'s,
    else the node's address as :func:`own_address` finds it."""
    return own_address(timeout=min(5.0, timeout / 4), ifname_vars=("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("auto", "torch", "tcp"), default="auto")
    p.add_argument("--size-mb", type=float, default=4.0)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds any rank waits for its peers")
    p.add_argument("--rdzv-dir", default=".")
    p.add_argument("--addr", default="", help="bind and publish this address (default: see above)")
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
    try:
        if backend == "torch":
            times, backend = torch_allreduce(rank, world, size, args.iters, args.timeout, args.rdzv_dir, args.addr)
        else:
            addr = args.addr or own_address(timeout=min(5.0, args.timeout / 4))
            times = tcp_ring(rank, world, size, args.iters, args.timeout, args.rdzv_dir, addr)
            backend = f"tcp-ring@{addr}"
    except Exception as exc:  # a peer gone or late: this rank fails, and so the job
        print(f"collective: failed on {node} rank={rank}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    if rank == 0:
        mean = statistics.mean(times[1:] or times)  # the first iteration warms up
        moved = size // world * world if backend.startswith("tcp") else size
        busbw = 2 * (world - 1) / world * moved / mean / 1e9 if world > 1 else 0.0
        print(f"collective: ok ranks={world} backend={backend} size={size} iters={len(times)} "
              f"mean_ms={mean * 1e3:.2f} busbw={busbw:.4f} GB/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
