"""Process entry point: exit codes, one-line errors, and a fast path for Slurm's hooks.

``slurm-hooks prolog`` runs in every job's launch path, ``epilog`` after every job and
``check`` on every node every few minutes. Slurm (through the programs ``slurm-hooks install``
lays) calls them with ``--config`` (and maybe ``--node``) only, so for exactly those forms this
module runs the hook without importing click (~20-50 ms). Everything else goes through the click
CLI in :mod:`slurm_hooks.cli`.
"""

from __future__ import annotations

import sys

# Exit codes and ``guard`` live with the errors they map (the click CLI uses them without importing
# this module, so ``entry`` -> ``cli`` is the only edge between the two); named here too for callers.
from slurm_hooks.errors import EXIT_INTERNAL, EXIT_OK, EXIT_UNAVAILABLE, EXIT_UNHEALTHY, EXIT_USAGE, guard

__all__ = ["EXIT_INTERNAL", "EXIT_OK", "EXIT_UNAVAILABLE", "EXIT_UNHEALTHY", "EXIT_USAGE", "guard", "main"]

_FAST = ("check", "prolog", "epilog")
_FAST_OPTIONS = ("--config", "--node")


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    fast = _fast_args(args)
    if fast is None:
        from slurm_hooks.cli import main as click_main

        click_main(args)
        return
    sys.exit(guard(lambda: _run_hook(*fast)))


def _fast_args(args: list[str]) -> tuple[str, str | None, str | None] | None:
    """``(hook, config, node)`` when ``args`` is a hook with only --config/--node, else None."""
    if not args or args[0] not in _FAST:
        return None
    opts: dict[str, str] = {}
    rest = args[1:]
    while rest:
        if len(rest) < 2 or rest[0] not in _FAST_OPTIONS or rest[0] in opts or rest[1].startswith("-"):
            return None
        opts[rest[0]] = rest[1]
        rest = rest[2:]
    return args[0], opts.get("--config"), opts.get("--node")


def _run_hook(hook: str, config_path: str | None, node: str | None) -> int:
    from slurm_hooks.config import cache as confcache
    from slurm_hooks.remedy.wiring import Wiring

    confcache.enable()  # the next run of any hook reads the parsed config instead of parsing it

    w = Wiring.load(config_path, node)
    if hook == "check":  # as `slurm-hooks check` (commands.check) without its options
        from slurm_hooks.commands.findings import print_findings
        from slurm_hooks.hooks import healthcheck

        report, outcome = healthcheck.run(w)
        print_findings(report, outcome)
        return 0 if report.healthy else 1
    from slurm_hooks.hooks import jobhooks

    return (jobhooks.prolog if hook == "prolog" else jobhooks.epilog)(w)
