"""The built-in all-reduce's PyTorch path (slurm_hooks.hooks.collective) on this machine, two ranks:
gloo binds and publishes the address toward the peers, never what the host's name resolves to."""

from __future__ import annotations

import os
import socket
import subprocess
import time

import pytest

from slurm_hooks.hooks import collective
from slurm_hooks.lab import ddp_train


@pytest.fixture
def torch_here():
    why = ddp_train.torch_missing()
    if why:
        pytest.skip(why)


def tcp_local_addresses(pids) -> set[str]:
    """The local IPv4 addresses of the TCP sockets these processes hold (their fds' inodes in /proc/net/tcp)."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    out = set()
    with open("/proc/net/tcp", encoding="ascii") as fh:
        for line in fh.readlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                out.add(socket.inet_ntoa(bytes.fromhex(fields[1].split(":")[0])[::-1]))
    return out


def run_ranks(tmp_path, addrs: list[str], env: dict[str, str] | None = None, iters: int = 300):
    """Two ranks of the torch all-reduce on this host (SLURM_PROCID/NTASKS as srun sets them), each
    given its address (or none), while the TCP sockets' addresses are watched; returns (outputs, seen)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "NCCL_", "GLOO_", "MASTER_"))}
    procs = []
    for rank, addr in enumerate(addrs):
        argv = [ddp_train.TORCH_PYTHON, collective.__file__, "--backend", "torch", "--timeout", "60",
                "--iters", str(iters), "--size-mb", "1", "--rdzv-dir", str(tmp_path)] + (["--addr", addr] if addr else [])
        procs.append(subprocess.Popen(argv, env={**base, **(env or {}), "SLURM_PROCID": str(rank), "SLURM_NTASKS": "2",
                                                 "CUDA_VISIBLE_DEVICES": ""},
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    seen: set[str] = set()
    deadline = time.monotonic() + 120
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        seen |= tcp_local_addresses([p.pid for p in procs])
        time.sleep(0.02)
    outs = [p.communicate(timeout=30)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    return outs, seen


def test_gloo_binds_each_ranks_own_address_toward_its_peers(torch_here, tmp_path):
    """Two "nodes" on two loopback addresses of their own: gloo's pair of them is accepted on one of
    them (the connecting side's source is the route's). Left to itself, gloo binds what the host's
    name resolves to, and neither address would carry a socket."""
    mine = ["127.77.0.1", "127.77.0.2"]
    outs, seen = run_ranks(tmp_path, mine)
    assert "collective: ok ranks=2 backend=gloo@127.77.0.1 " in outs[0], outs
    assert seen & set(mine), sorted(seen)


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_whose_peer_never_comes_gives_up_within_its_timeout(torch_here, tmp_path, rank):
    """A hung peer is how isolate finds a hung node: its partner must fail on its own ``--timeout``,
    whichever rank it is. Rank 1 waits for rank 0 on the rendezvous store, whose clock is not gloo's
    (left to itself it waits the store's five minutes)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "NCCL_", "GLOO_", "MASTER_"))}
    argv = [ddp_train.TORCH_PYTHON, collective.__file__, "--backend", "torch", "--timeout", "3", "--iters", "1",
            "--rdzv-dir", str(tmp_path), "--addr", "127.0.0.1"]
    t0 = time.monotonic()
    done = subprocess.run(argv, env={**base, "SLURM_PROCID": str(rank), "SLURM_NTASKS": "2", "CUDA_VISIBLE_DEVICES": ""},
                          capture_output=True, text=True, timeout=90)
    took = time.monotonic() - t0
    assert done.returncode == 1 and "collective: failed on" in done.stderr and f"rank={rank}:" in done.stderr, done
    # importing torch takes its seconds first; the wait is bounded by 3 s, not by the store's 300 s
    assert took < 60, took


def non_loopback_interface() -> tuple[str, str]:
    for _, name in socket.if_nameindex():
        addr = collective.interface_address(name)
        if addr and not addr.startswith("127."):
            return name, addr
    pytest.skip("no interface with an IPv4 address besides the loopback")


def test_gloo_takes_gloo_socket_ifname_before_nccl_socket_ifname(torch_here, tmp_path):
    """The fabric's interface named for gloo is the one gloo binds, whatever NCCL's names and
    whatever the host's name resolves to (this host's resolves to the loopback)."""
    name, addr = non_loopback_interface()
    outs, seen = run_ranks(tmp_path, ["", ""], env={"GLOO_SOCKET_IFNAME": name, "NCCL_SOCKET_IFNAME": "lo"})
    assert f"backend=gloo@{addr} " in outs[0], outs
    assert addr in seen and "127.0.0.1" not in seen, sorted(seen)


def test_the_address_variables_are_asked_in_the_order_given():
    name, addr = non_loopback_interface()
    env = {"GLOO_SOCKET_IFNAME": name, "NCCL_SOCKET_IFNAME": "lo"}
    assert collective.own_address(env) == "127.0.0.1"
    assert collective.own_address(env, ifname_vars=("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")) == addr
    assert collective.own_address({"NCCL_SOCKET_IFNAME": "^docker,=" + name}) == addr
