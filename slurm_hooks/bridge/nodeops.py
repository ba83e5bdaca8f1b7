"""The requests the bridge sends about a Node, built here and nowhere else.

JSON Patches guarded by a ``test`` on ``metadata.resourceVersion`` (the take, the taint, the
give-back), the ``GpuHealthy`` condition's strategic merge patch, and the Event bodies with
their fixed names. Plain functions over plain dicts, below the reconciler, as kopf keeps its
patch and event structures apart from its handlers (``structs/patches.py``, ``clients/events.py``).
"""

from __future__ import annotations

import datetime

from slurm_hooks.bridge.api import OWNER_ANNOTATION, OWNER_LABEL, Obj, annotations_of, labels_of, meta

COMPONENT = "slurm-hooks-bridge"


def now_iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def ptr(key: str) -> str:
    """A JSON Pointer token (RFC 6901): ``/`` and ``~`` escaped."""
    return key.replace("~", "~0").replace("/", "~1")


def rv_test(node: Obj) -> list[Obj]:
    """The guard: the patch applies only to the version read (kube-apiserver answers 422 otherwise)."""
    rv = meta(node).get("resourceVersion")
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": rv}] if rv else []


def set_entry(node: Obj, field_name: str, key: str, value: str) -> Obj:
    """Add ``key: value`` to ``metadata.<field_name>`` (annotations, labels), creating the map."""
    if field_name not in meta(node) or meta(node)[field_name] is None:
        return {"op": "add", "path": f"/metadata/{field_name}", "value": {key: value}}
    return {"op": "add", "path": f"/metadata/{field_name}/{ptr(key)}", "value": value}


def taint_op(spec: Obj, key: str, value: str) -> Obj:
    """Our taint, the whole list written (taints have no patch strategy), everyone else's kept."""
    taints = [t for t in spec.get("taints") or [] if t.get("key") != key]
    taints.append({"key": key, "value": value, "effect": "NoSchedule"})
    return {"op": "add", "path": "/spec/taints", "value": taints}


def take_ops(node: Obj, record_json: str, *, taint_key: str, action: str, taint: bool) -> tuple[list[Obj], bool]:
    """(the take's JSON Patch, whether it cordons): cordon only a schedulable node, taint, annotate,
    label; ``record_json`` is the ownership record, written with the rest in one guarded patch."""
    spec = node.get("spec")
    ops: list[Obj] = rv_test(node)
    if spec is None:
        ops.append({"op": "add", "path": "/spec", "value": {}})
        spec = {}
    cordons = not spec.get("unschedulable")
    if cordons:
        ops.append({"op": "add", "path": "/spec/unschedulable", "value": True})
    if taint:
        ops.append(taint_op(spec, taint_key, action))
    ops.append(set_entry(node, "annotations", OWNER_ANNOTATION, record_json))
    ops.append(set_entry(node, "labels", OWNER_LABEL, "true"))
    return ops, cordons


def restore_ops(node: Obj, *, taint_key: str, tainted: bool, cordoned: bool) -> list[Obj]:
    """Undo exactly what the record says we did: our taint (others stay), the cordon if ours,
    the annotation and the label."""
    ops = rv_test(node)
    spec = node.get("spec") or {}
    if tainted and spec.get("taints"):
        kept = [t for t in spec["taints"] if t.get("key") != taint_key]
        if len(kept) != len(spec["taints"]):
            ops.append({"op": "replace", "path": "/spec/taints", "value": kept})
    if cordoned and spec.get("unschedulable"):
        ops.append({"op": "remove", "path": "/spec/unschedulable"})
    if OWNER_ANNOTATION in annotations_of(node):
        ops.append({"op": "remove", "path": f"/metadata/annotations/{ptr(OWNER_ANNOTATION)}"})
    if OWNER_LABEL in labels_of(node):
        ops.append({"op": "remove", "path": f"/metadata/labels/{ptr(OWNER_LABEL)}"})
    return ops


def condition_patch(node: Obj, ctype: str, status: str, reason: str, message: str, now: float) -> Obj:
    """Strategic merge on ``nodes/status`` (conditions merge by type); the transition time kept
    when the status does not change."""
    stamp = now_iso(now)
    old = next((c for c in (node.get("status") or {}).get("conditions") or () if c.get("type") == ctype), None)
    transition = old.get("lastTransitionTime") if old and old.get("status") == status else stamp
    return {"status": {"conditions": [{
        "type": ctype, "status": status, "reason": reason, "message": message[:1024],
        "lastHeartbeatTime": stamp, "lastTransitionTime": transition or stamp,
    }]}}


def event_body(node: Obj, *, namespace: str, kind: str, take: str, reason: str, message: str, event_type: str,
               instance: str, now: float) -> Obj:
    """An Event on the Node named ``<node>.slurm-hooks.<kind>.<take>``: a retried create is a 409, a no-op."""
    kname = meta(node).get("name", "")
    stamp = now_iso(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{kname}.slurm-hooks.{kind}.{take}", "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": kname, "uid": meta(node).get("uid", "")},
        "reason": reason,
        "message": message[:1024],
        "type": event_type,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
