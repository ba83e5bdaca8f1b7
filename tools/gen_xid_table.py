#!/usr/bin/env python3
"""Generate ``slurm_hooks/xid/catalog.py`` from NVIDIA's XID catalogue (CSV).

The catalogue is data, not ``if`` chains: NVIDIA's resolution buckets are turned
into our actions by one small table (BUCKET_ACTIONS) plus the curated
OVERRIDES, and the result is written as plain literals so that importing it on
every health check run costs next to nothing.

    python tools/gen_xid_table.py [CSV] [-o slurm_hooks/xid/catalog.py]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CSV = os.path.join(REPO, "tests", "fixtures", "xid", "xid-catalog.csv")
DEFAULT_OUT = os.path.join(REPO, "slurm_hooks", "xid", "catalog.py")
SOURCE = ("NVIDIA's XID catalogue as shipped in\nNVSentinel's Xid-Catalog.xlsx "
          "(file last changed 2025-10-17, commit e5419d11b222)")

# NVIDIA's "Immediate Action" bucket -> our action. The investigatory bucket is
# kept in the table for humans but does not change what the node does.
BUCKET_ACTIONS = {
    # The application failed, the node is fine: tell the user.
    "RESTART_APP": "none",
    "IGNORE": "none",
    "WORKFLOW_XID_13": "none",
    "WORKFLOW_XID_31": "none",
    "WORKFLOW_XID_45": "none",
    # Informational; the XID it accompanies carries the action.
    "XID_154": "none",
    # Only matters with UVM/vGPU, which Slurm GPU nodes do not use.
    "CHECK_UVM": "warn",
    "RESET_GPU": "reset",
    "RESTART_BM": "reboot",
    "RESTART_VM": "reboot",
    # Needs an admin (driver/firmware update, or a human to look); no reset helps.
    "UPDATE_SWFW": "drain",
    "CONTACT_SUPPORT": "drain",
    # A cable or power connector: only hands at the machine fix it.
    "CHECK_MECHANICALS": "replace",
}

# Curated from field practice (gpud's and NVSentinel's XID tables, DESIGN.md):
# these win over the bucket mapping above.
OVERRIDES = {
    13: "none", 31: "none", 43: "none", 45: "none",  # application errors / cleanup
    46: "reset",  # GPU stopped processing
    48: "reset",  # double-bit ECC (WORKFLOW_XID_48: solo -> reset GPU)
    63: "none",  # row remap recorded; NVML's row-remap state says whether a reset is due
    64: "replace",  # row remap failure: RMA candidate
    74: "reset",  # NVLink error; repeats escalate to hardware
    # GPU has fallen off the bus: NVIDIA says reboot the node first (RESTART_BM); the repair
    # ladder escalates to replace only when it survives a reboot or recurs. A [replace] here
    # would let the Kubernetes bridge replace a node the ladder is about to reboot.
    79: "reboot",
    92: "warn",  # high single-bit ECC rate
    94: "none",  # contained ECC: restart the app
    95: "reset",  # uncontained ECC
    119: "reset", 120: "reset",  # GSP timeout / error
    140: "reset",  # unrecovered ECC
    143: "replace",  # GPU initialisation failure
    **{code: "reset" for code in range(144, 151)},  # NVLink5 errors (WORKFLOW_NVLINK5_ERR)
    169: "reset",  # SEC2 micro-controller halt, no bucket yet; as its sibling 62 (PMU halt)
}

# NVIDIA's "Immediate Action" bucket -> how soon we act (for an XID that acts at all): at once
# when the GPU cannot go on or its results are wrong; when the running jobs end when it needs
# a person (firmware, support, a cable) but keeps computing correctly.
BUCKET_URGENCY = {
    "RESET_GPU": "now",
    "RESTART_BM": "now",
    "RESTART_VM": "now",
    "WORKFLOW_XID_48": "now",
    "WORKFLOW_NVLINK_ERR": "now",
    "WORKFLOW_NVLINK5_ERR": "now",
    "UPDATE_SWFW": "job-end",
    "CONTACT_SUPPORT": "job-end",
    "CHECK_MECHANICALS": "job-end",
}

# Curated: degrading, not failing (the row remap is recorded; the error rate is rising): the node
# is drained (where the action says so) and its jobs finish.
URGENCY_OVERRIDES = {63: "job-end", 92: "job-end"}

# The "Investigatory Action" column: a fabric manager restart touches every GPU of the node.
NODE_SCOPE_HINTS = ("RESTART_FM",)

# Newer XIDs without a bucket yet, and "Unused" ones: worth telling an admin, not acting on.
DEFAULT_ACTION = "warn"

_ACTION_ENUM = {a: a.upper() for a in ("none", "warn", "drain", "reset", "reboot", "replace")}


def severity(action: str) -> str:
    """None and warn only tell someone; drain or worse fails the node."""
    return "WARN" if action in ("none", "warn") else "FAIL"


def _clean(text: str, sep: str = " ") -> str:
    return sep.join(part.strip() for part in text.strip().splitlines() if part.strip())


def action_for(code: int, description: str, immediate: str) -> str:
    if code in OVERRIDES:
        return OVERRIDES[code]
    if description == "Unused":
        return DEFAULT_ACTION
    return BUCKET_ACTIONS.get(immediate, DEFAULT_ACTION)


def urgency_for(code: int, immediate: str, action: str) -> str:
    """``watch`` for an XID that does not act; else the curated or the bucket's urgency ("now"
    for a bucket without one: an XID we act on is worth acting on at once)."""
    if code in URGENCY_OVERRIDES:
        return URGENCY_OVERRIDES[code]
    if action in ("none", "warn"):
        return "watch"
    return BUCKET_URGENCY.get(immediate, "now")


def scope_for(investigatory: str) -> str:
    """An XID names one GPU: its jobs are the ones touched, unless the remedy is the node's."""
    return "node" if any(hint in investigatory for hint in NODE_SCOPE_HINTS) else "gpu"


