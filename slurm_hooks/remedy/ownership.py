"""What we recorded when we drained a node, and the one test of whether a drain is still ours.

A reason's prefix alone does not say who drained a node (see DESIGN.md, "Where the field
differs"): Slurm appends to reasons (``" : Not responding"``, a reboot's ``" : reboot
issued"``), Slurm >= 23.11 without accounting keeps a resumed node's reason, so its own
later drains (``Prolog error``) and an admin's ``scontrol reboot ASAP`` wear our old text,
and an admin may drain with a text copied from ours. So at every drain we keep the exact
reason we wrote and the node's ReasonTime/ReasonUser as Slurm shows them after it
(:class:`DrainMarker`), and a drain is ours while (:meth:`DrainMarker.owns`):

- the reason is that text, followed by nothing but Slurm's owner-keeping suffixes
  (:data:`slurm_hooks.slurm.OWNER_KEEPING_SUFFIXES`);
- ReasonTime/ReasonUser are still the ones we recorded (a later party's update changes them);
- no reboot is pending that we did not ask for (an admin's ``scontrol reboot`` keeps the text).

When we let go of a drain (our resume, a person's) the reason Slurm may keep is remembered
(:class:`ReleasedReasons`): it is never adopted again, even after the marker is lost.
"""

from __future__ import annotations

import json
import os
import sys
import time

from slurm_hooks import fsutil
from slurm_hooks.engine import snapshot_xids
from slurm_hooks.errors import SlurmHooksError
from slurm_hooks.remedy import offenders
from slurm_hooks.slurm import (
    FOREIGN_PREFIXES,
    OWNER_KEEPING_SUFFIXES,
    SUFFIX_SEP,
    is_held,
    split_reason,
    status_tag,
)
from slurm_hooks.values import asdict, dataclass, replace

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from typing import Any

    from slurm_hooks.models import Report
    from slurm_hooks.remedy.wiring import Wiring
    from slurm_hooks.slurm import NodeInfo


class MarkerUnreadable(SlurmHooksError):
    """The drain marker exists but cannot be read: what we drained for is unknown."""


#: What :meth:`DrainMarker.load` reads for a marker that is not there (a ``null`` one is unreadable).
_NO_MARKER = object()


@dataclass(frozen=True)
class DrainMarker:
    """Our record of draining a node (``<state dir>/drained-<node>``, JSON)."""

    #: The reason exactly as we wrote it (Slurm's later suffixes are not part of it).
    reason: str
    #: When we drained (``time.time()``).
    ts: float = 0.0
    #: XID event keys and checks the drain was for (what a passing check must have judged again).
    xids: tuple[str, ...] = ()
    checks: tuple[str, ...] = ()
    context: str = ""
    #: The node's ReasonTime and ReasonUser as Slurm showed them after our drain ("": not read).
    reason_time: str = ""
    reason_user: str = ""
    #: Rebuilt from Slurm's view after the marker was lost (what it was for is then unknown).
    recovered: bool = False

    @classmethod
    def load(cls, path: str) -> DrainMarker | None:
        """The marker at ``path``; ``None`` when there is none. Raises :class:`MarkerUnreadable`."""
        data = fsutil.read_json(path, missing=_NO_MARKER, error=MarkerUnreadable,
                                message="{path}: unreadable drain marker ({reason})")
        if data is _NO_MARKER:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("reason"), str):
            raise MarkerUnreadable(f"{path}: drain marker without a reason")
        try:
            return cls(reason=data["reason"], ts=float(data.get("ts") or 0.0),
                       xids=tuple(str(k) for k in data.get("xids") or ()),
                       checks=tuple(str(c) for c in data.get("checks") or ()), context=str(data.get("context", "")),
                       reason_time=str(data.get("reason_time", "")), reason_user=str(data.get("reason_user", "")),
                       recovered=bool(data.get("recovered", False)))
        except (TypeError, ValueError) as exc:
            raise MarkerUnreadable(f"{path}: malformed drain marker ({exc})") from None

    def save(self, path: str) -> None:
        """Written atomically, mode 0600; raises OSError."""
        fsutil.atomic_write(path, json.dumps(self.to_dict()), mode=0o600)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["xids"], data["checks"] = list(self.xids), list(self.checks)
        return data

    def seen(self, node: NodeInfo) -> DrainMarker:
        """This marker with the node's ReasonTime/ReasonUser as Slurm shows them now (after our drain)."""
        return replace(self, reason_time=node.reason_time, reason_user=node.reason_user)

    def why_not_ours(self, node: NodeInfo, *, our_reboot: bool = False, same_text: bool = True) -> str:
        """"" when the node's drain is still the one this marker records; else why it is not.

        ``our_reboot``: a reboot pending on the node is ours (the repair ladder asked for it).
        ``same_text`` False: another of our texts counts too (a newer drain of ours)."""
        return foreign(node) or _differs(self, node, our_reboot, same_text)

    def owns(self, node: NodeInfo, *, our_reboot: bool = False) -> bool:
        return not self.why_not_ours(node, our_reboot=our_reboot)


