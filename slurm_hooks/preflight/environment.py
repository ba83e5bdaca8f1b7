"""The environment checks: our config loads, the GPU probe answers, scontrol reaches slurmctld,
the directories we write are writable, and (with a [bridge] section) the Kubernetes credentials
allow what the bridge does."""

from __future__ import annotations

import os
from typing import Any, Callable

from slurm_hooks import config as config_mod
from slurm_hooks import urlsecret
from slurm_hooks.config import Config
from slurm_hooks.errors import CommandError, CommandTimeout, ConfigError, SlurmHooksError, TransientError
from slurm_hooks.models import KERNEL_LOG, NodeSnapshot
from slurm_hooks.preflight import slurmconf
from slurm_hooks.preflight.results import Result, Status
from slurm_hooks.remedy.wiring import ActionPolicy

# --- our config and the machine -----------------------------------------------------------


def config_failure(check: str, exc: ConfigError) -> Result:
    """A ConfigError as a FAIL line: where = file:line, message starts with the key."""
    where = f"{exc.path or '<config>'}{':' + str(exc.line) if exc.line is not None else ''}"
    prefix = where + (f": {exc.key}" if exc.key else "") + ": "
    text = str(exc)
    message = text[len(where) + 2:] if text.startswith(prefix) else text
    fix = f"edit {exc.path}" + (f" line {exc.line}" if exc.line is not None else "")
    if exc.key:
        fix += f" ({exc.key})"
    return Result(check, Status.FAIL, message, fix, where)


def load_config(path: str | None) -> tuple[Config | None, list[Result]]:
    check = "config"
    try:
        cfg = config_mod.load(path)
    except ConfigError as exc:
        return None, [config_failure(check, exc)]
    if cfg.path is None:
        resolved, _ = config_mod.resolve_path(path)
        return cfg, [Result(check, Status.WARN, f"no config at {resolved}: running on defaults",
                            f"create {resolved} (or pass --config / set {config_mod.ENV_VAR})", resolved)]
    return cfg, [Result(check, Status.PASS, "loaded", "", cfg.path)]  # a deadline slurmd kills is a config error


def check_wrappers(cfg: Config) -> list[Result]:
    """The programs ``slurm-hooks install`` lays leave a status file when slurm-hooks could not run
    (they then let the job run, or refuse it): any such file is a FAIL until the next good run."""
    import time

    from slurm_hooks.install import layout

    check = "wrappers"
    found = layout.read_status(cfg.state.dir)
    if not found:
        return [Result(check, Status.PASS, "no failed run of slurm-hooks recorded by its programs", "", cfg.state.dir)]
    out = []
    for hook, st in sorted(found.items()):
        try:
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(st.get("time", ""))))
        except ValueError:
            when = "an unknown time"
        action = {"allowed": "it let the job and the node pass", "refused": "it failed closed"}.get(
            st.get("action", ""), "")
        program = st.get("program") or layout.program_path(hook)
        out.append(Result(check, Status.FAIL,
                          f"slurm-hooks {hook} could not run at {when} (exit {st.get('exit', '?')}): {action}",
                          f"run {program} by hand as root to see the error (the interpreter, the package or the "
                          "config); the record goes away at the next good run",
                          layout.status_path(cfg.state.dir, hook)))
    return out


def check_gpus(cfg: Config, node: str) -> list[Result]:
    from slurm_hooks import engine, probes

    backend = cfg.gpu.backend
    if backend == "sim":
        elsewhere = _other_sim_nodes(cfg.gpu.sim_dir, node)
        if elsewhere:
            return [Result("gpu-backend", Status.WARN,
                           f"sim: {node} (this host) is none of the simulated nodes in {cfg.gpu.sim_dir} "
                           f"({', '.join(elsewhere[:8])}{' ...' if len(elsewhere) > 8 else ''}): no GPUs judged here",
                           f"slurm-hooks validate --node {elsewhere[0]} judges a simulated node", cfg.gpu.sim_dir)]
    try:
        probe = probes.from_config(cfg, node)
    except ImportError as exc:
        return [Result("gpu-backend", Status.FAIL, f"{backend} backend cannot load: {exc}",
                       "pip install nvidia-ml-py on GPU nodes (or [gpu] backend = \"sim\" for rehearsals)", cfg.path or "")]
    return gpu_results(cfg, node, engine.take_snapshot(probe, node, cfg.gpu.probe_timeout))


