"""Pick the Slurm backend named by ``[slurm] backend``: auto, scontrol or pyslurm.

``auto`` takes pyslurm only when it was built for the running Slurm's major.minor
(pyslurm X.Y works with Slurm X.Y alone) and libslurm will find a slurm.conf;
otherwise the scontrol CLI, which works on every version. The choice is made
without importing pyslurm (:func:`choose`): ``import pyslurm`` initialises
libslurm, and a libslurm that finds no configuration source ends the process
(``fatal: Could not establish a configuration source``, exit 1) before anything
could be acted upon or queued. slurmd runs the health check with only ``PWD`` and
``SLURMD_NODENAME``, so that is the ordinary case wherever slurm.conf is not at
libslurm's compiled-in path. Such a run takes scontrol, whose calls then fail as
the controller being unreachable and leave the action pending.

Asking for ``pyslurm`` where it cannot work at all (not installed, another
Slurm's build) is a config error, said once, before anything is acted upon; a
missing slurm.conf is the run's environment, not the config: that run uses scontrol.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
from collections.abc import Mapping
from typing import Any

from slurm_hooks.errors import CommandError, ConfigError
from slurm_hooks.runner import Runner, run_command
from slurm_hooks.slurm import Slurm
from slurm_hooks.slurm.conffile import DEFAULT_PATHS, ENV_VAR, global_values
from slurm_hooks.slurm.version import parse_version
from slurm_hooks.values import dataclass

PYSLURM = "pyslurm"
SCONTROL = "scontrol"


@dataclass(frozen=True)
class Choice:
    """Which backend a run uses and why, in words ``validate`` prints."""

    backend: str
    why: str
    #: For pyslurm: the slurm.conf libslurm is to read (this process's SLURM_CONF from then on).
    slurm_conf: str = ""
    #: Whether pyslurm cannot work here whatever the environment (not installed, another Slurm's
    #: build): a config error when ``backend = "pyslurm"`` was asked for.
    permanent: bool = False


def from_config(config: Any, runner: Runner | None = None, env: Mapping[str, str] | None = None) -> Slurm:
    """A :class:`Slurm` for ``config`` (a loaded :class:`slurm_hooks.config.Config`)."""
    return backend_for(config, runner, env)[0]


def backend_for(config: Any, runner: Runner | None = None,
                env: Mapping[str, str] | None = None) -> tuple[Slurm, Choice]:
    """The adapter and the :class:`Choice` that made it."""
    from slurm_hooks.slurm.scontrol import ScontrolSlurm

    section = config.slurm
    runner = runner or run_command
    choice = choose(section.backend, section.bin_dir, runner, env)
    if choice.backend == PYSLURM:
        module, failed = _import_pyslurm(choice.slurm_conf)
        if module is not None:
            from slurm_hooks.slurm.pyslurm_backend import PyslurmSlurm

            cli = ScontrolSlurm(bin_dir=section.bin_dir, timeout=section.timeout, runner=runner, env=env)
            return PyslurmSlurm(timeout=section.timeout, module=module, cli=cli,
                                message_timeout=message_timeout(choice.slurm_conf)), choice
        choice = Choice(SCONTROL, failed, permanent=True)
    if section.backend == PYSLURM and choice.permanent:
        raise ConfigError(f"backend = \"pyslurm\" but {choice.why} (use \"auto\" or \"scontrol\")",
                          getattr(config, "path", None), None, "[slurm] backend")
    return ScontrolSlurm(bin_dir=section.bin_dir, timeout=section.timeout, runner=runner, env=env), choice


def choose(backend: str, bin_dir: str = "/usr/bin", runner: Runner | None = None,
           env: Mapping[str, str] | None = None) -> Choice:
    """The backend ``[slurm] backend = <backend>`` gives on this node, decided without importing
    pyslurm: its version is read from its files, Slurm's from ``scontrol --version``, and the
    slurm.conf libslurm would read from the environment and the disk."""
    if backend == SCONTROL:
        return Choice(SCONTROL, "[slurm] backend = \"scontrol\"")
    asked = "auto" if backend != PYSLURM else "pyslurm"
    pyslurm_version = installed_pyslurm_version()
    if pyslurm_version is None:
        return Choice(SCONTROL, f"{asked}: pyslurm is not installed", permanent=True)
    conf, why_not = libslurm_conf(bin_dir, env)
    if not conf:  # asked first: without a slurm.conf, `scontrol --version` dies the same way
        return Choice(SCONTROL, f"{asked}: pyslurm {pyslurm_version} is installed, but {why_not}")
    try:
        full_env = {**os.environ, **(env or {}), ENV_VAR: conf}
        out = (runner or run_command)([os.path.join(bin_dir, "scontrol"), "--version"], 10, env=full_env).stdout
    except CommandError as exc:
        return Choice(SCONTROL, f"{asked}: cannot read the Slurm version ({exc})")
    ok, why = versions_match(pyslurm_version, out)
    if not ok:
        return Choice(SCONTROL, f"{asked}: {why}", permanent=True)
    matched = f"pyslurm {pyslurm_version} matches Slurm {_major_minor(out)}"
    bound = _bound_conf()
    if bound and os.path.realpath(bound) != os.path.realpath(conf):
        return Choice(SCONTROL, f"{asked}: {matched}, but pyslurm in this process already reads {bound} "
                                f"(libslurm reads one slurm.conf per process), not {conf}")
    return Choice(PYSLURM, f"{asked}: {matched} (slurm.conf {conf})", slurm_conf=conf)


def message_timeout(slurm_conf: str) -> float:
    """slurm.conf's MessageTimeout in seconds (Slurm's default, 10, where it says none): how long
    libslurm waits for the controller before a pyslurm call fails."""
    text = global_values(("MessageTimeout",), slurm_conf).get("messagetimeout", "")
    return float(text) if text.isdigit() and int(text) > 0 else DEFAULT_MESSAGE_TIMEOUT


#: Slurm's MessageTimeout where slurm.conf sets none.
DEFAULT_MESSAGE_TIMEOUT = 10.0


def libslurm_conf(bin_dir: str, env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(the slurm.conf libslurm would read here, "") or ("", why none): as libslurm's
    ``_establish_config_source`` looks, less its last resort (a fetch from slurmctld, which
    scontrol does as well). ``SLURM_CONF`` when set (libslurm insists on it, existing or not);
    else the first that exists of the Slurm install's own ``etc/slurm.conf`` (``<bin_dir>/../etc``,
    its compiled-in default for a ``--prefix`` build) and the usual places (configless slurmd's
    cache among them)."""
    named = (env or {}).get(ENV_VAR) or os.environ.get(ENV_VAR)
    if named:
        if os.path.isfile(named):
            return named, ""
        return "", f"SLURM_CONF names {named}, which does not exist (libslurm would end this process)"
    candidates = [os.path.normpath(os.path.join(bin_dir, os.pardir, "etc", "slurm.conf")), *DEFAULT_PATHS]
    for path in dict.fromkeys(candidates):
        if os.path.isfile(path):
            return path, ""
    return "", (f"libslurm would find no slurm.conf (SLURM_CONF unset; none of {', '.join(dict.fromkeys(candidates))})"
                ": `import pyslurm` would end this process")


