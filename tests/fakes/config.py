"""The one throwaway config for tests: simulated GPUs, audit log and state under a tmp dir."""

from __future__ import annotations

from pathlib import Path

#: Slurm's gres.conf of the test nodes: eight GPUs, GRES index K on /dev/nvidiaK (the sim's GPU K).
GRES_CONF = "Name=gpu File=/dev/nvidia[0-7]\n"


def write_sim_config(tmp_path: Path, extra: str = "") -> Path:
    """``config.toml`` in ``tmp_path`` with the sim backend and a ``gres.conf`` (:data:`GRES_CONF`,
    unless the test wrote its own there first); ``extra`` is appended TOML.

    The repair ladder is off unless ``extra`` has a ``[repair]`` table: these tests are of
    detection, drain and resume; the ladder's own are in test_repair.py and test_e2e_repair.py."""
    path = Path(tmp_path) / "config.toml"
    if "[repair]" not in extra:
        extra = f"{extra}\n[repair]\nenabled = false\n"
    gres = Path(tmp_path) / "gres.conf"
    if not gres.exists():
        gres.write_text(GRES_CONF)
    path.write_text(f"""\
[gpu]
backend = "sim"
sim_dir = "{tmp_path}/sim"
gres_conf = "{gres}"

[log]
audit = "{tmp_path}/audit.jsonl"

[state]
dir = "{tmp_path}/state"

{extra}
""")
    return path


def sim_config(tmp_path: Path, extra: str = ""):
    """The loaded :class:`slurm_hooks.config.Config` of :func:`write_sim_config`."""
    from slurm_hooks import config

    return config.load(str(write_sim_config(tmp_path, extra)))


def repair_config(tmp_path: Path, extra: str = ""):
    """:func:`sim_config` with the repair ladder on, ``[expect] gpus = 8``, and the sim's dcgmi and
    rvs (``slurm-hooks sim tools``) as ``[dcgm] dcgmi`` and ``rvs``: each repair is validated before the node
    returns ([repair] dcgm_level 2). ``extra`` goes into the ``[repair]`` table. Call
    :func:`slurm_hooks.probes.sim.set_diag_seconds` for a fast diagnostic."""
    from slurm_hooks.probes import simtools

    tools = simtools.install(str(Path(tmp_path) / "bin"), str(Path(tmp_path) / "sim"))
    return sim_config(tmp_path, f'[expect]\ngpus = 8\n[repair]\nenabled = true\n{extra}\n'
                                f'[dcgm]\ndcgmi = "{tools["dcgmi"]}"\nrvs = "{tools["rvs"]}"\n')


def nvml_wiring(tmp_path: Path, slurm, nvml, kmsg_path):
    """A node ``n1`` expecting 8 GPUs, read by the real NVML probe over ``nvml`` (a FakeNvml)
    and the kernel log at ``kmsg_path``, keeping the GPUs' identities in the state dir as the
    installed probe does, acting on ``slurm`` (a FakeSlurm)."""
    from slurm_hooks.observe.audit import AuditLog
    from slurm_hooks.probes.identity import store_path
    from slurm_hooks.probes.nvml import NvmlProbe
    from slurm_hooks.remedy.wiring import Wiring

    cfg = sim_config(tmp_path, "[expect]\ngpus = 8\n")
    probe = NvmlProbe("n1", kmsg_path=str(kmsg_path), nvml=nvml, gpu_map_path=store_path(cfg.state.dir, "n1"))
    return Wiring(cfg, "n1", AuditLog(cfg.log.audit), probe_override=probe, slurm_override=slurm)


def sim_node(cfg, state: str, *jobs: int):
    """Node ``n1`` with 8 healthy simulated GPUs in ``cfg``'s sim dir, in Slurm ``state`` in a fresh
    FakeSlurm with ``jobs`` on it: ``(slurm, wiring)``, the :class:`Wiring` a hook runs with there."""
    from slurm_hooks.observe.audit import AuditLog
    from slurm_hooks.probes import sim
    from slurm_hooks.remedy.wiring import Wiring

    from .slurm import FakeSlurm

    sim.init(cfg.gpu.sim_dir, "n1", 8)
    slurm = FakeSlurm()
    slurm.add_node("n1", state)
    for job in jobs:
        slurm.add_job(job, "n1")
    return slurm, Wiring(cfg, "n1", AuditLog(cfg.log.audit), slurm_override=slurm)


def notify_settings(audit: str, dir: str, cluster: str = "", resume_timeout: float = 0.0, **notify):
    """A :class:`slurm_hooks.observe.notify.NotifySettings` whose ``[notify]`` keys are ``notify`` (the rest
    at their defaults), as if read from a config file."""
    from slurm_hooks.config import NotifySection
    from slurm_hooks.observe.notify import NotifySettings

    return NotifySettings(audit, dir, NotifySection(**notify), cluster, resume_timeout)
