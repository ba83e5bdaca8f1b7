"""HealthCheckProgram is LBNL NHC: does it run our ``check_slurm_hooks``, and in time?

Most sites keep NHC as their HealthCheckProgram (Slurm runs one); slurm-hooks then runs
inside NHC's run as the check ``check_slurm_hooks`` (``templates/nhc/slurm_hooks.nhc.j2``).
What is read here follows NHC's own driver (mej/nhc ``nhc``): its command line (``-c CONF``,
``-D CONFDIR``, ``-n NAME``, ``-t TIMEOUT``, ``VAR=value``), then the sysconfig file
``/etc/default/NAME`` (Debian) or ``/etc/sysconfig/NAME``, which is sourced after the command
line and so wins, then the defaults (``/etc/nhc/NAME.conf``, ``/etc/nhc/scripts``, 30 s).
nhc.conf lines are ``<hostmask> || <check> [args]``; a host mask is a glob, ``/regex/``,
``{pdsh range}``, any of them negated by ``!`` (``common.nhc``: ``mcheck``).
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
import shlex
from dataclasses import dataclass, field

from slurm_hooks.config import Config
from slurm_hooks.install import layout
from slurm_hooks.preflight.results import Result, Status
from slurm_hooks.preflight.slurmconf import SlurmConf
from slurm_hooks.slurm import hostlist, quirks

CHECK = "check_slurm_hooks"
#: NHC's watchdog when nothing sets TIMEOUT.
NHC_DEFAULT_TIMEOUT = 30
#: slurmd kills the HealthCheckProgram after this long unless HealthCheckTimeout (26.05+) says otherwise.
SLURM_KILL_S = int(quirks.HEALTH_CHECK_KILL_S)
#: What check_slurm_hooks keeps back of NHC's time for the checks after it and NHC's marking, what it
#: needs at least to run at all, and what it gives Python to start (templates/nhc/slurm_hooks.nhc.j2).
RESERVE_S = 5
MIN_S = 8
START_S = 3
SYSCONFIG_DIRS = ("/etc/default", "/etc/sysconfig")
_DRIVER_MARK = re.compile(r"^\s*function\s+nhcmain_", re.MULTILINE)
_DEFINES_CHECK = re.compile(rf"^\s*(function\s+{CHECK}\b|{CHECK}\s*\(\s*\))", re.MULTILINE)
_BAKED = re.compile(r"^SLURM_HOOKS_HEALTHCHECK='((?:[^']|'\\'')*)'\s*$", re.MULTILINE)
_MAX_READ = 1024 * 1024
#: Hosts a node line may name before we stop expanding it to match host masks.
_MAX_HOSTS = 100_000


@dataclass(frozen=True)
class NhcSetup:
    """How slurmd runs NHC here: which files it reads and its watchdog."""

    program: str
    driver: str
    conf: str
    incdir: str
    timeout: int
    #: Where the TIMEOUT came from (``default``, a file:line, or the program's command line).
    timeout_from: str = "default"
    settings: dict = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class ConfLine:
    mask: str
    check: str
    args: tuple[str, ...]
    line: int
    path: str

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def _read(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            data = fh.read(_MAX_READ)
    except OSError:
        return ""
    return "" if b"\0" in data else data.decode("utf-8", errors="replace")


def is_driver(path: str) -> bool:
    """``path`` is NHC's own driver script (it defines NHC's ``nhcmain_*`` functions)."""
    return bool(_DRIVER_MARK.search(_read(path)))


def detect(program: str, sysconfig_dirs: tuple[str, ...] = SYSCONFIG_DIRS) -> NhcSetup | None:
    """The NHC setup when ``program`` is NHC's driver or a script that runs it; else None."""
    if is_driver(program):
        return _setup(program, program, [], sysconfig_dirs)
    for raw in _read(program).replace("\\\n", " ").splitlines():  # a line continued with \ is one command
        line = raw.strip()
        if not line or line.startswith("#") or "nhc" not in line:
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        for i, word in enumerate(words):
            if os.path.basename(word) == "nhc":
                return _setup(program, word, words[i + 1:], sysconfig_dirs)
    return None


