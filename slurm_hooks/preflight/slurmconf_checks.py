"""The slurm.conf checks: pure functions of a parsed :class:`~slurm_hooks.preflight.slurmconf.SlurmConf`
and our config (HealthCheckProgram, Prolog and Epilog, the scheduling settings the hooks rely on)."""

from __future__ import annotations

import os
import re
import shlex
import stat

from slurm_hooks.config import Config
from slurm_hooks.install import layout
from slurm_hooks.preflight import nhc, slurmconf
from slurm_hooks.preflight.results import Result, Status
from slurm_hooks.preflight.slurmconf import SlurmConf
from slurm_hooks.slurm.conffile import HealthCheckNodeState as HCNS

# --- programs: HealthCheckProgram, Prolog, Epilog ---------------------------------------

#: slurm.conf key -> (check name, our subcommand, the program `slurm-hooks install` lays for it).
PROGRAMS = (
    ("HealthCheckProgram", "health-check-program", "check", layout.program_path("healthcheck")),
    ("Prolog", "prolog", "prolog", layout.program_path("prolog")),
    ("Epilog", "epilog", "epilog", layout.program_path("epilog")),
)
_MAX_SCRIPT = 256 * 1024
_OURS = re.compile(r"slurm[-_]hooks")
_SETS_PATH = re.compile(r"^\s*(export\s+)?PATH=|\benv\b.*\bPATH=|os\.environ\[.PATH.\]\s*=")


def find_invocation(text: str, subcommand: str) -> tuple[str, bool] | None:
    """(program word, script sets PATH) when ``text`` runs ``slurm-hooks <subcommand>``."""
    sets_path = any(_SETS_PATH.search(line) for line in text.splitlines())
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or not _OURS.search(line):
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            words = line.split()
        for i, word in enumerate(words):
            if os.path.basename(word) in ("slurm-hooks", "slurm_hooks") or (
                    word == "slurm_hooks" and i > 0 and words[i - 1] == "-m"):
                if subcommand not in words[i + 1:]:
                    continue
                program = word
                if word == "slurm_hooks":  # `python [-I ...] -m slurm_hooks`: the interpreter is the program
                    program = next((w for w in reversed(words[:i - 1]) if not w.startswith("-")), word)
                env_path = any(w.startswith("PATH=") for w in words[:i])
                return program, sets_path or env_path
    return None


def _mode_problems(path: str, st: os.stat_result) -> list[tuple[str, str]]:
    problems = []
    if not stat.S_ISREG(st.st_mode):
        problems.append(("is not a regular file", "point it at a script file"))
        return problems
    mode = stat.S_IMODE(st.st_mode)
    if not mode & 0o111:
        problems.append((f"is not executable (mode {mode:04o}): slurmd cannot run it", f"chmod 755 {path}"))
    if mode & 0o022:
        problems.append((f"is writable by group or others (mode {mode:04o}): whoever can write it runs code as root",
                         f"chmod go-w {path}"))
    parent = os.path.dirname(path) or "."
    try:
        pmode = stat.S_IMODE(os.stat(parent).st_mode)
    except OSError:
        pmode = 0
    if pmode & 0o002:
        problems.append((f"lives in world-writable {parent} (mode {pmode:04o}): anyone can replace it",
                         f"chmod o-w {parent}, or move the script to a root-owned directory"))
    return problems


