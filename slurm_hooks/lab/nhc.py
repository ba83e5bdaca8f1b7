"""LBNL NHC on the testbed: the real NHC as HealthCheckProgram, with our ``check_slurm_hooks``.

Most sites keep NHC as their HealthCheckProgram (Slurm runs one), so the testbed can run it
too (``testbed up --nhc SOURCE``): NHC's source (a ``git archive`` tarball of mej/nhc, or an
unpacked tree; the tests and bench take it from ``$SLURM_HOOKS_NHC_SRC``, else beside the project)
is unpacked under ``<state>/nhc/src`` and run from there, as NHC's own docs say:
``nhc -c CONF INCDIR=... HELPERDIR=... HOSTNAME=<node> NHC_RM=slurm``.

- ``<state>/nhc/scripts`` is NHC's INCDIR: links to NHC's own ``*.nhc`` and our
  ``slurm_hooks.nhc`` (where a site links it into /etc/nhc/scripts).
- ``<state>/nhc/nhc.conf``: our line first, then a site check of NHC's own
  (``check_file_test`` on ``<state>/nhc/site/<node>.ok``: remove the file and NHC fails the
  node, as a real site check would; :meth:`NhcTree.site_fault`).
- The testbed has no syslog daemon: a ``logger`` first on NHC's PATH appends what NHC and our
  check send to syslog to ``<state>/log/syslog``, one line per message, tag first.
"""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import stat
import tarfile
from dataclasses import dataclass

from slurm_hooks import fsutil
from slurm_hooks.errors import SlurmHooksError

#: NHC's source beside the project (``../shared/third_party``), as CI and development have it.
TARBALL_GLOB = "lbnl-nhc-*.tar.gz"
#: NHC's source named by the developer, over the one beside the project: a tarball (``git archive``
#: of mej/nhc) or a tree (a checkout of mej/nhc, its ``nhc`` driver at the top, or in ``nhc/``).
SOURCE_ENV = "SLURM_HOOKS_NHC_SRC"
#: What our nhc.conf line is called with, by default (normal mode).
CHECK = "check_slurm_hooks"

_LOGGER = """#!/bin/bash
# slurm-hooks testbed: the nodes' syslog. No syslog daemon runs here, so this logger, first on
# NHC's PATH, appends each message to {syslog} as "<UTC time> <tag>: <line>".
TAG=logger
OPTIND=1
while getopts ":t:p:u:is" OPTION ; do
    case "$OPTION" in
        t) TAG="$OPTARG" ;;
    esac
done
shift $((OPTIND-1))
if [[ $# -gt 0 ]]; then TEXT="$*"; else TEXT="$(cat)"; fi
NOW="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
while IFS= read -r LINE ; do
    [[ -n "$LINE" ]] && printf '%s %s: %s\\n' "$NOW" "$TAG" "$LINE"
done <<< "$TEXT" >> {syslog}
exit 0
"""

_WRAPPER = """#!/bin/sh
# slurm-hooks testbed HealthCheckProgram: the real LBNL NHC from {src}, run from its tree.
# slurmd gives it no PATH and only SLURMD_NODENAME; NHC's helpers need SLURM_CONF for sinfo/scontrol.
# VERBOSE=1: NHC's log (log/nhc-<node>.log) shows every run and check.
SLURM_CONF={slurm_conf}
PYTHONPATH={pythonpath}
export SLURM_CONF PYTHONPATH
exec {driver} -c {conf} INCDIR={incdir} HELPERDIR={helpers} NHC_RM=slurm TIMEOUT={timeout} VERBOSE=1 \\
    HOSTNAME="$SLURMD_NODENAME" LOGFILE={logdir}/nhc-"$SLURMD_NODENAME".log PATH={path}
"""


class NhcError(SlurmHooksError):
    """NHC's source cannot be found, unpacked or run on the testbed."""


def find_source(start: str, environ: dict[str, str] | None = None) -> str | None:
    """NHC's source: ``$SLURM_HOOKS_NHC_SRC`` (a tarball or tree), else the tarball in
    ``shared/third_party`` beside ``start`` or one of its parents, else None. NhcError when the
    variable names something that is not NHC's source (a typo must not read as "no NHC here")."""
    named = (os.environ if environ is None else environ).get(SOURCE_ENV, "").strip()
    if named:
        path = os.path.abspath(os.path.expanduser(named))
        tree = os.path.isfile(os.path.join(path, "nhc")) or os.path.isfile(os.path.join(path, "nhc", "nhc"))
        if not (os.path.isfile(path) or (os.path.isdir(path) and tree)):
            raise NhcError(f"{SOURCE_ENV}={named}: not NHC's source (a tarball, or a tree with the nhc driver)")
        return path
    here = os.path.abspath(start)
    while True:
        found = sorted(glob.glob(os.path.join(os.path.dirname(here), "shared", "third_party", TARBALL_GLOB)))
        if found:
            return found[-1]
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