def _setup(program: str, driver: str, args: list[str], sysconfig_dirs: tuple[str, ...]) -> NhcSetup:
    env: dict[str, str] = {"NAME": os.path.basename(driver)}
    origin: dict[str, str] = {}
    where = f"{program} (NHC's command line)"
    flags = {"-c": "CONFFILE", "-D": "CONFDIR", "-n": "NAME", "-t": "TIMEOUT"}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in flags and i + 1 < len(args):
            env[flags[arg]] = args[i + 1]
            origin[flags[arg]] = where
            i += 2
            continue
        if arg == "-e":  # one check line and out: no config file, no watchdog of its own
            i += 2
            continue
        name, sep, value = arg.partition("=")
        if sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            env[name] = value
            origin[name] = where
        i += 1
    for directory in sysconfig_dirs:
        path = os.path.join(directory, env["NAME"])
        if os.path.isfile(path):
            for no, raw in enumerate(_read(path).splitlines(), 1):
                try:
                    words = shlex.split(raw, comments=True)
                except ValueError:
                    continue
                if words and words[0] == "export":
                    words = words[1:]
                for word in words:
                    name, sep, value = word.partition("=")
                    if sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                        env[name] = value
                        origin[name] = f"{path}:{no}"
            break  # NHC sources one of them
    confdir = env.get("CONFDIR") or "/etc/nhc"
    conf = env.get("CONFFILE") or os.path.join(confdir, f"{env['NAME']}.conf")
    incdir = env.get("INCDIR") or os.path.join(confdir, "scripts")
    try:
        timeout = int(env.get("TIMEOUT") or NHC_DEFAULT_TIMEOUT)
    except ValueError:
        timeout = NHC_DEFAULT_TIMEOUT
    return NhcSetup(program, driver, conf, incdir, timeout, origin.get("TIMEOUT", "default"), env)


def read_conf(path: str) -> list[ConfLine]:
    """nhc.conf's check lines, as NHC splits them (``TARGET || CHECK``); comments skipped."""
    out = []
    for no, raw in enumerate(_read(path).splitlines(), 1):
        target, sep, check = raw.partition("||")
        target, check = target.strip(), check.strip()
        if not sep or not target or target.startswith("#") or not check:
            continue
        try:
            words = shlex.split(check)
        except ValueError:
            words = check.split()
        if words:
            out.append(ConfLine(target, words[0], tuple(words[1:]), no, path))
    return out


def mask_matches(mask: str, host: str) -> bool | None:
    """NHC's ``mcheck``: glob, ``/regex/``, ``{pdsh range}``, ``!`` negates; None when it cannot
    be told here (an external match program, a bad range)."""
    negate = mask.startswith("!")
    if negate:
        mask = mask[1:]
    if len(mask) >= 2 and mask[0] == "/" and mask[-1] == "/":
        try:
            hit = re.search(mask[1:-1], host) is not None
        except re.error:
            return None
    elif len(mask) >= 2 and mask[0] == "{" and mask[-1] == "}":
        try:
            hit = host in hostlist.expand(mask[1:-1])
        except ValueError:
            return None
    elif mask[:1] in "<[(" and mask[-1:] in ">])" and len(mask) >= 2:
        return None  # NHC_MCHECK_DELIM: an external program decides
    else:
        hit = fnmatch.fnmatchcase(host, mask)
    return hit != negate


def gpu_nodes(conf: SlurmConf) -> list[str]:
    """Every node slurm.conf gives GPUs (NodeName lines with gpu in Gres=)."""
    names: list[str] = []
    for rec in conf.nodes:
        if rec.gpus and rec.name.upper() != "DEFAULT":
            try:
                names.extend(hostlist.expand(rec.name)[:_MAX_HOSTS])
            except ValueError:
                continue
    return list(dict.fromkeys(names))


def parse_args(args: tuple[str, ...]) -> tuple[bool, int | None, str]:
    """(report mode, -t seconds, error) of a ``check_slurm_hooks`` line, as the check's getopts reads them."""
    report, limit, i = False, None, 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-") or arg == "-":
            return report, limit, f"unexpected argument {arg!r}"
        j = 1
        while j < len(arg):
            ch = arg[j]
            if ch == "r":
                report = True
            elif ch == "t":
                value = arg[j + 1:] or (args[i + 1] if i + 1 < len(args) else "")
                if not arg[j + 1:]:
                    i += 1
                if not value.isdigit():
                    return report, limit, f"-t wants whole seconds, not {value!r}"
                limit = int(value)
                break
            else:
                return report, limit, f"unknown option -{ch}"
            j += 1
        i += 1
    return report, limit, ""