def _read_script(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            data = fh.read(_MAX_SCRIPT)
    except OSError:
        return ""
    if b"\0" in data:
        return ""  # a binary cannot be told which subcommand to run
    return data.decode("utf-8", errors="replace")


def check_program(conf: SlurmConf, key: str, check: str, subcommand: str, example: str,
                  cfg: Config | None = None, node: str | None = None) -> list[Result]:
    """The program slurmd runs for ``key`` exists, is safe to run as root and calls us; for
    HealthCheckProgram, LBNL NHC that calls our ``check_slurm_hooks`` does too (preflight.nhc)."""
    wanted = f"slurm-hooks {subcommand}"
    fix_new = f"{key}={example} (laid by `{layout.install_command()}`)"
    e = conf.entry(key)
    if e is None or not e.value:
        return [Result(check, Status.FAIL, f"{key} is not set: slurmd never runs `{wanted}`", fix_new, conf.path)]
    target = conf.resolve(e.value)
    is_glob = any(c in target for c in "*?[")
    if is_glob:
        import glob

        files = sorted(p for p in glob.glob(target) if not os.path.isdir(p))
        if not files:
            return [Result(check, Status.FAIL, f"{e} matches no file", fix_new, e.where)]
    else:
        files = [target]
    out: list[Result] = []
    found: list[tuple[str, tuple[str, bool]]] = []
    inspected = []
    for path in files:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            out.append(Result(check, Status.FAIL, f"{e}: {path} does not exist", fix_new, e.where))
            continue
        except OSError as exc:
            out.append(Result(check, Status.FAIL, f"{e}: cannot stat {path}: {exc.strerror}", "", e.where))
            continue
        if stat.S_ISDIR(st.st_mode):
            out.append(Result(check, Status.FAIL, f"{e}: {path} is a directory; slurmd runs files, not directories",
                              f"{key}={e.value.rstrip('/')}/* (a glob runs every script in it)", e.where))
            continue
        inspected.append(path)
        for what, fix in _mode_problems(path, st):
            out.append(Result(check, Status.FAIL, f"{path} {what}", fix, e.where))
        inv = find_invocation(_read_script(path), subcommand)
        if inv is not None:
            found.append((path, inv))
    if inspected and not found and key == "HealthCheckProgram":
        for path in inspected:
            setup = nhc.detect(path)
            if setup is not None and cfg is None:
                return out + [Result(check, Status.WARN, f"{e}: LBNL NHC; whether it runs our check is not judged "
                                     "while our config does not load", "fix the config FAIL above", e.where)]
            if setup is not None:
                return out + nhc.check(conf, cfg, setup, node, e.where)
    if inspected and not found:
        shown = ", ".join(inspected) if len(inspected) <= 3 else f"{len(inspected)} files"
        fix = (f"link {example} into {os.path.dirname(target)} (laid by `{layout.install_command()}`)" if is_glob
               else fix_new)
        out.append(Result(check, Status.FAIL, f"{e}: {shown} does not run `{wanted}`", fix, e.where))
    for path, (program, sets_path) in found:
        if "/" not in program and not sets_path:
            out.append(Result(check, Status.WARN,
                              f"{path} calls `{program}` by bare name, but slurmd runs {key} without PATH",
                              f"use the absolute path, e.g. `exec {shutil_which(program)} {subcommand}`", e.where))
    if not out:
        names = "" if not is_glob else f" ({', '.join(p for p, _ in found)})"
        out.append(Result(check, Status.PASS, f"{e} runs `{wanted}`{names}", "", e.where))
    return out


def shutil_which(program: str) -> str:
    import shutil

    return shutil.which(program) or f"/usr/local/bin/{program}"


# --- scheduling settings ------------------------------------------------------------------


def _seconds(conf: SlurmConf, check: str, key: str, default: float | None) -> tuple[float | None, Result | None]:
    e = conf.entry(key)
    if e is None:
        return default, None
    try:
        return slurmconf.parse_duration(e.value), None
    except ValueError as exc:
        return None, Result(check, Status.FAIL, f"{e}: {exc}", f"{key}=<seconds>", e.where)


def check_health_check_interval(conf: SlurmConf) -> list[Result]:
    check = "health-check-interval"
    value, err = _seconds(conf, check, "HealthCheckInterval", 0)
    if err:
        return [err]
    where = conf.where("HealthCheckInterval")
    shown = str(conf.entry("HealthCheckInterval") or "HealthCheckInterval unset (default 0)")
    if not value:
        return [Result(check, Status.FAIL, f"{shown}: slurmd never runs HealthCheckProgram on its own",
                       "HealthCheckInterval=300 (NHC's and the field's usual 5 minutes)", where)]
    if value > 1800:
        return [Result(check, Status.WARN, f"{shown}: a repaired node waits up to {value:g} s to be re-checked and resumed",
                       "HealthCheckInterval=300", where)]
    return [Result(check, Status.PASS, f"{shown}: every {value:g} s", "", where)]


_ALL_NODE_STATES = HCNS.ALL


def check_health_check_node_state(conf: SlurmConf) -> list[Result]:
    check = "health-check-node-state"
    e = conf.entry("HealthCheckNodeState")
    where = conf.where("HealthCheckNodeState")
    if e is None:
        return [Result(check, Status.PASS, "HealthCheckNodeState unset (default ANY): drained idle nodes are re-checked", "", where)]
    states = {s.upper() for s in conf.list("HealthCheckNodeState")}
    unknown = states - set(_ALL_NODE_STATES)
    if unknown:
        return [Result(check, Status.FAIL, f"{e}: unknown state(s) {', '.join(sorted(unknown))}",
                       f"use some of {', '.join(_ALL_NODE_STATES)}; ANY is what slurm-hooks needs", where)]
    states.discard(HCNS.CYCLE)
    if not states or HCNS.ANY in states:
        return [Result(check, Status.PASS, f"{e}: drained idle nodes are re-checked", "", where)]
    why = ("the check then runs only when slurmd starts" if HCNS.START_ONLY in states
           else "NONDRAINED_IDLE skips exactly the nodes we drained" if HCNS.NONDRAINED_IDLE in states
           and HCNS.IDLE not in states
           else "drained idle nodes are never checked")
    if HCNS.IDLE not in states or HCNS.START_ONLY in states:
        return [Result(check, Status.FAIL,
                       f"{e}: {why}, so a node slurm-hooks drained is never re-checked and stays drained after repair",
                       "HealthCheckNodeState=ANY (or add IDLE: a drained node with no jobs is IDLE+DRAIN; "
                       "ALLOC/MIXED cover only busy nodes and NONDRAINED_IDLE leaves drained ones out)", where)]
    if not {HCNS.ALLOC, HCNS.MIXED} & states:
        return [Result(check, Status.WARN, f"{e}: busy nodes are not checked between prolog and epilog",
                       "HealthCheckNodeState=ANY, or run `slurm-hooks watch` on every node", where)]
    return [Result(check, Status.PASS, f"{e}: drained idle nodes are re-checked", "", where)]


def check_kill_wait(conf: SlurmConf, cfg: Config) -> list[Result]:
    check = "kill-wait"
    value, err = _seconds(conf, check, "KillWait", 30)
    if err:
        return [err]
    grace = cfg.remediation.requeue_grace
    where = conf.where("KillWait")
    shown = str(conf.entry("KillWait") or "KillWait unset (default 30)")
    if value < grace:
        return [Result(check, Status.WARN,
                       f"{shown} is shorter than [remediation] requeue_grace = {grace:g} s: a requeued job is "
                       f"SIGKILLed {max(value, 5):g} s after SIGTERM, before the {grace:g} s it was given to checkpoint",
                       f"KillWait={int(grace + 0.999)} in slurm.conf, or requeue_grace = {value:g} in {cfg.path or 'the config'}",
                       where)]
    return [Result(check, Status.PASS, f"{shown} >= requeue_grace {grace:g} s", "", where)]


def check_checkpoint_grace(conf: SlurmConf, cfg: Config) -> list[Result]:
    """A job given its checkpoint signal waits at most KillWait for itself to requeue
    (hooks.checkpoint.grace_seconds): a longer ``[requeue] checkpoint_grace`` is silently cut."""
    check = "checkpoint-grace"
    value, err = _seconds(conf, check, "KillWait", 30)
    if err:
        return []  # kill-wait says what is wrong with it
    grace = cfg.requeue.checkpoint_grace
    shown = str(conf.entry("KillWait") or "KillWait unset (default 30)")
    if grace > value:
        return [Result(check, Status.WARN,
                       f"[requeue] checkpoint_grace = {grace:g} s is cut to {shown}: a job given its checkpoint "
                       f"signal (USR1, USR2, ...) has {value:g} s to save and requeue itself before we requeue it",
                       f"KillWait={int(grace + 0.999)} in slurm.conf, or checkpoint_grace = {value:g} in "
                       f"{cfg.path or 'the config'}", conf.where("KillWait") or cfg.path or "")]
    what = "no grace: a signalled job is requeued at once" if grace == 0 else f"<= {shown}"
    return [Result(check, Status.PASS, f"[requeue] checkpoint_grace = {grace:g} s: {what}", "",
                   cfg.path or "")]


def check_prolog_epilog_timeout(conf: SlurmConf, cfg: Config) -> list[Result]:
    check = "prolog-epilog-timeout"
    deadline = cfg.check.deadline
    suggest = max(120, int(deadline) + 30)
    keys = [k for k in ("PrologEpilogTimeout", "PrologTimeout", "EpilogTimeout") if k in conf]
    if not keys:
        return [Result(check, Status.WARN,
                       "PrologEpilogTimeout is not set: a prolog or epilog that hangs holds the job and the node forever",
                       f"PrologEpilogTimeout={suggest} (above [check] deadline = {deadline:g} s)", conf.path)]
    out = []
    for key in keys:
        value, err = _seconds(conf, check, key, None)
        if err:
            out.append(err)
        elif value is not None and value < deadline:
            out.append(Result(check, Status.WARN,
                              f"{conf.entry(key)} is shorter than [check] deadline = {deadline:g} s: slurmd kills a slow "
                              "prolog/epilog and drains the node as `Prolog error`, a reason we never clear",
                              f"{key}={suggest}, or lower [check] deadline", conf.where(key)))
        else:
            out.append(Result(check, Status.PASS, f"{conf.entry(key)}", "", conf.where(key)))
    return out


def check_job_requeue(conf: SlurmConf, cfg: Config) -> list[Result]:
    check = "job-requeue"
    e = conf.entry("JobRequeue")
    where = conf.where("JobRequeue")
    if e is None:
        return [Result(check, Status.PASS, "JobRequeue unset (default 1): batch jobs can be requeued", "", where)]
    if e.value.strip() == "1":
        return [Result(check, Status.PASS, f"{e}: batch jobs can be requeued", "", where)]
    if not cfg.remediation.requeue:
        return [Result(check, Status.PASS, f"{e} ([remediation] requeue = false)", "", where)]
    return [Result(check, Status.WARN,
                   f"{e}: only jobs submitted with --requeue can be requeued; the others die with a bad node",
                   "JobRequeue=1 (users can still opt out with --no-requeue)", where)]


def check_nohold_on_prolog_fail(conf: SlurmConf) -> list[Result]:
    check = "nohold-on-prolog-fail"
    e = conf.entry("SchedulerParameters")
    where = conf.where("SchedulerParameters")
    params = conf.scheduler_parameters()
    if "nohold_on_prolog_fail" in params:
        return [Result(check, Status.PASS, "SchedulerParameters has nohold_on_prolog_fail", "", where)]
    current = e.value if e is not None else ""
    fix = f"SchedulerParameters={current + ',' if current else ''}nohold_on_prolog_fail"
    return [Result(check, Status.WARN,
                   "SchedulerParameters lacks nohold_on_prolog_fail: a job whose prolog failed on a bad GPU is requeued "
                   "HELD and waits until someone runs `scontrol release`", fix, where)]


def check_force_requeue_on_fail(conf: SlurmConf) -> list[Result]:
    """A prolog that refuses a bad GPU makes Slurm requeue the batch job, except a ``--no-requeue``
    one, which it cancels unless ``PrologFlags=ForceRequeueOnFail`` (``req.c``: ``_launch_job_fail``);
    salloc/srun allocations are cancelled either way."""
    check = "force-requeue-on-fail"
    e = conf.entry("PrologFlags")
    where = conf.where("PrologFlags")
    flags = [f.lower() for f in conf.list("PrologFlags")]
    if "forcerequeueonfail" in flags:
        return [Result(check, Status.PASS, f"{e}: a batch job our prolog refuses is requeued, --no-requeue too",
                       "", where)]
    current = e.value if e is not None else ""
    return [Result(check, Status.WARN,
                   f"{e or 'PrologFlags unset'}: when our prolog refuses a bad GPU, Slurm cancels a batch job "
                   "submitted with --no-requeue instead of requeueing it (req.c _launch_job_fail); interactive "
                   "salloc/srun allocations are cancelled either way (the flag is Slurm 23.02's: 22.05's daemons "
                   "exit on it)",
                   f"PrologFlags={current + ',' if current else ''}ForceRequeueOnFail", where or conf.path)]


def check_gres(conf: SlurmConf, cfg: Config | None, node: str | None) -> list[Result]:
    """GresTypes has gpu, GPU nodes offer it, and this node's gres.conf gives as many GPUs as its
    ``Gres=`` says (fewer: slurmd registers fewer and slurmctld drains the node). ``cfg`` None
    (the config did not load): the group's expected count is not compared."""
    check = "gres"
    out = []
    types = [t.lower() for t in conf.list("GresTypes")]
    if "gpu" not in types:
        e = conf.entry("GresTypes")
        current = e.value if e is not None else ""
        out.append(Result(check, Status.FAIL, f"{e or 'GresTypes unset'}: gpu is not a GRES type, so jobs cannot ask for GPUs",
                          f"GresTypes={current + ',' if current else ''}gpu", conf.where("GresTypes")))
    gpu_nodes = [r for r in conf.nodes if r.gpus]
    if not gpu_nodes:
        out.append(Result(check, Status.FAIL, "no NodeName= line has gpu in its Gres=",
                          "add Gres=gpu:<count> to the GPU nodes' NodeName= lines (and a gres.conf)", conf.path))
    mine = conf.nodes_named(node) if node else []
    if mine:
        rec = mine[-1]
        expected = cfg.expectations_for(node).gpus if cfg is not None else None
        out += _gres_conf_count(conf, cfg, node, rec)
        if not rec.gpus:
            out.append(Result(check, Status.FAIL, f"NodeName={rec.name} (this node, {node}) has no gpu Gres",
                              f"add Gres=gpu:{expected or '<count>'} to that line", rec.where))
        elif expected is not None and rec.gpus != expected:
            out.append(Result(check, Status.WARN,
                              f"NodeName={rec.name} Gres={rec.get('gres')} offers {rec.gpus} GPU(s) but group "
                              f"{cfg.group_for(node)} expects {expected}",
                              f"make Gres=gpu:{expected} or set gpus = {rec.gpus} for the group", rec.where))
    if not out:
        where = mine[-1].where if mine else conf.where("GresTypes")
        detail = f"; {node} has gpu:{mine[-1].gpus}" if mine else f"; {len(gpu_nodes)} node line(s) with GPUs"
        out.append(Result(check, Status.PASS, f"GresTypes includes gpu{detail}", "", where))
    return out


def _gres_conf_count(conf: SlurmConf, cfg: Config | None, node: str, rec) -> list[Result]:
    """slurm.conf's ``Gres=gpu:N`` against the GPUs gres.conf gives ``node``: slurmd registers
    what gres.conf gives, and slurmctld drains a node that reports fewer GPUs than configured
    ("gres/gpu count reported lower than configured"): that node never schedules."""
    from slurm_hooks.slurm import gres

    path = (cfg.gpu.gres_conf if cfg is not None else "") or gres.default_path(conf.path)
    if not rec.gpus or not os.path.exists(path):
        return []
    try:
        found = gres.load(path, node)
    except gres.GresConfError as exc:
        return [Result("gres", Status.FAIL, f"gres.conf unreadable: {exc}", "fix that line", path)]
    if found.autodetect not in ("", "off"):
        return []  # slurmd counts the GPUs its plugin finds (nvml, 24.11's nvidia, ...): gres.conf only names them
    given = len(found.devices) + found.fileless
    if given >= rec.gpus:
        return []
    files = ", ".join(d.file for d in found.devices[:4]) + (", ..." if len(found.devices) > 4 else "")
    return [Result("gres", Status.FAIL,
                   f"NodeName={rec.name} Gres={rec.get('gres')} offers {rec.gpus} GPU(s) but {path} gives {node} "
                   f"{given} ({files or 'no File='}): slurmd registers {given}, and slurmctld drains the node "
                   "(\"gres/gpu count reported lower than configured\"): it never runs a job",
                   f"list all {rec.gpus} device files for {node} in {path} (e.g. File=/dev/nvidia[0-{rec.gpus - 1}]), "
                   f"or Gres=gpu:{given} on the NodeName= line", rec.where)]


def check_controller_failover(conf: SlurmConf, cfg: Config) -> list[Result]:
    """Our Slurm call timeout lets scontrol reach a backup controller that has taken over.

    scontrol fails over by itself (Slurm's ``_open_controller``): it tries each
    SlurmctldHost in order; a controller whose host is down costs up to TCPTimeout
    to connect, and the one that answers takes up to MessageTimeout to reply. So
    with N controllers and the first N-1 away, one call needs up to
    ``MessageTimeout + (N - 1) x TCPTimeout``; a shorter ``[slurm] timeout`` kills
    scontrol before it reaches the backup, and every drain fails for as long as
    the primary is down. (While the backup is still taking over, up to
    SlurmctldTimeout, no controller answers: those actions wait as pending ones.)
    """
    check = "controller-failover"
    hosts = conf.controllers()
    where = hosts[0].where if hosts else conf.path
    message, err = _seconds(conf, check, "MessageTimeout", 10)
    if err:
        return [err]
    tcp, err = _seconds(conf, check, "TCPTimeout", 2)
    if err:
        return [err]
    takeover, err = _seconds(conf, check, "SlurmctldTimeout", 120)
    if err:
        return [err]
    ours = cfg.slurm.timeout
    n = max(len(hosts), 1)
    need = message + (n - 1) * tcp
    formula = f"MessageTimeout {message:g} s" + (f" + {n - 1} x TCPTimeout {tcp:g} s" if n > 1 else "")
    if ours < need:
        what = (f"{n} controllers: a call that reaches the last of them needs up to {formula} = {need:g} s"
                if n > 1 else f"one controller: a slow answer may take up to {formula}")
        return [Result(check, Status.WARN,
                       f"[slurm] timeout = {ours:g} s is shorter than a failover: {what}, so scontrol is killed "
                       "before Slurm's own failover reaches a controller that answers",
                       f"timeout = {int(need) + 2} in [slurm] of {cfg.path or 'the config'} "
                       f"(and keep [check] deadline = {cfg.check.deadline:g} s above it)", where)]
    if n == 1:
        return [Result(check, Status.PASS,
                       f"one controller ({hosts[0].value if hosts else 'none set'}): while it is away, drains and "
                       "requeues wait as pending actions and are retried when it is back", "", where)]
    return [Result(check, Status.PASS,
                   f"{n} controllers: [slurm] timeout = {ours:g} s covers {formula} = {need:g} s; during a takeover "
                   f"(up to SlurmctldTimeout {takeover:g} s) actions wait as pending ones", "", where)]


def _config_line(cfg: Config, section: str, key: str) -> str:
    """``<config.toml>:<line>`` of ``[section] key`` (the path alone when it is not written there)."""
    line = cfg.where.line_of(section, key) if cfg.where is not None else None
    return f"{cfg.path}:{line}" if cfg.path and line else (cfg.path or "")


def check_reboot(conf: SlurmConf, cfg: Config) -> list[Result]:
    """The repair ladder's reboot goes through Slurm: without RebootProgram ``scontrol reboot``
    is refused, and a ResumeTimeout shorter than ``[repair] reboot_timeout`` marks a node that is
    still rebooting DOWN ("reboot timed out") before our ladder has given up on it."""
    check = "reboot-program"
    if not (cfg.repair.enabled and cfg.repair.reboot):
        return [Result(check, Status.PASS, "the repair ladder's reboot rung is off: RebootProgram not needed", "",
                       conf.where("RebootProgram"))]
    rung = _config_line(cfg, "repair", "reboot") or _config_line(cfg, "repair", "enabled")
    e = conf.entry("RebootProgram")
    if e is None or not e.value.strip():
        return [Result(check, Status.FAIL,
                       f"RebootProgram is not set in {conf.path}, but the repair ladder's reboot rung is on "
                       f"([repair] reboot = true{', ' + rung if rung else ''}): Slurm refuses `scontrol reboot`, "
                       "and the ladder skips to [replace]",
                       "RebootProgram=/usr/sbin/reboot in slurm.conf, or [repair] reboot = false", rung or conf.path)]
    out = [Result(check, Status.PASS, f"{e}", "", e.where)]
    value, err = _seconds(conf, "resume-timeout", "ResumeTimeout", 60)
    if err:
        return [*out, err]
    ours = cfg.repair.reboot_timeout
    shown = str(conf.entry("ResumeTimeout") or "ResumeTimeout unset (default 60)")
    if value < ours:
        out.append(Result("resume-timeout", Status.FAIL,
                          f"{shown} is shorter than [repair] reboot_timeout = {ours:g} s: Slurm marks a node still "
                          "rebooting DOWN (\"reboot timed out\") while the ladder still waits for it",
                          f"ResumeTimeout={int(ours)} in slurm.conf, or reboot_timeout = {value:g} in [repair]",
                          conf.where("ResumeTimeout")))
    else:
        out.append(Result("resume-timeout", Status.PASS, f"{shown} >= [repair] reboot_timeout {ours:g} s", "",
                          conf.where("ResumeTimeout")))
    rts = conf.entry("ReturnToService")
    if rts is not None and rts.value.strip() == "2":
        # Seen on 22.05 and 24.11 (the testbed): DOWN after "reboot complete", IDLE ~5 s later.
        out.append(Result("return-to-service", Status.WARN,
                          f"{rts}: a node our reboot brings back DOWN (nextstate=DOWN) returns to service by itself "
                          "at its next registration, seconds later, before the health check on its new boot has "
                          "judged it; a fault the reboot did not mend takes jobs until that check drains it again",
                          "ReturnToService=1 (only nodes DOWN for not responding come back by themselves)", rts.where))
    return out


def check_health_check_timeout(conf: SlurmConf, cfg: Config, version: tuple[int, int] | None) -> list[Result]:
    """slurmd kills the health check at 60 s, or at ``HealthCheckTimeout`` on 26.05+: our
    ``[check] deadline`` must end the run before that."""
    from slurm_hooks.slurm import quirks

    check = "health-check-timeout"
    e = conf.entry("HealthCheckTimeout")
    kill = quirks.health_check_kill_s(version, e.value if e is not None else None)
    deadline = cfg.check.deadline
    shown = f"{e}" if e is not None and kill != quirks.HEALTH_CHECK_KILL_S else f"slurmd's {kill:g} s kill"
    if deadline >= kill:
        return [Result(check, Status.FAIL,
                       f"[check] deadline = {deadline:g} s is not shorter than {shown}: slurmd kills the check "
                       "before it can drain", f"deadline = {max(1, int(kill) - 15)} in [check]",
                       _config_line(cfg, "check", "deadline") or conf.where("HealthCheckTimeout"))]
    return [Result(check, Status.PASS, f"[check] deadline = {deadline:g} s < {shown}", "",
                   conf.where("HealthCheckTimeout"))]


#: The checks that compare slurm.conf with our config: not judged while the config does not load.
CONFIG_DEPENDENT = ("kill-wait", "checkpoint-grace", "prolog-epilog-timeout", "job-requeue", "controller-failover",
                    "reboot-program", "resume-timeout", "health-check-timeout")


def check_slurm_conf(conf: SlurmConf, cfg: Config | None, node: str | None) -> list[Result]:
    """Every slurm.conf check, in the order an admin reads them. ``cfg`` None (our config did not
    load): only the checks that need no setting of ours, and a line naming the others: judging
    slurm.conf against built-in defaults would ask for settings the file may well have."""
    out: list[Result] = []
    for key, check, sub, example in PROGRAMS:
        out += check_program(conf, key, check, sub, example, cfg, node)
    out += check_health_check_interval(conf)
    out += check_health_check_node_state(conf)
    if cfg is None:
        out += check_nohold_on_prolog_fail(conf)
        out += check_force_requeue_on_fail(conf)
        out += check_gres(conf, None, node)
        out.append(Result("config-dependent", Status.WARN,
                          f"not judged while our config does not load: {', '.join(CONFIG_DEPENDENT)} (they compare "
                          "slurm.conf with its settings, which were not read)",
                          "fix the config FAIL above, then run validate again", conf.path))
        return out
    out += check_kill_wait(conf, cfg)
    out += check_checkpoint_grace(conf, cfg)
    out += check_prolog_epilog_timeout(conf, cfg)
    out += check_job_requeue(conf, cfg)
    out += check_nohold_on_prolog_fail(conf)
    out += check_force_requeue_on_fail(conf)
    out += check_gres(conf, cfg, node)
    out += check_controller_failover(conf, cfg)
    out += check_reboot(conf, cfg)
    # HealthCheckTimeout exists from 26.05 on: a slurm.conf that sets it is read by such a Slurm.
    from slurm_hooks.slurm import quirks

    out += check_health_check_timeout(conf, cfg, quirks.HEALTH_CHECK_TIMEOUT_SINCE
                                      if "HealthCheckTimeout" in conf else None)
    return out