@dataclass(frozen=True)
class NhcTree:
    """NHC's files under ``root`` (``<state>/nhc``)."""

    root: str

    @property
    def src(self) -> str:
        return os.path.join(self.root, "src", "nhc")

    @property
    def driver(self) -> str:
        return os.path.join(self.src, "nhc")

    @property
    def helpers(self) -> str:
        return os.path.join(self.src, "helpers")

    @property
    def incdir(self) -> str:
        return os.path.join(self.root, "scripts")

    @property
    def conf(self) -> str:
        return os.path.join(self.root, "nhc.conf")

    @property
    def bin(self) -> str:
        return os.path.join(self.root, "bin")

    @property
    def check_script(self) -> str:
        """Where NHC finds ``check_slurm_hooks``: a link to what ``slurm-hooks install`` laid."""
        return os.path.join(self.incdir, "slurm_hooks.nhc")

    def site_ok(self, node: str) -> str:
        return os.path.join(self.root, "site", f"{node}.ok")

    # -- building it

    def unpack(self, source: str) -> None:
        """NHC's source (tarball or directory with ``nhc/nhc``) into ``src``, driver and helpers executable.
        Idempotent: an unpacked tree is kept."""
        if os.path.exists(self.driver):
            return
        staging = os.path.join(self.root, "src.new")
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(staging, mode=0o755)
        if os.path.isdir(source):
            top = source if os.path.isfile(os.path.join(source, "nhc")) else os.path.join(source, "nhc")
            if not os.path.isfile(os.path.join(top, "nhc")):
                raise NhcError(f"{source}: not NHC's source (no nhc/nhc driver in it)")
            shutil.copytree(top, os.path.join(staging, "nhc"), symlinks=True)
        else:
            try:
                with tarfile.open(source) as tar:
                    tar.extractall(staging, filter="data")
            except (OSError, tarfile.TarError) as exc:
                raise NhcError(f"{source}: cannot unpack NHC: {exc}") from None
            if not os.path.isfile(os.path.join(staging, "nhc", "nhc")):
                raise NhcError(f"{source}: not NHC's source (no nhc/nhc driver in it)")
        for path in [os.path.join(staging, "nhc", "nhc"), *glob.glob(os.path.join(staging, "nhc", "helpers", "*"))]:
            os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        os.makedirs(os.path.dirname(self.src), exist_ok=True)
        os.rename(os.path.join(staging, "nhc"), self.src)
        shutil.rmtree(staging, ignore_errors=True)

    def prepare(self, syslog: str) -> None:
        """INCDIR with NHC's own scripts, the site check's files, and the syslog ``logger``."""
        for sub in ("scripts", "site", "bin"):
            os.makedirs(os.path.join(self.root, sub), mode=0o755, exist_ok=True)
        for script in sorted(glob.glob(os.path.join(self.src, "scripts", "*.nhc"))):
            link = os.path.join(self.incdir, os.path.basename(script))
            if not os.path.islink(link):
                os.symlink(script, link)
        fsutil.atomic_write(os.path.join(self.bin, "logger"), _LOGGER.format(syslog=shlex.quote(syslog)), mode=0o755)

    def link_check(self, script: str) -> None:
        """Put our ``slurm_hooks.nhc`` (as ``install`` laid it) where NHC sources it."""
        tmp = self.check_script + ".new"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(os.path.abspath(script), tmp)
        os.replace(tmp, self.check_script)

    def write_conf(self, check: str = CHECK) -> None:
        """nhc.conf: our check (``check`` is the whole line's check part, e.g. ``check_slurm_hooks -r``)
        first, then the site check of NHC's own."""
        site = os.path.join(self.root, "site", "$HOSTNAME.ok")
        text = ("# slurm-hooks testbed: NHC's config (NHC reads it on every run). Rendered by the testbed.\n"
                f"* || {check}\n"
                "# A site check of NHC's own: fails while the node's file is missing (Testbed.nhc_site_fault).\n"
                f"* || check_file_test -e {site}\n")
        fsutil.atomic_write(self.conf, text, mode=0o644)

    def site_fault(self, node: str, failing: bool) -> None:
        """Make NHC's site check fail (``failing``) or pass on ``node``."""
        path = self.site_ok(node)
        if failing:
            if os.path.exists(path):
                os.unlink(path)
        else:
            fsutil.atomic_write(path, "ok\n", mode=0o644)

    def wrapper(self, *, slurm_conf: str, pythonpath: str, logdir: str, timeout: int = 30) -> str:
        """The HealthCheckProgram script that runs NHC for the node slurmd names."""
        q = shlex.quote
        return _WRAPPER.format(src=self.src, slurm_conf=q(slurm_conf), pythonpath=q(pythonpath), driver=q(self.driver),
                               conf=q(self.conf), incdir=q(self.incdir), helpers=q(self.helpers), timeout=int(timeout),
                               logdir=q(logdir), path=q(f"{self.bin}:/sbin:/usr/sbin:/bin:/usr/bin"))