def read_catalog(path: str) -> list[tuple[int, str, str, str, str, str]]:
    """Rows of (code, mnemonic, description, immediate, investigatory, action), by code."""
    with open(path, encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    out = []
    for row in rows:
        if row["Type (XID)"].strip() != "XID":
            continue
        code = int(row["Code"])
        description = _clean(row["Description"])
        immediate = _clean(row["Resolution Bucket (Immediate Action)"], "; ")
        out.append((code, re.sub(r"\s*/\s*", " / ", _clean(row["Mnemonic"])), description, immediate,
                    _clean(row["Resolution Bucket (Investigatory Action)"], "; "),
                    action_for(code, description, immediate)))
    unknown = {r[3] for r in out if r[3] and r[0] not in OVERRIDES and r[3] not in BUCKET_ACTIONS}
    if unknown:
        raise SystemExit(f"unmapped resolution bucket(s): {', '.join(sorted(unknown))}; add them to BUCKET_ACTIONS")
    return sorted(out)


HEADER = '''\
"""NVIDIA XID catalogue: what each XID means and what we do about it.

Generated by tools/gen_xid_table.py from {source}.
Do not edit: change the mapping in the generator and regenerate with

    python tools/gen_xid_table.py path/to/xid-catalog.csv
"""

from __future__ import annotations

from slurm_hooks.models import Action, Scope, Severity, Urgency
from slurm_hooks.values import dataclass


@dataclass(frozen=True)
class XidInfo:
    code: int
    mnemonic: str
    #: NVIDIA's short description, e.g. "GPU has fallen off the bus".
    description: str
    #: NVIDIA's resolution buckets, e.g. "RESET_GPU", "CONTACT_SUPPORT".
    immediate: str
    investigatory: str
    action: Action
    severity: Severity
    #: Which jobs it touches and how soon (from the buckets above; see tools/gen_xid_table.py).
    scope: Scope = Scope.GPU
    urgency: Urgency = Urgency.NOW


def lookup(code: int) -> XidInfo | None:
    return CATALOG.get(code)


_A, _S, _G, _N = Action, Severity, Scope.GPU, Scope.NODE
_NOW, _END, _WATCH = Urgency.NOW, Urgency.JOB_END, Urgency.WATCH

CATALOG: dict[int, XidInfo] = {{
'''


_SCOPES = {"gpu": "_G", "node": "_N"}
_URGENCIES = {"now": "_NOW", "job-end": "_END", "watch": "_WATCH"}


def _q(text: str) -> str:
    """A double-quoted Python literal (JSON string syntax is a subset of Python's)."""
    return json.dumps(text)


def render(path: str) -> str:
    lines = [HEADER.format(source=SOURCE)]
    for code, mnemonic, description, immediate, investigatory, action in read_catalog(path):
        lines.append(f"    {code}: XidInfo({code}, {_q(mnemonic)}, {_q(description)}, {_q(immediate)}, {_q(investigatory)}, "
                     f"_A.{_ACTION_ENUM[action]}, _S.{severity(action)}, {_SCOPES[scope_for(investigatory)]}, "
                     f"{_URGENCIES[urgency_for(code, immediate, action)]}),\n")
    lines.append("}\n")
    return "".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", nargs="?", default=DEFAULT_CSV, help=f"catalogue CSV (default {DEFAULT_CSV})")
    parser.add_argument("-o", "--output", default=DEFAULT_OUT, help="module to write, '-' for stdout")
    args = parser.parse_args(argv)
    text = render(args.csv)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
