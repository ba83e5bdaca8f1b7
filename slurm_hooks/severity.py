"""The severity table: for every finding, which jobs it touches (scope) and how soon (urgency).

One table, keyed by a finding's rule: ``xid.<code>`` rows come from NVIDIA's catalogue (the
generated :mod:`slurm_hooks.xid.catalog`, its "immediate" and "investigatory" columns), the
checks' rows are :data:`CHECK_RULES`. An admin overrides any row in config::

    [severity.xid.79]
    urgency = "job-end"
    [severity.check.row-remap]
    urgency = "now"
    action = "reset"

- scope ``gpu``: only the jobs whose allocation holds the finding's GPU; ``node``: every job
  on the node (a finding tied to no GPU is ``node``, or ``fabric``); ``fabric``: every job that
  spans nodes (a network link), a job on this node alone is left to run.
- urgency ``now``: drain and requeue the touched jobs at once; ``job-end``: drain, requeue
  nothing, the remedy waits for the node to empty; ``watch``: record it, act on nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

from slurm_hooks.models import Action, Finding, Scope, Severity, Urgency
from slurm_hooks.values import dataclass, field, replace

_G, _N, _F = Scope.GPU, Scope.NODE, Scope.FABRIC
_NOW, _END, _WATCH = Urgency.NOW, Urgency.JOB_END, Urgency.WATCH


@dataclass(frozen=True)
class Rule:
    scope: Scope
    urgency: Urgency
    #: What the finding suggests (the check's own action; ``None``: it varies per finding).
    action: Action | None = None


#: Rule -> default. The action column is the check's own (documented here; a test keeps them equal);
#: a config override of ``action`` replaces it.
CHECK_RULES: dict[str, Rule] = {
    # The node could not be read: nothing new lands, but its running jobs may be fine.
    "gpu-probe": Rule(_N, _END, Action.DRAIN),
    # Fewer GPUs than expected: one took the bus (or the node) with it.
    "gpu-count": Rule(_N, _NOW, Action.REBOOT),
    # One lost GPU is its jobs' loss; a lost bus shows as several lost GPUs or a short count.
    "gpu-lost": Rule(_G, _NOW, Action.REPLACE),
    "gpu-reset-required": Rule(_G, _NOW, Action.RESET),
    "gpu-model": Rule(_N, _END, Action.DRAIN),
    "probe": Rule(_G, _WATCH, Action.WARN),
    # What a run could not read or keep, so that its verdict says less than it seems: told, never acted on.
    "kernel-log": Rule(_N, _WATCH, Action.WARN),
    "hysteresis-memory": Rule(_N, _WATCH, Action.WARN),
    "ecc": Rule(_G, _NOW, Action.RESET),
    "ecc-aggregate": Rule(_G, _END, Action.REPLACE),
    # Poisoned data not yet consumed (AMD's deferred errors): a job that reads it gets an uncorrectable.
    "ecc-deferred": Rule(_G, _WATCH, Action.WARN),
    # Retired memory by status (AMD's bad-page table): pending waits for a reset; unreservable, or as
    # many retired as the board may have, is an RMA when its jobs end.
    "bad-pages-pending": Rule(_G, _END, Action.RESET),
    "bad-pages-threshold": Rule(_G, _END, Action.REPLACE),
    "bad-pages-unreservable": Rule(_G, _END, Action.REPLACE),
    # AMD's GPU-to-GPU links: the error status stays until a reset.
    "xgmi": Rule(_G, _END, Action.RESET),
    "retired-pages": Rule(_G, _END, Action.RESET),
    "row-remap": Rule(_G, _END, Action.RESET),
    "row-remap-failure": Rule(_G, _NOW, Action.REPLACE),
    "pcie": Rule(_G, _END, Action.DRAIN),
    "nvlink": Rule(_G, _END, Action.RESET),
    "nvlink-errors": Rule(_G, _END, Action.WARN),
    "thermal": Rule(_G, _END, Action.DRAIN),
    "memory-thermal": Rule(_G, _WATCH, Action.WARN),
    "throttle": Rule(_G, _END, Action.WARN),
    "persistence": Rule(_G, _WATCH, Action.WARN),
    "fabric": Rule(_N, _NOW, Action.DRAIN),
    "leftover": Rule(_G, _NOW, Action.DRAIN),
    "busy": Rule(_G, _NOW, Action.DRAIN),
    "dcgm": Rule(_G, _NOW, None),
    # The driver's own verdict (NVML's GPU recovery action, XID 154).
    "driver-reset": Rule(_G, _NOW, Action.RESET),
    "driver-reboot": Rule(_N, _NOW, Action.REBOOT),
    "driver-drain-p2p": Rule(_G, _END, Action.DRAIN),
    "driver-drain-and-reset": Rule(_G, _END, Action.RESET),
    "driver-unknown": Rule(_G, _WATCH, Action.WARN),
    # InfiniBand/RoCE (slurm_hooks.checks.links): a link is no GPU; the jobs that span nodes use it.
    "ib-down": Rule(_F, _NOW, Action.DRAIN),
    "ib-ports": Rule(_F, _NOW, Action.DRAIN),
    "ib-gone": Rule(_F, _NOW, Action.DRAIN),
    "ib-rate": Rule(_F, _END, Action.DRAIN),
    "ib-errors": Rule(_F, _END, Action.DRAIN),
    "ib-degraded": Rule(_F, _WATCH, Action.WARN),
    "ib-unjudged": Rule(_F, _WATCH, Action.WARN),
    "ib-flaps": Rule(_F, _END, Action.DRAIN),
    "ib-flap": Rule(_F, _WATCH, Action.WARN),
    # RoCE (link_layer Ethernet) ports, judged apart: their transport counters only warn.
    "roce-down": Rule(_F, _NOW, Action.DRAIN),
    "roce-ports": Rule(_F, _NOW, Action.DRAIN),
    "roce-gone": Rule(_F, _NOW, Action.DRAIN),
    "roce-rate": Rule(_F, _END, Action.DRAIN),
    "roce-degraded": Rule(_F, _WATCH, Action.WARN),
    "roce-unjudged": Rule(_F, _WATCH, Action.WARN),
    "roce-flaps": Rule(_F, _END, Action.DRAIN),
    "roce-flap": Rule(_F, _WATCH, Action.WARN),
    # The links' counter memory cannot be written: no rate or unseen flap is judged until it can.
    "links-memory": Rule(_N, _WATCH, Action.WARN),
    # mlx5 kernel lines (slurm_hooks.probes.kmsg): an overheating cable module, a slot short of power.
    "ib-module-temperature": Rule(_F, _END, Action.DRAIN),
    "ib-power": Rule(_F, _END, Action.DRAIN),
    # Counter reads refused on a restricted function (DGX, GB200): noise, unless nothing else explains a fault.
    "ib-access-reg": Rule(_F, _WATCH, Action.WARN),
    # amdgpu kernel lines (slurm_hooks.probes.amdgpu_log), judged like XIDs by slurm_hooks.checks.amdgpu.
    # An uncorrectable error in the HBM (UMC block): the job read bad memory; the driver retires the
    # page, a reset puts the retirement in force. The line is printed once per new error, never for a
    # count that merely stands.
    "amdgpu-ue-umc": Rule(_G, _NOW, Action.RESET),
    # In any other block (gfx, sdma, mmhub, ...): the GPU's state is not to be trusted until reset.
    "amdgpu-ue": Rule(_G, _NOW, Action.RESET),
    # In an XGMI link: the driver resets every GPU of the hive, so every job on the node loses its GPUs.
    "amdgpu-ue-xgmi": Rule(_N, _NOW, Action.RESET),
    # A job read memory an uncorrectable error had poisoned: its results are wrong; the driver resets.
    "amdgpu-poison": Rule(_G, _NOW, Action.RESET),
    # The driver's own reset did not bring the GPU back: only a reboot may.
    "amdgpu-reset-failed": Rule(_G, _NOW, Action.REBOOT),
    # The retired pages reached the driver's threshold: the driver itself marks the board for RMA.
    "amdgpu-bad-pages": Rule(_G, _END, Action.REPLACE),
    # Recorded, never acted on: a deferred error not yet read, the driver's reset that came back, the
    # VRAM that reset wiped (its jobs fail on their own), a ring that hung (an application, as a rule).
    "amdgpu-deferred": Rule(_G, _WATCH, Action.WARN),
    "amdgpu-reset": Rule(_G, _WATCH, Action.WARN),
    "amdgpu-vram-lost": Rule(_G, _WATCH, Action.WARN),
    "amdgpu-ring-timeout": Rule(_G, _WATCH, Action.WARN),
    # amdsmi's events in the watcher (slurm_hooks.probes.amdsmi_events): a GPU page fault of a process
    # is the job's own bug as a rule (NVIDIA's XID 31 is its like), a GPU that throttles for heat is
    # judged by the thermal check's readings; both are recorded, never acted on.
    "amdgpu-vm-fault": Rule(_G, _WATCH, Action.WARN),
    "amdgpu-thermal-throttle": Rule(_G, _WATCH, Action.WARN),
    # A check that crashed or ran out of time says nothing about the jobs.
    "check-error": Rule(_N, _END, None),
}

#: A rule the table does not name: node-wide, at once, with the action its finding asks for (the safe side).
FALLBACK = Rule(_N, _NOW, None)
#: An XID the catalogue does not know.
UNKNOWN_XID = Rule(_G, _WATCH, Action.WARN)

OVERRIDE_KEYS = ("scope", "urgency", "action")


def xid_rule_key(code: int) -> str:
    return f"xid.{code}"


def default_rule(key: str) -> Rule:
    if key.startswith("xid."):
        from slurm_hooks.xid.catalog import lookup

        info = lookup(int(key[4:])) if key[4:].isdigit() else None
        return UNKNOWN_XID if info is None else Rule(info.scope, info.urgency, info.action)
    return CHECK_RULES.get(key, FALLBACK)


@dataclass(frozen=True)
class Severities:
    """The table with an admin's overrides: rule key -> {"scope"|"urgency"|"action": value}."""

    overrides: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def rule(self, key: str) -> Rule:
        return self.over(key, default_rule(key))

    def over(self, key: str, base: Rule) -> Rule:
        """``base`` (the row's default) with the admin's override of ``key`` laid over it."""
        over = self.overrides.get(key)
        if not over:
            return base
        return Rule(Scope(over["scope"]) if "scope" in over else base.scope,
                    Urgency(over["urgency"]) if "urgency" in over else base.urgency,
                    Action(over["action"]) if "action" in over else base.action)

    def apply(self, finding: Finding) -> Finding:
        """The finding with its row's scope and urgency (and the admin's action, if one is set)."""
        key = finding.rule_key
        rule = self.rule(key)
        scope = rule.scope if finding.gpu is not None or rule.scope is Scope.FABRIC else Scope.NODE
        changes: dict = {"scope": scope, "urgency": rule.urgency}
        action = self.overrides.get(key, {}).get("action")
        if action is not None and finding.severity is not Severity.OK:
            changes["action"] = Action(action)
            changes["severity"] = Severity.FAIL if changes["action"].takes_node_out else Severity.WARN
        return replace(finding, **changes)


DEFAULT = Severities()


def table(severities: Severities = DEFAULT) -> list[tuple[str, Rule]]:
    """Every row that acts or may act: the checks', then the XIDs that are not merely watched."""
    from slurm_hooks.xid.catalog import CATALOG

    rows = [(key, severities.rule(key)) for key in CHECK_RULES]
    for code in sorted(CATALOG):
        key = xid_rule_key(code)
        rule = severities.rule(key)
        if rule.urgency is not Urgency.WATCH or (rule.action is not None and rule.action.takes_node_out):
            rows.append((key, rule))
    return rows


def markdown_table(severities: Severities = DEFAULT) -> str:
    """docs/severity.md's table of defaults (``tools/gen_severity_table.py`` writes it there)."""
    lines = ["| rule | scope | urgency | action |", "|---|---|---|---|"]
    for key, rule in table(severities):
        action = rule.action.value if rule.action is not None else "per finding"
        lines.append(f"| `{key}` | {rule.scope.value} | {rule.urgency.value} | {action} |")
    return "\n".join(lines) + "\n"