def _other_sim_nodes(sim_dir: str, node: str) -> list[str]:
    """The simulated nodes in ``sim_dir`` when ``node`` is not one of them ([] when it is, or there are none)."""
    from slurm_hooks.probes import sim

    try:
        names = sorted(n[:-5] for n in os.listdir(sim_dir) if n.endswith(".json") and not n.startswith("."))
    except OSError:
        return []
    try:
        mine = os.path.basename(sim.state_path(sim_dir, node))[:-5]
    except SlurmHooksError:
        return names
    return [] if mine in names else names


def _what(snap: NodeSnapshot) -> str:
    """``: 64 x AMD Instinct MI300X on 8 boards (8 partitions each)``: the models, and the boards a
    partitioned (or two-die) GPU's parts share (by board serial)."""
    by_model: dict[str, list] = {}
    for g in snap.gpus:
        by_model.setdefault(g.model or "unknown model", []).append(g)
    said = []
    for model, gpus in by_model.items():
        boards = len({g.serial or g.uuid for g in gpus})
        parted = any(g.partition is not None for g in gpus)
        split = f" on {boards} boards ({len(gpus) // boards} parts each)" if parted and boards < len(gpus) else ""
        said.append(f"{len(gpus)} x {model}{split}")
    return f": {', '.join(said)}" if said else ""


def gpu_results(cfg: Config, node: str, snap: NodeSnapshot) -> list[Result]:
    """What validate says of one snapshot of this node: the probe, the GPU count, and what of the
    node the probe could not read (a kernel log: XIDs would go unseen)."""
    from slurm_hooks.probes.amdras import AMDSMI

    backend = cfg.gpu.backend
    if snap.error is not None:
        fix = (f"slurm-hooks sim init --node {node}" if backend == "sim"
               else "check the driver with amd-smi; the amdsmi module (ROCm's amd-smi-lib) must load for root"
               if snap.backend in ("amdsmi", "amdgpu-sysfs")
               else "check the driver with nvidia-smi; the NVML library must be loadable by root")
        return [Result("gpu-backend", Status.FAIL, f"{backend}: {snap.error}", fix)]
    source = f" ({snap.backend})" if snap.backend and snap.backend != backend else ""
    out = [Result("gpu-backend", Status.PASS, f"{backend}{source}: {len(snap.gpus)} GPU(s){_what(snap)}"
                                              f"{', driver ' + snap.driver_version if snap.driver_version else ''}")]
    if snap.unread(AMDSMI) is not None:
        out.append(Result("gpu-source", Status.WARN, snap.unread(AMDSMI) or "",
                          "install ROCm's amd-smi-lib and its amdsmi Python module (pip install 'slurm-hooks[amd]' "
                          "beside it) for temperatures, PCIe, XGMI and partitions", cfg.path or ""))
    expected = cfg.expectations_for(node).gpus
    group = cfg.group_for(node)
    if expected is None:
        out.append(Result("gpu-count", Status.WARN,
                          f"no GPU count expected for {node} (group {group}): a GPU missing at boot goes unnoticed",
                          f"set gpus = {len(snap.gpus)} in [expect] or in the node's [groups.<name>]", cfg.path or ""))
    elif expected != len(snap.gpus):
        out.append(Result("gpu-count", Status.FAIL, f"{node} has {len(snap.gpus)} GPU(s), group {group} expects {expected}",
                          "find the missing GPU (lspci; nvidia-smi or amd-smi) or correct gpus in the config",
                          cfg.path or ""))
    else:
        out.append(Result("gpu-count", Status.PASS, f"{node} has the {expected} GPU(s) group {group} expects"))
    if snap.unread(KERNEL_LOG) is not None:
        out.append(Result(KERNEL_LOG, Status.WARN,
                          f"kernel log unreadable: the GPU driver's events not seen ({snap.unread(KERNEL_LOG)})",
                          "run as root (or with CAP_SYSLOG), or point [watch] kmsg at a readable kernel log",
                          cfg.path or ""))
    return out


