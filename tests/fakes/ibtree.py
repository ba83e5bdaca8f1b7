"""The captured H100 ``/sys/class/infiniband`` tree (tests/fixtures/ib), laid as a node's sysfs
holds it: each RDMA device's ``device`` link to its PCI function, the RoCE bond's network
interface under that function (``net/<if>/carrier_*``), and, with ``roce=2``, a second RoCE port
(a copy of the bond) whose interface only its GID table names (``gid_attrs/ndevs/0``), under
``/sys/class/net``. Faults are then made in it as the kernel shows them: a file rewritten.
"""

from __future__ import annotations

import os
import shutil

from paths import FIXTURES

H100_SYS = os.path.join(FIXTURES, "ib", "sys-class-infiniband-h100")

#: The PCI function behind each captured device (mlx5_0 and mlx5_1 as the captured kernel lines
#: name them, tests/fixtures/kmsg/mlx5-events.log).
PCI = {"mlx5_0": "0000:5c:00.0", "mlx5_1": "0000:d2:00.0", "mlx5_4": "0000:1a:00.0", "mlx5_5": "0000:2a:00.0",
       "mlx5_6": "0000:3a:00.0", "mlx5_7": "0000:ba:00.0", "mlx5_8": "0000:ca:00.0", "mlx5_9": "0000:da:00.0",
       "mlx5_bond_0": "0000:9a:00.0"}
#: The bond's physical interface (PCI bus 0x9a = 154), as udev names it.
BOND_IF = "enp154s0f0np0"


def lay(sys_dir: str, roce: int = 1) -> str:
    """The tree under ``sys_dir`` (``class/infiniband``, ``class/net``, ``devices``); its
    ``class/infiniband`` path."""
    root = os.path.join(sys_dir, "class", "infiniband")
    shutil.copytree(H100_SYS, root)
    os.makedirs(os.path.join(sys_dir, "class", "net"), exist_ok=True)
    for device, pci in PCI.items():
        func = os.path.join(sys_dir, "devices", "pci0000:00", pci)
        os.makedirs(func, exist_ok=True)
        os.symlink(os.path.relpath(func, os.path.join(root, device)), os.path.join(root, device, "device"))
    carrier(os.path.join(sys_dir, "devices", "pci0000:00", PCI["mlx5_bond_0"], "net", BOND_IF), downs=1)
    if roce > 1:
        second = os.path.join(root, "mlx5_bond_1")
        shutil.copytree(os.path.join(H100_SYS, "mlx5_bond_0"), second)
        ndevs = os.path.join(second, "ports", "1", "gid_attrs", "ndevs")
        os.makedirs(ndevs)
        write(os.path.join(ndevs, "0"), "bond1")
        carrier(os.path.join(sys_dir, "class", "net", "bond1"), downs=1)
    return root


def carrier(netdev: str, downs: int, ups: int | None = None) -> None:
    """A network interface's carrier counters (``/sys/class/net/<if>/carrier_*``)."""
    ups = downs + 1 if ups is None else ups
    os.makedirs(netdev, exist_ok=True)
    for name, value in (("carrier_down_count", downs), ("carrier_up_count", ups), ("carrier_changes", downs + ups)):
        write(os.path.join(netdev, name), str(value))
    write(os.path.join(netdev, "operstate"), "up")


def write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text + "\n")


def port_file(root: str, device: str, name: str, port: int = 1) -> str:
    return os.path.join(root, device, "ports", str(port), name)


def set_counter(root: str, device: str, counter: str, value: int, folder: str = "counters") -> None:
    write(os.path.join(port_file(root, device, folder), counter), str(value))


def set_state(root: str, device: str, state: str, phys: str) -> None:
    """``state``/``phys_state`` as sysfs writes them: ``"1: DOWN"``, ``"2: Polling"``."""
    numbers = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "Sleep": 1, "Polling": 2, "Disabled": 3,
               "LinkUp": 5, "LinkErrorRecovery": 6}
    write(port_file(root, device, "state"), f"{numbers[state]}: {state}")
    write(port_file(root, device, "phys_state"), f"{numbers[phys]}: {phys}")