def installed_pyslurm_version() -> str | None:
    """pyslurm's version from its files (``pyslurm/version.py``), without importing it; None when
    it is not installed. ("" when it is installed but says no version.)"""
    spec = importlib.util.find_spec(PYSLURM)
    if spec is None:
        return None
    for folder in spec.submodule_search_locations or ():
        try:
            with open(os.path.join(folder, "version.py"), encoding="utf-8") as fh:
                m = _VERSION_LINE.search(fh.read())
        except OSError:
            continue
        if m:
            return m.group(1)
    from importlib import metadata

    try:
        return metadata.version(PYSLURM)
    except metadata.PackageNotFoundError:
        return ""


_VERSION_LINE = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.M)

#: The slurm.conf pyslurm was imported with in this process (libslurm reads one per process).
_BOUND: list[str] = []


def _bound_conf() -> str:
    if _BOUND:
        return _BOUND[0]
    import sys

    if PYSLURM in sys.modules:  # imported by someone else: libslurm read what SLURM_CONF said then
        return os.environ.get(ENV_VAR, "") or "its compiled-in slurm.conf"
    return ""


def _import_pyslurm(slurm_conf: str) -> tuple[Any, str]:
    """(the pyslurm module, "") imported with libslurm reading ``slurm_conf``, or (None, why not).

    SLURM_CONF is set first and stays set: libslurm reads it as it initialises at import, sets it
    itself, and its later calls look it up again."""
    os.environ[ENV_VAR] = slurm_conf
    try:
        module = importlib.import_module(PYSLURM)
    except Exception as exc:  # noqa: BLE001 - a broken build raises ImportError, OSError, ...
        return None, f"pyslurm does not import ({type(exc).__name__}: {exc})"
    if not _BOUND:
        _BOUND.append(slurm_conf)
    return module, ""


def usable_pyslurm(bin_dir: str = "/usr/bin", runner: Runner | None = None,
                   env: Mapping[str, str] | None = None) -> tuple[Any, str]:
    """(the pyslurm module, "") when it can drive this cluster, else (None, why not); imports
    pyslurm only where :func:`choose` found it safe."""
    choice = choose("auto", bin_dir, runner, env)
    if choice.backend != PYSLURM:
        return None, choice.why
    return _import_pyslurm(choice.slurm_conf)


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


def _major_minor(text: str) -> str:
    version = parse_version(text)
    return f"{version[0]}.{version[1]:02d}" if version else "?"