def foreign(node: NodeInfo) -> str:
    """Why the node's reason is someone else's by its text alone ("" when it could be ours)."""
    reason = node.reason
    if not reason:
        return "no reason on the node"
    if reason.startswith(FOREIGN_PREFIXES):
        return f"another tool's reason: {reason!r}"
    if not node.ours:
        text, suffixes = split_reason(reason)
        later = [s for s in suffixes if s not in OWNER_KEEPING_SUFFIXES]
        if later and text != reason:
            return f"drained again by Slurm or a person after ours ({SUFFIX_SEP.join(later)!r} follows our text)"
        return f"someone else's reason: {reason!r}"
    return ""


def _differs(marker: DrainMarker, node: NodeInfo, our_reboot: bool, same_text: bool) -> str:
    text, suffixes = split_reason(node.reason)
    if text != marker.reason:
        if same_text:
            return f"drained for {node.reason!r}, but our record is of a drain for {marker.reason!r}"
    elif not suffixes:
        # Set again with our very text? (Slurm's own suffixes may restamp it: a reboot's, seen on 22.05.)
        restamped = _restamped(marker, node)
        if restamped:
            return restamped
    if node.reboot_pending and not our_reboot:
        return "a reboot we did not ask for is pending on the node (someone else's scontrol reboot)"
    return ""


def _restamped(marker: DrainMarker, node: NodeInfo) -> str:
    """Why ReasonTime/ReasonUser say a later party set our text again ("" when they do not)."""
    if marker.reason_time and node.reason_time and node.reason_time != marker.reason_time:
        return (f"the reason was set again at {node.reason_time} by {node.reason_user or '?'} "
                f"(ours at {marker.reason_time}): a later party's drain with our text")
    if marker.reason_user and node.reason_user and node.reason_user != marker.reason_user:
        return f"the reason was set again by {node.reason_user} (ours by {marker.reason_user})"
    return ""


# -- reasons we let go of ---------------------------------------------------------

#: How many released reasons are remembered per node.
RELEASED_KEEP = 8


@dataclass(frozen=True)
class ReleasedReasons:
    """Reasons of drains we let go of (our resume, a person's): Slurm >= 23.11 without
    accounting keeps the text on the resumed node, and it is never ours again."""

    path: str

    def add(self, reason: str, reason_time: str) -> None:
        entries = [e for e in self._read() if (e.get("reason"), e.get("reason_time")) != (reason, reason_time)]
        entries.append({"reason": split_reason(reason)[0], "reason_time": reason_time, "t": time.time()})
        try:
            os.makedirs(os.path.dirname(self.path) or ".", mode=0o700, exist_ok=True)
            fsutil.atomic_write(self.path, json.dumps(entries[-RELEASED_KEEP:]), mode=0o600)
        except OSError:
            pass  # then a kept reason may be looked at again: the suffix and reboot rules still hold

    def covers(self, node: NodeInfo) -> bool:
        """Whether the node's reason is one we let go of (same text, same ReasonTime)."""
        text = split_reason(node.reason)[0]
        return any(e.get("reason") == text and (not e.get("reason_time") or not node.reason_time
                                                or e.get("reason_time") == node.reason_time)
                   for e in self._read())

    def _read(self) -> list[dict[str, Any]]:
        data = fsutil.read_json(self.path, missing=[], error=[])
        return [e for e in data if isinstance(e, dict)] if isinstance(data, list) else []


# -- holding a node's drain, letting go of it, and finding it again ---------------------

def still_ours(w: Wiring, info: NodeInfo) -> bool:
    """Our text on a drained node: is it our drain (not one that outlived our resume)?"""
    try:
        marker = load_marker(w)
    except MarkerUnreadable:
        marker = None
    if marker is not None:
        return marker.owns(info, our_reboot=True)
    return not released(w).covers(info)


#: How often a node with no drain marker asks Slurm whether it carries our drain anyway
#: (the state dir was lost: a slurmd pod restarted, a node reimaged).
#: Once an hour: 10,000 nodes cost slurmctld under 3 light RPCs a second.
RECOVER_LOOK_S = 3600.0


