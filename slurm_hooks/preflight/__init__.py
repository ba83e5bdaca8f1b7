"""The admin's preflight: is this cluster set up so that the hooks can do their job?

Each check returns :class:`Result` lines (PASS, WARN or FAIL, what was found, how
to fix it, and where: ``file:line`` when a setting is to blame). The slurm.conf
checks are pure functions of a parsed :class:`~slurm_hooks.preflight.slurmconf.SlurmConf`
and our config; the environment checks (GPU probe, scontrol, directories,
Kubernetes access) look at the machine. :func:`run` calls them all.
"""

from __future__ import annotations

from typing import Any, Callable

from slurm_hooks.errors import ConfigError
from slurm_hooks.preflight import slurmconf
from slurm_hooks.preflight.environment import (
    check_bridge,
    check_gpus,
    check_hysteresis_memory,
    check_isolate_mpi,
    check_notify_receivers,
    check_notify_secrets,
    check_nvrx,
    check_paths,
    check_scontrol,
    check_slurm_backend,
    check_validation,
    check_wrappers,
    load_config,
)
from slurm_hooks.preflight.results import Result, Status, passed
from slurm_hooks.preflight.slurmconf_checks import check_slurm_conf

__all__ = ["Result", "Status", "passed", "run"]


def run(config_path: str | None = None, slurm_conf_path: str | None = None, node: str | None = None,
        *, runner: Callable[..., Any] | None = None) -> list[Result]:
    """Every check. Never raises for a bad input: that is a FAIL line."""
    cfg, results = load_config(config_path)
    try:
        conf = slurmconf.load(slurm_conf_path)
    except ConfigError as exc:
        fix = f"pass --slurm-conf PATH or set {slurmconf.ENV_VAR}" if "not found" in str(exc) else "fix that line"
        results.append(Result("slurm-conf", Status.FAIL, str(exc), fix))
        conf = None
    if conf is not None:
        more = f" (+{len(conf.files) - 1} included)" if len(conf.files) > 1 else ""
        results.append(Result("slurm-conf", Status.PASS, f"read{more}", "", conf.path))
        results += check_slurm_conf(conf, cfg, node)  # cfg None: only what needs none of our settings
    if cfg is None:
        return results  # the config FAIL says it all; checks below would judge the wrong settings
    if node:
        results += check_gpus(cfg, node)
    results += check_scontrol(cfg, conf.path if conf is not None else slurm_conf_path, runner)
    results += check_slurm_backend(cfg, conf.path if conf is not None else slurm_conf_path)
    results += check_isolate_mpi(cfg, conf.path if conf is not None else slurm_conf_path, runner)
    results += check_paths(cfg)
    results += check_hysteresis_memory(cfg, node or "")
    results += check_validation(cfg)
    results += check_notify_secrets(cfg)
    results += check_notify_receivers(cfg)
    results += check_nvrx(cfg)
    results += check_wrappers(cfg)
    if "bridge" in cfg.raw:
        results += check_bridge(cfg)
    return results
