"""``torchrun`` as Debian's python3-torch ships it, runnable on Python 3.11+ (torch 1.13 on Debian 12,
torch 2.6 on Debian 13).

torch 1.13's ``Std.from_str`` answers ``None`` for every ``--redirects``/``--tee`` value on
Python 3.11 (an ``IntFlag`` membership test changed), so its ``torchrun`` fails before it starts
a worker. This is torchrun's own code path (``torch.distributed.run``'s parser, its
``config_from_args`` and ``elastic_launch``) with those two settings mended to "no redirect"
where they came back ``None`` (torch 2 parses them right, into its ``logs_specs``: nothing to mend);
every other flag means what it means to torchrun::

    srun --kill-on-bad-exit=0 python3 -m slurm_hooks.lab.torchrun --nnodes=1:2 ... train.py ...

Plain script, no slurm_hooks import (runs under the interpreter that has torch).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.api import Std
    from torch.distributed.launcher.api import elastic_launch

    args = run.parse_args(sys.argv[1:] if argv is None else argv)
    config, cmd, cmd_args = run.config_from_args(args)
    for name in ("redirects", "tee"):  # torch 2's LaunchConfig keeps them in its logs_specs, parsed right
        value = getattr(config, name, Std.NONE)
        if not isinstance(value, (Std, dict)) or isinstance(value, dict) and None in value.values():
            setattr(config, name, Std.NONE)
    elastic_launch(config=config, entrypoint=cmd)(*cmd_args)


if __name__ == "__main__":
    from torch.distributed.elastic.multiprocessing.errors import record

    record(main)()