def check_scontrol(cfg: Config, slurm_conf_path: str | None = None, runner: Callable[..., Any] | None = None) -> list[Result]:
    from slurm_hooks.runner import run_command

    run = runner or run_command
    check = "scontrol"
    scontrol = os.path.join(cfg.slurm.bin_dir, "scontrol")
    env = None
    if slurm_conf_path:
        env = {**os.environ, slurmconf.ENV_VAR: os.path.abspath(slurm_conf_path)}
    timeout = cfg.slurm.timeout
    try:
        done = run([scontrol, "ping"], timeout, check=False, env=env)
    except CommandTimeout:
        return [Result(check, Status.FAIL, f"`{scontrol} ping` did not answer within {timeout:g} s",
                       "is slurmctld up and reachable (SlurmctldHost, firewall, munge)?")]
    except CommandError as exc:
        return [Result(check, Status.FAIL, f"cannot run {scontrol}: {exc.stderr or exc}",
                       "set [slurm] bin_dir to the directory that holds scontrol", cfg.path or "")]
    text = (done.stdout + done.stderr).strip().splitlines()
    if done.returncode != 0:
        last = text[-1] if text else f"exit {done.returncode}"
        return [Result(check, Status.FAIL, f"`{scontrol} ping` exited {done.returncode}: {last}",
                       "start slurmctld, check munge and that SLURM_CONF names this cluster")]
    return [Result(check, Status.PASS, f"`{scontrol} ping`: {text[0] if text else 'ok'}")]


def check_slurm_backend(cfg: Config, slurm_conf_path: str | None = None,
                        runner: Callable[..., Any] | None = None) -> list[Result]:
    """Which Slurm backend the hooks use here and why (``[slurm] backend``: auto takes pyslurm where
    it matches this Slurm and libslurm finds slurm.conf), decided as a hook run decides it,
    without importing pyslurm."""
    from slurm_hooks.slurm.factory import PYSLURM, choose

    env = {slurmconf.ENV_VAR: os.path.abspath(slurm_conf_path)} if slurm_conf_path else None
    choice = choose(cfg.slurm.backend, cfg.slurm.bin_dir, runner, env)
    message = f"{choice.backend}: {choice.why}"
    if cfg.slurm.backend != PYSLURM or choice.backend == PYSLURM:
        return [Result("slurm-backend", Status.PASS, message)]
    if choice.permanent:
        return [Result("slurm-backend", Status.FAIL, message,
                       "install the pyslurm built for this Slurm (pyslurm X.Y for Slurm X.Y), or set [slurm] "
                       "backend = \"auto\"", cfg.path or "")]
    return [Result("slurm-backend", Status.WARN, message,
                   "give the hooks SLURM_CONF (slurm-hooks install --env SLURM_CONF=...), or put slurm.conf "
                   "where libslurm looks for it")]


def mpi_plugins(text: str) -> set[str]:
    """The MPI plugin types ``srun --mpi=list`` names: each indented line after "MPI plugin types
    are...", and the versions of "specific pmix plugin versions available: pmix_v4"."""
    names: set[str] = set()
    for line in text.splitlines():
        if line[:1] in (" ", "\t") and line.strip():
            names.add(line.strip())
        elif "plugin versions available:" in line:
            names.update(v.strip() for v in line.split(":", 1)[1].split(",") if v.strip())
    return names