def check(conf: SlurmConf, cfg: Config, setup: NhcSetup, node: str | None, where: str) -> list[Result]:
    """Every NHC result: the program, nhc.conf's line for the GPU nodes, our script, the time."""
    out = [Result("health-check-program", Status.PASS,
                  f"HealthCheckProgram={setup.program} runs LBNL NHC ({setup.driver}); slurm-hooks runs inside it "
                  f"as {CHECK}", "", where)]
    lines = read_conf(setup.conf)
    if not os.path.isfile(setup.conf):
        out.append(Result("nhc-conf", Status.FAIL, f"NHC's config {setup.conf} does not exist: NHC checks nothing",
                          f"write {setup.conf} with `* || {CHECK}` as its first line", setup.program))
        return out
    ours = [c for c in lines if c.check == CHECK]
    if not ours:
        out.append(Result("nhc-conf", Status.FAIL,
                          f"{setup.conf} never calls {CHECK}: NHC runs, slurm-hooks does not",
                          f"add `* || {CHECK}` (or a host mask of the GPU nodes) as the first line", setup.conf))
    else:
        out += _conf_lines(conf, lines, ours, node)
    out += _script(cfg, setup)
    if ours:
        out += _timing(conf, cfg, setup, lines, ours)
    return out


def _conf_lines(conf: SlurmConf, lines: list[ConfLine], ours: list[ConfLine], node: str | None) -> list[Result]:
    out = []
    for c in ours:
        report, _, error = parse_args(c.args)
        if error:
            out.append(Result("nhc-conf", Status.FAIL,
                              f"`{c.mask} || {CHECK} {' '.join(c.args)}`: {error}; the check then logs that and "
                              "runs nothing", f"`{CHECK}` takes only -r and -t SECONDS", c.where))
        elif report:
            out.append(Result("nhc-conf", Status.WARN,
                              f"`{CHECK} -r` is report mode: NHC drains every GPU fault `NHC: slurm-hooks: ...`; "
                              "no requeue by scope, no repair ladder, no resume of ours",
                              "drop -r to let slurm-hooks act itself (it then never makes NHC drain)", c.where))
    wanted = gpu_nodes(conf)
    if node and node not in wanted:
        wanted.append(node)
    missing, unsure = [], []
    for host in wanted:
        verdicts = [mask_matches(c.mask, host) for c in ours]
        if True in verdicts:
            continue
        (unsure if None in verdicts else missing).append(host)
    where = ours[0].where
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        out.append(Result("nhc-conf", Status.FAIL,
                          f"{CHECK} does not run on GPU node(s) {shown}: no host mask of its line(s) matches them",
                          f"widen the mask (`* || {CHECK}`), or add a line for those nodes", where))
    if unsure:
        out.append(Result("nhc-conf", Status.WARN,
                          f"cannot tell whether {CHECK} runs on {', '.join(unsure[:5])} (an external host match)",
                          "use a glob, /regex/ or {range} mask for the GPU nodes", where))
    first = lines[0]
    if first.check != CHECK:
        out.append(Result("nhc-conf", Status.WARN,
                          f"{CHECK} is not the first check ({first.check} at {first.where} is): NHC stops at the first "
                          "failing check, so a node it fails is not checked for GPUs, and the checks before ours take "
                          "from our time", f"move `{ours[0].mask} || {CHECK}` to the top of {ours[0].path}", where))
    if not [r for r in out if r.status is not Status.PASS]:
        nodes = f"{len(wanted)} GPU node(s)" if wanted else "every node"
        out.append(Result("nhc-conf", Status.PASS, f"{CHECK} runs first, on {nodes}", "", where))
    return out


def _script(cfg: Config, setup: NhcSetup) -> list[Result]:
    """Some ``*.nhc`` in NHC's INCDIR defines the check, and the health check program it runs is there."""
    defining = [p for p in sorted(glob.glob(os.path.join(setup.incdir, "*.nhc"))) if _DEFINES_CHECK.search(_read(p))]
    if not defining:
        return [Result("nhc-script", Status.FAIL,
                       f"no *.nhc in NHC's scripts dir {setup.incdir} defines {CHECK}: NHC runs it as a command, "
                       "which fails, and NHC drains every node it runs on",
                       f"ln -s {os.path.join(layout.DEFAULT_PREFIX, layout.NHC)} {setup.incdir}/ (laid by "
                       f"`{layout.install_command()}`)", setup.incdir)]
    path = defining[-1]
    baked = _BAKED.search(_read(path))
    program = baked.group(1).replace("'\\''", "'") if baked else ""
    if program and not os.access(program, os.X_OK):
        return [Result("nhc-script", Status.FAIL,
                       f"{path} runs {program}, which is not there: {CHECK} says so in syslog and checks nothing",
                       f"`{layout.install_command()}` (the prefix the NHC check was laid from)", path)]
    out = []
    config = _config_of(program) if program else ""
    if config and cfg.path and os.path.abspath(config) != os.path.abspath(cfg.path):
        out.append(Result("nhc-script", Status.WARN,
                          f"{program} (run by {CHECK}) uses {config}, not {cfg.path} (what this validate judged)",
                          f"slurm-hooks validate --config {config}, or install again with --config {cfg.path}", path))
    if not out:
        out.append(Result("nhc-script", Status.PASS, f"defines {CHECK}" + (f", which runs {program}" if program else ""),
                          "", path))
    return out


