"""The bits of API-server semantics the bridge relies on, shared by both test doubles.

Strategic merge for the fields the bridge patches (node conditions merge by
``type``; taints have no strategy and are replaced), JSON Patch with ``test``,
label and field selectors, dry run. Kept deliberately small: this is what a
real kube-apiserver does for these fields, nothing more.
"""

from __future__ import annotations

import copy
from typing import Any

#: list fields with a merge key in the core API (the ones a Node status patch touches).
MERGE_KEYS = {"conditions": "type", "addresses": "type"}


def strategic_merge(base: Any, patch: Any) -> Any:
    if not isinstance(base, dict) or not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif key in MERGE_KEYS and isinstance(value, list) and isinstance(out.get(key), list):
            mk = MERGE_KEYS[key]
            merged = [copy.deepcopy(item) for item in out[key]]
            for item in value:
                for i, old in enumerate(merged):
                    if old.get(mk) == item.get(mk):
                        merged[i] = strategic_merge(old, item)
                        break
                else:
                    merged.append(copy.deepcopy(item))
            out[key] = merged
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = strategic_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def merge_patch(base: Any, patch: Any) -> Any:
    """RFC 7386 (custom resources have no strategic merge)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(base) if isinstance(base, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class PatchTestFailed(Exception):
    """A JSON Patch ``test`` op did not hold: kube-apiserver answers 422."""


def _walk(doc: Any, pointer: str) -> tuple[Any, str]:
    parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.split("/")[1:]]
    for part in parts[:-1]:
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc, parts[-1]


def json_patch(base: dict, ops: list) -> dict:
    """RFC 6902 ``add``/``remove``/``replace``/``test`` (what the bridge sends)."""
    doc = copy.deepcopy(base)
    for op in ops:
        parent, key = _walk(doc, op["path"])
        kind = op["op"]
        if kind == "test":
            actual = parent[int(key)] if isinstance(parent, list) else parent.get(key)
            if actual != op["value"]:
                raise PatchTestFailed(f"test failed at {op['path']}: {actual!r} != {op['value']!r}")
        elif kind == "add":
            if isinstance(parent, list):
                parent.insert(len(parent) if key == "-" else int(key), copy.deepcopy(op["value"]))
            else:
                parent[key] = copy.deepcopy(op["value"])
        elif kind == "replace":
            if isinstance(parent, list):
                parent[int(key)] = copy.deepcopy(op["value"])
            elif key not in parent:
                raise ValueError(f"replace: no {op['path']}")
            else:
                parent[key] = copy.deepcopy(op["value"])
        elif kind == "remove":
            if isinstance(parent, list):
                del parent[int(key)]
            else:
                del parent[key]
        else:
            raise ValueError(f"unsupported op {kind!r}")
    return doc


def matches_labels(obj: dict, selector: str) -> bool:
    """Equality-based selectors: ``a=b,c!=d,e`` (what the bridge and kubectl drain use)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in (selector or "").split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def matches_fields(obj: dict, selector: str) -> bool:
    for term in filter(None, (t.strip() for t in (selector or "").split(","))):
        k, v = term.split("=", 1)
        value: Any = obj
        for part in k.strip().split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if (value or "") != v.strip():
            return False
    return True