def check_isolate_mpi(cfg: Config, slurm_conf_path: str | None = None,
                      runner: Callable[..., Any] | None = None) -> list[Result]:
    """``[isolate] mpi`` is a plugin this Slurm's srun offers (an MPI build of all_reduce_perf
    launched without one runs as N one-node tests). A warning, not a failure: only `isolate`
    needs it."""
    from slurm_hooks.runner import run_command

    check, mpi = "isolate-mpi", cfg.isolate.mpi
    if not mpi or mpi == "none":
        return [Result(check, Status.PASS, f"[isolate] mpi = {mpi!r}: all_reduce_perf is launched without an "
                                           "MPI plugin (a build without MPI only)")]
    srun = os.path.join(cfg.slurm.bin_dir, "srun")
    env = {**os.environ, slurmconf.ENV_VAR: os.path.abspath(slurm_conf_path)} if slurm_conf_path else None
    try:
        done = (runner or run_command)([srun, "--mpi=list"], cfg.slurm.timeout, check=False, env=env)
    except (CommandError, CommandTimeout) as exc:
        return [Result(check, Status.WARN, f"cannot run `{srun} --mpi=list`: {exc}",
                       "check it where `slurm-hooks isolate` runs")]
    offered = mpi_plugins(done.stdout + done.stderr)
    if done.returncode != 0 or not offered:
        last = (done.stdout + done.stderr).strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        return [Result(check, Status.WARN, f"`{srun} --mpi=list` named no plugin ({last[0]})",
                       "check it where `slurm-hooks isolate` runs")]
    if mpi in offered:
        return [Result(check, Status.PASS, f"[isolate] mpi = {mpi!r}: srun offers it")]
    return [Result(check, Status.WARN, f"[isolate] mpi = {mpi!r}: srun offers {', '.join(sorted(offered))}",
                   "set [isolate] mpi to one of them (all_reduce_perf built with MPI needs Slurm's plugin), "
                   "or build Slurm with it", cfg.path or "")]


