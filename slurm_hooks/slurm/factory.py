"""Pick the Slurm backend named by ``[slurm] backend``: auto, scontrol or pyslurm.

``auto`` takes pyslurm only when it imports and was built for the running
Slurm's major.minor (pyslurm X.Y works with Slurm X.Y alone); otherwise the
scontrol CLI, which works on every version. Asking for ``pyslurm`` where it
cannot work is a config error, said once, before anything is acted upon.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Mapping
from typing import Any

from slurm_hooks.errors import CommandError, ConfigError
from slurm_hooks.runner import Runner, run_command
from slurm_hooks.slurm import Slurm
from slurm_hooks.slurm.version import parse_version


def from_config(config: Any, runner: Runner | None = None, env: Mapping[str, str] | None = None) -> Slurm:
    """A :class:`Slurm` for ``config`` (a loaded :class:`slurm_hooks.config.Config`)."""
    section = config.slurm
    backend = section.backend
    runner = runner or run_command
    if backend in ("auto", "pyslurm"):
        module, why_not = usable_pyslurm(section.bin_dir, runner, env)
        if module is not None:
            from slurm_hooks.slurm.pyslurm_backend import PyslurmSlurm
            from slurm_hooks.slurm.scontrol import ScontrolSlurm

            cli = ScontrolSlurm(bin_dir=section.bin_dir, timeout=section.timeout, runner=runner, env=env)
            return PyslurmSlurm(timeout=section.timeout, module=module, cli=cli)
        if backend == "pyslurm":
            raise ConfigError(f"backend = \"pyslurm\" but {why_not} (use \"auto\" or \"scontrol\")",
                              getattr(config, "path", None), None, "[slurm] backend")
    from slurm_hooks.slurm.scontrol import ScontrolSlurm

    return ScontrolSlurm(bin_dir=section.bin_dir, timeout=section.timeout, runner=runner, env=env)


def usable_pyslurm(bin_dir: str = "/usr/bin", runner: Runner | None = None,
                   env: Mapping[str, str] | None = None) -> tuple[Any, str]:
    """(the pyslurm module, "") when it can drive this cluster, else (None, why not)."""
    if importlib.util.find_spec("pyslurm") is None:
        return None, "pyslurm is not installed"
    try:
        module = importlib.import_module("pyslurm")
    except Exception as exc:  # noqa: BLE001 - a broken build raises ImportError, OSError, ...
        return None, f"pyslurm does not import ({type(exc).__name__}: {exc})"
    pyslurm_version = str(getattr(module, "__version__", "") or getattr(module, "version", lambda: "")())
    try:
        full_env = {**os.environ, **env} if env is not None else None
        out = (runner or run_command)([os.path.join(bin_dir, "scontrol"), "--version"], 10, env=full_env).stdout
    except CommandError as exc:
        return None, f"cannot read the Slurm version ({exc})"
    ok, why = versions_match(pyslurm_version, out)
    return (module if ok else None), why


def versions_match(pyslurm_version: str, slurm_version_text: str) -> tuple[bool, str]:
    """pyslurm X.Y.* goes with Slurm X.Y.* only (``slurm 22.05.8``, ``slurm-wlm 23.11.4``)."""
    py = parse_version(pyslurm_version)
    sl = parse_version(slurm_version_text)
    if py is None:
        return False, f"pyslurm reports no usable version ({pyslurm_version!r})"
    if sl is None:
        return False, f"cannot read the Slurm version from {slurm_version_text.strip()!r}"
    if py != sl:
        return False, (f"pyslurm {py[0]}.{py[1]:02d} does not match Slurm {sl[0]}.{sl[1]:02d} "
                       "(pyslurm X.Y works only with Slurm X.Y)")
    return True, ""

