"""What ``slurm-hooks install`` lays under a prefix: the one install path, named once.

Every place that names an installed program (README, docs, ``validate``'s fix hints, ``render``,
the NHC check) takes the path from here::

    P/bin/slurm-hooks-healthcheck          HealthCheckProgram
    P/bin/slurm-hooks-prolog               Prolog
    P/bin/slurm-hooks-epilog               Epilog
    P/share/systemd/slurm-hooks-watch.service
    P/share/nhc/slurm_hooks.nhc            NHC's check_slurm_hooks

Each of those is a symlink into ``P/current``, itself a symlink to ``P/versions/<id>`` that an
install replaces with one rename: a prolog never sees half a version. The files are rendered
from package data (``slurm_hooks/templates/install``, ``templates/nhc``), so the wheel is all a
node needs. This module renders; :mod:`slurm_hooks.install.apply` writes.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from dataclasses import dataclass, field
from importlib import resources

from slurm_hooks import __version__
from slurm_hooks.errors import EXIT_WRAPPED_UNHEALTHY

DEFAULT_PREFIX = "/opt/slurm-hooks"
DEFAULT_CONFIG = "/etc/slurm-hooks/config.toml"

#: What to do when slurm-hooks itself cannot run: "allow" (exit 0, the default) or "refuse".
ON_ERROR = ("allow", "refuse")



@dataclass(frozen=True)
class Program:
    hook: str  # file name part and status name: healthcheck, prolog, epilog
    command: str  # slurm-hooks subcommand
    slurm_key: str  # the slurm.conf key that names it
    allowed: str  # what happens when the tool cannot run, by default
    refused: str  # ... with --on-internal-error refuse
    verdict: str  # what exit 1 (our verdict) means to slurmd


PROGRAMS = (
    Program("healthcheck", "check", "HealthCheckProgram",
            "the node stays in service, unchecked until slurm-hooks runs again",
            "the node is drained (admin resumes it)",
            "the node is unhealthy (slurm-hooks drained it itself; slurmd ignores this code)"),
    Program("prolog", "prolog", "Prolog",
            "the job runs",
            "the job is refused and Slurm drains the node (Prolog error)",
            "the job is refused (slurm-hooks drained the node and the job starts elsewhere; Slurm cancels a "
            "--no-requeue job and a salloc/srun allocation instead, unless PrologFlags=ForceRequeueOnFail)"),
    Program("epilog", "epilog", "Epilog",
            "the node stays in service",
            "Slurm drains the node (Epilog error)",
            "our drain could not be written: Slurm drains the node (Epilog error)"),
)

UNIT = "share/systemd/slurm-hooks-watch.service"
NHC = "share/nhc/slurm_hooks.nhc"
MANIFEST = "install-manifest.json"
CURRENT = "current"
VERSIONS = "versions"


#: The refuse-mode wrapper's scontrol calls run under coreutils' timeout (hooks get no PATH).
TIMEOUT_BIN = "/usr/bin/timeout"
SCONTROL_TIMEOUT_S = 10


def program_rel(hook: str) -> str:
    return f"bin/slurm-hooks-{hook}"


def program_path(hook: str, prefix: str = DEFAULT_PREFIX) -> str:
    """Where ``install --prefix`` puts the program slurmd runs for ``hook`` (healthcheck, prolog, epilog)."""
    return os.path.join(prefix, program_rel(hook))


def program_for(slurm_key: str) -> Program:
    return next(p for p in PROGRAMS if p.slurm_key == slurm_key)


def venv_path(prefix: str = DEFAULT_PREFIX) -> str:
    """The virtualenv of this version (the docs' convention: one per version, so rollback is an install)."""
    return os.path.join(prefix, f"venv-{__version__}")


def install_command(prefix: str = DEFAULT_PREFIX, config: str = DEFAULT_CONFIG, venv: str | None = None) -> str:
    """The command line that lays the programs (what the docs and validate's fix hints show)."""
    return f"{venv or venv_path(prefix)}/bin/slurm-hooks install --prefix {prefix} --config {config}"


def status_path(state_dir: str, hook: str) -> str:
    """The file a wrapper leaves when slurm-hooks could not run (removed by the next good run)."""
    return os.path.join(state_dir, f"wrapper-{hook}.status")


def read_status(state_dir: str) -> dict[str, dict[str, str]]:
    """hook -> what its wrapper recorded the last time slurm-hooks could not run (``time``, ``exit``,
    ``action``, ``version``); a hook whose last run went well has no entry."""
    out = {}
    for p in PROGRAMS:
        try:
            with open(status_path(state_dir, p.hook), encoding="utf-8", errors="replace") as fh:
                line = fh.readline(4096)
        except OSError:
            continue
        out[p.hook] = dict(part.partition("=")[::2] for part in line.split() if "=" in part)
    return out


def laid_env(prefix: str = DEFAULT_PREFIX) -> dict[str, str] | None:
    """The environment ``install --env`` gave the programs laid under ``prefix`` (the watcher's unit
    and the hooks slurmd runs carry the same pairs), read back from the unit's ``Environment=`` lines;
    None when nothing is laid there. systemd starts the watcher with these alone, and slurmd runs
    the hooks with its own environment and these: neither has the variables of an admin's shell."""
    try:
        with open(os.path.join(prefix, UNIT), encoding="utf-8") as fh:
            text = fh.read(1 << 16)
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        if line.startswith('Environment="') and line.endswith('"'):
            pair = line[len('Environment="'):-1].replace('\\"', '"').replace("\\\\", "\\")
            name, sep, value = pair.partition("=")
            if sep:
                out[name] = value
    return out


def slurm_conf_lines(prefix: str) -> list[str]:
    """The slurm.conf lines that wire the programs in, with the settings they rely on."""
    return [
        f"HealthCheckProgram={program_path('healthcheck', prefix)}",
        "HealthCheckInterval=300",
        "HealthCheckNodeState=ANY              # drained idle nodes are re-checked, and resumed when mended",
        f"Prolog={program_path('prolog', prefix)}",
        f"Epilog={program_path('epilog', prefix)}",
        "PrologEpilogTimeout=120",
        "JobRequeue=1                          # cluster-wide: see below",
        "KillWait=120                          # cluster-wide: see below",
        "SchedulerParameters=nohold_on_prolog_fail   # MERGE into your existing line: see below",
        "PrologFlags=ForceRequeueOnFail        # MERGE into your existing line: see below",
        "RebootProgram=/usr/sbin/reboot       # the repair ladder reboots through `scontrol reboot`; without it Slurm refuses",
        "ResumeTimeout=900                     # > the node's boot time; match [repair] reboot_timeout",
    ]


def slurm_conf_notes() -> list[str]:
    """What the settings of :func:`slurm_conf_lines` do to every job on the cluster, not just to the
    ones slurm-hooks requeues, and which of them must be merged with what slurm.conf already says."""
    return [
        "JobRequeue=1: every batch job is requeueable unless submitted with --no-requeue (Slurm also "
        "requeues jobs on a node failure, not only ours).",
        "KillWait=120: every job Slurm ends (scancel, time limit, preemption, requeue) gets 120 s "
        "between SIGTERM and SIGKILL, up from 30: a node takes that much longer to free; nodes stay "
        "COMPLETING meanwhile. Lower it if your jobs checkpoint faster.",
        "SchedulerParameters is ONE comma-separated list: add nohold_on_prolog_fail to the options your "
        "line already has (a second SchedulerParameters= line replaces the first, dropping its options). "
        "Effect: a job whose prolog fails is requeued without Slurm's hold, for every prolog failure.",
        "PrologFlags is ONE comma-separated list too (merge, e.g. Alloc,Contain,ForceRequeueOnFail): a "
        "--no-requeue batch job our prolog refuses is requeued instead of cancelled. Without it Slurm "
        "cancels such jobs, and every salloc/srun allocation on a bad GPU, whatever slurm-hooks does.",
    ]


@dataclass(frozen=True)
class Inputs:
    """Everything the laid files depend on; the same inputs give the same files (and version id)."""

    prefix: str
    python: str
    config: str
    state_dir: str
    audit: str
    textfile_dir: str = ""
    scontrol: str = "/usr/bin/scontrol"
    on_error: str = "allow"
    env: tuple[tuple[str, str], ...] = ()
    version: str = __version__
    extra_write_paths: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class Laid:
    """One version's files: path relative to the version dir -> (text, mode)."""

    files: dict[str, tuple[str, int]]

    @property
    def version_id(self) -> str:
        h = hashlib.sha256()
        for rel in sorted(self.files):
            text, mode = self.files[rel]
            h.update(f"{rel}\0{mode:o}\0".encode())
            h.update(text.encode())
            h.update(b"\0")
        return f"{_safe(__version__)}-{h.hexdigest()[:12]}"


def _safe(s: str) -> str:
    return "".join(c if c.isalnum() or c in "._-+" else "_" for c in s)


def _template(*parts: str) -> str:
    return resources.files("slurm_hooks").joinpath("templates", *parts).read_text(encoding="utf-8")


def example_config() -> str:
    """The example config (every key with its default), shipped in the wheel."""
    return _template("install", "config.toml")


def render(inp: Inputs) -> Laid:
    import jinja2

    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True, autoescape=False)
    q = shlex.quote
    env_pairs = [(name, q(value)) for name, value in inp.env]
    refuse = inp.on_error == "refuse"
    files: dict[str, tuple[str, int]] = {}
    hook_t = env.from_string(_template("install", "hook.sh.j2"))
    textfile = inp.textfile_dir
    for p in PROGRAMS:
        status = status_path(inp.state_dir, p.hook)
        prom = os.path.join(textfile, f"slurm_hooks_wrapper_{p.hook}.prom") if textfile else ""
        drain = show = ""
        if p.hook == "healthcheck" and refuse:
            # bounded: a hung slurmctld must not hold the check until slurmd kills it
            bounded = f"{TIMEOUT_BIN} {SCONTROL_TIMEOUT_S} {q(inp.scontrol)}"
            drain, show = f"{bounded} update", bounded
        files[program_rel(p.hook)] = (hook_t.render(
            hook=p.hook, command=p.command, slurm_key=p.slurm_key, program=program_path(p.hook, inp.prefix),
            program_q=q(program_path(p.hook, inp.prefix)),
            version=inp.version, python=q(inp.python), config=q(inp.config), env=env_pairs,
            status=q(status), status_dir=q(inp.state_dir), prom=q(prom) if prom else "", prom_dir=q(textfile),
            refuse=refuse, consequence=p.refused if refuse else p.allowed, verdict=EXIT_WRAPPED_UNHEALTHY,
            verdict_meaning=p.verdict, drain_argv=drain, show_argv=show,
        ), 0o755)
    # "-": a path that does not exist yet does not stop the unit from starting
    write_paths = ["-" + p for p in sorted({inp.state_dir, os.path.dirname(inp.audit) or "/",
                                            *(p for p in (textfile,) if p), *inp.extra_write_paths})]
    files[UNIT] = (env.from_string(_template("install", "slurm-hooks-watch.service.j2")).render(
        version=inp.version, python=inp.python, config=inp.config,
        env=[(name, value.replace("\\", "\\\\").replace('"', '\\"')) for name, value in inp.env],
        unit_path=os.path.join(inp.prefix, UNIT), write_paths=write_paths), 0o644)
    files[NHC] = (env.from_string(_template("nhc", "slurm_hooks.nhc.j2")).render(
        version=inp.version, healthcheck=program_path("healthcheck", inp.prefix),
        nhc_path=os.path.join(inp.prefix, NHC), config=inp.config, python=inp.python), 0o644)
    return Laid(files)