def writable_dir(path: str) -> tuple[bool, str]:
    """Whether this process could create files in ``path`` (making it if needed); never writes."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        return False, f"{probe} exists and is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return False, f"{probe} is not writable by uid {os.geteuid()}"
    if probe != os.path.abspath(path):
        return True, f"will be created under {probe}"
    return True, "writable"


def check_paths(cfg: Config) -> list[Result]:
    out = []
    audit = cfg.log.audit
    ok, why = writable_dir(os.path.dirname(os.path.abspath(audit)))
    if ok and os.path.exists(audit) and not os.access(audit, os.W_OK):
        ok, why = False, f"{audit} exists and is not writable"
    out.append(Result("audit-log", Status.PASS if ok else Status.FAIL, f"[log] audit = {audit}: {why}",
                      "" if ok else f"create {os.path.dirname(audit)} writable by root, or change [log] audit",
                      "" if ok else cfg.path or ""))
    for check, section, key in (("state-dir", "state", "dir"), ("metrics-dir", "metrics", "textfile_dir")):
        path = getattr(getattr(cfg, section), key)
        if not path:
            continue
        ok, why = writable_dir(path)
        out.append(Result(check, Status.PASS if ok else Status.FAIL, f"[{section}] {key} = {path}: {why}",
                          "" if ok else f"create {path} writable by root, or change [{section}] {key}",
                          "" if ok else cfg.path or ""))
    fs = fs_type(cfg.state.dir)
    if fs in VOLATILE_FS:
        out.append(Result("state-dir-volatile", Status.WARN,
                          f"[state] dir = {cfg.state.dir} is on {fs}: it is lost at every reboot, and with it our "
                          "drain markers and the repair ladder's count (the ladder then reads what Slurm's reason "
                          "keeps: [reboot n/m], [replace])",
                          "[state] dir on a disk that survives a reboot (default /var/lib/slurm-hooks)",
                          cfg.path or ""))
    return out


def check_hysteresis_memory(cfg: Config, node: str = "") -> list[Result]:
    """With [hysteresis] on, its memory must be kept: else every run judges alone and says so."""
    from slurm_hooks.checks import hysteresis
    from slurm_hooks.slurm import nodename

    h = hysteresis.from_config(cfg, node or nodename.resolve(None))
    if h.off:
        return []
    trouble = h.trouble()
    if not trouble:
        return [Result(hysteresis.MEMORY_RULE, Status.PASS, f"readings are remembered in {h.path}")]
    return [Result(hysteresis.MEMORY_RULE, Status.WARN, f"cannot remember readings: {trouble}",
                   "free or remount [state] dir read-write: until then [hysteresis] confirm is never reached",
                   cfg.path or "")]


def check_validation(cfg: Config) -> list[Result]:
    """The repair ladder validates before a node returns ([repair] dcgm_level): without a runnable
    dcgmi every repaired node ends [unverified] and waits for a person."""
    level, dcgmi = cfg.repair.dcgm_level, cfg.dcgm.dcgmi
    if not ActionPolicy.of(cfg).may_repair or level <= 0:
        return []
    if os.path.isfile(dcgmi) and os.access(dcgmi, os.X_OK):
        return [Result("repair-validation", Status.PASS, f"repaired nodes return after dcgmi diag -r {level} ({dcgmi})")]
    return [Result("repair-validation", Status.WARN,
                   f"[repair] dcgm_level = {level} but no dcgmi at {dcgmi}: every repaired node stays drained "
                   "[unverified] until a person looks",
                   "install DCGM (datacenter-gpu-manager) and point [dcgm] dcgmi at it, or set [repair] dcgm_level = 0 "
                   "to return nodes on the NVML check alone", cfg.path or "")]


def check_nvrx(cfg: Config, ask: Callable[..., Any] | None = None) -> list[Result]:
    """Whether the watcher answers NVRx's node health check ([interop] nvrx_socket): off, or on and
    answering a real ``RunHealthCheck`` on the socket (its answer shown), with the socket's mode and
    group as the config asks. NVRx skips its check when the socket is missing and counts a service
    that does not answer as healthy, so a socket that is not served is a silent gap: a FAIL here."""
    import grp
    import stat

    from slurm_hooks.interop import nvhcd

    check, it = "nvrx", cfg.interop
    path = it.nvrx_socket
    if not path:
        return [Result(check, Status.PASS, 'off ([interop] nvrx_socket = "")')]
    where = cfg.path or ""
    try:
        nvhcd.require()
    except nvhcd.Unavailable as exc:
        return [Result(check, Status.FAIL, f"[interop] nvrx_socket = {path}, but {exc}: the watcher serves no answer",
                       f"{nvhcd.INSTALL_HINT} where slurm-hooks runs, or set [interop] nvrx_socket = \"\"", where)]
    if it.nvrx_group:
        try:
            nvhcd.group_id(it.nvrx_group)
        except SlurmHooksError as exc:
            return [Result(check, Status.FAIL, f"[interop] nvrx_group: {exc}: the watcher serves no answer",
                           "name a group the users whose jobs use NVRx belong to", where)]
    try:
        st = os.stat(path)
    except OSError as exc:
        return [Result(check, Status.FAIL, f"[interop] nvrx_socket = {path}: {exc.strerror}: NVRx skips its check "
                       "without a word", "start slurm-hooks watch on this node (systemctl start slurm-hooks-watch)",
                       where)]
    if not stat.S_ISSOCK(st.st_mode):
        return [Result(check, Status.FAIL, f"{path} is not a socket", "remove it, then restart slurm-hooks watch",
                       where)]
    try:
        said = (ask or nvhcd.ask)(path, (), timeout=it.nvrx_wait + 5.0)
    except SlurmHooksError as exc:
        return [Result(check, Status.FAIL, f"[interop] nvrx_socket = {path} does not answer: {exc}: NVRx counts that "
                       "as healthy", "restart slurm-hooks watch and read its log (journalctl -u slurm-hooks-watch)",
                       where)]
    mode = stat.S_IMODE(st.st_mode)
    group = str(st.st_gid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        pass
    shape = f"mode {mode:04o}, group {group}"
    verdict = f"{'healthy' if said.healthy else 'UNHEALTHY'}: {said.message}"
    wrong = []
    if mode != nvhcd.SOCKET_MODE:
        wrong.append(f"mode {mode:04o}, not {nvhcd.SOCKET_MODE:04o}")
    if it.nvrx_group and it.nvrx_group not in (group, str(st.st_gid)):
        wrong.append(f"group {group}, not {it.nvrx_group}")
    if wrong:
        return [Result(check, Status.WARN, f"{path} answers ({verdict}), but its {' and '.join(wrong)}",
                       "restart slurm-hooks watch: it sets both when it makes the socket", where)]
    return [Result(check, Status.PASS, f"answers NVRx on {path} ({shape}): {verdict}")]


def check_notify_secrets(cfg: Config) -> list[Result]:
    """A receiver's URL is a credential (anyone holding a Slack webhook URL can post to the channel): the
    file it is written in, the config or its ``url_file`` (and an ``auth_file``), must be readable by
    its owner alone: no group or other read bit (0600 and 0400 pass, 0640 and 0644 fail); and it must
    be readable by us. Never prints a URL."""
    from slurm_hooks.observe.destinations import read_auth

    check = "notify-secrets"
    tables = [(kind, n, t) for kind in config_mod.DESTINATION_KEYS for n, t in enumerate(getattr(cfg.notify, kind))]
    if not tables:
        return []
    problems: list[str] = []
    seen: dict[tuple[str, str], str] = {}
    same: list[str] = []
    for kind, n, table in tables:
        label = f"[[notify.{kind}]] #{n + 1}"
        if urlsecret.holds_secret(table) and cfg.path:
            exposed = _readable_beyond_owner(cfg.path)
            if exposed:
                problems.append(f"{label} has its url written in {cfg.path}, which is {exposed}")
        for key in ("url_file", "auth_file"):
            path = table.get(key)
            exposed = _readable_beyond_owner(path) if path and os.path.exists(path) else ""
            if exposed:
                problems.append(f"{label} {key} {path} is {exposed}")
        try:
            url = urlsecret.resolve_url(table, label)
            if (kind, url) in seen:
                same.append(f"{label} and {seen[kind, url]} name the same URL")
            seen.setdefault((kind, url), label)
            if table.get("auth_file"):
                read_auth(table["auth_file"])
        except ConfigError as exc:
            problems.append(str(exc))
        except OSError as exc:
            problems.append(f"{label} auth_file {table['auth_file']}: cannot read: {exc.strerror}")
        except ValueError as exc:
            why = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else str(exc)
            problems.append(f"{label} auth_file {table['auth_file']}: {why}")
    out = []
    if same:
        out.append(Result("notify-duplicates", Status.WARN,
                          "; ".join(same) + ": both are kept, so every message goes there twice",
                          "remove one of the tables, or point it at the receiver it was meant for", cfg.path or ""))
    if problems:
        return [Result(check, Status.FAIL, "; ".join(problems),
                       "chmod 600 the file (owned by root), keep the URL alone on one line, or move it to "
                       "url_file = \"/etc/slurm-hooks/<name>.url\" (mode 0600)", cfg.path or ""), *out]
    return [Result(check, Status.PASS, f"{len(tables)} receiver URL(s) readable by us; every file holding one "
                   "(the config, a url_file, an auth_file) is readable by its owner alone (no group or other read bit)"),
            *out]


def check_notify_receivers(cfg: Config) -> list[Result]:
    """A receiver out now (its last delivery failed: its messages wait, held back): FAIL, with since
    when and its last error, from the notifier's live state on this host (``pace.json``)."""
    import time

    from slurm_hooks import fsutil
    from slurm_hooks.observe import receivers
    from slurm_hooks.observe.notify import NotifySettings

    settings = NotifySettings.from_config(cfg)
    if not settings.configured:
        return []
    names = {d.name: d.where for d in settings.destinations(problem=lambda m: None).values()}
    pace = fsutil.read_json(os.path.join(settings.dir, "pace.json"), missing={}, error={})
    out = [o for o in receivers.live(pace if isinstance(pace, dict) else {}, names) if o.receiver in names]
    if not out:
        return [Result("notify-receivers", Status.PASS, f"no receiver out of {len(names)} (as this host's notifier "
                       "last found them)")]
    now = time.time()
    return [Result("notify-receivers", Status.FAIL, o.line(now),
                   "mend the receiver (its credentials, its URL, its service), then `slurm-hooks notify test`: a "
                   "receiver that takes the test is no longer held back and what waits goes at once",
                   os.path.join(settings.dir, "pace.json")) for o in out]


