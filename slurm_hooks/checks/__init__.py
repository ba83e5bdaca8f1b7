"""The registry: every check family, in one explicit list.

A check is a pure function ``CheckInput -> iterable of Finding``. Adding a check
is adding one function in its family's module and one line here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from slurm_hooks.checks import (
    amdgpu,
    dcgm,
    ecc,
    fabric,
    gpus,
    links,
    nvlink,
    pcie,
    persistence,
    processes,
    recovery,
    remap,
    thermal,
    xgmi,
    xid,
)
from slurm_hooks.models import CheckInput, Context, Finding
from slurm_hooks.values import dataclass

CheckFn = Callable[[CheckInput], Iterable[Finding]]

_ALL = frozenset(Context)
_NOT_EPILOG_ONLY = frozenset({Context.CHECK, Context.PROLOG, Context.EPILOG, Context.WATCH})
#: Where the hooks gather the node's links (slurm_hooks.probes.ib): elsewhere they look at nothing.
_LINKS = frozenset({Context.CHECK, Context.WATCH})


@dataclass(frozen=True)
class Check:
    name: str
    fn: CheckFn
    contexts: frozenset = _ALL


REGISTRY: tuple[Check, ...] = (
    Check("gpu-count", gpus.check_count, frozenset({Context.CHECK, Context.PROLOG, Context.EPILOG})),
    Check("gpu-lost", gpus.check_lost),
    Check("gpu-model", gpus.check_model, frozenset({Context.CHECK, Context.PROLOG})),
    Check("probe", gpus.check_probe_errors),
    Check("xid", xid.check_xids),
    Check("amdgpu", amdgpu.check_events),
    Check("recovery-action", recovery.check_recovery_action),
    Check("ecc", ecc.check_uncorrectable),
    Check("retired-pages", remap.check_retired_pages),
    Check("row-remap", remap.check_row_remap),
    Check("bad-pages", remap.check_bad_pages),
    Check("pcie", pcie.check_link, frozenset({Context.CHECK, Context.PROLOG})),
    Check("nvlink", nvlink.check_links, frozenset({Context.CHECK, Context.PROLOG, Context.EPILOG})),
    Check("xgmi", xgmi.check_xgmi, frozenset({Context.CHECK, Context.PROLOG, Context.EPILOG})),
    Check("thermal", thermal.check_temperature, frozenset({Context.CHECK, Context.PROLOG, Context.EPILOG})),
    Check("throttle", thermal.check_throttle, frozenset({Context.CHECK})),
    Check("persistence", persistence.check_persistence_mode, frozenset({Context.CHECK, Context.PROLOG})),
    Check("fabric", fabric.check_fabric_manager, frozenset({Context.CHECK, Context.PROLOG})),
    Check("leftover", processes.check_leftovers, frozenset({Context.EPILOG})),
    Check("busy", processes.check_busy_idle_node, frozenset({Context.PROLOG})),
    Check("links", links.check_ports, _LINKS),
    Check("link-errors", links.check_counters, _LINKS),
    Check("link-flaps", links.check_flaps, _LINKS),
    Check("link-events", links.check_kernel_events, _LINKS),
    Check("dcgm", dcgm.check_diag, frozenset({Context.CHECK, Context.PROLOG, Context.EPILOG})),
)


def for_context(context: Context) -> tuple[Check, ...]:
    return tuple(c for c in REGISTRY if context in c.contexts)