def recover_marker(w: Wiring) -> DrainMarker | None:
    """No marker: now and then, ask Slurm whether this node carries our drain anyway.

    Adopted only when nothing says it is not ours: our text with at most Slurm's
    owner-keeping suffixes, no reboot pending that our repair state does not name, and
    not a reason we let go of (Slurm >= 23.11 without accounting keeps it after a resume)."""
    stamp = w.state_path(f"slurm-look-{w.node}")
    try:
        if time.time() - os.stat(stamp).st_mtime < RECOVER_LOOK_S:
            return None
    except FileNotFoundError:
        pass
    _touch(stamp)
    try:
        info = w.slurm.node(w.node)
    except SlurmHooksError:
        return None
    if not (info.out_of_service and info.ours) or info.reboot_pending or released(w).covers(info):
        return None
    text = split_reason(info.reason)[0]
    # What it was drained for is lost with the marker; the reason still says whether it was the GPU
    # diagnostic's (DCGM's, RVS's). A node drained [validating]/[unverified] waits for its diagnostic,
    # which the periodic check does not run.
    from slurm_hooks.checks.dcgm import said_by_diagnostic

    dcgm = said_by_diagnostic(text) or bool(status_tag(text))
    return DrainMarker(reason=text, checks=("dcgm",) if dcgm else (), recovered=True).seen(info)


def holds(w: Wiring, info: NodeInfo, *, our_reboot: bool = False) -> str:
    """"" when the drain on this node is ours to act on (repair, reboot); else why not.

    By our marker when there is one (any of our texts: a newer drain of ours counts); with
    the marker lost, by Slurm's view: our text, not one we let go of, no reboot pending that
    ``our_reboot`` does not cover."""
    theirs = foreign(info)
    if theirs:
        return theirs
    try:
        marker = load_marker(w)
    except MarkerUnreadable:
        marker = None
    if marker is not None:
        return marker.why_not_ours(info, our_reboot=our_reboot, same_text=False)
    if released(w).covers(info):
        return "a reason we let go of (Slurm kept it on the node after a resume)"
    if info.reboot_pending and not our_reboot:
        return "a reboot we did not ask for is pending on the node (someone else's scontrol reboot)"
    return ""


def let_go(w: Wiring, marker: DrainMarker | None, info: NodeInfo | None) -> None:
    """We no longer hold this node's drain: forget the marker, and remember the reason that
    Slurm may keep on the node (>= 23.11 without accounting) so it is never adopted again."""
    if marker is not None and info is not None and info.reason and split_reason(info.reason)[0] == marker.reason:
        released(w).add(marker.reason, info.reason_time)
    if marker is not None and is_held(marker.reason):
        # we never resume a held node: whoever let it go was a person
        offenders.release(w, info, "a person resumed the node" if info is None or not info.out_of_service
                          else f"someone else took the node over ({info.reason!r})")
    forget_drain(w)


def released(w: Wiring) -> ReleasedReasons:
    return ReleasedReasons(w.state_path(f"released-{w.node}.json"))


def forget_drain(w: Wiring) -> None:
    _remove(w.drained_marker())


def write_marker(w: Wiring, reason: str, report: Report | None, node: NodeInfo | None = None) -> None:
    """Remember that we drained this node: when, why, for which XID events and checks, and the
    node's ReasonTime/ReasonUser right after (``node``, as read then; ``None``: unknown).
    ``report`` None: a new reason for the same drain, as the repair's reboot gives it."""
    try:
        before = load_marker(w)
    except MarkerUnreadable:
        before = None
    if report is None:
        marker = replace(before, ts=time.time(), reason=reason, reason_time="", reason_user="") if before \
            else DrainMarker(reason=reason, ts=time.time())
    else:
        snap = report.snapshot
        keys = sorted({x.key for x in snapshot_xids(snap)}) if snap else []
        marker = DrainMarker(reason=reason, ts=time.time(), xids=tuple(keys), context=report.context.value,
                             checks=tuple(sorted({f.check for f in report.drain_findings()})))
    if node is not None and split_reason(node.reason)[0] == reason:
        marker = marker.seen(node)
    if report is not None and before is not None and replace(before, ts=marker.ts) == marker:
        return  # the same drain, seen again by a later run: kept as written (its time too), no write
    try:
        marker.save(w.drained_marker())
    except OSError as exc:
        print(f"slurm-hooks: cannot write {w.drained_marker()}: {exc.strerror}", file=sys.stderr)


def load_marker(w: Wiring) -> DrainMarker | None:
    """Our record of draining this node; ``None`` when we have not drained it.
    Raises :class:`MarkerUnreadable` when it exists but cannot be read."""
    return DrainMarker.load(w.drained_marker())


def drained_for(w: Wiring) -> list[str] | None:
    """XID event keys our drain of this node was for; ``None`` when we have not drained it
    (an unreadable marker: ``[]``, a drain for unknown events)."""
    try:
        marker = load_marker(w)
    except MarkerUnreadable:
        return []
    return None if marker is None else list(marker.xids)


def _touch(path: str) -> None:
    try:
        os.makedirs(os.path.dirname(path), mode=0o750, exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        os.utime(path)
    except OSError:
        pass


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