def _readable_beyond_owner(path: str) -> str:
    """Who besides the file's owner may read ``path``, with its mode and the command that ends it; ""
    when no one does (0600, 0400)."""
    mode = os.stat(path).st_mode & 0o777
    who = [name for bit, name in ((0o040, "its group"), (0o004, "others")) if mode & bit]
    if not who:
        return ""
    return f"readable by {' and '.join(who)} (mode {mode:04o}): run chmod 600 {path}"


#: File systems that do not survive a reboot.
VOLATILE_FS = ("tmpfs", "ramfs")


def fs_type(path: str, mounts: str = "/proc/mounts") -> str:
    """The type of the file system that holds ``path`` (or would, once made); "" when unknown."""
    target = os.path.abspath(path)
    try:
        with open(mounts, encoding="utf-8") as fh:
            rows = [line.split() for line in fh]
    except OSError:
        return ""
    best, kind = "", ""
    for row in rows:
        if len(row) < 3:
            continue
        point = row[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, row[2]
    return kind


def check_bridge(cfg: Config) -> list[Result]:
    """Kubernetes credentials load and allow every verb the bridge uses."""
    from slurm_hooks.bridge import access as kube_access
    from slurm_hooks.bridge import kubeclient, rbac
    from slurm_hooks.bridge import settings as bridge_settings
    from slurm_hooks.bridge.kubeclient import CredentialsError, KubeClientMissing

    check = "kube-access"
    try:
        settings = bridge_settings.from_config(cfg)
    except ConfigError as exc:
        return [config_failure("bridge-config", exc)]
    try:
        client, source = kubeclient.load_credentials(settings.kubeconfig or None, settings.context or None)
    except KubeClientMissing:
        return [Result(check, Status.WARN, "kubernetes client not installed (bridge environment only)",
                       "run validate where the bridge runs, or pip install 'slurm-hooks[k8s]'")]
    except CredentialsError as exc:
        return [Result(check, Status.FAIL, str(exc),
                       "set [bridge] kubeconfig, or run in a pod with a service account token")]
    try:
        from slurm_hooks.bridge.leader import lease_namespace
        from slurm_hooks.bridge.replace import ReplacementError, template_groups

        try:
            groups = template_groups(settings.replace, settings.reboot)
        except (ReplacementError, ConfigError) as exc:
            return [Result(check, Status.FAIL, str(exc), "fix the template: its apiVersion names the group to ask about")]
        needed = kube_access.permissions_for(rbac.rules(settings, groups), lease_namespace(settings.lease_namespace))
        verdicts = kube_access.review(client, needed)
    except TransientError as exc:
        return [Result(check, Status.FAIL, f"{source}: {exc}", "is the API server reachable from here?")]
    except CredentialsError as exc:
        return [Result(check, Status.FAIL, f"{source}: {exc}", "renew the token or client certificate")]
    finally:
        kube_access.close(client)
    denied = [v for v in verdicts if not v.allowed]
    if denied:
        return [Result(check, Status.FAIL, f"{source}: not allowed to {v.permission}{': ' + v.reason if v.reason else ''}",
                       f"grant it in the bridge's ClusterRole: {v.permission.rule()}") for v in denied]
    return [Result(check, Status.PASS, f"{source}: all {len(verdicts)} permissions the bridge needs are allowed")]
