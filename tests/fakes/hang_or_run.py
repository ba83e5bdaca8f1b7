"""A test-side wrapper around one rank's command: it hangs where the testbed's ``hang`` fault file
names this node (``$SLURM_HOOKS_FAULT_DIR/$SLURMD_NODENAME``), and runs the command otherwise.

    srun python3 hang_or_run.py [--fault-dir DIR] python3 collective.py --backend tcp ...

A hung rank is a process, not a network fault: the kernel cannot make one, and no shipped program
reads this file.
"""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    argv, directory = sys.argv[1:], os.environ.get("SLURM_HOOKS_FAULT_DIR", "")
    if argv[:1] == ["--fault-dir"]:
        directory, argv = argv[1], argv[2:]
    path = os.path.join(directory, os.environ.get("SLURMD_NODENAME", ""))
    try:
        with open(path, encoding="utf-8") as fh:
            hang = fh.read().split()[:1] == ["hang"]
    except OSError:
        hang = False
    while hang:
        time.sleep(3600)
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