def _config_of(program: str) -> str:
    """The ``--config`` the installed health check program passes (its line that runs ``slurm_hooks check``)."""
    for raw in _read(program).splitlines():
        if "slurm_hooks" not in raw or raw.lstrip().startswith("#"):
            continue
        try:
            words = shlex.split(raw, comments=True)
        except ValueError:
            continue
        if "check" in words and "--config" in words[:-1]:
            return words[words.index("--config") + 1]
    return ""


def _timing(conf: SlurmConf, cfg: Config, setup: NhcSetup, lines: list[ConfLine], ours: list[ConfLine]) -> list[Result]:
    """NHC's watchdog ends before Slurm's kill, and our share of it holds a hung probe and a drain."""
    # HealthCheckTimeout exists from 26.05 on: a slurm.conf that sets it is read by such a Slurm.
    e = conf.entry("HealthCheckTimeout")
    kill = int(quirks.health_check_kill_s(quirks.HEALTH_CHECK_TIMEOUT_SINCE if e is not None else None,
                                          e.value if e is not None else None))
    kill_from = "HealthCheckTimeout" if kill != SLURM_KILL_S else "Slurm's fixed limit"
    timeout = setup.timeout
    shown = f"NHC's TIMEOUT={timeout} s ({setup.timeout_from})"

    def fix_where(seconds: object) -> str:
        return f"TIMEOUT={seconds} for NHC (in /etc/sysconfig/nhc or /etc/default/nhc, or nhc -t {seconds})"

    out = []
    if timeout <= 0 or timeout >= kill:
        out.append(Result("nhc-timing", Status.WARN,
                          f"{shown} does not end NHC before slurmd kills it at {kill} s ({kill_from}): a hung check is "
                          "killed with no NHC log line and no drain", fix_where(f"<below {kill}>"), setup.program))
    window = min(timeout if timeout > 0 else kill, kill) - RESERVE_S
    limits = [parse_args(c.args)[1] for c in ours]
    limit = min((t for t in limits if t is not None), default=None)
    share = window if limit is None else min(window, limit)
    need = START_S + cfg.gpu.probe_timeout + cfg.slurm.timeout
    what = (f"{CHECK} gets at most {share} s ({shown}, Slurm's kill at {kill} s, {RESERVE_S} s kept for the checks "
            f"after it" + (f", -t {limit}" if limit is not None else "") + ")")
    before = next(i for i, c in enumerate(lines) if c.check == CHECK)
    if before:
        what += f", less what the {before} check(s) before it take"
    if share < MIN_S:
        out.append(Result("nhc-timing", Status.FAIL,
                          f"{what}: below the {MIN_S} s it needs, so it never runs",
                          fix_where(MIN_S + RESERVE_S) + f" or more, below {kill}" if limit is None or window < MIN_S
                          else f"-t {MIN_S} or more", ours[0].where))
    elif share < need:
        out.append(Result("nhc-timing", Status.WARN,
                          f"{what}: a GPU probe that hangs ([gpu] probe_timeout = {cfg.gpu.probe_timeout:g} s) then "
                          f"leaves less than one Slurm call ([slurm] timeout = {cfg.slurm.timeout:g} s) for the drain "
                          f"(needs {need:g} s with {START_S} s to start)",
                          fix_where(int(need) + RESERVE_S + 1) + f" (below {kill}), or a lower [gpu] probe_timeout",
                          ours[0].where))
    else:
        out.append(Result("nhc-timing", Status.PASS,
                          f"{what}: room for a hung probe ({cfg.gpu.probe_timeout:g} s) and a drain "
                          f"({cfg.slurm.timeout:g} s)", "", ours[0].where))
    return out
